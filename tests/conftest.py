"""Device parametrization, per-test seeding and the `cuda` marker.

- The `device` fixture runs a test on "cpu" always, on "cuda" when torch.cuda.is_available() and
  on "mps" when torch.backends.mps.is_available(); absent devices are skipped, not failed.
- A test marked `cuda` is skipped when there is no CUDA device.
- A device that is present but has no fusedops kernels in this build fails loudly: that is a
  build problem (e.g. built with FUSEDOPS_CUDA=0), not a reason to skip.
- Every test starts from torch.manual_seed(<hash of its id>): reproducible, and different per test.
- A test marked `bigmem` needs most of the GPU's memory: it holds a file lock shared by every
  process on the machine while it runs, so pytest-xdist workers (`pytest -n auto`) run such tests
  one at a time, and it hands its cached memory back before the next one starts. (xdist's own
  `--dist loadgroup` would do the scheduling part, but with pytest >= 9 its group marks are
  silently ignored: it renames items through an attribute pytest no longer reads.)
- Hypothesis profiles (tests/test_properties.py): "ci", the default, a small example budget;
  `--hypothesis-profile gpu` a large one for the GPU machine. Examples are derandomized in "ci"
  (the same examples every run: CI is red or green by the code, not by luck).
"""

import fcntl
import gc
import importlib
import os
import tempfile
import zlib

import pytest
import torch
from hypothesis import HealthCheck, settings

import fusedops

_PROFILE = {
    "deadline": None,  # kernels' first calls (and compiles) are slow; budgets count examples
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
}
settings.register_profile("ci", max_examples=60, derandomize=True, **_PROFILE)
settings.register_profile("gpu", max_examples=400, **_PROFILE)
# torch's test internals (test_opinfo imports op_db) load a hypothesis profile of their own when
# first imported, and @given binds the profile current at its import: import them here first, so
# that ours is the one loaded (--hypothesis-profile, applied after conftest, still wins).
importlib.import_module("torch.testing._internal.common_utils")
settings.load_profile("ci")


HAS_CUDA = torch.cuda.is_available()
HAS_MPS = hasattr(torch.backends, "mps") and torch.backends.mps.is_available()

_BACKEND_OF = {"cpu": "CPU", "cuda": "CUDA", "mps": "MPS"}

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param(
        "cuda",
        id="cuda",
        marks=[pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")],
    ),
    pytest.param("mps", id="mps", marks=pytest.mark.skipif(not HAS_MPS, reason="no MPS device")),
]


def require_backend(device: str) -> None:
    """Fails the test when `device` exists but this build of fusedops has no kernels for it."""
    backend = _BACKEND_OF[torch.device(device).type]
    if backend not in fusedops.build_info()["backends"]:
        pytest.fail(
            f"a {backend} device is present but this fusedops build has no {backend} kernels "
            f"(backends: {fusedops.build_info()['backends']}); rebuild fusedops for it"
        )


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    require_backend(request.param)
    return request.param


@pytest.fixture
def cuda_device() -> str:
    """ "cuda" for tests that only make sense there (mark them `cuda` too)."""
    if not HAS_CUDA:
        pytest.skip("no CUDA device")
    require_backend("cuda")
    return "cuda"


def pytest_runtest_setup(item):
    if item.get_closest_marker("cuda") is not None and not HAS_CUDA:
        pytest.skip("no CUDA device")


@pytest.fixture(autouse=True)
def _seed(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    yield


@pytest.fixture(autouse=True)
def _bigmem_one_at_a_time(request):
    if request.node.get_closest_marker("bigmem") is None:
        yield
        return
    with open(os.path.join(tempfile.gettempdir(), "fusedops-tests-bigmem.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            gc.collect()
            if HAS_CUDA:
                torch.cuda.empty_cache()
            fcntl.flock(lock, fcntl.LOCK_UN)
