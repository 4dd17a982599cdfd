"""pytest-benchmark: every cell of fusedops.bench (all registered ops, both passes), one test per
provider. Select with -k, e.g. `pytest bench -k "softmax_fwd and bf16"`.

Ops, shapes, dtypes and byte counts come from fusedops.bench. On CPU each N is kept (it picks the
kernel path) and the rows are cut so the run stays short; python -m fusedops.bench is the full
measurement.
"""

import pytest
import torch

from fusedops import bench

pytest.importorskip("pytest_benchmark")

CPU_ELEMENTS = 1 << 18


def _case(spec, pass_, dtype, rows, n):
    if not torch.cuda.is_available():
        rows = max(1, min(rows, CPU_ELEMENTS // n))
    return pytest.param(spec, pass_, dtype, rows, n, id=f"{spec.name}_{pass_}-{dtype}-{rows}x{n}")


CASES = [
    _case(spec, pass_, dtype, *shape) for spec, pass_, dtype, shape in bench.cells(bench.SPECS)
]


@pytest.mark.parametrize("provider", bench.PROVIDERS)
@pytest.mark.parametrize("spec, pass_, dtype, rows, n", CASES)
def test_cell(bench_cell, spec, pass_, dtype, rows, n, provider):
    bench_cell(spec, pass_, dtype, rows, n, provider)
