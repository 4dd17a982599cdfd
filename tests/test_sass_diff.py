"""scripts/sass_diff.py's parsing: ptxas's and cuobjdump's reports, and kernel names that match
across two trees (the compiles themselves need nvcc: the script is run by hand)."""

import importlib.util
import shutil
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "sass_diff", Path(__file__).resolve().parent.parent / "scripts" / "sass_diff.py"
)
sass_diff = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sass_diff)


def _kernel(anon: str) -> str:  # fusedops::k<fusedops::<anon>::Foo>(...), as nvcc mangles it
    return f"_ZN8fusedops1kINS_{len(anon)}{anon}3FooEEEvT_"


# The same kernel compiled from two trees: its anonymous namespace's hash differs.
A = _kernel("_GLOBAL__N__aa2724eb_7_x_cu_a431dc2f_25804")
B = _kernel("_GLOBAL__N__ed19457f_7_x_cu_01ef242a_28421")

PTXAS = f"""ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '{A}' for 'sm_90a'
ptxas info    : Function properties for {A}
    0 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 1152 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function '_Z3barv' for 'sm_90a'
ptxas info    : Function properties for _Z3barv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 360 bytes cmem[0]
"""

SASS = f"""
	code for sm_90a
		Function : {B}
	.headerflags	@"EF_CUDA_TEXMODE_UNIFIED"
        /*0000*/                   LDC R1, c[0x0][0x28] ;         /* 0x00000a00ff017b82 */
                                                                    /* 0x000fe20000000800 */
        /*0010*/                   S2R R0, SR_TID.X ;             /* 0x0000000000007919 */
                                                                    /* 0x000e240000002100 */
        /*0020*/                   EXIT ;                         /* 0x000000000000794d */
		..........
		Function : _Z3barv
        /*0000*/                   EXIT ;                         /* 0x000000000000794d */
"""


def test_kernel_names_match_across_trees():
    assert sass_diff.kernel_name(A) == sass_diff.kernel_name(B) != A
    assert sass_diff.kernel_name("_Z3barv") == "_Z3barv"


def test_parse_ptxas():
    got = sass_diff.parse_ptxas(PTXAS)
    assert got == {
        sass_diff.kernel_name(A): {"regs": 128, "spill_stores": 12, "spill_loads": 8},
        "_Z3barv": {"regs": 8, "spill_stores": 0, "spill_loads": 0},
    }


def test_parse_sass():
    assert sass_diff.parse_sass(SASS) == {sass_diff.kernel_name(B): 3, "_Z3barv": 1}


def test_table_lists_what_changed():
    name = sass_diff.kernel_name(A)
    ref = {name: {"regs": 64, "spill_stores": 0, "instructions": 900}, "_Z3barv": {"regs": 8}}
    work = {name: {"regs": 48, "spill_stores": 0, "instructions": 800}, "_Z3barv": {"regs": 8}}
    lines = sass_diff.table(ref, work, "", show_all=False)
    assert len(lines) == 1
    assert "registers 64 -> 48, spill stores 0 -> 0 B, instructions 900 -> 800" in lines[0]
    assert len(sass_diff.table(ref, work, "", show_all=True)) == 2
    assert sass_diff.table(ref, work, "nothing", show_all=True) == []


@pytest.mark.skipif(shutil.which("c++filt") is None, reason="no c++filt")
def test_short_names_demangle_without_parameters():
    assert sass_diff.short(sass_diff.kernel_name(A)) == "k<anon::Foo>"
