"""Each kind of planted bug is caught by some check: the emulator (divergent barriers, NaN-poisoned
threadgroup memory, forward and reverse thread order, ASan) for the kernel bugs of
planted/row_sum.metal, the host lint for a wrong buffer offset (planted/bad_offset.mm)."""

import pytest
import torch
from mslcheck import HERE, Emulator, EmulatorError, host_lint, host_syntax_check

PLANTED = HERE / "planted"
ORDERS = ("fwd", "rev")
SCRATCH_BYTES = 32 * 4  # as the host: one float per possible SIMD group
# PLANTED_BUG value (planted/row_sum.metal) -> what must catch it: an emulator error containing
# this text, or (None) a wrong result in at least one thread order.
BUGS = {
    "missing_barrier": (1, None),
    "early_return": (2, "divergent barrier"),
    "out_of_bounds_read": (3, "heap-buffer-overflow"),
    "uninit_scratch": (4, None),
    "divergent_simd": (5, "divergent simd_* call"),
}


def row_sum(emu: Emulator, x: torch.Tensor, order: str, tg_size: int = 64) -> torch.Tensor:
    rows, cols = x.shape
    y = torch.full((rows,), float("nan"))
    params = {"rows": rows, "cols": cols}
    out = emu.run(
        "row_sum_float",
        [x, y],
        params,
        grid=rows,
        tg_size=tg_size,
        scratch_bytes=SCRATCH_BYTES,
        order=order,
    )
    return out[1]


def close(y: torch.Tensor, x: torch.Tensor) -> bool:
    return torch.allclose(y.double(), x.double().sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("cols", [1, 40, 300])
def test_baseline_is_correct(cols, order):
    emu = Emulator(PLANTED / "row_sum.metal", PLANTED / "params.h")
    x = torch.randn(3, cols)
    assert close(row_sum(emu, x, order), x)


@pytest.mark.parametrize("bug", BUGS)
def test_planted_bug_is_caught(bug):
    value, error = BUGS[bug]
    emu = Emulator(PLANTED / "row_sum.metal", PLANTED / "params.h", [f"-DPLANTED_BUG={value}"])
    x = torch.randn(3, 40)  # 40 columns, 64 threads: two SIMD groups, idle threads, a tail
    caught = []
    for order in ORDERS:
        try:
            if not close(row_sum(emu, x, order), x):
                caught.append(f"{order}: wrong result")
        except EmulatorError as e:
            assert error and error in str(e), str(e)
            caught.append(f"{order}: {error}")
    assert caught, f"planted bug {bug} went unnoticed in both thread orders"


def test_planted_host_offset_is_caught():
    bad = PLANTED / "bad_offset.mm"
    host_syntax_check(bad, "macos14")  # valid code: the compiler alone can't see the bug
    problems = host_lint(bad.read_text())
    assert any("not scaled by element_size()" in p for p in problems), problems
    assert any("setBuffer offset `offsets[i]`" in p for p in problems), problems
