"""Multi-GPU training with fusedops.swap: a GPT-2-small-config model (transformers), swapped and
not, trains 20 steps on 2 GPUs with DDP and with FSDP2 (fully_shard); the swapped run's losses
match the unswapped run's within LOSS_RTOL, and two swapped runs give bitwise-identical
gradients on every rank (fusedops' weight gradients are deterministic; torch runs with
deterministic algorithms).

The test launches this file under torchrun (`python -m torch.distributed.run`); run as a
script, it is the per-rank worker and rank 0 prints one JSON summary line. Skips without 2 GPUs.
NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1.
"""

import hashlib
import json
import os
import subprocess
import sys

import pytest
import torch

STEPS = 20
LOSS_RTOL = 5e-3  # fp32 training; a wrong kernel moves GPT-2's loss by far more
LOSS_DROP = 1.0  # nats the unswapped run's loss must fall over STEPS on its fixed batch
ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",  # deterministic cuBLAS
}


def _gpt2(device):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(  # GPT-2 small; no dropout, so the runs compare step by step
        n_layer=12,
        n_head=12,
        n_embd=768,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        attn_implementation="eager",  # deterministic backward (no fused attention kernels)
    )
    return GPT2LMHeadModel(config).to(device)


def _grad_digest(model) -> str:
    """sha256 over every gradient's bytes (this rank's shard under FSDP2)."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        h.update(name.encode())
        h.update(g.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def _train(mode: str, swapped: bool, device, rank: int):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import fusedops

    torch.manual_seed(0)  # the same initial weights on every rank and in every run
    model = _gpt2(device)
    if swapped:
        assert fusedops.swap(model).swapped > 0, "swap replaced nothing in GPT-2"
    if mode == "ddp":
        model = DistributedDataParallel(model, device_ids=[device.index])
    else:
        from torch.distributed.fsdp import fully_shard

        for block in model.transformer.h:
            fully_shard(block)
        fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    losses, digest = [], None
    for step in range(STEPS):
        # Each rank trains on its own fixed batch: memorising it moves the loss far within 20
        # steps, so a wrong gradient shows as diverging losses (fresh random tokens each step
        # would keep every run near ln(vocab)).
        g = torch.Generator().manual_seed(rank)
        ids = torch.randint(0, 50257, (4, 128), generator=g).to(device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if step == STEPS - 1:
            digest = _grad_digest(model)
        opt.step()
        opt.zero_grad(set_to_none=True)
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        losses.append(mean.item())
    return losses, digest


def worker() -> None:
    import torch.distributed as dist

    dist.init_process_group("nccl")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    torch.use_deterministic_algorithms(True)
    summary = {}
    for mode in ("ddp", "fsdp2"):
        plain, _ = _train(mode, False, device, rank)
        fused, digest_a = _train(mode, True, device, rank)
        again, digest_b = _train(mode, True, device, rank)
        same = torch.tensor(int(digest_a == digest_b), device=device)
        dist.all_reduce(same, op=dist.ReduceOp.MIN)  # every rank's gradients
        rel = max(abs(a - b) / abs(b) for a, b in zip(fused, plain, strict=True))
        summary[mode] = {
            "loss_first_last_plain": [plain[0], plain[-1]],
            "loss_first_last_fused": [fused[0], fused[-1]],
            "max_rel_loss_diff": rel,
            "swapped_runs_equal_losses": fused == again,
            "grads_bitwise_equal": bool(same.item()),
        }
    if rank == 0:
        print("FUSEDOPS_DISTRIBUTED " + json.dumps(summary), flush=True)
    dist.destroy_process_group()


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.bigmem
def test_ddp_and_fsdp2_train_gpt2_swapped():
    pytest.importorskip("transformers")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    import fusedops

    # The workers run this file as a script: they find fusedops where this process did.
    repo = os.path.dirname(os.path.dirname(fusedops.__file__))
    path = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, **ENV, "PYTHONPATH": path}
    proc = subprocess.run([*cmd, __file__], env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("FUSEDOPS_DISTRIBUTED "))
    summary = json.loads(line.split(" ", 1)[1])
    print(json.dumps(summary, indent=1))
    for mode, s in summary.items():
        first, last = s["loss_first_last_plain"]
        assert last < first - LOSS_DROP, (mode, s)  # the runs trained
        assert s["max_rel_loss_diff"] <= LOSS_RTOL, (mode, s)
        assert s["grads_bitwise_equal"], (mode, s)
        assert s["swapped_runs_equal_losses"], (mode, s)


if __name__ == "__main__":
    worker()
