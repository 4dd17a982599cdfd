"""Check 3: the Objective-C++ host (csrc/mps/*.mm) compiles (syntax only) against the real macOS
torch headers and the Foundation/Metal stubs, for the macOS 14 and 15 SDK views, and passes the
host lint (buffer offsets in bytes, torch's own encoder, no check inside its dispatch_sync block,
no fast math)."""

import pytest
from mslcheck import HOST_DIR, SDKS, host_lint, host_syntax_check

HOST_FILES = sorted(HOST_DIR.glob("*.mm"))
NO_HOST = pytest.mark.skipif(not HOST_FILES, reason="no csrc/mps/*.mm host yet")


@NO_HOST
@pytest.mark.parametrize("sdk", SDKS)
@pytest.mark.parametrize("mm", HOST_FILES, ids=lambda p: p.name)
def test_host_syntax(mm, sdk):
    host_syntax_check(mm, sdk)


@NO_HOST
@pytest.mark.parametrize("mm", HOST_FILES, ids=lambda p: p.name)
def test_host_lint(mm):
    assert host_lint(mm.read_text()) == []


# The lint's other rules on small snippets (the wrong offset is in test_planted.py).
BAD_HOST = {
    "own encoder": "id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoder];",
    "end encoding": "[enc endEncoding];",
    "commit": "[cb commit];",
    "check in block": 'dispatch_sync(q, ^{ TORCH_CHECK(n > 0, "n"); [enc setBytes:&n length:4'
    " atIndex:0]; });",
    "fast math": "options.fastMathEnabled = YES;",
}


@pytest.mark.parametrize("what", BAD_HOST)
def test_host_lint_rejects(what):
    assert host_lint(BAD_HOST[what]), f"{what} passed the lint"
