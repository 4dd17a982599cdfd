"""pytest-benchmark: every cell of fusedops.bench (all registered ops, both passes), one test per
provider, and a few cells of fusedops.bench_mlp. Select with -k, e.g.
`pytest bench -k "softmax_fwd and bf16"` or `pytest bench -k mlp`.

Ops, shapes, dtypes and byte counts come from fusedops.bench. On CPU each N is kept (it picks the
kernel path) and the rows are cut so the run stays short; python -m fusedops.bench is the full
measurement. The MLP cells: D=1024 and 8192 tokens on CUDA, D=256 and 256 tokens on CPU, no
max-autotune (minutes per cell: python -m fusedops.bench_mlp has it).
"""

import pytest

from fusedops.tools import bench, bench_mlp

pytest.importorskip("pytest_benchmark")

DEVICE = bench.pick_device()  # CUDA, else MPS, else the CPU
CUDA = DEVICE.type == "cuda"
CPU_ELEMENTS = 1 << 18


def _case(spec, pass_, dtype, rows, n, provider):
    if not CUDA:
        rows = max(1, min(rows, CPU_ELEMENTS // n))
    case_id = f"{spec.name}_{pass_}-{dtype}-{rows}x{n}-{provider}"
    return pytest.param(spec, pass_, dtype, rows, n, provider, id=case_id)


CASES = [
    _case(spec, pass_, dtype, *shape, provider)
    for spec, pass_, dtype, shape in bench.cells(bench.SPECS)
    for provider in bench.providers(spec, pass_, DEVICE)
]


@pytest.mark.parametrize("spec, pass_, dtype, rows, n, provider", CASES)
def test_cell(bench_cell, spec, pass_, dtype, rows, n, provider):
    bench_cell(spec, pass_, dtype, rows, n, provider)


MLP_TOKENS, MLP_D = (8192, 1024) if CUDA else (256, 256)
MLP_CASES = [
    pytest.param(mode, approx, provider, id=f"mlp_{mode}-{approx}-{provider}")
    for mode in bench_mlp.MODES
    for approx in bench_mlp.APPROX
    for provider in bench_mlp.providers(mode, with_compile=True, with_max_autotune=False)
]


@pytest.mark.parametrize("mode, approximate, provider", MLP_CASES)
def test_mlp(bench_mlp_cell, mode, approximate, provider):
    bench_mlp_cell(mode, approximate, MLP_TOKENS, MLP_D, provider)
