"""pytest-benchmark fixtures over fusedops.bench and fusedops.bench_mlp: the device, the copy
roof, one cell's runner for each.

pytest-benchmark reads the host clock, so on CUDA every timed call synchronizes (a latency);
the harness' own throughput median (CUDA events, inputs rotated past L2) goes to extra_info.
"""

import itertools

import pytest
import torch

from fusedops.tools import bench, bench_mlp

DEVICE = bench.pick_device()  # CUDA, else MPS, else the CPU
CUDA = DEVICE.type == "cuda"
ROUNDS = 30 if DEVICE.type != "cpu" else 5  # CPU: a short run that only checks the suite works
COMPILED = ("compile", "max-autotune")  # the torch.compile providers of both harnesses
# Providers whose failure is a missing cell (a skip), as in the harness: torch.compile, and
# Liger-Kernel, whose kernels stop at rows of 64K elements.
MAY_FAIL = (*COMPILED, "liger")


@pytest.fixture(scope="session")
def copy_gbps():
    """The roof: GB/s of a 2 GiB device copy (GPUs only; a CPU run reports no % of copy)."""
    return bench.copy_gbps(DEVICE, quick=True) if DEVICE.type != "cpu" else None


def _measured(benchmark, provider: str, prepare) -> tuple[bench.Timed, float]:
    """prepare() and the harness' median seconds per call, then pytest-benchmark's own rounds.
    torch.compile is not run on CPU."""
    if provider in COMPILED and not CUDA:
        pytest.skip("torch.compile on CPU builds C++ per case; the python -m benchmarks have it")
    try:
        t = prepare()
        seconds = bench.measure(t, DEVICE, quick=True)  # warms up (and compiles) too
    except Exception as e:
        if provider not in MAY_FAIL:
            raise
        pytest.skip(f"{provider} failed: {bench._error(e)}")
    it = itertools.cycle(t.sets)

    def call():
        t.call(*next(it))
        bench.synchronize(DEVICE)

    with torch.set_grad_enabled(t.grad):  # forward under no_grad, as in the harness
        benchmark.pedantic(call, rounds=ROUNDS, iterations=1)
    return t, seconds


@pytest.fixture
def bench_cell(benchmark, copy_gbps):
    """Runner: time one fusedops.bench cell (spec, pass, dtype, rows, N) for one provider."""

    def run(spec, pass_, dtype, rows, n, provider):
        benchmark.group = f"{spec.name}_{pass_} {dtype} {rows}x{n}"
        t, seconds = _measured(
            benchmark,
            provider,
            lambda: bench.prepare(spec, pass_, provider, rows, n, bench.DTYPES[dtype], DEVICE),
        )
        gbps = t.nbytes / seconds / 1e9
        benchmark.extra_info.update(
            shape=f"{rows}x{n}",
            bytes=t.nbytes,
            timer="cuda events, L2 rotated" if CUDA else "perf_counter",
            median_us=seconds * 1e6,
            gbps=gbps,
            pct_copy=100 * gbps / copy_gbps if copy_gbps else None,
        )

    return run


@pytest.fixture
def bench_mlp_cell(benchmark):
    """Runner: time one fusedops.bench_mlp cell (mode, approximate, tokens, D) for one provider."""

    def run(mode, approximate, tokens, d, provider):
        benchmark.group = f"fused_mlp {mode} {approximate} {tokens}x{d}"
        _, seconds = _measured(
            benchmark,
            provider,
            lambda: bench_mlp.prepare(
                provider, mode, approximate, tokens, d, torch.bfloat16, DEVICE
            ),
        )
        benchmark.extra_info.update(
            tokens=tokens,
            d=d,
            timer="cuda events, L2 rotated" if CUDA else "perf_counter",
            median_ms=seconds * 1e3,
            tflops=bench_mlp.flops(mode, tokens, d) / seconds / 1e12,
        )

    return run
