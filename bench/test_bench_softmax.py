"""pytest-benchmark: the softmax / log_softmax cells of fusedops.bench, one test per provider.

    pytest bench/test_bench_softmax.py

Ops, shapes, dtypes and byte counts come from fusedops.bench. On CPU each N is kept and the rows
are cut so the run stays short; python -m fusedops.bench is the full measurement.
"""

import pytest
import torch

from fusedops import bench

pytest.importorskip("pytest_benchmark")

CPU_ELEMENTS = 1 << 20


def _case(spec, pass_, dtype, rows, n):
    if not torch.cuda.is_available():  # N picks the kernel path: keep it, cut the rows
        rows = max(1, min(rows, CPU_ELEMENTS // n))
    return pytest.param(spec, pass_, dtype, rows, n, id=f"{spec.name}_{pass_}-{dtype}-{rows}x{n}")


CASES = [
    _case(spec, pass_, dtype, *shape)
    for spec, pass_, dtype, shape in bench.cells(bench.DEFAULT_OPS)
    if "softmax" in spec.name
]


@pytest.mark.parametrize("provider", bench.PROVIDERS)
@pytest.mark.parametrize("spec, pass_, dtype, rows, n", CASES)
def test_softmax(bench_cell, spec, pass_, dtype, rows, n, provider):
    bench_cell(spec, pass_, dtype, rows, n, provider)
