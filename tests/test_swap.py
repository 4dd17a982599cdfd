"""fusedops.swap: each recognised pattern, what is left and why, undo, state_dicts, training,
torch.compile and CUDA graphs. Models are built from configs with random weights (no downloads);
transformers and timm are optional (their tests skip without them)."""

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from reference import ATOL_GEMM, assert_close_to_reference, capture_cuda_graph
from torch import nn

import fusedops
from fusedops.swap import FusedChain, FusedSequential, SwapReport, WeightDtypeRMSNorm


class TimmLikeMlp(nn.Module):
    """timm's Mlp: fc1 / act / drop1 / norm / fc2 / drop2, called in that order."""

    def __init__(self, d, hidden, drop=0.0):
        super().__init__()
        self.fc1, self.act, self.drop1 = nn.Linear(d, hidden), nn.GELU(), nn.Dropout(drop)
        self.norm, self.fc2, self.drop2 = nn.Identity(), nn.Linear(hidden, d), nn.Dropout(drop)

    def forward(self, x):
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(self.fc1(x))))))


class Net(nn.Module):
    """One of every torch.nn pattern swap recognises, in a forward that uses them all."""

    def __init__(self, d=32, drop=0.0):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU("tanh"), nn.Linear(4 * d, d))
        self.rms = nn.RMSNorm(d, eps=1e-6)
        self.block = TimmLikeMlp(d, 2 * d, drop)
        self.softmax = nn.Softmax(dim=-1)
        self.log_softmax = nn.LogSoftmax(dim=-1)

    def forward(self, x):
        x = x + self.mlp(self.ln(x))
        x = x + self.block(self.rms(x))
        return self.log_softmax(x) + self.softmax(x)


NET_SWAPS = {
    "ln": "fusedops.nn.LayerNorm",
    "mlp": "fusedops.swap.FusedSequential: fused_mlp(0, 1, 2; tanh)",
    "rms": "fusedops.nn.RMSNorm",
    "block": "fusedops.swap.FusedChain: fused_mlp(fc1, act, drop1, norm, fc2; none)",
    "softmax": "fusedops.nn.Softmax",
    "log_softmax": "fusedops.nn.LogSoftmax",
}


def fp64_twin(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model).to("cpu", torch.float64)


def assert_rule(out, torch_out, ref, what="output"):
    """The tolerance rule (tests/reference.py), with the matrix-product ATOL: models hold GEMMs."""
    assert_close_to_reference(out, torch_out, ref, torch_out.dtype, what, atol=ATOL_GEMM)


def module_ids(model):
    return [(path, id(m)) for path, m in model.named_modules()]


def rows_by_path(report):
    return {r.path: r for r in report.rows}


def fresh(make, device="cpu", dtype=torch.float32, train=False):
    model = make().to(device, dtype)
    return model.train(train)


# ------------------------------------------------------------------------------------------------
# torch.nn patterns
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_patterns(dtype, device):
    model = fresh(Net, device, dtype)
    original = copy.deepcopy(model)
    report = fusedops.swap(model)
    assert {r.path: r.replacement for r in report.rows} == NET_SWAPS
    assert all(r.reason is None for r in report.rows)
    assert report.swapped == len(NET_SWAPS)
    assert type(model.ln) is fusedops.nn.LayerNorm and type(model.rms) is fusedops.nn.RMSNorm
    assert type(model.mlp) is FusedSequential and type(model.block) is FusedChain
    assert type(model.softmax) is fusedops.nn.Softmax
    assert type(model.log_softmax) is fusedops.nn.LogSoftmax

    x = torch.randn(3, 5, 32, device=device, dtype=dtype)
    assert_rule(model(x), original(x), fp64_twin(original)(x.double().cpu()))


def test_parameters_are_the_same_objects(device):
    model = fresh(Net, device)
    before = [(name, id(p)) for name, p in model.named_parameters()]
    children = (model.mlp[0], model.mlp[2], model.block.fc1, model.block.fc2)
    fusedops.swap(model)
    assert [(name, id(p)) for name, p in model.named_parameters()] == before
    now = (model.mlp[0], model.mlp[2], model.block.fc1, model.block.fc2)
    assert all(a is b for a, b in zip(now, children, strict=True))


def test_state_dict_loads_both_ways(device):
    model = fresh(Net, device)
    other = fresh(Net, device)  # different random weights
    keys = {k: v.shape for k, v in model.state_dict().items()}
    fusedops.swap(model)
    assert {k: v.shape for k, v in model.state_dict().items()} == keys
    assert list(model.state_dict()) == list(keys)  # the same order too

    model.load_state_dict(other.state_dict())  # original -> swapped
    for k, v in other.state_dict().items():
        assert torch.equal(model.state_dict()[k], v)
    third = fresh(Net, device)
    third.load_state_dict(model.state_dict())  # swapped -> original
    x = torch.randn(4, 32, device=device)
    assert_rule(model(x), third(x), fp64_twin(third)(x.double().cpu()))


@pytest.mark.parametrize("train", [False, True])
def test_mode_device_dtype_kept(train, device):
    model = fresh(Net, device, torch.bfloat16, train)
    fusedops.swap(model)
    for path, module in model.named_modules():
        assert module.training == train, path
    for name, t in model.state_dict().items():
        assert t.dtype == torch.bfloat16 and t.device.type == device, name


def test_optimizer_built_before_swap_keeps_working(device):
    model = fresh(Net, device, train=True)
    twin = copy.deepcopy(model)
    initial = copy.deepcopy(model.state_dict())
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, twin)]
    fusedops.swap(model)
    x, target = torch.randn(8, 32, device=device), torch.randn(8, 32, device=device)
    for _ in range(3):
        for m, opt in zip((model, twin), opts, strict=True):
            opt.zero_grad()
            F.mse_loss(m(x), target).backward()
            opt.step()
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        assert not torch.equal(p, initial[name]), name
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)


def test_trains_like_the_original(device):
    """50 Adam steps on one batch: the loss falls as the original's does."""
    model = fresh(lambda: nn.Sequential(Net(), nn.Linear(32, 4)), device, train=True)
    twin = copy.deepcopy(model)
    fusedops.swap(model)
    x, target = torch.randn(64, 32, device=device), torch.randn(64, 4, device=device)
    losses = {}
    for name, m in (("swapped", model), ("original", twin)):
        opt = torch.optim.Adam(m.parameters(), lr=3e-3)
        curve = []
        for _ in range(50):
            opt.zero_grad()
            loss = F.mse_loss(m(x), target)
            loss.backward()
            opt.step()
            curve.append(loss.item())
        losses[name] = curve
    first, last = losses["original"][0], losses["original"][-1]
    assert last < 0.5 * first
    assert losses["swapped"][0] == pytest.approx(first, rel=1e-4)
    assert losses["swapped"][-1] == pytest.approx(last, rel=0.05, abs=0.01 * first)


def test_second_swap_changes_nothing(device):
    model = fresh(Net, device)
    fusedops.swap(model)
    ids = module_ids(model)
    again = fusedops.swap(model)
    assert again.swapped == 0
    assert module_ids(model) == ids
    assert all(r.replacement is None for r in again.rows)
    assert {r.path for r in again.rows} == set(NET_SWAPS)
    assert {r.reason for r in again.rows} == {"already a fusedops module"}


def test_dry_run_only_reports(device):
    model = fresh(Net, device)
    ids = module_ids(model)
    dry = fusedops.swap(model, dry_run=True)
    assert module_ids(model) == ids
    assert dry.swapped == 0 and dry.dry_run
    assert "dry run: nothing replaced" in str(dry)
    real = fusedops.swap(model)
    assert dry.rows == real.rows


def test_undo_restores_exactly(device):
    model = fresh(Net, device)
    ids, types = module_ids(model), [type(m) for m in model.modules()]
    state = {k: id(v) for k, v in model.state_dict(keep_vars=True).items()}
    x = torch.randn(4, 32, device=device)
    before = model(x)
    report = fusedops.swap(model)
    model.train()  # a mode change after the swap carries over to the restored modules
    report.undo()
    assert module_ids(model) == ids
    assert [type(m) for m in model.modules()] == types
    assert {k: id(v) for k, v in model.state_dict(keep_vars=True).items()} == state
    assert all(m.training for m in model.modules())
    assert torch.equal(model.eval()(x), before)
    report.undo()  # a second undo has nothing left to do
    assert module_ids(model) == ids


def test_undo_refuses_when_the_replacement_was_replaced(device):
    model = fresh(Net, device)
    report = fusedops.swap(model)
    model.ln = nn.LayerNorm(32)
    with pytest.raises(RuntimeError, match="fusedops.swap: undo: ln no longer holds"):
        report.undo()


def test_shared_module_replaced_everywhere(device):
    ln = nn.LayerNorm(16)
    model = nn.Sequential(ln, nn.Tanh(), ln).to(device)
    report = fusedops.swap(model)
    assert [r.path for r in report.rows] == ["0"]  # named_modules lists a shared module once
    assert report.swapped == 1
    assert type(model[0]) is fusedops.nn.LayerNorm and model[0] is model[2]
    report.undo()
    assert model[0] is ln and model[2] is ln


@pytest.mark.parametrize(
    "options, expected",
    [
        ({"softmax": False}, {"softmax", "log_softmax"}),
        ({"norms": False}, {"ln", "rms"}),
        ({"mlp": False, "gelu": False}, {"mlp", "block"}),
    ],
)
def test_options_leave_their_patterns(options, expected, device):
    model = fresh(Net, device)
    report = fusedops.swap(model, **options)
    assert {r.path for r in report.rows} == set(NET_SWAPS) - expected


def test_gelu_only_without_mlp(device):
    """mlp=False: Linear -> GELU runs as linear + bias_gelu with the Linear's own Parameters."""
    model = fresh(Net, device)
    original = copy.deepcopy(model)
    keys = list(model.state_dict())
    report = fusedops.swap(model, mlp=False)
    rows = rows_by_path(report)
    assert rows["mlp"].replacement == "fusedops.swap.FusedSequential: bias_gelu(0, 1; tanh)"
    assert rows["block"].replacement == "fusedops.swap.FusedChain: bias_gelu(fc1, act; none)"
    assert list(model.state_dict()) == keys
    x = torch.randn(6, 32, device=device)
    assert_rule(model(x), original(x), fp64_twin(original)(x.double().cpu()))


@pytest.mark.parametrize("mlp", [True, False])
def test_autocast(mlp, device):
    """Under autocast the swapped model returns what the original returns, in its dtype."""
    model = fresh(Net, device)
    original = copy.deepcopy(model)
    fusedops.swap(model, mlp=mlp)
    x = torch.randn(8, 32, device=device)
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        out, want = model(x), original(x)
    assert out.dtype == want.dtype
    assert_rule(out, want, fp64_twin(original)(x.double().cpu()))


def test_mlp_with_dropout_in_eval_then_training(device):
    """Dropout p > 0 between the Linears: fused in eval mode; after model.train() the block runs
    its modules unfused (same random stream as the original's)."""
    model = fresh(lambda: Net(drop=0.3), device)
    original = copy.deepcopy(model)
    rows = rows_by_path(fusedops.swap(model))
    assert rows["block"].replacement == NET_SWAPS["block"]
    model.train()
    original.train()
    x = torch.randn(16, 32, device=device)
    torch.manual_seed(1)
    got = model(x)
    torch.manual_seed(1)
    want = original(x)
    assert_rule(got, want, fp64_twin(original)(x.double().cpu()).detach())


# ------------------------------------------------------------------------------------------------
# What is left, and why
# ------------------------------------------------------------------------------------------------


class QuickGELU(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


class GemmaLikeRMSNorm(nn.Module):
    """(1 + weight) * x / rms: shaped like LLaMA's RMSNorm but not weight * x / rms."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.zeros(d)), eps

    def forward(self, x):
        return (1 + self.weight) * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class ScaledLayerNorm(nn.LayerNorm):
    def forward(self, x):
        return 2 * super().forward(x)


class GatedMlp(nn.Module):
    """LLaMA's MLP shape: down(act(gate(x)) * up(x)), not a chain."""

    def __init__(self, d):
        super().__init__()
        self.gate, self.up, self.down = (
            nn.Linear(d, 2 * d),
            nn.Linear(d, 2 * d),
            nn.Linear(2 * d, d),
        )
        self.act = nn.GELU()

    def forward(self, x):
        return self.down(self.act(self.gate(x)) * self.up(x))


def hooked_layer_norm():
    ln = nn.LayerNorm(16)
    ln.register_forward_hook(lambda *args: None)
    return ln


LEFT = [
    pytest.param(
        lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)),
        "1 (ReLU) is not GELU (checked numerically)",
        id="relu",
    ),
    pytest.param(
        lambda: nn.Sequential(nn.Linear(16, 32), QuickGELU(), nn.Linear(32, 16)),
        "1 (QuickGELU) is not GELU (checked numerically)",
        id="quick-gelu",
    ),
    pytest.param(
        lambda: nn.Sequential(nn.Linear(16, 32, bias=False), nn.GELU()),
        "0 -> 1 not fused: 0 has no bias: nothing to fuse into the GELU",
        id="no-bias",
    ),
    pytest.param(
        lambda: GemmaLikeRMSNorm(16),
        "it computes something other than weight * x / rms (checked numerically)",
        id="gemma-rmsnorm",
    ),
    pytest.param(
        lambda: ScaledLayerNorm(16),
        "its forward is not torch's layer_norm (checked numerically)",
        id="ln-subclass",
    ),
    pytest.param(
        lambda: GatedMlp(16),
        "its forward is not a plain chain of its children (x feeds several)",
        id="gated",
    ),
    pytest.param(hooked_layer_norm, "it has hooks, which a replacement would not call", id="hook"),
]


@pytest.mark.parametrize("make, reason", LEFT)
def test_left_with_reason(make, reason, device):
    model = fresh(lambda: nn.Sequential(make()), device, train=True)
    ids = module_ids(model)
    report = fusedops.swap(model)
    assert [(r.path, r.replacement, r.reason) for r in report.rows] == [("0", None, reason)]
    assert module_ids(model) == ids and report.swapped == 0


def test_dropout_in_training_mode_leaves_the_mlp(device):
    model = fresh(lambda: nn.Sequential(TimmLikeMlp(16, 32, drop=0.1)), device, train=True)
    (row,) = fusedops.swap(model, dry_run=True).rows
    note = "not fused as an MLP: dropout drop1 (p=0.1) between fc1 and fc2 is in training mode"
    assert row.replacement == "fusedops.swap.FusedChain: bias_gelu(fc1, act; none)"
    assert row.reason == note
    (row,) = fusedops.swap(model, gelu=False).rows
    assert (row.replacement, row.reason) == (None, note)
    assert type(model[0]) is TimmLikeMlp


def forward_set_on_instance():
    ln = nn.LayerNorm(16)
    ln.forward = lambda x: nn.LayerNorm.forward(ln, x)  # as accelerate's hooks do
    return ln


def test_forward_set_on_the_instance_is_left(device):
    model = fresh(lambda: nn.Sequential(forward_set_on_instance()), device)
    (row,) = fusedops.swap(model).rows
    assert (row.replacement, row.reason) == (
        None,
        "it has its own forward set on the instance, which would not run",
    )


def test_random_stream_untouched(device):
    model = fresh(lambda: nn.Sequential(Net(), GemmaLikeRMSNorm(32), nn.LayerNorm(32)), device)
    state = torch.get_rng_state()
    fusedops.swap(model)
    assert torch.equal(torch.get_rng_state(), state)


def test_containers_without_forward_are_not_considered(device):
    model = nn.Sequential(nn.ModuleList([nn.Linear(8, 8), nn.GELU()])).to(device)
    assert fusedops.swap(model).rows == []


def test_the_model_itself_is_left(device):
    model = nn.LayerNorm(8).to(device)
    (row,) = fusedops.swap(model).rows
    assert row.path == "" and row.replacement is None
    assert row.reason == "it is the model itself: swap replaces modules inside it"


def test_device_without_kernels_is_left(monkeypatch, device):
    info = fusedops.build_info()
    monkeypatch.setattr(fusedops, "build_info", lambda: {**info, "backends": []})
    report = fusedops.swap(fresh(Net, device))
    assert {r.path for r in report.rows} == set(NET_SWAPS) and report.swapped == 0
    for row in report.rows:
        assert row.replacement is None
        assert f"this fusedops build has no {torch.device(device).type} kernels" in row.reason


@pytest.mark.cuda
def test_cuda_fp64_model_is_swapped(cuda_device):
    model = fresh(Net, cuda_device, torch.float64)
    rows = rows_by_path(fusedops.swap(model))
    for path, replacement in NET_SWAPS.items():
        assert rows[path].replacement == replacement, rows[path].reason


@pytest.mark.parametrize(
    "act, hidden, fusable",
    [(nn.ReLU, 64, True), (nn.GELU, 128, True), (nn.ReLU, 128, False)],
    ids=["relu-64", "gelu-128", "relu-128"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_small_mlp_becomes_fully_fused(act, hidden, fusable, dtype, device):
    # Two hidden layers: FullyFusedMLP where its kernels run (CUDA sm_80+, 16-bit) and swap takes
    # the width for the activation (GELUs up to 128, ReLU up to 64); elsewhere ReLU doesn't fuse
    # and GELU chains take the chain rules.
    torch.manual_seed(0)
    field = nn.Sequential(
        nn.Linear(32, hidden), act(), nn.Linear(hidden, hidden), act(), nn.Linear(hidden, 8)
    )
    model = nn.Sequential(field).to(device, dtype).eval()  # swap replaces inside the model
    ref_model = fp64_twin(model)
    x = torch.randn(100, 32, device=device, dtype=dtype)
    expected = model(x)
    report = fusedops.swap(model)
    fused = fusable and device == "cuda" and dtype == torch.bfloat16
    fused = fused and torch.cuda.get_device_capability()[0] >= 8
    assert isinstance(model[0], fusedops.nn.FullyFusedMLP) == fused
    if fused:
        row = rows_by_path(report)["0"]
        name = "relu" if act is nn.ReLU else "gelu"
        assert row.replacement == f"fusedops.nn.FullyFusedMLP: 2 hidden layers of {hidden}, {name}"
        assert list(model[0]) == list(field)  # the same modules
    assert_rule(model(x), expected, ref_model(x.double().cpu()))
    report.undo()
    assert model[0] is field


def test_report_text_and_dict(device):
    model = fresh(lambda: nn.Sequential(Net(), nn.Sequential(nn.Linear(8, 8), nn.ReLU())), device)
    report = fusedops.swap(model)
    text = str(report)
    for row in report.rows:
        assert row.path in text
    assert "left: 1 (ReLU) is not GELU" in text
    assert text.splitlines()[-1] == "6 of 7 considered modules fusable (6 replaced)"
    data = json.loads(json.dumps(report.to_dict()))
    assert data["swapped"] == 6 and len(data["rows"]) == 7
    assert data["rows"][0] == {
        "path": "0.ln",
        "original": "LayerNorm",
        "replacement": "fusedops.nn.LayerNorm",
        "reason": None,
    }
    assert isinstance(report, SwapReport) and "swapped=6" in repr(report)


def test_bad_model():
    with pytest.raises(TypeError, match="fusedops.swap: model must be a torch.nn.Module, got dict"):
        fusedops.swap({})


# ------------------------------------------------------------------------------------------------
# GPT-2's layout: weights stored [in, out], passed to fused_mlp as weight.t() (a view)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("n_in, hidden", [(64, 256), (24, 37)])  # aligned / odd (CUDA fallback)
def test_fused_mlp_reads_transposed_weights_in_place(n_in, hidden, approximate, dtype, device):
    stored = [  # Conv1D's layout: w1 [in, hidden], w2 [hidden, in]
        (torch.randn(n_in, hidden, device=device) / n_in**0.5).to(dtype).requires_grad_(),
        torch.randn(hidden, device=device, dtype=dtype, requires_grad=True),
        (torch.randn(hidden, n_in, device=device) / hidden**0.5).to(dtype).requires_grad_(),
        torch.randn(n_in, device=device, dtype=dtype, requires_grad=True),
    ]
    w1, b1, w2, b2 = stored
    x = torch.randn(3, 5, n_in, device=device, dtype=dtype, requires_grad=True)

    def copies(w1, w2):
        """The copy ops fused_mlp runs (addmm fills its output with the bias by one on CPU)."""
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            y = fusedops.fused_mlp(x, w1, b1, w2, b2, approximate)
        return y, sorted(e.name for e in prof.events() if e.name in ("aten::copy_", "aten::clone"))

    w1_t, w2_t = w1.t(), w2.t()
    linear_layout = w1_t.contiguous(), w2_t.contiguous()  # nn.Linear's [out, in]
    y, copied = copies(w1_t, w2_t)
    assert copied == copies(*linear_layout)[1]  # no copy of the weights

    def composed(x, w1, b1, w2, b2):
        return F.linear(F.gelu(F.linear(x, w1.t(), b1), approximate=approximate), w2.t(), b2)

    leaves = [x, *stored]
    torch_leaves = [t.detach().clone().requires_grad_() for t in leaves]
    ref_leaves = [t.detach().double().cpu().requires_grad_() for t in leaves]
    y_torch, y_ref = composed(*torch_leaves), composed(*ref_leaves)
    assert_rule(y, y_torch, y_ref)
    dy = torch.randn_like(y)
    for out, grad in ((y, dy), (y_torch, dy), (y_ref, dy.double().cpu())):
        out.backward(grad)
    names = ["dx", "dw1", "db1", "dw2", "db2"]
    for name, t, tt, tr in zip(names, leaves, torch_leaves, ref_leaves, strict=True):
        # .grad in the parameter's own layout: weights stay [in, out] for the optimizer
        assert t.grad.shape == t.shape and t.grad.stride() == t.stride(), name
        assert_rule(t.grad, tt.grad, tr.grad, name)


# ------------------------------------------------------------------------------------------------
# torch.compile and CUDA graphs
# ------------------------------------------------------------------------------------------------


def test_compile_fullgraph(device):
    model = fresh(Net, device, train=True)
    # The original compiles with no graph break, so the swapped model must too.
    torch.compile(copy.deepcopy(model), backend="eager", fullgraph=True)(
        torch.randn(2, 32, device=device)
    )
    fusedops.swap(model)
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(4, 7, 32, device=device)
    y, y_eager = compiled(x), model(x)
    torch.testing.assert_close(y, y_eager)
    dy = torch.randn_like(y)
    params = list(model.parameters())
    for g, g_eager in zip(
        torch.autograd.grad(y, params, dy), torch.autograd.grad(y_eager, params, dy), strict=True
    ):
        torch.testing.assert_close(g, g_eager)


@pytest.mark.cuda
def test_cuda_graph(cuda_device):
    model = fresh(lambda: Net(d=256), cuda_device, torch.bfloat16)
    fusedops.swap(model)
    x = torch.randn(64, 256, device=cuda_device, dtype=torch.bfloat16)
    graph, (static,) = capture_cuda_graph(lambda: (model(x),))
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static, model(x))


# ------------------------------------------------------------------------------------------------
# Hugging Face models (transformers) and timm
# ------------------------------------------------------------------------------------------------


def hf_model(name):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    small = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4}
    tokens = torch.randint(0, 100, (2, 12))
    if name == "gpt2":
        config = transformers.GPT2Config(
            n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab_size=100
        )
        return transformers.GPT2LMHeadModel(config), tokens, lambda out: out.logits
    if name == "bert":
        config = transformers.BertConfig(**small, intermediate_size=128, vocab_size=100)
        return transformers.BertModel(config), tokens, lambda out: out.last_hidden_state
    if name == "vit":
        config = transformers.ViTConfig(**small, intermediate_size=128, image_size=32, patch_size=8)
        return (
            transformers.ViTModel(config),
            torch.randn(2, 3, 32, 32),
            lambda out: out.last_hidden_state,
        )
    config = transformers.LlamaConfig(
        **small, num_key_value_heads=2, intermediate_size=128, vocab_size=100
    )
    return transformers.LlamaModel(config), tokens, lambda out: out.last_hidden_state


# Each model's rows: (path suffix, replacement), every row of the report in order of paths.
# The replacement of each original type swapped in each model (ViT's MLP class differs between
# transformers versions: ViTIntermediate, ViTMLP).
HF_EXPECTED = {
    "gpt2": {
        "LayerNorm": "fusedops.nn.LayerNorm",
        "GPT2MLP": "fusedops.swap.FusedChain: fused_mlp(c_fc, act, c_proj; tanh)",
    },
    "bert": {
        "LayerNorm": "fusedops.nn.LayerNorm",
        "BertIntermediate": "fusedops.swap.FusedChain: bias_gelu(dense, intermediate_act_fn; none)",
    },
    "vit": {"LayerNorm": "fusedops.nn.LayerNorm"},
    "llama": {"LlamaRMSNorm": "fusedops.swap.WeightDtypeRMSNorm"},
}


# 2 layers: GPT-2 2 x (2 LayerNorms + MLP) + ln_f; BERT embeddings' LayerNorm + 2 x (2 LayerNorms +
# intermediate); ViT 2 x (2 LayerNorms + MLP) + final LayerNorm; LLaMA 2 x 2 RMSNorms + final.
HF_SWAPPED = {"gpt2": 7, "bert": 7, "vit": 7, "llama": 5}


@pytest.mark.parametrize("name", ["gpt2", "bert", "vit", "llama"])
def test_hugging_face_models(name, device):
    model, inputs, output = hf_model(name)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = model.to(device, dtype).eval()
    original = copy.deepcopy(model)
    params = [id(p) for p in model.parameters()]
    keys = {k: v.shape for k, v in model.state_dict().items()}
    report = fusedops.swap(model)

    swapped = [r for r in report.rows if r.replacement is not None]
    assert report.swapped == len(swapped) == HF_SWAPPED[name]
    expected = HF_EXPECTED[name]
    assert {(r.original, r.replacement) for r in swapped if r.original in expected} == set(
        expected.items()
    )
    left = {r.original: r.reason for r in report.rows if r.replacement is None}
    if name == "llama":
        assert left == {
            "LlamaMLP": "its forward is not a plain chain of its children (x feeds several)"
        }
    if name == "vit":
        assert any("fused_mlp" in r.replacement or "bias_gelu" in r.replacement for r in swapped)
    assert [id(p) for p in model.parameters()] == params
    assert {k: v.shape for k, v in model.state_dict().items()} == keys

    floating = inputs.is_floating_point()  # ViT's pixels; token ids for the others
    inputs = inputs.to(device, dtype) if floating else inputs.to(device)
    ref_inputs = inputs.double().cpu() if floating else inputs.cpu()
    with torch.no_grad():
        out, want = output(model(inputs)), output(original(inputs))
        assert_rule(out, want, output(fp64_twin(original)(ref_inputs)))


def test_gpt2_compile_fullgraph(device):
    model, tokens, output = hf_model("gpt2")
    model = model.to(device).eval()
    tokens = tokens.to(device)
    # The original compiles with no graph break, so the swapped model must too.
    torch.compile(copy.deepcopy(model), backend="eager", fullgraph=True)(tokens)
    fusedops.swap(model)
    backend = "inductor" if device == "cuda" else "aot_eager"  # CPU: no C++ codegen, faster
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(output(compiled(tokens)), output(model(tokens)))


def test_gpt2_conv1d_weights_stay_stored_in_out():
    model, tokens, _ = hf_model("gpt2")
    mlp = model.transformer.h[0].mlp
    c_fc_weight = mlp.c_fc.weight
    fusedops.swap(model)
    fused = model.transformer.h[0].mlp
    assert type(fused) is FusedChain and fused.c_fc.weight is c_fc_weight
    assert c_fc_weight.shape == (64, 256) and c_fc_weight.is_contiguous()  # [in, out]


HF_ACTIVATIONS = [
    ("GELUActivation", (), "none"),
    ("NewGELUActivation", (), "tanh"),
    ("GELUTanh", (), "tanh"),
    ("PytorchGELUTanh", (), "tanh"),
    ("FastGELUActivation", (), "tanh"),
    ("QuickGELUActivation", (), None),
    ("ClippedGELUActivation", (-10.0, 10.0), None),  # erf GELU clipped to [-10, 10]
]


@pytest.mark.parametrize(
    "cls_name, args, approximate", HF_ACTIVATIONS, ids=[a[0] for a in HF_ACTIVATIONS]
)
def test_hugging_face_activations(cls_name, args, approximate, device):
    activations = pytest.importorskip("transformers.activations")
    if not hasattr(activations, cls_name):
        pytest.skip(f"this transformers has no {cls_name}")
    act = getattr(activations, cls_name)(*args)
    model = nn.Sequential(nn.Sequential(nn.Linear(16, 32), act, nn.Linear(32, 16))).to(device)
    original = copy.deepcopy(model)
    (row,) = fusedops.swap(model).rows
    if approximate is None:
        assert (row.replacement, row.reason) == (
            None,
            f"1 ({cls_name}) is not GELU (checked numerically)",
        )
        return
    assert row.replacement == f"fusedops.swap.FusedSequential: fused_mlp(0, 1, 2; {approximate})"
    x = torch.randn(8, 16, device=device)
    assert_rule(model(x), original(x), fp64_twin(original)(x.double().cpu()))


def test_llama_rmsnorm_keeps_its_output_dtype(device):
    modeling = pytest.importorskip("transformers.models.llama.modeling_llama")
    norm = modeling.LlamaRMSNorm(32, eps=1e-5).to(device)  # fp32 weight
    with torch.no_grad():
        norm.weight.normal_()
    model = nn.Sequential(norm)
    original = copy.deepcopy(model)
    fusedops.swap(model)
    assert type(model[0]) is WeightDtypeRMSNorm and model[0].weight is norm.weight
    assert model[0].eps == 1e-5
    x = torch.randn(4, 32, device=device, dtype=torch.bfloat16)
    out, want = model(x), original(x)
    assert out.dtype == want.dtype == torch.float32  # weight * x.to(bf16): promoted to fp32
    ref = fp64_twin(original)(x.double().cpu())
    assert_close_to_reference(out, want, ref, torch.float32, atol={torch.float32: 7.8e-3})


def test_timm_mlp(device):
    layers = pytest.importorskip("timm.layers")
    model = nn.Sequential(layers.Mlp(32, 96, drop=0.1)).to(device).eval()
    original = copy.deepcopy(model)
    (row,) = fusedops.swap(model).rows
    assert (
        row.replacement == "fusedops.swap.FusedChain: fused_mlp(fc1, act, drop1, norm, fc2; none)"
    )
    x = torch.randn(2, 9, 32, device=device)
    assert_rule(model(x), original(x), fp64_twin(original)(x.double().cpu()))
    model.train()  # drop1 active: the block runs unfused, the original's random stream
    original.train()
    torch.manual_seed(2)
    got = model(x)
    torch.manual_seed(2)
    torch.testing.assert_close(got, original(x))
