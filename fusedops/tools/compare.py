"""Two or more benchmark results side by side: python -m fusedops.compare BEFORE.json AFTER.json ...

Reads the JSON that `python -m fusedops.bench` or `python -m fusedops.bench_mlp` (also with
--fully-fused) writes, matches their cells (same op, dtype and shape, or mode and width), and
prints one provider's metric per file with the speed of each later file over the first: > 1 is
faster. The kernel benchmark's metric is % of copy (`--metric device_pct_copy`: kernel-only,
`median_us`: time); the MLP benchmarks' is ms. The summary adds what eager did between the same
files: on a noisy machine, eager's spread is the noise floor of the comparison.

For an A/B, alternate the two builds' runs in one session on one machine and compare the files
of each pair; files from different machines or clocks compare those too.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from fusedops.tools.bench import columns

# Per-cell fields that are measurements or derived from the shape, not part of its identity.
_NOT_IDENTITY = {"bytes", "flops"}
# Metrics where more is faster (the rest are times).
_HIGHER_IS_FASTER = {"pct_copy", "device_pct_copy", "gbps", "tflops", "speedup"}


def load(path: Path) -> dict:
    try:
        result = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"compare: {path} is not JSON ({e})") from e
    if not isinstance(result, dict) or not isinstance(result.get("cells"), list):
        raise ValueError(f"compare: {path} is not a fusedops benchmark result (no 'cells' list)")
    return result


def default_metric(result: dict) -> str:
    """% of copy for the kernel benchmark, ms for the MLP benchmarks."""
    return "pct_copy" if "copy_gbps" in result else "ms"


def cell_key(cell: dict) -> tuple:
    return tuple(
        (k, v) for k, v in cell.items() if k not in _NOT_IDENTITY and not isinstance(v, dict | list)
    )


def cell_label(key: tuple) -> str:
    """op dtype ROWSxN for the kernel benchmark; otherwise the words as they are and each number
    after its name (infer width 64 rows 262144)."""
    d = dict(key)
    if {"op", "dtype", "rows", "n"} <= d.keys():
        return f"{d['op']} {d['dtype']} {d['rows']}x{d['n']}"
    return " ".join(v if isinstance(v, str) else f"{k} {v}" for k, v in d.items())


def speed(before: float | None, after: float | None, metric: str) -> float | None:
    """How much faster `after` is than `before` (> 1: faster)."""
    if not before or not after:
        return None
    return after / before if metric in _HIGHER_IS_FASTER else before / after


def value(cell: dict, metric: str, provider: str) -> float | None:
    return (cell.get(metric) or {}).get(provider)


def compare(results: list[dict], metric: str, provider: str) -> tuple[list[str], list[str]]:
    """The table's lines and the summary's lines."""
    if len(results) < 2:
        raise ValueError("compare: give at least two result files")
    kinds = {default_metric(r) for r in results}
    if len(kinds) > 1:
        raise ValueError("compare: the files mix the kernel benchmark and an MLP benchmark")
    indexed = [{cell_key(c): c for c in r["cells"]} for r in results]
    keys = [k for k in indexed[0] if all(k in ix for ix in indexed[1:])]
    if not keys:
        raise ValueError("compare: the files have no cell in common (not the same benchmark?)")
    head = ["cell", *[f"#{i + 1}" for i in range(len(results))]]
    head += [f"#{i + 1}/#1" for i in range(1, len(results))]
    rows, ratios, eager = [], [[] for _ in results[1:]], [[] for _ in results[1:]]
    for k in keys:
        cells = [ix[k] for ix in indexed]
        values = [value(c, metric, provider) for c in cells]
        if all(v is None for v in values):
            continue  # a metric these cells lack (older results: no backward device_pct_copy)
        row = [cell_label(k), *["-" if v is None else f"{v:.4g}" for v in values]]
        for i in range(1, len(cells)):
            s = speed(values[0], values[i], metric)
            row.append("-" if s is None else f"{s:.3f}")
            if s is not None:
                ratios[i - 1].append((s, cell_label(k)))
            e = speed(value(cells[0], metric, "eager"), value(cells[i], metric, "eager"), metric)
            if e is not None and provider != "eager":
                eager[i - 1].append(e)
        rows.append(row)
    lines = columns(head, rows, text=1)

    summary = [f"{provider}, {metric}: {len(rows)} of the {len(keys)} cells every file has"]
    for i, ix in enumerate(indexed):
        if len(ix) > len(keys):
            summary.append(f"#{i + 1}: {len(ix) - len(keys)} cells not in every file, left out")
    for i, r in enumerate(ratios):
        if not r:
            continue
        lo, hi = min(r), max(r)
        text = (
            f"#{i + 2} over #1: median {statistics.median(s for s, _ in r):.3f}x, "
            f"lowest {lo[0]:.3f}x ({lo[1]}), highest {hi[0]:.3f}x ({hi[1]})"
        )
        if eager[i]:
            text += f"; eager moved {min(eager[i]):.3f}-{max(eager[i]):.3f}x"
        summary.append(text)
    devices = {r.get("device") for r in results}
    if len(devices) > 1:
        summary.append(f"note: different devices: {', '.join(sorted(map(str, devices)))}")
    copies = [r["copy_gbps"] for r in results if r.get("copy_gbps")]
    if copies and max(copies) > 1.05 * min(copies):
        summary.append(
            f"note: the copy rate differs between files ({min(copies):.0f}-{max(copies):.0f} "
            "GB/s): % of copy then compares against different roofs"
        )
    return lines, summary


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m fusedops.compare",
        description="Benchmark results side by side (the first file is the baseline).",
    )
    ap.add_argument("files", nargs="+", type=Path, help="result JSON files, baseline first")
    ap.add_argument(
        "--metric",
        help="pct_copy (kernel benchmark default), device_pct_copy, median_us, gbps; "
        "ms (MLP benchmarks default), tflops",
    )
    ap.add_argument("--provider", default="fusedops", help="fusedops (default), eager, ...")
    args = ap.parse_args(argv)
    try:
        results = [load(f) for f in args.files]
        metric = args.metric or default_metric(results[0])
        lines, summary = compare(results, metric, args.provider)
    except (OSError, ValueError) as e:
        ap.error(str(e))
    for i, (path, r) in enumerate(zip(args.files, results, strict=True)):
        print(f"#{i + 1}: {path} ({r.get('device', '?')}, {r.get('date', '?')})")
    print("\n".join(lines))
    print("\n".join(summary))


if __name__ == "__main__":
    main()
