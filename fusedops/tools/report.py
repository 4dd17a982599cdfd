"""The demo's report: text tables, PNG plots (matplotlib) and report.md from results.json's dict."""

from __future__ import annotations

import json
from pathlib import Path

from fusedops.tools.bench import columns


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def primitives_table(res: dict) -> str:
    """One row per group of swapped modules: count, share f, torch and fused time, s; then the
    Amdahl prediction and ceiling."""
    head = ["primitive (input shape)", "n", "f", "torch ms", "fused ms", "s", "copy %"]
    rows = [
        [
            p["label"],
            str(p["count"]),
            f"{p['f']:.3f}",
            _ms(p["torch_s"]),
            _ms(p["fused_s"]),
            f"{p['s']:.2f}x",
            f"{100 * p['bytes'] / p['fused_s'] / 1e9 / res['copy_gbps']:.0f}",
        ]
        for p in res["primitives"]
    ]
    f = sum(p["f"] for p in res["primitives"])
    lines = columns(head, rows, text=1)
    lines.append(
        f"covered share {f:.3f}: predicted {res['predicted']:.3f}x, ceiling "
        f"{res['ceiling']:.3f}x (copy roof {res['copy_gbps']:.0f} GB/s)"
    )
    return "\n".join(lines)


def check_text(check: dict) -> str:
    lines = [f"swapped vs original: max abs {check['max_abs']:.3g}, max rel {check['max_rel']:.3g}"]
    if "err_fused" in check:
        verdict = "within" if check["within_rule"] else "OUTSIDE"
        lines.append(
            f"vs fp64: torch {check['err_torch']:.3g}, fused {check['err_fused']:.3g} "
            f"({verdict} the rule err(fused) <= 2 err(torch) + eps)"
        )
    if "accuracy_before" in check:
        lines.append(
            f"accuracy {check['accuracy_before']:.4f} -> {check['accuracy_after']:.4f} "
            f"({check['predictions_changed']} predictions changed)"
        )
    return "\n".join(lines)


def prediction_note(res: dict) -> str:
    """Predicted vs measured; outside 10%, the numbers that bear on why."""
    ratio = res["measured"] / res["predicted"]
    text = f"Predicted {res['predicted']:.3f}x, measured {res['measured']:.3f}x (ratio {ratio:.3f})"
    if abs(ratio - 1) <= 0.1:
        return text + ": within 10%."
    inf = res["profile"]["before"]["inference"]
    timed = res["latency_s"]["eager_before"]["inference"] * 1e6
    return (
        f"{text}: outside 10%. The shares f come from the profiled step ({inf['step_us']:.0f} µs "
        f"{'of device time' if inf['device'] == 'gpu' else 'wall'}) and the speedups s from each "
        f"module timed alone; the unprofiled step takes {timed:.0f} µs. Where these differ, "
        "profiler or host overhead, or caches warm in the model but cold alone (or the reverse), "
        "move f or s away from what the model sees."
    )


def summary_rows(res: dict) -> list[list[str]]:
    """Before/after per phase: latency, launches, peak memory; then the speedups."""
    lat, pb, pa = res["latency_s"], res["profile"]["before"], res["profile"]["after"]
    rows = []
    for phase in ("inference", "training"):
        b, a = lat["eager_before"][phase], lat["eager_after"][phase]
        rows += [
            [f"{phase} latency ms", _ms(b), _ms(a), f"{b / a:.3f}x"],
            [
                f"{phase} {pb[phase]['launch_kind']}",
                f"{pb[phase]['launches']:.0f}",
                f"{pa[phase]['launches']:.0f}",
                "",
            ],
            [
                f"{phase} peak memory MiB",
                f"{pb[phase]['peak_bytes'] / 2**20:.1f}",
                f"{pa[phase]['peak_bytes'] / 2**20:.1f}",
                "",
            ],
        ]
    if "compile_before" in lat:
        b, a = lat["compile_before"]["inference"], lat["compile_after"]["inference"]
        rows.append(["inference, torch.compile, ms", _ms(b), _ms(a), f"{b / a:.3f}x"])
        rows.append(
            [
                "eager swapped vs compiled original",
                "",
                "",
                f"{b / lat['eager_after']['inference']:.3f}x",
            ]
        )
    rows.append(["inference speedup, predicted", "", "", f"{res['predicted']:.3f}x"])
    rows.append(["inference speedup, measured", "", "", f"{res['measured']:.3f}x"])
    return rows


def summary_table(res: dict) -> str:
    return "\n".join(columns(["", "before", "after", "speedup"], summary_rows(res), text=1))


# ---------------------------------------------------------------------------------------------
# Plots


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_ops(res: dict, path: Path, top: int = 12) -> None:
    """Self time per op, before and after the swap (inference), the top ops of either."""
    plt = _plt()
    before = {o["name"]: o["self_us"] for o in res["profile"]["before"]["inference"]["ops"]}
    after = {o["name"]: o["self_us"] for o in res["profile"]["after"]["inference"]["ops"]}
    names = sorted(set(before) | set(after), key=lambda n: -max(before.get(n, 0), after.get(n, 0)))
    names = names[:top][::-1]
    fig, ax = plt.subplots(figsize=(9, 0.4 * len(names) + 1.5))
    y = range(len(names))
    ax.barh([i + 0.2 for i in y], [before.get(n, 0) for n in names], 0.4, label="before")
    ax.barh([i - 0.2 for i in y], [after.get(n, 0) for n in names], 0.4, label="after swap")
    ax.set_yticks(list(y), [n[:50] for n in names], fontsize=8)
    kind = "device" if res["profile"]["before"]["inference"]["device"] == "gpu" else "CPU"
    ax.set(xlabel=f"self {kind} time per inference step (µs)", title=_title(res))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_speedup(res: dict, path: Path) -> None:
    """Predicted (Amdahl) vs measured inference speedup, with the ceiling, and compile's."""
    plt = _plt()
    lat = res["latency_s"]
    bars = {"predicted": res["predicted"], "measured": res["measured"]}
    if "compile_before" in lat:
        bars["compile\n(original)"] = (
            lat["eager_before"]["inference"] / lat["compile_before"]["inference"]
        )
        bars["compile\n(swapped)"] = (
            lat["eager_before"]["inference"] / lat["compile_after"]["inference"]
        )
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(list(bars), list(bars.values()), color=[f"C{i}" for i in range(len(bars))])
    for i, v in enumerate(bars.values()):
        ax.text(i, v, f"{v:.2f}x", ha="center", va="bottom")
    ax.axhline(1, color="gray", lw=0.8)
    if res["ceiling"] != float("inf"):
        ax.axhline(res["ceiling"], color="gray", ls="--", lw=0.8, label="Amdahl ceiling")
        ax.legend()
    ax.set(ylabel="inference speedup vs eager", title=_title(res))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_roofline(res: dict, path: Path) -> None:
    """Each swapped primitive, torch and fused, on a roofline: the measured copy bandwidth and
    the measured matmul rate as the roofs."""
    plt = _plt()
    bw, peak = res["copy_gbps"] * 1e9, res["matmul_flops"]
    prims = res["primitives"]
    fig, ax = plt.subplots(figsize=(7, 5))
    xs = [p["flops"] / p["bytes"] for p in prims] or [1.0]
    lo, hi = min(xs + [0.1]) / 2, max(xs + [2 * peak / bw]) * 2
    ridge = peak / bw
    ax.plot([lo, ridge, hi], [bw * lo, peak, peak], color="gray", label="roof (copy, matmul)")
    for i, p in enumerate(prims):
        x = p["flops"] / p["bytes"]
        ax.scatter(x, p["flops"] / p["fused_s"], color=f"C{i}", marker="o", label=p["label"])
        ax.scatter(x, p["flops"] / p["torch_s"], color=f"C{i}", marker="x")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set(
        xlabel="flops / minimal byte",
        ylabel="flop/s",
        title=f"{_title(res)}\no fused, x torch; copy {res['copy_gbps']:.0f} GB/s",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _title(res: dict) -> str:
    return f"{res['model']}, {res['device']}, {res['dtype']}"


# ---------------------------------------------------------------------------------------------
# Files


def markdown(res: dict, plots: list[str]) -> str:
    lat = res["latency_s"]
    pb = res["profile"]["before"]
    lines = [
        f"# fusedops demo: {res['model']}",
        "",
        f"{res['device']}, {res['dtype']}, torch {res['torch']}, {res['date']}"
        + (" (--quick)" if res["quick"] else ""),
        "",
    ]
    if res["train"]:
        t = res["train"]
        lines += [
            f"Predictor: test accuracy {t['accuracy_fp32']:.3f} after training (fp32) on "
            f"scikit-learn's digits; checkpoint `{t['checkpoint']}`.",
            "",
        ]
    lines += [
        "## Before and after `fusedops.swap`",
        "",
        "```",
        summary_table(res),
        "```",
        "",
        "## Amdahl: shares, fused speedups at the model's shapes, prediction",
        "",
        "f: share of the inference step (profile); s: torch / fused time of one module, timed "
        "alone at the shape the model feeds it; copy %: fused module's minimal bytes per second "
        "against the measured copy bandwidth.",
        "",
        "```",
        primitives_table(res),
        "```",
        "",
        prediction_note(res),
        "",
        "## Checks",
        "",
        "```",
        check_text(res["check"]),
        "```",
        "",
        "## Profile before the swap",
        "",
    ]
    for phase in ("inference", "training"):
        top = pb[phase]["ops"][:12]
        kind = "device" if pb[phase]["device"] == "gpu" else "CPU"
        lines += [
            f"{phase}: step {pb[phase]['step_us']:.1f} µs, {pb[phase]['launches']:.0f} "
            f"{pb[phase]['launch_kind']}; top ops by self {kind} time (µs per step):",
            "",
            "| op | µs | calls |",
            "|---|---:|---:|",
            *(f"| `{o['name']}` | {o['self_us']:.1f} | {o['calls']:.0f} |" for o in top),
            "",
        ]
    if "compile_before" in lat:
        lines += [
            "torch.compile (default mode) of the original and of the swapped model, inference: "
            f"{_ms(lat['compile_before']['inference'])} and "
            f"{_ms(lat['compile_after']['inference'])} ms.",
            "",
        ]
    traces = ", ".join(
        f"`{Path(res['profile'][when][phase]['trace']).name}`"
        for when in ("before", "after")
        for phase in ("inference", "training")
    )
    lines += ["## Plots", "", *(f"![{p}]({p})" for p in plots), ""]
    lines += [f"Chrome traces (chrome://tracing or Perfetto): {traces}.", ""]
    return "\n".join(lines)


def write(res: dict, out: Path) -> list[Path]:
    """results.json, the PNG plots (when matplotlib is installed) and report.md under out."""
    out = Path(out)
    written = [out / "results.json"]
    written[0].write_text(json.dumps(res, indent=1, default=str) + "\n")
    plots = []
    try:
        _plt()
    except ImportError:
        print("note: matplotlib not installed, no plots (pip install matplotlib)", flush=True)
    else:
        for name, fn in (
            ("ops-before-after.png", plot_ops),
            ("predicted-vs-measured.png", plot_speedup),
            ("roofline.png", plot_roofline),
        ):
            fn(res, out / name)
            plots.append(name)
            written.append(out / name)
    (out / "report.md").write_text(markdown(res, plots))
    written.append(out / "report.md")
    return written
