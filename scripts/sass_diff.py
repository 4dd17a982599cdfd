"""Registers, spills and SASS instructions of each kernel in CUDA files, at a git commit against
the working tree, without a GPU: the check that a kernel change moved what it should (ptxas's
registers decide the blocks per SM; instructions per element, the issue slots a memory-bound row
kernel spends), before any device time.

    python scripts/sass_diff.py REF [FILE...] [--arch sm_90a] [--match REGEX] [--all]

FILE: csrc/cuda/*.cu by default (the kernel files are torch-free, as scripts/compile_kernels.sh
builds them); REF: a commit. Each file is compiled with `nvcc -cubin -Xptxas -v` from the REF tree
(`git archive`) and from the working tree, two compiles at a time; instructions come from
`cuobjdump -sass` (from the CUDA toolkit or Triton's bundled copy; without one, that column is
empty). Prints the kernels whose numbers differ (--all: every kernel) matching --match.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def kernel_name(mangled: str) -> str:
    """The mangled name with its anonymous namespace, which carries a hash of the file's
    path, renamed `anon`: the same kernel compiled from two trees then has one name."""
    for m in re.finditer(r"(\d+)_GLOBAL__N__", mangled):
        end = m.start(1) + len(m.group(1)) + int(m.group(1))
        return mangled[: m.start(1)] + "4anon" + mangled[end:]
    return mangled


def parse_ptxas(text: str) -> dict[str, dict[str, int]]:
    """ptxas -v output -> {kernel: {"regs": n, "spill_stores": n, "spill_loads": n}}."""
    out: dict[str, dict[str, int]] = {}
    name = None
    for line in text.splitlines():
        if m := re.search(r"Compiling entry function '(\S+)'", line):
            name = kernel_name(m.group(1))
            out[name] = {"regs": 0, "spill_stores": 0, "spill_loads": 0}
        elif name and (m := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)):
            out[name]["spill_stores"], out[name]["spill_loads"] = map(int, m.groups())
        elif name and (m := re.search(r"Used (\d+) registers", line)):
            out[name]["regs"] = int(m.group(1))
    return out


def parse_sass(text: str) -> dict[str, int]:
    """cuobjdump -sass output -> {kernel: instructions}."""
    out: dict[str, int] = {}
    name = None
    for line in text.splitlines():
        if m := re.search(r"Function : (\S+)", line):
            name = kernel_name(m.group(1))
            out[name] = 0
        elif name and re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+\S", line):
            out[name] += 1
    return out


def find_cuobjdump() -> str | None:
    if path := shutil.which("cuobjdump"):
        return path
    try:
        import triton  # its wheel bundles NVIDIA's binary tools

        bundled = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
        return str(bundled) if bundled.exists() else None
    except Exception:
        return None


def compile_file(tree: Path, rel: str, arch: str, work: Path, cuobjdump: str | None) -> dict:
    """{kernel: {"regs", "spill_stores", "spill_loads", "instructions"}} of tree/rel."""
    cubin = work / (rel.replace("/", "_") + ".cubin")
    cmd = ["nvcc", "-std=c++17", f"-arch={arch}", "-Icsrc", "-cubin", "-Xptxas", "-v"]
    done = subprocess.run([*cmd, rel, "-o", str(cubin)], cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"nvcc failed on {tree / rel}:\n{done.stderr[-3000:]}")
    kernels = parse_ptxas(done.stderr + done.stdout)
    if cuobjdump:
        sass = subprocess.run(
            [cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=True
        ).stdout
        for name, n in parse_sass(sass).items():
            kernels.setdefault(name, {})["instructions"] = n
    return kernels


def short(name: str) -> str:
    """The demangled kernel, without its parameter list and the fusedops:: qualifiers."""
    if shutil.which("c++filt"):
        demangled = subprocess.run(["c++filt", name], capture_output=True, text=True).stdout
        name = demangled.strip() or name
    depth = 0
    for i, c in enumerate(name):
        depth += {"<": 1, ">": -1}.get(c, 0)
        if c == "(" and depth == 0:
            name = name[:i]
            break
    return name.removeprefix("void ").replace("fusedops::", "")


def table(ref: dict, work: dict, match: str, show_all: bool) -> list[str]:
    keys = ("regs", "spill_stores", "instructions")
    lines = []
    for name in sorted(set(ref) | set(work)):
        if not re.search(match, name):
            continue
        a, b = ref.get(name, {}), work.get(name, {})
        if not show_all and all(a.get(k) == b.get(k) for k in keys):
            continue
        cells = [f"{a.get(k, '-')} -> {b.get(k, '-')}" for k in keys]
        lines.append(
            f"{short(name)}\n    registers {cells[0]}, spill stores {cells[1]} B, "
            f"instructions {cells[2]}"
        )
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ref", help="the commit to compare the working tree with")
    ap.add_argument("files", nargs="*", help="CUDA files (default: csrc/cuda/*.cu)")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--match", default="", help="only kernels whose mangled name matches")
    ap.add_argument("--all", action="store_true", help="every kernel, changed or not")
    args = ap.parse_args(argv)
    if not shutil.which("nvcc"):
        ap.error("needs nvcc on PATH")
    paths = [Path(f).resolve() for f in args.files] or sorted(ROOT.glob("csrc/cuda/*.cu"))
    files = [str(p.relative_to(ROOT)) for p in paths]  # the same file in both trees
    cuobjdump = find_cuobjdump()
    if not cuobjdump:
        print("no cuobjdump found: registers and spills only", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        ref_tree, work = Path(tmp) / "ref", Path(tmp) / "out"
        for d in (ref_tree, work / "r", work / "w"):
            d.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "archive", args.ref, "csrc"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(ref_tree)], input=archive, check=True)
        for rel in files:
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                ref = pool.submit(compile_file, ref_tree, rel, args.arch, work / "r", cuobjdump)
                new = pool.submit(compile_file, ROOT, rel, args.arch, work / "w", cuobjdump)
                lines = table(ref.result(), new.result(), args.match, args.all)
            print(
                f"== {rel} ({args.ref} -> working tree, {args.arch}): "
                f"{len(lines)} kernel(s) {'listed' if args.all else 'changed'}"
            )
            print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
