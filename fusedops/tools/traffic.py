"""DRAM traffic model: the bytes each op moves as one fusedops kernel ("fused") and as the unfused
torch composition a model runs without fused kernels ("unfused"), for rows x N in a dtype; and
the Nsight Compute measurement that checks it.

    python -m fusedops.tools.traffic [--ops softmax_fwd,...] [--shape 16384x8192] [--dtype bf16]
        the model table (MB read + written, and unfused / fused)
    python -m fusedops.tools.traffic run OP ROWSxN DTYPE fused|unfused
        one call of OP between cudaProfilerStart/Stop, for ncu --profile-from-start off
    python -m fusedops.tools.traffic compare DIR
        DIR/<op>-<rows>x<n>-<dtype>-<variant>.csv from ncu: measured bytes beside the model
    python -m fusedops.tools.traffic stalls FILE
        an ncu CSV of STALL_METRICS: per kernel, time, DRAM and issue use, occupancy, and
        where its warps wait
    python -m fusedops.tools.traffic lines FILE [--top N]
        an ncu source page (SASS with its warp-state samples): per kernel, the samples per
        reason and the N instructions that gathered the most

bench/ncu_traffic.sh runs `run` and `compare`; bench/ncu_stalls.sh runs `run` and `stalls`;
bench/ncu_lines.sh runs `run` and `lines`.
The model assumes inputs much larger than the L2 cache (every full-size tensor an op touches
crosses DRAM once per op), and vectors of N parameters or of one statistic per row read or
written once per op. Fused: what the kernel's contract moves
(statistics in fp32; the norm backward's per-block partial sums stay in L2 and are left out).
Unfused: each step of the composition below reads its inputs and writes its output.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

OPS = (
    "softmax_fwd",
    "softmax_bwd",
    "log_softmax_fwd",
    "log_softmax_bwd",
    "layer_norm_fwd",
    "layer_norm_bwd",
    "rms_norm_fwd",
    "rms_norm_bwd",
    "bias_gelu_fwd",
    "bias_gelu_bwd",
)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
STAT_BYTES = 4  # fusedops keeps per-row statistics in fp32
EPS = 1e-5


@dataclass(frozen=True)
class Traffic:
    read: int  # bytes
    write: int

    @property
    def total(self) -> int:
        return self.read + self.write


@dataclass(frozen=True)
class Model:
    fused: Traffic
    unfused: Traffic


def _bytes(rows: int, n: int, dtype: torch.dtype, param_dtype: torch.dtype | None = None):
    """(X, V, P): one full [rows, n] tensor, one value per row, one value per column (a param)."""
    e = dtype.itemsize
    return rows * n * e, rows * e, n * (param_dtype or dtype).itemsize


def softmax_traffic(rows: int, n: int, dtype: torch.dtype, *, log: bool, backward: bool) -> Model:
    """softmax / log_softmax along rows of n. Unfused: the steps of _softmax_fwd/_softmax_bwd."""
    x, v, _ = _bytes(rows, n, dtype)
    if not backward:  # fused: read x, write y
        fused = Traffic(x, x)
        # amax, x - m, exp, sum, then e / s (softmax) or log and t - lse (log_softmax)
        unfused = (
            Traffic(5 * x + 3 * v, 3 * x + 3 * v) if log else Traffic(5 * x + 2 * v, 3 * x + 2 * v)
        )
        return Model(fused, unfused)
    fused = Traffic(2 * x, x)  # read y and dy, write dx
    # softmax: dy * y, sum, dy - s, y * d; log_softmax: exp(y), sum(dy), e * s, dy - t
    unfused = Traffic(5 * x + v, 3 * x + v) if log else Traffic(6 * x + v, 3 * x + v)
    return Model(fused, unfused)


def norm_traffic(
    rows: int,
    n: int,
    dtype: torch.dtype,
    *,
    rms: bool,
    backward: bool,
    param_dtype: torch.dtype | None = None,
) -> Model:
    """layer_norm (weight and bias) or rms_norm (weight) over rows of n. Unfused: the steps of
    _layer_norm_fwd/_bwd and _rms_norm_fwd/_bwd, statistics in the input's dtype."""
    x, v, p = _bytes(rows, n, dtype, param_dtype)
    s = rows * STAT_BYTES
    nstats = 1 if rms else 2  # rstd; mean and rstd
    nparams = 1 if rms else 2  # weight; weight and bias
    if not backward:  # fused: read x and the params, write y and the statistics
        fused = Traffic(x + nparams * p, x + nstats * s)
        unfused = (
            Traffic(5 * x + 3 * v + p, 3 * x + 3 * v)
            if rms
            else Traffic(8 * x + 4 * v + 2 * p, 5 * x + 4 * v)
        )
        return Model(fused, unfused)
    # fused: read x, dy, weight and the statistics; write dx and each parameter's gradient
    fused = Traffic(2 * x + p + nstats * s, x + nparams * p)
    unfused = (
        Traffic(12 * x + 3 * v + p, 7 * x + v + p)
        if rms
        else Traffic(16 * x + 5 * v + p, 9 * x + 2 * v + 2 * p)
    )
    return Model(fused, unfused)


def bias_gelu_traffic(rows: int, n: int, dtype: torch.dtype, *, backward: bool) -> Model:
    """gelu(x + bias), bias [n]. Unfused: x + b, then gelu (or gelu_backward and the dbias sum)."""
    x, _, p = _bytes(rows, n, dtype)
    if not backward:
        return Model(Traffic(x + p, x), Traffic(2 * x + p, 2 * x))
    return Model(Traffic(2 * x + p, x + p), Traffic(4 * x + p, 2 * x + p))


def model(op: str, rows: int, n: int, dtype: torch.dtype) -> Model:
    """The model of an op named as in OPS, e.g. "layer_norm_bwd"."""
    if op not in OPS:
        raise ValueError(
            f"fusedops.tools.traffic.model: unknown op {op!r}; known: {', '.join(OPS)}"
        )
    family, _, pass_ = op.rpartition("_")
    backward = pass_ == "bwd"
    if family in ("softmax", "log_softmax"):
        return softmax_traffic(rows, n, dtype, log=family == "log_softmax", backward=backward)
    if family in ("layer_norm", "rms_norm"):
        return norm_traffic(rows, n, dtype, rms=family == "rms_norm", backward=backward)
    return bias_gelu_traffic(rows, n, dtype, backward=backward)


# ---------------------------------------------------------------------------------------------
# The unfused compositions the model counts (each line one step), and the fused calls.


def _softmax_fwd(x, log):
    m = x.amax(-1, keepdim=True)
    t = x - m
    e = t.exp()
    if log:
        return t - e.sum(-1, keepdim=True).log()
    return e / e.sum(-1, keepdim=True)


def _softmax_bwd(dy, y, log):
    if log:
        return dy - y.exp() * dy.sum(-1, keepdim=True)
    return y * (dy - (dy * y).sum(-1, keepdim=True))


def _layer_norm_fwd(x, w, b):
    mean = x.mean(-1, keepdim=True)
    xc = x - mean
    rstd = ((xc * xc).mean(-1, keepdim=True) + EPS).rsqrt()
    return xc * rstd * w + b


def _layer_norm_bwd(dy, x, w, mean, rstd):
    xhat = (x - mean) * rstd
    g = dy * w
    dw, db = (dy * xhat).sum(0), dy.sum(0)
    a, b = g.mean(-1, keepdim=True), (g * xhat).mean(-1, keepdim=True)
    return (g - a - xhat * b) * rstd, dw, db


def _rms_norm_fwd(x, w):
    rstd = ((x * x).mean(-1, keepdim=True) + EPS).rsqrt()
    return x * rstd * w


def _rms_norm_bwd(dy, x, w, rstd):
    xhat = x * rstd
    g = dy * w
    dw = (dy * xhat).sum(0)
    b = (g * xhat).mean(-1, keepdim=True)
    return (g - xhat * b) * rstd, dw


def _bias_gelu_fwd(x, b):
    return torch.nn.functional.gelu(x + b)


def _bias_gelu_bwd(dy, x, b):
    dh = torch.ops.aten.gelu_backward(dy, x + b)
    return dh, dh.sum(0)


def calls(
    op: str, rows: int, n: int, dtype: torch.dtype, device
) -> dict[str, Callable[[], object]]:
    """{"fused": f, "unfused": g}: argument-free calls of op on fresh random inputs. Backward
    inputs (y, statistics) come from the forward of the same variant."""
    family, _, pass_ = op.rpartition("_")
    fo = torch.ops.fusedops

    def rand(*shape):
        return torch.randn(*shape, dtype=dtype, device=device)

    x, dy, w, b = rand(rows, n), rand(rows, n), rand(n), rand(n)
    shape = [n]
    if family in ("softmax", "log_softmax"):
        log = family == "log_softmax"
        if pass_ == "fwd":
            return {
                "fused": lambda: fo.softmax_fwd(x, -1, log),
                "unfused": lambda: _softmax_fwd(x, log),
            }
        y = _softmax_fwd(x, log)
        return {
            "fused": lambda: fo.softmax_bwd(dy, y, -1, log),
            "unfused": lambda: _softmax_bwd(dy, y, log),
        }
    if family == "layer_norm":
        if pass_ == "fwd":
            return {
                "fused": lambda: fo.layer_norm_fwd(x, shape, w, b, EPS),
                "unfused": lambda: _layer_norm_fwd(x, w, b),
            }
        _, mean, rstd = fo.layer_norm_fwd(x, shape, w, b, EPS)
        mask = [True, True, True]
        mean_d, rstd_d = (t.to(dtype).reshape(rows, 1) for t in (mean, rstd))  # [rows, 1]
        return {
            "fused": lambda: fo.layer_norm_bwd(dy, x, shape, mean, rstd, w, b, mask),
            "unfused": lambda: _layer_norm_bwd(dy, x, w, mean_d, rstd_d),
        }
    if family == "rms_norm":
        if pass_ == "fwd":
            return {
                "fused": lambda: fo.rms_norm_fwd(x, shape, w, EPS),
                "unfused": lambda: _rms_norm_fwd(x, w),
            }
        _, rstd = fo.rms_norm_fwd(x, shape, w, EPS)
        rstd_d = rstd.to(dtype).reshape(rows, 1)
        return {
            "fused": lambda: fo.rms_norm_bwd(dy, x, shape, rstd, w, [True, True]),
            "unfused": lambda: _rms_norm_bwd(dy, x, w, rstd_d),
        }
    if pass_ == "fwd":
        return {
            "fused": lambda: fo.bias_gelu_fwd(x, b, "none"),
            "unfused": lambda: _bias_gelu_fwd(x, b),
        }
    return {
        "fused": lambda: fo.bias_gelu_bwd(dy, x, b, "none"),
        "unfused": lambda: _bias_gelu_bwd(dy, x, b),
    }


# ---------------------------------------------------------------------------------------------
# Nsight Compute's CSV

_UNITS = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12}
# Units whose values are taken as they are (ncu --print-units base).
_PLAIN_UNITS = {"", "%", "ns", "inst", "warp", "block", "register/thread", "cycle"}
DRAM_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
_STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
STALL_REASONS = (
    "barrier",
    "branch_resolving",
    "dispatch_stall",
    "drain",
    "lg_throttle",
    "long_scoreboard",
    "math_pipe_throttle",
    "membar",
    "mio_throttle",
    "misc",
    "no_instruction",
    "not_selected",
    "selected",
    "short_scoreboard",
    "sleeping",
    "tex_throttle",
    "wait",
)
STALL_METRICS = (
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__registers_per_thread",
    *(_STALL.format(r) for r in STALL_REASONS),
)


def _number(value: str, unit: str, metric: str) -> float:
    if value.strip() in ("", "N/A"):
        raise ValueError(
            f"fusedops.tools.traffic: ncu gave no value for {metric} ({value!r}): is the metric "
            "available on this GPU, and may this user read its counters?"
        )
    if unit not in _UNITS and unit not in _PLAIN_UNITS:
        known = ", ".join(repr(u) for u in (*_UNITS, *sorted(_PLAIN_UNITS)))
        raise ValueError(f"fusedops.tools.traffic: unknown ncu unit {unit!r} (known: {known})")
    return float(value.replace(",", "")) * _UNITS.get(unit, 1)


def parse_ncu_csv(text: str) -> list[dict]:
    """Kernels profiled, in order, from `ncu --csv` output (the "details" page: one row per
    metric; or --page raw: one row per kernel after a row of units): [{"kernel": name, "metrics":
    {metric: value in base units}}]. Lines before the header (==PROF== messages, the program's
    own output) are skipped."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError(
            'fusedops.tools.traffic.parse_ncu_csv: no ncu CSV header (a line starting with "ID")'
        )
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))
    kernels: dict[str, dict] = {}
    if rows and "Metric Name" in rows[0]:
        for r in rows:
            k = kernels.setdefault(r["ID"], {"kernel": r["Kernel Name"], "metrics": {}})
            k["metrics"][r["Metric Name"]] = _number(
                r["Metric Value"], r["Metric Unit"], r["Metric Name"]
            )
        return list(kernels.values())
    units, *rows = rows  # raw page: the first row holds each column's unit

    def numeric(metric: str, value: str) -> bool:  # unitless columns also hold names
        return bool(units[metric]) or value.replace(",", "").replace(".", "", 1).isdigit()

    return [
        {
            "kernel": r["Kernel Name"],
            "metrics": {
                m: _number(v, units[m], m)
                for m, v in r.items()
                if "__" in m and units[m] in (*_UNITS, *_PLAIN_UNITS) and numeric(m, v)
            },
        }
        for r in rows
    ]


def dram_bytes(text: str) -> Traffic:
    """DRAM bytes read and written, summed over every kernel in an ncu CSV."""
    kernels = parse_ncu_csv(text)
    missing = [m for m in DRAM_METRICS if not any(m in k["metrics"] for k in kernels)]
    if missing:
        raise ValueError(
            f"fusedops.tools.traffic.dram_bytes: metric(s) {missing} not in the ncu CSV"
        )
    read, write = (round(sum(k["metrics"].get(m, 0) for k in kernels)) for m in DRAM_METRICS)
    return Traffic(read, write)


def stalls(text: str) -> list[dict]:
    """Per kernel of an ncu CSV holding STALL_METRICS: {"kernel", "us", "dram_pct", "issue_pct",
    "occupancy_pct", "registers", "stalls": [(reason, warps waiting per issued instruction),
    ...] largest first, those under 0.05 left out}."""
    out = []
    for k in parse_ncu_csv(text):
        m = k["metrics"]
        if missing := [name for name in STALL_METRICS if name not in m]:
            raise ValueError(f"fusedops.tools.traffic.stalls: metric(s) {missing} not in the CSV")
        waits = [(r, m[_STALL.format(r)]) for r in STALL_REASONS]
        out.append(
            {
                "kernel": k["kernel"],
                "us": m["gpu__time_duration.sum"] / 1e3,
                "dram_pct": m["dram__throughput.avg.pct_of_peak_sustained_elapsed"],
                "issue_pct": m["smsp__issue_active.avg.pct_of_peak_sustained_active"],
                "occupancy_pct": m["sm__warps_active.avg.pct_of_peak_sustained_active"],
                "registers": int(m["launch__registers_per_thread"]),
                "stalls": sorted((w for w in waits if w[1] >= 0.05), key=lambda w: -w[1]),
            }
        )
    return out


def stalls_table(kernels: list[dict]) -> str:
    lines = [
        [
            k["kernel"] if len(k["kernel"]) <= 60 else k["kernel"][:57] + "...",
            f"{k['us']:.1f}",
            f"{k['dram_pct']:.1f}",
            f"{k['issue_pct']:.1f}",
            f"{k['occupancy_pct']:.1f}",
            str(k["registers"]),
            " ".join(f"{r} {w:.2f}" for r, w in k["stalls"][:4]),
        ]
        for k in kernels
    ]
    head = ["kernel", "us", "DRAM %", "issue %", "occupancy %", "regs", "warps waiting on"]
    return _table(head, lines)


def source_lines(text: str, top: int = 12) -> list[dict]:
    """Per kernel of an ncu source page (`ncu -i REPORT --page source --csv --print-source sass`,
    the report taken with `--set full --import-source yes`): {"kernel", "samples" (warp-state
    samples in all), "reasons": [(reason, samples), ...] largest first, "lines": the `top`
    instructions with the most samples, [(address, instruction, samples, [(reason, samples), ...]
    its three largest)]}. Each kernel's section starts with a "Kernel Name" row."""
    kernels: list[dict] = []
    header: list[str] = []
    for row in csv.reader(io.StringIO(text)):
        if row[:1] == ["Kernel Name"]:
            kernels.append({"kernel": row[1], "rows": []})
            header = []
        elif row[:1] == ["Address"]:
            header = row
        elif kernels and header and len(row) == len(header):
            kernels[-1]["rows"].append(dict(zip(header, row, strict=True)))
    if not kernels or not all(k["rows"] for k in kernels):
        raise ValueError(
            'fusedops.tools.traffic.source_lines: no ncu source page (a "Kernel Name" row, then '
            'an "Address" header and a row per instruction)'
        )

    def count(value: str) -> float:
        return float(value.replace(",", "") or 0)

    out = []
    for k in kernels:
        # stall_<reason> columns count every sample; "(Not Issued)" ones are a subset of them.
        reasons = [c for c in k["rows"][0] if c.startswith("stall_") and "(" not in c]
        lines = [
            (
                r["Address"],
                r["Source"].strip(),
                count(r["# Samples"]),
                sorted(((c[6:], count(r[c])) for c in reasons), key=lambda w: -w[1]),
            )
            for r in k["rows"]
        ]
        totals = {c[6:]: sum(count(r[c]) for r in k["rows"]) for c in reasons}
        out.append(
            {
                "kernel": k["kernel"],
                "samples": sum(line[2] for line in lines),
                "reasons": sorted(
                    ((r, n) for r, n in totals.items() if n > 0), key=lambda w: -w[1]
                ),
                "lines": [
                    (a, src, n, [w for w in ws[:3] if w[1] > 0])
                    for a, src, n, ws in sorted(lines, key=lambda line: -line[2])[:top]
                ],
            }
        )
    return out


def source_lines_table(kernels: list[dict]) -> str:
    parts = []
    for k in kernels:
        total = k["samples"] or 1
        reasons = [[r, f"{n:.0f}", f"{100 * n / total:.1f}"] for r, n in k["reasons"]]
        lines = [
            [
                addr,
                f"{n:.0f}",
                f"{100 * n / total:.1f}",
                src if len(src) <= 48 else src[:45] + "...",
                " ".join(f"{r} {c:.0f}" for r, c in ws),
            ]
            for addr, src, n, ws in k["lines"]
        ]
        parts.append(
            f"{k['kernel']}\n{k['samples']:.0f} warp-state samples\n"
            + _table(["waiting on", "samples", "%"], reasons)
            + "\n\n"
            + _table(["address", "samples", "%", "instruction", "largest reasons"], lines)
        )
    return "\n\n".join(parts)


def compare(directory: str | Path) -> list[dict]:
    """Measured vs model for each <op>-<rows>x<n>-<dtype>-<variant>.csv under directory."""
    out = []
    for path in sorted(Path(directory).glob("*.csv")):
        op, shape, dt, variant = path.stem.split("-")
        rows, n = (int(s) for s in shape.split("x"))
        expected = getattr(model(op, rows, n, DTYPES[dt]), variant)
        measured = dram_bytes(path.read_text())
        out.append(
            dict(
                op=op,
                shape=shape,
                dtype=dt,
                variant=variant,
                model=expected.total,
                measured=measured.total,
                ratio=measured.total / expected.total,
            )
        )
    return out


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f}"


def _table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join(
        "  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in [head, *rows]
    )


def model_table(ops, rows: int, n: int, dtype: str) -> str:
    lines = []
    for op in ops:
        m = model(op, rows, n, DTYPES[dtype])
        lines.append(
            [
                op,
                _mb(m.fused.read),
                _mb(m.fused.write),
                _mb(m.unfused.read),
                _mb(m.unfused.write),
                f"{m.unfused.total / m.fused.total:.2f}x",
            ]
        )
    head = ["op", "fused rd MB", "fused wr MB", "unfused rd MB", "unfused wr MB", "unfused/fused"]
    return f"DRAM traffic model, {rows}x{n} {dtype}\n" + _table(head, lines)


def compare_table(results: list[dict]) -> str:
    lines = [
        [
            r["op"],
            r["shape"],
            r["dtype"],
            r["variant"],
            _mb(r["model"]),
            _mb(r["measured"]),
            f"{100 * (r['ratio'] - 1):+.1f}%",
        ]
        for r in results
    ]
    head = ["op", "shape", "dtype", "variant", "model MB", "measured MB", "vs model"]
    return _table(head, lines)


def _shape(s: str) -> tuple[int, int]:
    rows, x, n = s.lower().partition("x")
    if not (x and rows.isdigit() and n.isdigit()):
        raise argparse.ArgumentTypeError(f"bad shape {s!r}: expected ROWSxN, e.g. 16384x8192")
    return int(rows), int(n)


def _run(op: str, shape: tuple[int, int], dtype: str, variant: str) -> None:
    rows, n = shape
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    if rows * n * DTYPES[dtype].itemsize < 4 * l2:
        print(
            f"warning: {rows}x{n} {dtype} is < 4x the L2 cache: the model will not hold",
            file=sys.stderr,
        )
    call = calls(op, rows, n, DTYPES[dtype], torch.device("cuda"))[variant]
    call()  # load every kernel before the profiled call
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m fusedops.tools.traffic", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma list of: {', '.join(OPS)}")
    ap.add_argument("--shape", type=_shape, default=(16384, 8192), help="ROWSxN")
    ap.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    sub = ap.add_subparsers(dest="command")
    run = sub.add_parser("run", help="one call of OP between cudaProfilerStart/Stop (for ncu)")
    run.add_argument("op", choices=OPS)
    run.add_argument("shape", type=_shape, help="ROWSxN")
    run.add_argument("dtype", choices=list(DTYPES))
    run.add_argument("variant", choices=("fused", "unfused"))
    cmp = sub.add_parser("compare", help="ncu CSVs in DIR beside the model")
    cmp.add_argument("dir")
    st = sub.add_parser("stalls", help="an ncu CSV of STALL_METRICS, summarized per kernel")
    st.add_argument("file")
    ln = sub.add_parser("lines", help="an ncu source page: where in the SASS the warps wait")
    ln.add_argument("file")
    ln.add_argument("--top", type=int, default=12, help="instructions listed per kernel")
    args = ap.parse_args(argv)
    if args.command == "run":
        _run(args.op, args.shape, args.dtype, args.variant)
    elif args.command == "compare":
        print(compare_table(compare(args.dir)))
    elif args.command == "stalls":
        print(stalls_table(stalls(Path(args.file).read_text())))
    elif args.command == "lines":
        print(source_lines_table(source_lines(Path(args.file).read_text(), args.top)))
    else:
        if bad := [op for op in args.ops.split(",") if op not in OPS]:
            ap.error(f"unknown op(s) {bad}; known: {', '.join(OPS)}")
        print(model_table(args.ops.split(","), *args.shape, args.dtype))


if __name__ == "__main__":
    main()
