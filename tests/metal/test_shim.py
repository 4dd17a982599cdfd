"""Check 1: every metal/kernels/*.metal compiles through the shim as Metal 3.0 and 3.1, and the
kernel names match the names the host (csrc/mps/*.mm) asks for."""

import functools
import re

import pytest
from mslcheck import (
    HERE,
    HOST_DIR,
    KERNEL_DIR,
    METAL_VERSIONS,
    CheckError,
    embedded_source,
    typecheck,
)

METAL_FILES = sorted(KERNEL_DIR.glob("*.metal"))
TYPES = ("float", "half", "bfloat")


@functools.cache
def names(version: int) -> dict[str, str]:
    out = {}
    for path in METAL_FILES:
        out.update(typecheck(path, version))
    return out


def test_kernels_exist():
    assert METAL_FILES, f"no .metal files in {KERNEL_DIR}"


@pytest.mark.parametrize("version", METAL_VERSIONS, ids=lambda v: f"metal{v / 100:.1f}")
@pytest.mark.parametrize("path", METAL_FILES, ids=lambda p: p.name)
def test_typecheck(path, version):
    typecheck(path, version)


@pytest.mark.parametrize("version", METAL_VERSIONS, ids=lambda v: f"metal{v / 100:.1f}")
def test_embedded_source(version):
    """The one source the host compiles at run time (setup.py concatenates the files): it
    compiles as a whole and holds every kernel."""
    assert typecheck(embedded_source(), version) == names(version)


def test_bfloat_only_in_metal_3_1():
    old, new = set(names(300)), set(names(310))
    assert not {n for n in old if n.endswith("_bfloat")}
    assert old == {n for n in new if not n.endswith("_bfloat")}


def test_kernel_name_scheme():
    pattern = re.compile(r"[a-z0-9_]+_(fwd|bwd)_[a-z0-9]+_(" + "|".join(TYPES) + ")")
    bad = [n for n in names(310) if not pattern.fullmatch(n)]
    assert not bad, f"kernel names not <op>_<fwd|bwd>_<tier>_<type>: {bad}"


# The host asks for kernels through its lookup helpers, with names built from string literals
# (e.g. row_plan("softmax_fwd", type, cols) -> kernel(prefix + "_row_" + type)).
LOOKUPS = ("kernel", "row_plan", "pipeline")


def _call_args(text: str, fn: str) -> list[str]:
    args = []
    for m in re.finditer(rf"\b{fn}\(", text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        args.append(text[m.end() : i - 1])
    return args


def host_name_pieces() -> set[str]:
    pieces = set()
    for mm in sorted(HOST_DIR.glob("*.mm")):
        text = re.sub(r"//[^\n]*", "", mm.read_text())
        for fn in LOOKUPS:
            for arg in _call_args(text, fn):
                pieces |= set(re.findall(r'"([^"\\]*)"', arg))
        pieces |= {t for t in TYPES if f'"{t}"' in text}
    return pieces


def composable(name: str, pieces: set[str]) -> bool:
    ok = [True] + [False] * len(name)  # ok[i]: name[:i] is a concatenation of pieces
    for i in range(len(name)):
        if ok[i]:
            for p in pieces:
                if p and name.startswith(p, i):
                    ok[i + len(p)] = True
    return ok[-1]


@pytest.mark.skipif(not HOST_DIR.is_dir(), reason="no csrc/mps host yet")
def test_host_asks_for_every_kernel():
    pieces = host_name_pieces()
    unasked = sorted(n for n in names(310) if not composable(n, pieces))
    assert not unasked, f"kernels no host lookup can name (dead, or a typo in the host): {unasked}"


@pytest.mark.skipif(not HOST_DIR.is_dir(), reason="no csrc/mps host yet")
def test_every_host_name_exists():
    leading = {p for p in host_name_pieces() if p and not p.startswith("_") and p not in TYPES}
    missing = sorted(p for p in leading if not any(n.startswith(p) for n in names(310)))
    assert not missing, f"the host asks for kernels no .metal file defines: {missing}"


# The shim's own promises: what MSL (or the kernel contract) rejects, the type check rejects.
BAD_MSL = {
    # The contract: threadgroup memory only as the host-sized scratch argument.
    "threadgroup_array_in_body": (
        "kernel void k(device float* y [[buffer(0)]]) {\n"
        "  threadgroup float s[32];\n  s[0] = y[0];\n  y[0] = s[0]; }"
    ),
    "erf": "kernel void k(device float* y [[buffer(0)]]) { y[0] = erf(y[0]); }",
    "double": "kernel void k(device float* y [[buffer(0)]]) { double d = y[0]; y[0] = d; }",
    "address_space": (
        "void f(device float* p) { p[0] = 1.0f; }\n"
        "kernel void k(threadgroup float* s [[threadgroup(0)]]) { f(s); }"
    ),
    "bfloat_in_3_0": "kernel void k(device bfloat* y [[buffer(0)]]) { y[0] = y[0]; }",
    "libm": "#include <math.h>\nkernel void k(device float* y [[buffer(0)]]) { y[0] = 1; }",
    "cxx17": (
        "template <typename T> kernel void k(device T* y [[buffer(0)]]) {\n"
        "  if constexpr (sizeof(T) == 4) y[0] = 1; }\n"
        'template [[host_name("k_float")]] kernel void k<float>(device float*);'
    ),
}


@pytest.mark.parametrize("what", BAD_MSL)
def test_shim_rejects(what, tmp_path):
    src = tmp_path / "bad.metal"
    src.write_text("#include <metal_stdlib>\nusing namespace metal;\n" + BAD_MSL[what] + "\n")
    with pytest.raises(CheckError):
        typecheck(src, 300)


def test_shim_accepts_baseline():
    assert set(typecheck(HERE / "planted" / "row_sum.metal", 310)) == {
        f"row_sum_{t}" for t in TYPES
    }
