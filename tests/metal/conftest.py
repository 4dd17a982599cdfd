"""The Linux checks of the Metal backend. scripts/metal_check.sh runs them with
FUSEDOPS_METAL_CHECK=1; without it a plain `pytest tests` leaves this folder out (CI runs it as
its own stage, and it needs clang)."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import mslcheck  # noqa: E402

ENABLED = os.environ.get("FUSEDOPS_METAL_CHECK") == "1"


def pytest_ignore_collect(collection_path, config):
    return not ENABLED


def pytest_collection_modifyitems(config, items):
    if ENABLED and mslcheck.CLANG is None:
        raise pytest.UsageError(
            "the Metal checks need clang++ (scripts/metal_check.sh installs it)"
        )
