"""Where a fused_mlp training step's peak memory goes, beside eager's: the allocations live at the
peak, with the fusedops / ATen frames that made them (torch.cuda.memory's allocation trace).

    python bench/mlp_memory.py [--tokens 8192] [--d 768]

One step = forward + backward for input, weights and biases (fusedops.bench_mlp's train step),
bf16, after two warm-up steps; "peak" is above what was allocated before the step.
"""

import argparse

import torch

from fusedops.tools import bench_mlp

KEEP = ("fusedops::", "at::native::", "Backward", "autograd::generated")
SKIP = ("empty", "alloc", "Alloc", "c10::", "at::detail", "TensorBase", "TensorImpl")


def live_at_peak(snapshot: dict) -> list[dict]:
    """Replays the allocation trace; the allocations live when the total was highest."""
    live, total, best, best_live = {}, 0, -1, {}
    for e in snapshot["device_traces"][torch.cuda.current_device()]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
            total += e["size"]
            if total > best:
                best, best_live = total, dict(live)
        elif e["action"] == "free_requested" and e["addr"] in live:
            total -= live.pop(e["addr"])["size"]
    return sorted(best_live.values(), key=lambda e: -e["size"])


def origin(e: dict) -> str:
    names = [
        f["name"][:60]
        for f in e.get("frames", [])
        if any(k in f.get("name", "") for k in KEEP) and not any(k in f["name"] for k in SKIP)
    ]
    if names:
        return " < ".join(names[:2])
    # No C++ frame of ours or ATen's: the innermost Python line outside torch that allocated it.
    py = [
        f"{f['filename'].rsplit('/', 1)[-1]}:{f['line']} {f['name']}"
        for f in e.get("frames", [])
        if f.get("filename", "").endswith(".py") and "/torch/" not in f["filename"]
    ]
    return py[0] if py else "(no frame recorded)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--d", type=int, default=768)
    args = ap.parse_args()
    device = torch.device("cuda")
    for approximate in ("tanh", "none"):
        for provider in ("eager", "fusedops", "fusedops-recompute"):
            t = bench_mlp.prepare(
                provider, "train", approximate, args.tokens, args.d, torch.bfloat16, device
            )
            for _ in range(2):
                t.call(*t.sets[0])
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.memory._record_memory_history(max_entries=100000, stacks="all")
            torch.cuda.reset_peak_memory_stats()
            t.call(*t.sets[0])
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - before
            snapshot = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            print(
                f"== GELU {approximate}, {provider}: peak {peak / 2**20:.0f} MiB; live at the peak:"
            )
            for e in live_at_peak(snapshot):
                if e["size"] >= 2**20:
                    print(f"   {e['size'] / 2**20:7.1f} MiB  {origin(e)}")


if __name__ == "__main__":
    main()
