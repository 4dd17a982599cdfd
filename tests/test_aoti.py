"""AOTInductor: a model built from fusedops modules exports (torch.export, with a dynamic batch
dimension), packages with torch._inductor.aoti_compile_and_package, loads with
aoti_load_package and runs in Python, matching eager. The package calls fusedops' operators
through the dispatcher, so the process that loads it must have imported fusedops (or, from C++,
linked the fusedops library): without it, loading fails with "Could not find schema for
fusedops::...".
"""

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


@pytest.mark.slow
def test_aoti_compile_package_load_run(device, tmp_path):
    if device == "mps":
        pytest.skip("AOTInductor's MPS backend is not covered here")
    if not hasattr(torch._inductor, "aoti_load_package"):
        pytest.skip(
            f"torch {torch.__version__} has no aoti_compile_and_package / aoti_load_package"
        )
    model = Block().to(device).eval()
    with torch.no_grad():
        torch.nn.init.normal_(model.bias_gelu.bias)
        x = torch.randn(8, COLS, device=device)
        batch = torch.export.Dim("batch", min=1, max=1024)
        program = torch.export.export(model, (x,), dynamic_shapes={"x": {0: batch}})
        path = torch._inductor.aoti_compile_and_package(
            program, package_path=str(tmp_path / "block.pt2")
        )
        loaded = torch._inductor.aoti_load_package(path)
        for rows in (8, 3, 129):
            xi = torch.randn(rows, COLS, device=device)
            torch.testing.assert_close(loaded(xi), model(xi))
