"""pytest-benchmark fixtures over fusedops.bench: the device, the copy roof, one cell's runner.

pytest-benchmark reads the host clock, so on CUDA every timed call synchronizes (a latency);
the harness' own throughput median (CUDA events, inputs rotated past L2) goes to extra_info.
"""

import itertools

import pytest
import torch

from fusedops import bench

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
ROUNDS = 30 if CUDA else 5  # CPU: a short run that only checks the suite works


@pytest.fixture(scope="session")
def copy_gbps():
    """The roof: GB/s of a 2 GiB device copy (CUDA only; a CPU run reports no % of copy)."""
    return bench.copy_gbps(DEVICE, quick=True) if CUDA else None


@pytest.fixture
def bench_cell(benchmark, copy_gbps):
    """Runner: time one fusedops.bench cell (spec, pass, dtype, rows, N) for one provider."""

    def run(spec, pass_, dtype, rows, n, provider):
        if provider == "compile" and not CUDA:
            pytest.skip("torch.compile on CPU builds C++ per case; python -m fusedops.bench has it")
        benchmark.group = f"{spec.name}_{pass_} {dtype} {rows}x{n}"
        try:
            t = bench.prepare(spec, pass_, provider, rows, n, bench.DTYPES[dtype], DEVICE)
            seconds = bench.measure(t, DEVICE, quick=True)  # warms up (and compiles) too
        except Exception as e:
            if provider != "compile":
                raise
            reason = (str(e).strip().splitlines() or [""])[0][:160]
            pytest.skip(f"torch.compile failed: {type(e).__name__}: {reason}")  # a missing cell
        it = itertools.cycle(t.sets)

        def call():
            t.call(*next(it))
            if CUDA:
                torch.cuda.synchronize()

        with torch.set_grad_enabled(t.grad):  # forward under no_grad, as in the harness
            benchmark.pedantic(call, rounds=ROUNDS, iterations=1)
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
