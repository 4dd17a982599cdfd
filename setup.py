"""Builds fusedops._C: CPU kernels always, CUDA kernels when torch has CUDA and nvcc is found,
Metal kernels (Objective-C++ host, MSL compiled at run time) on macOS when torch has MPS.

Environment switches:
  FUSEDOPS_CUDA=0/1     0: CPU only. 1: CUDA required (fail loudly). Unset: CUDA when possible.
  FUSEDOPS_METAL=0/1    0: no Metal. 1: Metal required (fail loudly). Unset: Metal when possible.
  TORCH_CUDA_ARCH_LIST  e.g. "8.7;9.0". Unset: the local GPU's arch, or 8.7;9.0 with no GPU.
  MAX_JOBS              parallel compile jobs (lower it on 8 GB Jetsons: MAX_JOBS=2).
  CUDA_HOME             the toolkit; when unset or wrong, the toolkit of the nvcc on PATH.
"""

import glob
import os
import platform
import re
import shutil
import subprocess
import sys

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))
DEFAULT_ARCHS = "8.7;9.0"  # Jetson Orin, H100/H200
ARCH_NOTE = "Thor is 11.0; CUDA 13 no longer builds 7.2 (Xavier)"


def log(msg):
    print(f"fusedops setup: {msg}", file=sys.stderr)


def is_toolkit(path):
    return bool(path) and os.path.isfile(os.path.join(path, "bin", "nvcc"))


def toolkit_of_nvcc_on_path():
    """The toolkit behind the nvcc on PATH, also when that nvcc is a wrapper script."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    try:
        probe = os.path.join(ROOT, "build", "probe.cu")
        os.makedirs(os.path.dirname(probe), exist_ok=True)
        open(probe, "w").close()
        out = subprocess.run(
            [nvcc, "--dryrun", "-c", probe, "-o", os.devnull],
            capture_output=True,
            text=True,
            timeout=60,
        ).stderr
        top = re.search(r"^#\$ TOP=(.*)$", out, re.M)
        if top and is_toolkit(os.path.normpath(top.group(1).strip())):
            return os.path.normpath(top.group(1).strip())
    except (OSError, subprocess.SubprocessError):
        pass
    parent = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    return parent if is_toolkit(parent) else None


def resolve_cuda_home():
    for var in ("CUDA_HOME", "CUDA_PATH"):
        path = os.environ.get(var)
        if is_toolkit(path):
            return path
        if path:
            log(f"{var}={path} holds no bin/nvcc; looking for the nvcc on PATH")
    for path in (toolkit_of_nvcc_on_path(), "/usr/local/cuda"):
        if is_toolkit(path):
            return path
    return None


def pip_cuda_include_dirs():
    """Headers (cusparse.h, cublasLt.h, ...) that only pip's nvidia packages may provide."""
    dirs = []
    for site in sys.path:
        dirs += glob.glob(os.path.join(site, "nvidia", "cu13", "include"))
        dirs += glob.glob(os.path.join(site, "nvidia", "*", "include"))
    return list(dict.fromkeys(d for d in dirs if os.path.isdir(d)))


def cublaslt_library(cuda_home):
    """(directory, -l name) of libcublasLt: pip's nvidia wheel (the copy torch loads, matching
    the pip header) first, then the toolkit's (Jetson). Only a versioned .so may exist (pip)."""
    dirs = []
    for site in sys.path:
        dirs += glob.glob(os.path.join(site, "nvidia", "cu13", "lib"))
        dirs += glob.glob(os.path.join(site, "nvidia", "cublas", "lib"))
    dirs += [os.path.join(cuda_home, "lib64"), os.path.join(cuda_home, "lib")]
    dirs += glob.glob(os.path.join(cuda_home, "targets", "*", "lib"))
    for d in dict.fromkeys(os.path.realpath(d) for d in dirs):
        names = sorted(os.path.basename(f) for f in glob.glob(os.path.join(d, "libcublasLt.so*")))
        if "libcublasLt.so" in names:
            return d, "cublasLt"
        if names:
            return d, ":" + min(names, key=len)
    raise RuntimeError(
        "libcublasLt not found (fused_mlp needs it): install torch's nvidia-cublas wheel or a "
        f"CUDA toolkit with cuBLAS; looked in {', '.join(dict.fromkeys(dirs))}"
    )


def cutlass_include_dir():
    """CUTLASS's headers as pip's nvidia-cutlass ships them (cutlass_library/source/include), found
    without importing the package; None without it."""
    import importlib.util

    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "source", "include")
    return path if os.path.isfile(os.path.join(path, "cutlass", "cutlass.h")) else None


def hopper_archs(archs, cutlass):
    """fused_mlp's Hopper GEMM (csrc/cuda/gemm_gelu_sm90.cu: wgmma, TMA) needs CUTLASS's headers
    and the arch-specific target sm_90a. With both, "9.0" becomes "9.0a" (its cubin runs on
    the same GPUs; the other kernels compile alike). Returns (archs, whether the GEMM is built)."""
    names = [a.strip() for a in re.split(r"[;\s]+", archs) if a.strip()]
    if cutlass is None or not {"9.0", "9.0a"} & set(names):
        if "9.0" in names:
            log(
                "no CUTLASS headers (pip install nvidia-cutlass): fused_mlp's exact-GELU GEMM "
                "for Hopper is not built; cuBLASLt + the GELU kernel serve"
            )
        return archs, False
    return ";".join("9.0a" if a == "9.0" else a for a in names), True


def want_cuda(torch, cuda_home):
    flag = os.environ.get("FUSEDOPS_CUDA", "").strip()
    if flag == "0":
        return False
    reasons = []
    if torch.version.cuda is None:
        reasons.append(f"torch {torch.__version__} was built without CUDA")
    if cuda_home is None:
        reasons.append("no CUDA toolkit found (set CUDA_HOME or put nvcc on PATH)")
    if not reasons:
        return True
    if flag == "1":
        raise RuntimeError("FUSEDOPS_CUDA=1 but CUDA can't be built: " + "; ".join(reasons))
    log("building CPU only: " + "; ".join(reasons))
    return False


def cuda_arch_list(torch):
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if not archs:
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            archs = f"{major}.{minor}"
        else:
            archs = DEFAULT_ARCHS
        os.environ["TORCH_CUDA_ARCH_LIST"] = archs
    log(f"CUDA archs {archs} ({ARCH_NOTE})")
    return archs


def default_max_jobs():
    """Each nvcc job can take 2+ GB: on small-memory boards, don't let ninja use every core."""
    if "MAX_JOBS" in os.environ:
        return
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return
    jobs = max(1, min(os.cpu_count() or 1, int(mem_gb // 3)))
    os.environ["MAX_JOBS"] = str(jobs)


def cpu_simd_flags():
    """ATen's at::vec picks its SIMD code from CPU_CAPABILITY_* macros; without them an x86
    build gets the scalar fallback. The machine that builds fusedops runs it (an editable
    install), so use the widest level torch itself dispatches to there: AVX512 (with torch's
    subset: F, BW, VL, DQ), else AVX2. aarch64 builds get NEON from at::vec by default."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return []
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(re.findall(r"^flags\s*:(.*)$", f.read(), re.M)[0].split())
    except (OSError, IndexError):
        return []
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma"} <= flags:
        isa = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma"]
        return ["-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512", *isa]
    if {"avx2", "fma", "f16c"} <= flags:
        return ["-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2", "-mavx2", "-mfma", "-mf16c"]
    return []


def openmp_flags(torch):
    """at::parallel_for is inline: compiled without OpenMP it runs every range on one thread. With
    torch's OpenMP backend, compile with -fopenmp (GCC/clang on Linux; not Apple clang) and link
    nothing more: the GOMP symbols resolve to the runtime libtorch_cpu already loads."""
    if platform.system() != "Linux" or "OpenMP" not in torch.__config__.parallel_info():
        return []
    return ["-fopenmp"]


def want_metal(torch):
    flag = os.environ.get("FUSEDOPS_METAL", "").strip()
    if flag == "0":
        return False
    reasons = []
    if platform.system() != "Darwin":
        reasons.append(f"Metal needs macOS, this is {platform.system()}")
    elif not torch.backends.mps.is_built():
        reasons.append(f"torch {torch.__version__} was built without MPS")
    if not reasons:
        return True
    if flag == "1":
        raise RuntimeError("FUSEDOPS_METAL=1 but Metal can't be built: " + "; ".join(reasons))
    return False


def embed_metal_sources():
    """metal/kernels as one MSL source, a raw string in build/generated/fusedops_metal_source.h,
    for newLibraryWithSource: at run time, which resolves no #include of project files: params.h,
    common.h, then each .metal file, with those #includes and #pragma once dropped (#line keeps
    compiler messages pointing at the real files). Returns the directory to add to the include
    path. Rewritten only when it changes, so ninja rebuilds its includer only then."""
    kernels = os.path.join(ROOT, "metal", "kernels")
    names = ["params.h", "common.h"] + sorted(
        os.path.basename(f) for f in glob.glob(os.path.join(kernels, "*.metal"))
    )
    local = re.compile(r'^\s*#\s*(include\s+"[^"]+"|pragma\s+once)\s*$')
    parts = []
    for name in names:
        with open(os.path.join(kernels, name)) as f:
            lines = f.read().splitlines()
        parts.append(f'#line 1 "{name}"')
        parts += ["" if local.match(line) else line for line in lines]
    source = "\n".join(parts) + "\n"
    delimiter = "FUSEDOPS_MSL"
    assert f"){delimiter}" not in source, "the MSL sources end the raw string literal"
    header = (
        "// Generated by setup.py from metal/kernels: do not edit.\n#pragma once\n\n"
        f'static const char kMetalSource[] = R"{delimiter}(\n{source}){delimiter}";\n'
    )
    out_dir = os.path.join(ROOT, "build", "generated")
    path = os.path.join(out_dir, "fusedops_metal_source.h")
    os.makedirs(out_dir, exist_ok=True)
    if not os.path.exists(path) or open(path).read() != header:
        with open(path, "w") as f:
            f.write(header)
    return out_dir


def extensions():
    cuda_home = resolve_cuda_home()
    if cuda_home:
        os.environ["CUDA_HOME"] = cuda_home  # read once when cpp_extension is imported
    import torch
    from torch.utils import cpp_extension

    default_max_jobs()
    sources = sorted(sum((glob.glob(f"csrc/{d}*.cpp") for d in ("", "autograd/", "cpu/")), []))
    # torch picks the C++ standard its headers need. No trapping math (clang's default, not
    # GCC's): GCC then if-converts float compares and vectorizes the CPU GELU lane loops; NaN and
    # inf semantics are unchanged.
    cxx = ["-O3", "-fno-trapping-math", *cpu_simd_flags(), *openmp_flags(torch)]
    macros = []
    include_dirs = [os.path.join(ROOT, "csrc")]
    link_args = []
    if want_metal(torch):
        log("building the Metal (MPS) kernels")
        sources += sorted(glob.glob("csrc/mps/*.mm"))
        include_dirs += [ROOT, embed_metal_sources()]  # ROOT: metal/kernels/params.h
        macros += [("FUSEDOPS_WITH_MPS", None)]
        cxx += ["-fobjc-arc"]  # the .mm files rely on ARC; no effect on the C++ files
        link_args += ["-framework", "Metal", "-framework", "Foundation"]
    if not want_cuda(torch, cuda_home):
        return [
            cpp_extension.CppExtension(
                "fusedops._C",
                sources,
                include_dirs=include_dirs,
                extra_compile_args={"cxx": cxx},
                extra_link_args=link_args,
                define_macros=macros,
            )
        ]

    cutlass = cutlass_include_dir()
    archs, with_cutlass = hopper_archs(cuda_arch_list(torch), cutlass)
    os.environ["TORCH_CUDA_ARCH_LIST"] = archs  # read by cpp_extension at build time
    if with_cutlass:
        include_dirs.append(cutlass)
        macros.append(("FUSEDOPS_WITH_CUTLASS", None))
        log(f"CUTLASS: {cutlass}; archs {archs}")
    sources += sorted(glob.glob("csrc/cuda/*.cpp") + glob.glob("csrc/cuda/*.cu"))
    toolkit_include = os.path.join(cuda_home, "include")
    for d in pip_cuda_include_dirs():
        # After the toolkit's own headers, so a mismatched pip copy never shadows them.
        if d != toolkit_include:
            cxx += ["-idirafter", d]
    # Stringified in C++ (build_info): no quotes or ';' survive the shell that ninja runs.
    macros += [
        ("FUSEDOPS_WITH_CUDA", None),
        ("FUSEDOPS_CUDA_ARCHS", re.sub(r"[;\s]+", "-", archs.strip())),
    ]
    nvcc = ["-O3", "--expt-relaxed-constexpr", "-lineinfo"]
    lt_dir, lt_name = cublaslt_library(cuda_home)
    log(f"cuBLASLt: {lt_dir} (-l{lt_name})")
    return [
        cpp_extension.CUDAExtension(
            "fusedops._C",
            sources,
            include_dirs=include_dirs,
            library_dirs=[lt_dir],
            libraries=[lt_name],
            extra_link_args=[f"-Wl,-rpath,{lt_dir}", *link_args],
            extra_compile_args={"cxx": cxx, "nvcc": nvcc},
            define_macros=macros,
        )
    ]


def main():
    ext_modules = extensions()  # first: it sets CUDA_HOME before cpp_extension is imported
    from torch.utils.cpp_extension import BuildExtension

    setup(
        ext_modules=ext_modules,
        cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    )


if __name__ == "__main__":
    main()
