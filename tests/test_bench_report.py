"""fusedops.bench's reporting: tables within 100 columns, numbers never rounded to 0, the device
choice, the untracked default output, the host cost table; and, on tiny CPU cells, the flow of a
run and the bookkeeping of --rounds (bench and bench_mlp)."""

import json
import subprocess
import time
from pathlib import Path

import pytest
import torch

from fusedops.tools import bench, bench_mlp

ROOT = Path(__file__).resolve().parent.parent
PROVIDERS = ["fusedops", "eager", "compile", "liger"]


def _cell(op, dtype, rows, n, us, graphed):
    nbytes = 2 * rows * n * 2
    cell = {"op": op, "dtype": dtype, "rows": rows, "n": n, "bytes": nbytes, "errors": {}}
    cell["median_us"] = dict(zip(PROVIDERS, us, strict=True))
    cell["gbps"] = {p: nbytes / t / 1e3 if t else None for p, t in cell["median_us"].items()}
    cell["pct_copy"] = {p: 100 * g / 3000 if g else None for p, g in cell["gbps"].items()}
    if graphed:
        cell["device_pct_copy"] = {p: 97.25 for p in PROVIDERS}
    return cell


def _cuda_result():
    cells = [
        _cell("layer_norm_fp32w_bwd", "bf16", 16384, 4096, [123.4, 456.7, 234.5, None], False),
        _cell("softmax_fwd", "bf16", 512, 262144, [12345.6, 23456.7, 34567.8, 45678.9], True),
        _cell("softmax_fwd", "bf16", 4096, 1024, [10.1, 20.2, 30.3, 40.4], True),
    ]
    return {
        "device": "NVIDIA H100 80GB HBM3",
        "device_type": "cuda",
        "torch": "2.14.1",
        "copy_gbps": 3000.0,
        "providers": PROVIDERS,
        "cells": cells,
        "host": {
            "shape": [8, 256],
            "dtype": "bf16",
            "rows": [
                {"name": "nn.LayerNorm fwd+bwd", "fusedops_us": 35.9, "torch_us": 27.3},
                {"name": "fused_mlp fwd", "fusedops_us": None, "torch_us": 4.1},
            ],
        },
    }


def test_table_fits_100_columns_and_has_every_section():
    text = bench.table(_cuda_result())
    lines = text.splitlines()
    assert max(map(len, lines)) <= 100, max(lines, key=len)
    for section in (
        "µs per call (host-inclusive) and fusedops' speedup",
        "GB/s (% of copy)",
        "% of copy, kernel only (CUDA graph replay)",
        "host µs per call, 8x256 bf16",
    ):
        assert any(line.startswith(section) for line in lines), section
    assert lines.count("softmax_fwd bf16") == 3  # a heading per table
    speed = lines[lines.index("softmax_fwd bf16") + 2].split()  # the 4096x1024 row
    assert speed == ["4096x1024", "10.1", "20.2", "30.3", "40.4", "2.00x", "3.00x", "4.00x"]
    host = next(line for line in lines if line.startswith("nn.LayerNorm fwd+bwd")).split()
    assert host[-3:] == ["35.9", "27.3", "1.32"]
    assert next(line for line in lines if line.startswith("fused_mlp fwd")).split()[-3:] == [
        "-",
        "4.1",
        "-",
    ]


def test_cpu_table_says_what_the_roof_means():
    result = _cuda_result() | {"device": "CPU x86_64, 2 threads", "device_type": "cpu"}
    assert "shapes that fit in cache can pass 100% of it" in bench.table(result)


@pytest.mark.parametrize(
    "x, text",
    [(0.0013, "0.0013"), (0.4, "0.4"), (0.867, "0.87"), (12.34, "12.3"), (2950.4, "2950")],
)
def test_small_numbers_are_not_rounded_to_zero(x, text):
    assert bench._num(x) == text


def test_pick_device():
    assert bench.pick_device("cpu") == torch.device("cpu")
    assert bench.pick_device().type in bench.DEVICES
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        bench.pick_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device 'cuda' is not available"):
            bench.pick_device("cuda")


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout (an archive of it)")
def test_default_output_is_untracked():
    probe = Path(bench.DEFAULT_OUT) / "cpu-softmax.json"
    out = subprocess.run(
        ["git", "check-ignore", "-q", str(probe)], cwd=ROOT, capture_output=True
    ).returncode
    assert out == 0, f"{bench.DEFAULT_OUT}/ is not ignored by git"


def test_host_costs_cover_every_op_and_module():
    names = [name for name, *_ in bench.host_cases(torch.device("cpu"), torch.float32)]
    assert names == [
        "softmax",
        "log_softmax",
        "layer_norm",
        "rms_norm",
        "bias_gelu",
        "fused_mlp",
        "nn.Softmax",
        "nn.LogSoftmax",
        "nn.LayerNorm",
        "nn.RMSNorm",
        "nn.FusedMLP",
    ]
    for name, fused, ref, args in bench.host_cases(torch.device("cpu"), torch.float32):
        torch.testing.assert_close(fused(*args), ref(*args), rtol=1e-4, atol=1e-4, msg=name)


def test_estimate_grows_with_the_work():
    device, calib = torch.device("cpu"), (1e-6, 1e9)
    small, big = (
        bench._predicted_seconds(
            bench.SPECS["softmax"], "fwd", "bf16", shape, device, 50, True, calib, None
        )
        for shape in ((64, 1024), (4096, 32768))
    )
    assert 0 < small < big


def _quick_run(ops, dtypes, shapes, device, log=None, **kwargs):
    """bench.run on a few cells: quick, no torch.compile, no host table."""
    return bench.run(
        ops,
        dtypes,
        shapes,
        quick=True,
        with_compile=False,
        log=log,
        device=device,
        with_host=False,
        **kwargs,
    )


def test_run_logs_an_estimate_and_progress(monkeypatch):
    monkeypatch.setattr(bench, "COPY_BYTES", 1 << 20)  # a small roof: this only checks the flow
    lines = []
    result = _quick_run(["softmax_fwd"], ["fp32"], [(8, 64), (16, 64)], "cpu", log=lines.append)
    assert lines[1].startswith("2 cells: about ")
    assert lines[2].startswith("[1/2 ") and " left] softmax_fwd fp32 8x64: fusedops " in lines[2]
    assert lines[3].startswith("[2/2 ")
    assert [c["rows"] for c in result["cells"]] == [8, 16]
    assert all(c["gbps"]["fusedops"] > 0 for c in result["cells"])
    assert "host" not in result


def test_a_run_cut_short_has_written_its_timed_cells(monkeypatch, tmp_path):
    # The JSON is rewritten after every cell (as bench_mlp's): a run stopped by a job's time
    # limit keeps what it measured.
    monkeypatch.setattr(bench, "COPY_BYTES", 1 << 20)

    def log(line):
        if line.startswith("[2/"):
            raise KeyboardInterrupt  # stopped during the second cell's report

    with pytest.raises(KeyboardInterrupt):
        _quick_run(
            ["softmax_fwd"], ["fp32"], [(8, 64), (16, 64), (32, 64)], "cpu", log=log, out=tmp_path
        )
    (written,) = tmp_path.glob("*.json")
    result = json.loads(written.read_text())
    assert [c["rows"] for c in result["cells"]] == [8, 16]
    assert result["providers"] == ["fusedops", "eager"]


def test_only_the_chosen_providers_are_timed(monkeypatch, capsys):
    monkeypatch.setattr(bench, "COPY_BYTES", 1 << 20)
    result = _quick_run(["softmax_fwd"], ["fp32"], [(8, 64)], "cpu", only_providers=["fusedops"])
    assert result["providers"] == ["fusedops"]
    assert list(result["cells"][0]["median_us"]) == ["fusedops"]
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--providers", "fusedops,triton"])
    assert "--providers: unknown ['triton']" in capsys.readouterr().err


def test_rounds_take_turns_and_report_the_median(monkeypatch):
    # Each provider timed once per round on the same prepared inputs; the cell's time is the
    # median round (bench_mlp likewise).
    monkeypatch.setattr(bench, "COPY_BYTES", 1 << 20)
    monkeypatch.setattr(bench, "CPU_WARMUP_SECONDS", 0.0)
    prepared = []
    real_prepare = bench.prepare
    monkeypatch.setattr(bench, "prepare", lambda *a: prepared.append(a[2]) or real_prepare(*a))
    result = _quick_run(["softmax_fwd"], ["fp32"], [(8, 64)], "cpu", rounds=3)
    cell = result["cells"][0]
    assert sorted(prepared) == ["eager", "fusedops"]  # once each, kept for the rounds
    for p in ("fusedops", "eager"):
        assert len(cell["rounds_us"][p]) == 3
        assert cell["median_us"][p] == sorted(cell["rounds_us"][p])[1]


def test_cpu_warmup_waits_for_calls_to_settle():
    # A provider whose calls run slow for a while after its first (as fresh memory on a virtual
    # machine made them) is timed once they are fast again, not during the slow spell.
    delays = iter([0.002, 0.002] + [0.06] * 12)

    def call(x):
        time.sleep(next(delays, 0.002))
        return x

    t = bench.Timed(call, [(torch.zeros(1),), (torch.zeros(1),)], grad=False, nbytes=4)
    assert bench.measure(t, torch.device("cpu"), quick=True, warmup_s=0.01) < 0.02


def test_mlp_rounds():
    result = bench_mlp.run(
        dims=[16],
        tokens=8,
        approx=["tanh"],
        modes=["infer"],
        quick=True,
        log=None,
        device="cpu",
        rounds=2,
    )
    cell = result["cells"][0]
    for p in ("eager", "fusedops"):
        assert len(cell["ms_rounds"][p]) == 2
        assert cell["ms"][p] == pytest.approx(sum(cell["ms_rounds"][p]) / 2)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_cells_are_timed_kernel_only_backward_too(monkeypatch):
    # A backward's autograd.grad costs about as much host time as a large backward's kernels:
    # its kernels are captured in a CUDA graph on the stream its forward ran on, and replayed.
    monkeypatch.setattr(bench, "COPY_BYTES", 1 << 24)
    result = _quick_run(["softmax_fwd", "layer_norm_bwd"], ["bf16"], [(256, 1024)], "cuda")
    for cell in result["cells"]:
        for p in ("fusedops", "eager"):
            assert p not in cell["errors"] and f"{p} graph" not in cell["errors"], cell["errors"]
            assert cell["device_us"][p] > 0, (cell["op"], p)
            assert cell["device_pct_copy"][p] > 0, (cell["op"], p)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_mlp_steps_are_timed_kernel_only():
    # bench_mlp's training step (forward, autograd.grad) is captured in a CUDA graph per round,
    # for every provider, beside its host-timed rounds.
    result = bench_mlp.run(
        dims=[64],
        tokens=256,
        modes=["infer", "train"],
        quick=True,
        with_compile=False,
        log=None,
        device="cuda",
        rounds=2,
    )
    for cell in result["cells"]:
        assert not cell["errors"], cell["errors"]
        for p, ms in cell["graph_ms"].items():
            assert len(cell["graph_ms_rounds"][p]) == 2 and ms > 0, (cell["mode"], p)
            assert cell["graph_speedup"][p] > 0, (cell["mode"], p)
    assert "graph ms" in bench_mlp.table(result)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_fully_fused_steps_take_turns_and_are_timed_kernel_only():
    # bench_ffm shares bench_mlp's rounds: every provider timed once per round, host-timed and
    # kernel-only, the median reported.
    from fusedops.tools import bench_ffm

    result = bench_ffm.run(
        widths=[32], rows=[4096], quick=True, with_compile=False, log=lambda s: None, rounds=2
    )
    assert [c["mode"] for c in result["cells"]] == ["infer", "train"]
    for cell in result["cells"]:
        assert not cell["errors"], cell["errors"]
        for p in ("eager", "fusedops"):
            assert len(cell["ms_rounds"][p]) == len(cell["graph_ms_rounds"][p]) == 2
            assert cell["ms"][p] == pytest.approx(sum(cell["ms_rounds"][p]) / 2)
            assert cell["graph_speedup"][p] > 0 and cell["peak_mib"][p] >= 0, (cell["mode"], p)
    assert "graph ms" in bench_ffm.table(result)
