"""pytest-benchmark: the bias_gelu and fused_mlp cells of fusedops.bench, one test per provider.

    pytest bench/test_bench_mlp.py

Ops, shapes, dtypes and byte counts come from fusedops.bench. On CPU the rows are cut so the run
stays short; python -m fusedops.bench --ops bias_gelu,bias_gelu_tanh,fused_mlp,fused_mlp_tanh is
the full measurement.
"""

import pytest
import torch

from fusedops import bench

pytest.importorskip("pytest_benchmark")

CPU_ELEMENTS = 1 << 18
OPS = ("bias_gelu", "bias_gelu_tanh", "fused_mlp", "fused_mlp_tanh")


def _case(spec, pass_, dtype, rows, n):
    if not torch.cuda.is_available():
        rows = max(1, min(rows, CPU_ELEMENTS // n))
    return pytest.param(spec, pass_, dtype, rows, n, id=f"{spec.name}_{pass_}-{dtype}-{rows}x{n}")


CASES = [_case(spec, pass_, dtype, *shape) for spec, pass_, dtype, shape in bench.cells(OPS)]


@pytest.mark.parametrize("provider", bench.PROVIDERS)
@pytest.mark.parametrize("spec, pass_, dtype, rows, n", CASES)
def test_mlp(bench_cell, spec, pass_, dtype, rows, n, provider):
    bench_cell(spec, pass_, dtype, rows, n, provider)
