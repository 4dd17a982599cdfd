"""GPT-2 small under torch.compile with and without fusedops.swap: does swapping in the fused
modules keep a compiled model at least as fast? bf16, random weights (transformers' default
GPT2Config, dropout off), inference (forward under no_grad) and a training step (forward with
the language-model loss, backward), the four variants timed in turn over five rounds, median
(fastest-slowest).

    python bench/compile_swap.py [--shapes 1x64,8x1024] [--modes inference,training]

Needs CUDA and transformers.
"""

import argparse
import statistics

import torch

import fusedops
from fusedops.tools.bench import Timed, measure


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1x64,8x1024", help="comma list of BATCHxTOKENS")
    ap.add_argument("--modes", default="inference,training", help="inference, training or both")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    import transformers

    device = torch.device("cuda")
    config = transformers.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    for mode in args.modes.split(","):
        if mode not in ("inference", "training"):
            ap.error(f"--modes: unknown mode {mode!r}")
        training = mode == "training"
        for shape in args.shapes.split(","):
            batch, tokens = map(int, shape.split("x"))
            torch.manual_seed(0)
            ids = torch.randint(0, config.vocab_size, (batch, tokens), device=device)
            model = transformers.GPT2LMHeadModel(config).to(device, torch.bfloat16)
            swapped = transformers.GPT2LMHeadModel(config).to(device, torch.bfloat16)
            swapped.load_state_dict(model.state_dict())
            model.train(training)
            swapped.train(training)
            report = fusedops.swap(swapped)
            torch._dynamo.reset()
            variants = {
                "eager": model,
                "eager+swap": swapped,
                "compile": torch.compile(model),
                "compile+swap": torch.compile(swapped),
            }

            def step(m, ids=ids, training=training):
                if training:
                    m.zero_grad(set_to_none=True)
                    m(ids, labels=ids).loss.backward()
                else:
                    with torch.no_grad():
                        m(ids)

            for m in variants.values():  # compiles, warms up
                for _ in range(3):
                    step(m)
            times: dict[str, list[float]] = {name: [] for name in variants}
            for _ in range(args.rounds):
                for name, m in variants.items():
                    call = Timed(lambda m=m: step(m), [()], grad=training, nbytes=0)
                    times[name].append(measure(call, device))
            cells = "  ".join(
                f"{name} {statistics.median(t) * 1e3:.3f} ms "
                f"({min(t) * 1e3:.3f}-{max(t) * 1e3:.3f})"
                for name, t in times.items()
            )
            print(f"{mode} {shape} ({report.swapped} modules swapped): {cells}", flush=True)


if __name__ == "__main__":
    main()
