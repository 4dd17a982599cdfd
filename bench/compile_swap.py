"""GPT-2 small under torch.compile with and without fusedops.swap: does swapping in the fused
modules keep a compiled model at least as fast? Inference, bf16, random weights (transformers'
default GPT2Config), the four variants timed in turn over five rounds, median (fastest-slowest).

    python bench/compile_swap.py [--shapes 1x64,8x1024]

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
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    import transformers

    device = torch.device("cuda")
    config = transformers.GPT2Config()
    for shape in args.shapes.split(","):
        batch, tokens = map(int, shape.split("x"))
        torch.manual_seed(0)
        ids = torch.randint(0, config.vocab_size, (batch, tokens), device=device)
        model = transformers.GPT2LMHeadModel(config).to(device, torch.bfloat16).eval()
        swapped = transformers.GPT2LMHeadModel(config).to(device, torch.bfloat16).eval()
        swapped.load_state_dict(model.state_dict())
        report = fusedops.swap(swapped)
        torch._dynamo.reset()
        variants = {
            "eager": model,
            "eager+swap": swapped,
            "compile": torch.compile(model),
            "compile+swap": torch.compile(swapped),
        }

        def step(m, ids=ids):
            with torch.no_grad():
                return m(ids).logits

        for m in variants.values():  # compiles, warms up
            for _ in range(3):
                step(m)
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, m in variants.items():
                call = Timed(lambda m=m: step(m), [()], grad=False, nbytes=0)
                times[name].append(measure(call, device))
        cells = "  ".join(
            f"{name} {statistics.median(t) * 1e3:.3f} ms ({min(t) * 1e3:.3f}-{max(t) * 1e3:.3f})"
            for name, t in times.items()
        )
        print(f"{shape} ({report.swapped} modules swapped): {cells}", flush=True)


if __name__ == "__main__":
    main()
