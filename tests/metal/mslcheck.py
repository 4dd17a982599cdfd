"""Driver of the Linux checks for the Metal backend: MSL through the clang shim (type check and CPU
emulator) and the Objective-C++ host through a syntax-only compile. Test infrastructure.

MSL that clang can't read as C++ is rewritten before compiling, in exactly two places:
- ``[[threadgroup(N)]]`` becomes ``[[msl_threadgroup(N)]]`` (``threadgroup`` is a macro of the
  shim, and a macro can't also be an attribute name);
- after preprocessing, ``template [[host_name("X")]] void f<T>(...)`` loses its attribute (C++
  allows none there); X and ``f<T>`` are collected as the kernel's name and function.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import hashlib
import importlib.util
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "tests" / "metal"
KERNEL_DIR = ROOT / "metal" / "kernels"
HOST_DIR = ROOT / "csrc" / "mps"
BUILD = ROOT / "build" / "metal_check"

METAL_VERSIONS = (300, 310)  # Metal 3.0 (macOS 13) and 3.1 (macOS 14: bfloat)
CLANG = shutil.which("clang++")

TYPECHECK_FLAGS = [
    "--target=aarch64-linux-gnu",  # a target with _Float16 and __bf16 for half and bfloat
    "-march=armv8.6-a+bf16",
    "-std=c++14",  # MSL 3.0 and 3.1 are C++14 dialects: no if constexpr, no structured bindings
    "-nostdinc",  # no libc/libm: a stray erf or std:: fails
    "-nostdinc++",
    "-Wall",
    "-Werror",
    "-Wno-unknown-attributes",
]
EMU_FLAGS = [
    "-std=c++17",
    "-O1",
    "-g",
    "-fno-omit-frame-pointer",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-DMSL_SHIM_EMULATE",
    "-Wno-unknown-attributes",
]

_TG_ATTR = re.compile(r"\[\[\s*threadgroup\s*\(")
# `template [[host_name("X")]] [[kernel]]` (kernel is empty after preprocessing), then either
# `void f<T>(...)` or `decltype(f<T>) f<T>`; the lookahead keeps the declaration itself.
_HOST_NAME = re.compile(
    r'template\s*\[\[\s*host_name\s*\(\s*((?:"[^"]*"\s*)+)\)\s*\]\]\s*(?:\[\[\s*\]\]\s*)?'
    r"(?=decltype\s*\(\s*(?P<dt>[^()]*?)\s*\)|void\s+(?P<fn>[A-Za-z_]\w*\s*<[^;{(]*>)\s*\()"
)
# A kernel that is not a template: `kernel void f(` not right after a template header.
_PLAIN_KERNEL = re.compile(r"(?<![>\s])(\s*)\bkernel\s+void\s+([A-Za-z_]\w*)\s*\(")


class CheckError(Exception):
    """A check failed; the message holds the compiler's or emulator's own output."""


def _run(cmd: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, cwd=ROOT)


def preprocess(path: Path, version: int, *, emulate: bool, defines: list[str] = ()) -> str:
    """The .metal file after the [[threadgroup(N)]] rename and clang's preprocessor."""
    text = f'#line 1 "{os.path.relpath(path, ROOT)}"\n'
    text += _TG_ATTR.sub("[[msl_threadgroup(", path.read_text())
    flags = ["-DMSL_SHIM_EMULATE", "-nostdinc", "-nostdinc++"] if emulate else TYPECHECK_FLAGS
    inc = [f"-I{HERE / 'include'}", f"-I{path.parent}"]
    cmd = [CLANG, "-E", *flags, f"-D__METAL_VERSION__={version}", *defines, *inc, "-x", "c++", "-"]
    r = _run(cmd, text)
    if r.returncode:
        raise CheckError(f"preprocessing {path.name} (Metal {version / 100:.1f}):\n{r.stderr}")
    return r.stdout


def plain_kernels(path: Path) -> list[str]:
    """Kernels defined without a template (their MSL name is the function's name)."""
    return [m.group(2) for m in _PLAIN_KERNEL.finditer(path.read_text())]


def split_instantiations(pre: str, plain: list[str]) -> tuple[str, dict[str, str]]:
    """Drops the host_name attributes; returns the text and {kernel name: function}."""
    names = {name: name for name in plain}

    def take(m: re.Match) -> str:
        name = "".join(re.findall(r'"([^"]*)"', m.group(1)))
        if name in names:
            raise CheckError(f"kernel name {name!r} defined twice")
        names[name] = re.sub(r"\s+", "", m.group("dt") or m.group("fn"))
        return "template "

    return _HOST_NAME.sub(take, pre), names


def typecheck(path: Path, version: int) -> dict[str, str]:
    """Compiles one .metal file as the Metal `version` view; returns its kernel names."""
    text, names = split_instantiations(
        preprocess(path, version, emulate=False), plain_kernels(path)
    )
    r = _run([CLANG, "-fsyntax-only", *TYPECHECK_FLAGS, "-x", "c++", "-"], text)
    if r.returncode:
        raise CheckError(f"{path.name} as Metal {version / 100:.1f}:\n{r.stderr}")
    return names


@functools.cache
def embedded_header_dir() -> Path:
    """Where setup.py's embed_metal_sources() writes fusedops_metal_source.h (kMetalSource: the
    one MSL source the host compiles at run time), after running it. Locked: parallel test
    workers would otherwise read it while one of them writes it."""
    spec = importlib.util.spec_from_file_location("fusedops_setup", ROOT / "setup.py")
    setup_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup_py)
    BUILD.mkdir(parents=True, exist_ok=True)
    with open(BUILD / "embed.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return Path(setup_py.embed_metal_sources())


def embedded_source() -> Path:
    """kMetalSource as a .metal file, as the host compiles it."""
    header = (embedded_header_dir() / "fusedops_metal_source.h").read_text()
    m = re.search(r'R"(\w*)\(\n(.*)\)\1";', header, re.S)
    if m is None:
        raise CheckError("fusedops_metal_source.h holds no raw string literal")
    out = BUILD / f"embedded-{os.getpid()}.metal"
    out.write_text(m.group(2))
    return out


# --------------------------------------------------------------------------------------------
# CPU emulator
# --------------------------------------------------------------------------------------------

_STRUCT = re.compile(r"struct\s+(\w+)\s*\{([^}]*)\}\s*;")
_FIELD_FMT = {"uint32_t": "I", "uint": "I", "int32_t": "i", "int": "i", "float": "f"}


def parse_params(header: Path) -> dict[str, list[tuple[str, str]]]:
    """{struct name: [(field, struct format char)]} of a params.h of plain 32-bit fields."""
    structs = {}
    for name, body in _STRUCT.findall(re.sub(r"//[^\n]*", "", header.read_text())):
        fields = []
        for decl in filter(None, (d.strip() for d in body.split(";"))):
            ctype, *rest = decl.split()
            if ctype not in _FIELD_FMT:
                raise CheckError(f"{header.name}: {name} has a field of type {ctype}")
            fields += [(f.strip(), _FIELD_FMT[ctype]) for f in " ".join(rest).split(",")]
        structs[name] = fields
    return structs


@dataclasses.dataclass
class KernelInfo:
    name: str
    params_type: str
    params_size: int
    has_scratch: bool
    buffers: list[tuple[str, bool]]  # (MSL type, is input)


_DTYPE = {"float": torch.float32, "half": torch.float16, "bfloat": torch.bfloat16}
_DTYPE.update({"int": torch.int32, "uint": torch.int32})


class EmulatorError(CheckError):
    """The emulator found a divergent barrier / simd call, or a sanitizer stopped it."""


class Emulator:
    """The kernels of one .metal file, built for the CPU emulator (ASan + UBSan)."""

    def __init__(self, path: Path, params_header: Path, defines: list[str] = ()):
        self.path = path
        self.exe = _build_emulator(path, defines)
        self.params = parse_params(params_header)
        self.kernels: dict[str, KernelInfo] = {}
        for line in _run([str(self.exe), "list"]).stdout.splitlines():
            name, ptype, psize, scratch, *bufs = line.split("\t")
            ptype = re.search(r"T = (\w+)", ptype).group(1)
            info = KernelInfo(
                name,
                ptype,
                int(psize),
                scratch == "1",
                [(b.removeprefix("in:"), b.startswith("in:")) for b in bufs],
            )
            fields = self.params.get(ptype)
            if (
                fields is None
                or struct.calcsize("<" + "".join(f for _, f in fields)) != info.params_size
            ):
                raise CheckError(f"{name}: {ptype} in the params header does not match sizeof")
            self.kernels[name] = info

    def run(
        self,
        name: str,
        buffers: list[torch.Tensor],
        params: dict[str, float],
        *,
        grid: int,
        tg_size: int,
        scratch_bytes: int = 0,
        order: str = "fwd",
    ) -> list[torch.Tensor]:
        """Runs kernel `name` on `grid` threadgroups; returns the buffers after the run."""
        info = self.kernels[name]
        if len(buffers) != len(info.buffers):
            raise ValueError(f"{name} takes {len(info.buffers)} buffers, got {len(buffers)}")
        for i, (t, (mtype, _)) in enumerate(zip(buffers, info.buffers, strict=True)):
            if t.dtype != _DTYPE[mtype]:
                raise ValueError(f"{name}: buffer {i} is {mtype}, got {t.dtype}")
        fields = self.params[info.params_type]
        if set(params) != {f for f, _ in fields}:
            raise ValueError(f"{name}: {info.params_type} has fields {[f for f, _ in fields]}")
        packed = struct.pack("<" + "".join(f for _, f in fields), *(params[f] for f, _ in fields))
        with tempfile.TemporaryDirectory() as tmp:
            files = []
            for i, t in enumerate(buffers):
                files.append(os.path.join(tmp, f"b{i}"))
                Path(files[-1]).write_bytes(t.contiguous().view(torch.uint8).numpy().tobytes())
            pfile = os.path.join(tmp, "params")
            Path(pfile).write_bytes(packed)
            cmd = [str(self.exe), "run", name, order, str(grid), str(tg_size), str(scratch_bytes)]
            r = _run([*cmd, pfile, *files])
            if r.returncode:
                raise EmulatorError(f"{name} ({order}): exit {r.returncode}\n{r.stderr[-4000:]}")
            out = []
            for t, f in zip(buffers, files, strict=True):
                data = bytearray(Path(f).read_bytes())
                out.append(torch.frombuffer(data, dtype=torch.uint8).view(t.dtype).view(t.shape))
            return out


def _compiled(source: str, stem: str, flags: list[str], *mode: str, objs: list[Path] = ()) -> Path:
    """Compiles (and caches by content) `source`; returns the object or executable."""
    key = hashlib.sha256()
    for part in (source, *flags, *mode, *(o.name for o in objs), *_shim_files()):
        key.update(part.encode())
    out = BUILD / f"{stem}-{key.hexdigest()[:16]}"
    if not out.exists():
        BUILD.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")  # parallel test workers build alike
        cmd = [
            CLANG,
            *flags,
            *mode,
            "-x",
            "c++",
            "-",
            *(["-x", "none"] if objs else []),
            *map(str, objs),
        ]
        r = _run([*cmd, "-o", str(tmp)], source)
        if r.returncode:
            raise CheckError(f"building {stem} for the emulator:\n{r.stderr}")
        tmp.rename(out)
    return out


def _shim_files() -> list[str]:
    return [(HERE / f).read_text() for f in ("msl_shim.h", "emu.h", "emu.cpp")]


def _build_emulator(path: Path, defines: list[str]) -> Path:
    flags = [*EMU_FLAGS, "-D__METAL_VERSION__=310", f"-I{HERE}"]
    runtime = _compiled('#include "emu.cpp"\n', "emu_runtime.o", flags, "-c")
    pre = preprocess(path, 310, emulate=True, defines=defines)
    text, names = split_instantiations(pre, plain_kernels(path))
    if not names:
        raise CheckError(f"{path.name}: no template [[host_name(...)]] instantiations")
    table = ",\n".join(f'    MSL_EMU_KERNEL("{n}", {f})' for n, f in names.items())
    text += (
        '\n#include "emu.h"\n'
        f"const EmuKernel emu_kernels[] = {{\n{table}}};\n"
        f"const int emu_num_kernels = {len(names)};\n"
    )
    return _compiled(text, path.stem, flags, objs=[runtime])


# --------------------------------------------------------------------------------------------
# Objective-C++ host: syntax check against the macOS torch headers, and lint
# --------------------------------------------------------------------------------------------

MACOS_TORCH = ROOT / "build" / "macos-torch"
# As setup.py compiles the .mm on macOS (ARC, FUSEDOPS_WITH_MPS); C++17: the oldest standard
# the supported torch versions accept.
HOST_FLAGS = [
    "-x", "objective-c++", "-std=c++17", "-fobjc-arc", "-fblocks", "-fobjc-runtime=macosx-11.0",
    "-DFUSEDOPS_WITH_MPS", "-fsyntax-only", "-Wall", "-Werror=objc-method-access",
]  # fmt: skip
# The SDKs the host is read against: macOS 14's, and macOS 15's (MTLCompileOptions.mathMode).
SDKS = {
    "macos14": [],
    "macos15": ["-D__MAC_15_0=150000", "-D__MAC_OS_X_VERSION_MAX_ALLOWED=150000"],
}


def macos_torch_include() -> Path:
    """torch/include of the macOS arm64 wheel of the newest torch not newer than ours (the same
    version where PyPI has it), fetched once into build/macos-torch."""
    wheels = sorted(MACOS_TORCH.glob("torch-*-macosx_*_arm64.whl"))
    if not wheels:
        local = torch.__version__.split("+")[0]
        cmd = [sys.executable, "-m", "pip", "download", f"torch<={local}", "--no-deps"]
        cmd += ["--platform", "macosx_11_0_arm64", "--only-binary=:all:", "-d", str(MACOS_TORCH)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(MACOS_TORCH.glob("torch-*-macosx_*_arm64.whl"))
        if r.returncode or not wheels:
            raise CheckError(f"fetching the macOS torch wheel failed:\n{r.stdout}\n{r.stderr}")
    wheel = wheels[-1]
    out = MACOS_TORCH / wheel.name.removesuffix(".whl")
    if not (out / "torch" / "include").is_dir():
        with zipfile.ZipFile(wheel) as z:
            z.extractall(out, [n for n in z.namelist() if n.startswith("torch/include/")])
    return out / "torch" / "include"


def host_syntax_check(mm: Path, sdk: str, include_root: Path = ROOT / "csrc") -> None:
    """Compiles one .mm as Objective-C++ (syntax only) against the macOS torch headers and the
    Foundation/Metal stubs of tests/metal/stubs."""
    inc = macos_torch_include()
    cmd = [CLANG, *HOST_FLAGS, *SDKS[sdk], "-isystem", str(inc)]
    cmd += ["-isystem", str(inc / "torch" / "csrc" / "api" / "include")]
    cmd += [f"-I{HERE / 'stubs'}", f"-I{include_root}", f"-I{ROOT / 'csrc'}", f"-I{ROOT}"]
    cmd += [f"-I{embedded_header_dir()}", str(mm)]
    r = _run(cmd)
    if r.returncode:
        raise CheckError(f"{mm.name} ({sdk}):\n{r.stderr}")


_OFFSET_PRODUCT = re.compile(
    r"(\w+)\.storage_offset\(\)\s*\*\s*\1\.element_size\(\)"
    r"|(\w+)\.element_size\(\)\s*\*\s*\2\.storage_offset\(\)"
)
_SET_BUFFER = re.compile(r"setBuffer:\s*(.+?)\s+offset:\s*(.+?)\s+atIndex:", re.S)
# Encoders belong to torch's MPS stream (stream->commandEncoder()): creating, ending or
# committing one here aborts ("A command encoder is already encoding to this command buffer").
_FORBIDDEN = re.compile(r"\b(computeCommandEncoder|endEncoding|commit|commitAndWait)\s*\]")


def _dispatch_blocks(text: str) -> list[tuple[int, str]]:
    """(offset, body) of each `dispatch_sync(queue, ^{ body })` block."""
    blocks = []
    for m in re.finditer(r"dispatch_sync\([^,]*,\s*\^\s*\{", text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        blocks.append((m.end(), text[m.end() : i - 1]))
    return blocks


def host_lint(text: str) -> list[str]:
    """What the compiler can't see in a host file: each buffer bound at its tensor's storage
    offset in bytes, no encoder of our own, no check inside the stream's dispatch_sync block, no
    fast math. Returns the problems found."""
    problems = []

    def line(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    spans = [m.span() for m in _OFFSET_PRODUCT.finditer(text)]
    for m in re.finditer(r"(\w+)\.storage_offset\(\)", text):
        if not any(a <= m.start() < b for a, b in spans):
            problems.append(f"line {line(m.start())}: {m.group(0)} not scaled by element_size()")
    for m in _SET_BUFFER.finditer(text):
        offset = m.group(2)
        if _OFFSET_PRODUCT.search(offset):
            continue
        var = re.match(r"(\w+)", offset)
        sources = []
        if var and not offset[0].isdigit():
            assign = re.compile(rf"\b{var.group(1)}\s*(?:=|\.push_back\(|\.emplace_back\()([^;]*);")
            sources = [a.group(1) for a in assign.finditer(text)]
        if not sources or not all(_OFFSET_PRODUCT.search(s) for s in sources):
            problems.append(
                f"line {line(m.start())}: setBuffer offset `{offset}` is not the tensor's "
                "storage_offset() * element_size()"
            )
    for m in _FORBIDDEN.finditer(text):
        problems.append(f"line {line(m.start())}: {m.group(1)} on an encoder/command buffer")
    for block in _dispatch_blocks(text):
        # An exception out of a block on the stream's queue ends the process, not the op.
        for m in re.finditer(r"\b(TORCH_CHECK\w*|TORCH_INTERNAL_ASSERT\w*|throw)\b", block[1]):
            problems.append(f"line {line(block[0] + m.start())}: {m.group(1)} inside dispatch_sync")
    if re.search(r"fastMathEnabled\s*=\s*YES|MTLMathModeFast|MTLMathModeRelaxed", text):
        problems.append("fast math on: -inf masking in softmax needs IEEE exp/max")
    return problems
