"""AOTInductor: a model built from fusedops modules exports (torch.export, with a dynamic batch
dimension), packages with torch._inductor.aoti_compile_and_package, loads with
aoti_load_package and runs in Python, matching eager. The package calls fusedops' operators
through the dispatcher, so the process that loads it must have imported fusedops (or, from C++,
linked the fusedops library): without it, loading fails with "Could not find schema for
fusedops::...".
"""

import os
import signal
import subprocess
import sys

import pytest
import torch

import fusedops

COLS = 64


class Block(torch.nn.Module):
    """Every fusedops module, in one forward."""

    def __init__(self):
        super().__init__()
        self.ln = fusedops.nn.LayerNorm(COLS)
        self.rms = fusedops.nn.RMSNorm(COLS)
        self.mlp = fusedops.FusedMLP(COLS, 2 * COLS)
        self.fc = torch.nn.Linear(COLS, COLS, bias=False)
        self.bias_gelu = fusedops.nn.BiasGELU(COLS)
        self.softmax = fusedops.nn.Softmax(-1)
        self.log_softmax = fusedops.nn.LogSoftmax(-1)

    def forward(self, x):
        h = self.mlp(self.rms(self.ln(x)))
        h = self.bias_gelu(self.fc(h))
        return self.softmax(h) + self.log_softmax(h)


def compile_load_run(device: str, folder: str) -> None:
    """Exports Block, packages it, loads the package and checks it against eager."""
    model = Block().to(device).eval()
    with torch.no_grad():
        torch.nn.init.normal_(model.bias_gelu.bias)
        x = torch.randn(8, COLS, device=device)
        batch = torch.export.Dim("batch", min=1, max=1024)
        program = torch.export.export(model, (x,), dynamic_shapes={"x": {0: batch}})
        path = torch._inductor.aoti_compile_and_package(
            program, package_path=os.path.join(folder, "block.pt2")
        )
        loaded = torch._inductor.aoti_load_package(path)
        for rows in (8, 3, 129):
            xi = torch.randn(rows, COLS, device=device)
            torch.testing.assert_close(loaded(xi), model(xi))


@pytest.mark.slow
def test_aoti_compile_package_load_run(device, tmp_path):
    if device == "mps":
        pytest.skip("AOTInductor's MPS backend is not covered here")
    if not hasattr(torch._inductor, "aoti_load_package"):
        pytest.skip(
            f"torch {torch.__version__} has no aoti_compile_and_package / aoti_load_package"
        )
    # In a child process: a crash inside torch's package loader must fail this test, not the run.
    # The child imports the fusedops this process imported, however pytest found it.
    checkout = os.path.dirname(os.path.dirname(fusedops.__file__))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([checkout, os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, __file__, device, str(tmp_path)], capture_output=True, text=True, env=env
    )
    if proc.returncode == -signal.SIGSEGV:
        # Seen on one machine image (torch 2.11 wheel, g++ 13.3): aoti_load_package segfaults
        # for the CPU and the CUDA package alike; with torch 2.14 the CPU package loads and runs.
        pytest.xfail(f"aoti_load_package segfaults with torch {torch.__version__} here")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


if __name__ == "__main__":
    compile_load_run(sys.argv[1], sys.argv[2])
