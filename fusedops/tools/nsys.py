"""Nsight Systems summaries: the GPU kernel and NVTX range tables of an nsys report.

    python -m fusedops.tools.nsys REPORT.nsys-rep [--top 15]
    python -m fusedops.tools.nsys --csv KERNELS.csv [--nvtx-csv NVTX.csv]   (saved `nsys stats`)

bench/nsys_profile.sh profiles the demo and calls the first form. Newer nsys releases name the
reports cuda_gpu_kern_sum and nvtx_sum, older ones gpukernsum and nvtxsum, with other column
names ("Time (%)", "Avg (ns)" against "Time(%)", "Average"): both are read.
"""

from __future__ import annotations

import argparse
import csv
import re
import shutil
import subprocess
import sys

from fusedops.tools.kernels import short_name

REPORTS = {  # what we want -> its names, newest first
    "kernels": ("cuda_gpu_kern_sum", "gpukernsum"),
    "nvtx": ("nvtx_sum", "nvtxsum"),
}

# Header (lowercased, only letters and %) -> field. Old and new nsys spellings.
_FIELDS = {
    "time%": "time_pct",
    "totaltimens": "total_ns",
    "totaltime": "total_ns",
    "instances": "instances",
    "avgns": "avg_ns",
    "average": "avg_ns",
    "averagens": "avg_ns",
    "medns": "med_ns",
    "median": "med_ns",
    "minns": "min_ns",
    "minimum": "min_ns",
    "maxns": "max_ns",
    "maximum": "max_ns",
    "stddevns": "std_ns",
    "stddev": "std_ns",
    "name": "name",
    "range": "name",
    "style": "style",
}


def _field(header: str) -> str | None:
    return _FIELDS.get(re.sub(r"[^a-z%]", "", header.lower()))


def _is_header(row: list[str]) -> bool:
    fields = {_field(h) for h in row}
    return {"name", "instances", "total_ns"} <= fields


def parse_stats_csv(text: str) -> list[dict]:
    """Rows of one `nsys stats --format csv` summary (kernels or NVTX ranges), any nsys version:
    [{"name", "time_pct", "total_ns", "instances", "avg_ns", ...}], numbers as float/int. Lines
    before the header (nsys' progress messages) are skipped."""
    rows = list(csv.reader(text.splitlines()))
    start = next((i for i, head in enumerate(rows) if _is_header(head)), None)
    if start is None:
        raise ValueError(
            "fusedops.tools.nsys.parse_stats_csv: no summary header (Name/Range, Instances, "
            f"Total Time) in {len(rows)} line(s): {text[:200]!r}"
        )
    fields = [_field(h) for h in rows[start]]
    out = []
    for r in rows[start + 1 :]:
        if len(r) != len(fields):
            continue  # blank or trailing lines
        row = {}
        for f, v in zip(fields, r, strict=True):
            if f in ("name", "style"):
                row[f] = v
            elif f is not None:
                row[f] = int(float(v)) if f == "instances" else float(v)
        out.append(row)
    return out


def run_stats(report: str, what: str, nsys: str = "nsys") -> list[dict]:
    """`nsys stats` of report for what ("kernels" or "nvtx"), under whichever name this nsys
    knows. Raises RuntimeError with nsys' messages when neither name gives a table."""
    messages = []
    for name in REPORTS[what]:
        cmd = [nsys, "stats", "--report", name, "--format", "csv", "--output", "-", report]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        try:
            return parse_stats_csv(proc.stdout)
        except ValueError:
            messages.append(f"{name}: {(proc.stderr or proc.stdout).strip()[:300]}")
    raise RuntimeError(
        f"fusedops.tools.nsys: no {what} summary in {report}: " + "; ".join(messages)
    )


def table(rows: list[dict], title: str, top: int = 15) -> str:
    """The top rows by total time: % of time, total ms, calls, mean µs, short name; then the
    share of the fusedops kernels."""
    rows = sorted(rows, key=lambda r: r["total_ns"], reverse=True)
    total = sum(r["total_ns"] for r in rows) or 1.0
    lines = [title, f"{'time %':>7}  {'total ms':>9}  {'calls':>7}  {'mean µs':>9}  name"]
    for r in rows[:top]:
        lines.append(
            f"{100 * r['total_ns'] / total:7.1f}  {r['total_ns'] / 1e6:9.3f}  {r['instances']:7d}  "
            f"{r['total_ns'] / max(r['instances'], 1) / 1e3:9.2f}  {short_name(r['name'])}"
        )
    if len(rows) > top:
        lines.append(f"... {len(rows) - top} more")
    ours = sum(r["total_ns"] for r in rows if "fusedops::" in r["name"])
    if ours:
        lines.append(f"fusedops kernels: {100 * ours / total:.1f}% of the time above")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m fusedops.tools.nsys", description=__doc__.splitlines()[0]
    )
    ap.add_argument("report", nargs="?", help="an .nsys-rep file")
    ap.add_argument("--csv", help="a saved kernel summary (nsys stats --format csv)")
    ap.add_argument("--nvtx-csv", help="a saved NVTX summary")
    ap.add_argument("--top", type=int, default=15, help="rows per table")
    ap.add_argument("--nsys", default="nsys", help="the nsys executable")
    args = ap.parse_args(argv)
    if bool(args.report) == bool(args.csv):
        ap.error("give an .nsys-rep report or --csv, not both")
    if args.report:
        if shutil.which(args.nsys) is None:
            ap.error(f"{args.nsys} not found: install Nsight Systems or pass --nsys PATH")
        kernels = run_stats(args.report, "kernels", args.nsys)
        try:
            nvtx = run_stats(args.report, "nvtx", args.nsys)
        except RuntimeError as e:  # a run without NVTX ranges: the kernels still tell
            print(f"note: {e}", file=sys.stderr)
            nvtx = []
    else:
        with open(args.csv) as f:
            kernels = parse_stats_csv(f.read())
        nvtx = []
        if args.nvtx_csv:
            with open(args.nvtx_csv) as f:
                nvtx = parse_stats_csv(f.read())
    if nvtx:
        print(table(nvtx, "NVTX ranges", args.top), end="\n\n")
    print(table(kernels, "GPU kernels", args.top))


if __name__ == "__main__":
    main()
