"""What the build says about itself: fusedops.build_info() and `python -m fusedops`."""

import json
import subprocess
import sys

import torch

import fusedops


def _major_minor(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def test_build_info_keys_and_torch_version():
    info = fusedops.build_info()
    assert {"torch", "backends", "runtime_torch", "fusedops"} <= set(info)
    assert info["fusedops"] == fusedops.__version__
    assert info["runtime_torch"] == torch.__version__
    # An extension only runs against the torch it was built with (no stable C++ ABI).
    assert _major_minor(info["torch"]) == _major_minor(torch.__version__), info


def test_build_info_backends():
    info = fusedops.build_info()
    backends = info["backends"]
    assert isinstance(backends, list) and "CPU" in backends
    assert set(backends) <= {"CPU", "CUDA", "MPS"}
    if torch.cuda.is_available():
        assert "CUDA" in backends, f"a CUDA device is present but the build has none: {info}"
    if "CUDA" in backends:
        assert info.get("cuda") and info.get("cuda_archs"), info
    if hasattr(torch.backends, "mps") and torch.backends.mps.is_available():
        assert "MPS" in backends, f"an MPS device is present but the build has none: {info}"


def test_python_m_fusedops_runs():
    proc = subprocess.run(
        [sys.executable, "-m", "fusedops"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    assert printed == json.loads(json.dumps(fusedops.build_info()))
