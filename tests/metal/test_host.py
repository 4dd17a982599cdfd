"""Check 3: the Objective-C++ host (csrc/mps/*.mm) compiles (syntax only) against the real macOS
torch headers and the Foundation/Metal stubs, for the macOS 14 and 15 SDK views, and passes the
host lint (buffer offsets in bytes, torch's own encoder, no fast math)."""

import pytest
from mslcheck import HOST_DIR, SDKS, host_lint, host_syntax_check

HOST_FILES = sorted(HOST_DIR.glob("*.mm"))
pytestmark = pytest.mark.skipif(not HOST_FILES, reason="no csrc/mps/*.mm host yet")


@pytest.mark.parametrize("sdk", SDKS)
@pytest.mark.parametrize("mm", HOST_FILES, ids=lambda p: p.name)
def test_host_syntax(mm, sdk):
    host_syntax_check(mm, sdk)


@pytest.mark.parametrize("mm", HOST_FILES, ids=lambda p: p.name)
def test_host_lint(mm):
    assert host_lint(mm.read_text()) == []
