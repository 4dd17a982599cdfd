"""fusedops.profile: Amdahl's arithmetic, the trace parser (on a recorded CPU trace and on a
GPU-shaped event list), live profiling on CPU and, where present, CUDA.

tests/data/trace-cpu-torch2.14.json.gz was recorded with fusedops.profile.profile (torch 2.14,
CPU) from nn.Sequential(LayerNorm(32), Linear(32, 64), GELU(), Linear(64, 32), Softmax(-1)) on a
[4, 8, 32] input under no_grad: 3 steps, the LayerNorm labelled "norm", the Softmax "softmax".
"""

import gzip
import json
import math
from pathlib import Path

import pytest
import torch

import fusedops
from fusedops.tools.profile import LABEL, STEP, amdahl, labelled, parse_trace, profile, table

FIXTURE = Path(__file__).parent / "data" / "trace-cpu-torch2.14.json.gz"


# ---------------------------------------------------------------------------------------------
# Amdahl


def test_amdahl_one_primitive():
    predicted, ceiling = amdahl([(0.5, 2.0)])
    assert predicted == pytest.approx(1 / (0.5 + 0.25))
    assert ceiling == pytest.approx(2.0)


def test_amdahl_combines_primitives():
    predicted, ceiling = amdahl([(0.2, 2.0), (0.3, 3.0), (0.1, 0.5)])
    assert predicted == pytest.approx(1 / (0.4 + 0.1 + 0.1 + 0.2))
    assert ceiling == pytest.approx(1 / 0.4)


def test_amdahl_edges():
    assert amdahl([]) == (1.0, 1.0)
    assert amdahl([(0.3, 1.0)])[0] == pytest.approx(1.0)  # no speedup, no gain
    predicted, ceiling = amdahl([(0.6, 4.0), (0.4, 2.0)])  # everything covered
    assert predicted == pytest.approx(1 / (0.15 + 0.2))
    assert ceiling == math.inf


@pytest.mark.parametrize(
    "parts, match",
    [([(-0.1, 2.0)], "f=-0.1"), ([(0.2, 0.0)], "s=0.0"), ([(0.7, 2.0), (0.4, 2.0)], "1.1000")],
)
def test_amdahl_rejects_bad_input(parts, match):
    with pytest.raises(ValueError, match=match):
        amdahl(parts)


# ---------------------------------------------------------------------------------------------
# The recorded CPU trace


def _events():
    with gzip.open(FIXTURE, "rt") as f:
        return json.load(f)["traceEvents"]


def test_recorded_cpu_trace_totals():
    p = parse_trace(FIXTURE)
    events = _events()
    steps = [e for e in events if e.get("name") == STEP]
    assert p.device == "cpu" and p.steps == len(steps) == 3
    assert p.step_us == pytest.approx(sum(e["dur"] for e in steps) / 3)
    # LayerNorm, Linear, GELU, Linear, Softmax: five top-level aten calls per step
    assert p.launches == 5 and p.launch_kind == "top-level op calls"
    calls = {o.name: o.calls for o in p.ops}
    assert calls["aten::addmm"] == 2 and calls["aten::native_layer_norm"] == 1
    assert [o.self_us for o in p.ops] == sorted((o.self_us for o in p.ops), reverse=True)
    assert p.peak_bytes > 0


def test_recorded_cpu_trace_self_times_add_up():
    """Self times of all ops add up to the time of the top-level ops: nothing counted twice."""
    p = parse_trace(FIXTURE)
    events = _events()
    top = ("aten::layer_norm", "aten::linear", "aten::gelu", "aten::softmax")
    top_us = sum(e["dur"] for e in events if e.get("cat") == "cpu_op" and e["name"] in top)
    assert sum(o.self_us for o in p.ops) == pytest.approx(top_us / 3, rel=1e-6)


def test_recorded_cpu_trace_labels():
    p = parse_trace(FIXTURE)
    events = _events()
    for name in ("norm", "softmax"):
        ranges = [e["dur"] for e in events if e.get("name") == LABEL + name]
        assert len(ranges) == 3
        assert p.labels[name] == pytest.approx(sum(ranges) / 3)
    assert sum(p.labels.values()) < p.step_us


def test_trace_sources_agree(tmp_path):
    """A .json.gz path, a .json path and the loaded dict parse alike."""
    with gzip.open(FIXTURE, "rt") as f:
        data = json.load(f)
    plain = tmp_path / "trace.json"
    plain.write_text(json.dumps(data))
    a, b, c = parse_trace(FIXTURE), parse_trace(plain), parse_trace(data)
    assert a.ops == b.ops == c.ops and a.labels == b.labels == c.labels


def test_trace_without_steps_is_an_error():
    with pytest.raises(ValueError, match="parse_trace: no 'fusedops.step' range"):
        parse_trace({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 0, "dur": 1}]})


# ---------------------------------------------------------------------------------------------
# GPU-shaped events: kernels belong to the op whose External id they carry


def _x(cat, name, ts, dur, ext=None, tid=1, correlation=None):
    args = {} if ext is None else {"External id": ext}
    if correlation is not None:
        args["correlation"] = correlation
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "ts": ts,
        "dur": dur,
        "pid": 1,
        "tid": tid,
        "args": args,
    }


def test_gpu_events_attributed_by_external_id():
    events = [
        _x("cpu_op", "aten::warmup", 0, 5, ext=1),  # before the step: not counted
        _x("kernel", "warmup_kernel", 1, 50, ext=1, tid=7),
        _x("user_annotation", STEP, 10, 100, ext=2),
        _x("user_annotation", LABEL + "norm", 11, 20, ext=3),
        _x("cpu_op", "aten::layer_norm", 12, 15, ext=4),
        _x("cpu_op", "aten::native_layer_norm", 13, 10, ext=5),
        _x("Kernel", "ln_kernel", 14, 7, ext=5, tid=7),  # older torch: capitalised category
        _x("cpu_op", "aten::addmm", 40, 10, ext=6),
        _x("kernel", "gemm_a", 41, 30, ext=6, tid=7),
        _x("kernel", "gemm_b", 72, 3, ext=6, tid=7),
        _x("gpu_memset", "Memset", 80, 2, ext=6, tid=7),
        # no op id on the kernel: found through its launch call, inside aten::addmm
        _x("cuda_runtime", "cudaLaunchKernel", 45, 1, correlation=99),
        _x("kernel", "gemm_c", 83, 4, tid=7, correlation=99),
        # the backward on autograd's thread, inside the step's time span
        _x("cpu_op", "aten::native_layer_norm_backward", 60, 10, ext=8, tid=2),
        _x("kernel", "ln_bwd_kernel", 90, 6, ext=8, tid=7),
    ]
    p = parse_trace({"traceEvents": events}, "cuda")
    assert p.device == "gpu" and p.launch_kind == "kernel launches"
    assert p.steps == 1 and p.launches == 5
    assert p.step_us == pytest.approx(7 + 30 + 3 + 2 + 4 + 6)
    self_us = {o.name: o.self_us for o in p.ops}
    assert self_us == {
        "aten::addmm": 39,
        "aten::native_layer_norm": 7,
        "aten::native_layer_norm_backward": 6,
    }
    assert p.labels == {"norm": 7}


# ---------------------------------------------------------------------------------------------
# Live


def _mlp():
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
    return torch.nn.Sequential(torch.nn.LayerNorm(16), mlp)


def test_labelled_hooks_are_removed():
    m = _mlp()
    with labelled([("norm", m[0])]):
        assert m[0]._forward_pre_hooks and m[0]._forward_hooks
    assert not m[0]._forward_pre_hooks and not m[0]._forward_hooks


def _live(device: str, tmp_path: Path):
    m = _mlp().to(device)
    fusedops.swap(m)
    x = torch.randn(8, 16, device=device)
    trace = tmp_path / "t.json"
    with torch.no_grad():
        p = profile(lambda: m(x), torch.device(device), trace, steps=2, labels=[("norm", m[0])])
    assert trace.exists() and p.trace == str(trace) and p.steps == 2
    calls = {o.name: o.calls for o in p.ops}
    # one call each per step, also where an op's autograd kernel redispatches to itself
    assert calls["fusedops::layer_norm_fwd"] == calls["fusedops::mlp_fwd"] == 1
    assert 0 < p.labels["norm"] < p.step_us
    assert "top ops by self" in table(p)
    return p


def test_profile_cpu(tmp_path):
    p = _live("cpu", tmp_path)
    assert p.device == "cpu" and p.launches == 2  # layer_norm_fwd, mlp_fwd


@pytest.mark.cuda
def test_profile_cuda(cuda_device, tmp_path):
    p = _live(cuda_device, tmp_path)
    assert p.device == "gpu" and p.launches >= 2  # kernels seen and attributed
    assert p.peak_bytes > 0
