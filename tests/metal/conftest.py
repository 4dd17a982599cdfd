"""The Linux checks of the Metal backend. scripts/metal_check.sh runs them with
FUSEDOPS_METAL_CHECK=1; without it a plain `pytest tests` leaves this folder out (CI runs it as
its own stage, and it needs clang)."""

import os
import sys
import zlib
from pathlib import Path

import pytest
import torch

# mslcheck (here) and reference (tests/): scripts/metal_check.sh leaves tests/conftest.py out.
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]

import mslcheck  # noqa: E402

ENABLED = os.environ.get("FUSEDOPS_METAL_CHECK") == "1"


def pytest_ignore_collect(collection_path, config):
    return not ENABLED


def pytest_collection_modifyitems(config, items):
    if ENABLED and mslcheck.CLANG is None:
        raise pytest.UsageError(
            "the Metal checks need clang++ (scripts/metal_check.sh installs it)"
        )


@pytest.fixture(autouse=True)
def _seed(request):
    """Reproducible random inputs, different per test (as tests/conftest.py does)."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
