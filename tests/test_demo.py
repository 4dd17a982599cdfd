"""python -m fusedops.demo: a smoke run of a tiny predictor on CPU (every file written, every
number in results.json), the checkpoint cache, the workloads and the command line's errors."""

import dataclasses
import json
import math
import sys

import pytest
import torch

from fusedops.tools import demo, predictor

TINY = dataclasses.replace(predictor.QUICK, d_model=32, heads=2, depth=1, epochs=2)


def test_demo_smoke(device, tmp_path, monkeypatch, capsys):
    pytest.importorskip("sklearn")  # the demo's data (an optional extra: scripts/test.sh has it)
    monkeypatch.setattr(predictor, "QUICK", TINY)
    out, cache = tmp_path / "out", tmp_path / "cache"
    argv = ["--quick", "--device", device, "--out", str(out), "--cache", str(cache), "--no-compile"]
    demo.main(argv)
    printed = capsys.readouterr().out
    for i in range(1, 7):
        assert f"[{i}/6]" in printed
    assert "done in " in printed and str(out / "report.md") in printed

    names = {p.name for p in out.iterdir()}
    traces = {f"trace-{w}-{p}.json" for w in ("before", "after") for p in ("inference", "training")}
    plots = {"ops-before-after.png", "predicted-vs-measured.png", "roofline.png"}
    assert {"report.md", "results.json"} | traces | plots <= names
    assert all((out / p).read_bytes().startswith(b"\x89PNG") for p in plots)

    res = json.loads((out / "results.json").read_text())
    assert res["model"] == "predictor" and res["device_type"] == device and res["quick"]
    assert res["dtype"] == ("bfloat16" if device == "cuda" else "float32")
    assert {p["kind"] for p in res["primitives"]} == {"layer_norm", "softmax", "mlp"}
    # one block: ln1, ln2 and the final norm share a shape; one softmax; one MLP
    assert sorted(p["count"] for p in res["primitives"]) == [1, 1, 3]
    for p in res["primitives"]:
        assert 0 < p["f"] < 1 and p["s"] > 0 and p["bytes"] > 0 and p["flops"] > 0
        assert p["s"] == pytest.approx(p["torch_s"] / p["fused_s"])
    fs = [(p["f"], p["s"]) for p in res["primitives"]]
    assert res["predicted"] == pytest.approx(
        1 / (1 - sum(f for f, _ in fs) + sum(f / s for f, s in fs))
    )
    assert res["ceiling"] == pytest.approx(1 / (1 - sum(f for f, _ in fs)))
    lat = res["latency_s"]
    assert set(lat) == {"eager_before", "eager_after"}  # --no-compile
    assert res["measured"] == pytest.approx(
        lat["eager_before"]["inference"] / lat["eager_after"]["inference"]
    )
    assert res["swap"]["swapped"] == 5  # ln1, softmax, ln2, mlp, final norm
    check = res["check"]
    assert check["within_rule"]
    # fp32 swaps change no prediction; in bf16 (CUDA) the barely trained model's near-ties may
    # flip: at most 1% of the 360 test digits, and accuracy moves by no more than the flips
    changed = check["predictions_changed"]
    assert changed == 0 if res["dtype"] == "float32" else changed <= 3
    assert abs(check["accuracy_before"] - check["accuracy_after"]) <= changed / 360 + 1e-6
    for when in ("before", "after"):
        for phase in ("inference", "training"):
            p = res["profile"][when][phase]
            assert p["steps"] == 3 and p["step_us"] > 0 and p["ops"] and p["peak_bytes"] > 0
    # CPU counts top-level op calls: fewer once fused (one mlp_fwd for 3 calls). CUDA counts
    # kernels: an erf-GELU MLP is GEMM, bias_gelu, GEMM fused or not, so inference never has
    # more; its training step has more (the fused backward's column sums), as the README says.
    launches = {w: res["profile"][w] for w in ("before", "after")}
    for phase in ("inference", "training") if device == "cpu" else ("inference",):
        before, after = (launches[w][phase]["launches"] for w in ("before", "after"))
        assert after < before if device == "cpu" else after <= before, (phase, before, after)
    assert math.isfinite(res["copy_gbps"]) and res["copy_gbps"] > 0

    # the checkpoint is cached: a second load does not train
    model, acc, path, cached = predictor.load_or_train(TINY, torch.device(device), cache)
    assert cached and path.parent == cache and acc == res["train"]["accuracy_fp32"]


def test_predictor_shapes():
    cfg = dataclasses.replace(TINY, image=28, patch=2)
    assert cfg.tokens == 197
    model = predictor.Predictor(cfg)
    assert model(torch.rand(3, 28, 28)).shape == (3, 10)
    with pytest.raises(ValueError, match="Predictor: image 28 is not divisible by patch 3"):
        predictor.Predictor(dataclasses.replace(cfg, patch=3))


def test_digits_split():
    pytest.importorskip("sklearn")
    xtr, ytr, xte, yte = predictor.digits(8)
    assert xtr.shape[1:] == (8, 8) and len(xtr) + len(xte) == 1797 and len(yte) == len(xte)
    assert 0 <= xtr.min() and xtr.max() <= 1


@pytest.mark.parametrize("model", ["gpt2", "bert", "vit"])
def test_hf_workloads_are_covered(model):
    pytest.importorskip("transformers")
    work = demo.workload(model, torch.device("cpu"), torch.float32, True, None)
    kinds = {g.kind for g in demo.groups(work)}
    # The MLP is fused whole (fused_mlp) where one module holds it (GPT-2, ViT in transformers 5),
    # as linear + bias_gelu where it spans two modules (BERT)
    assert "layer_norm" in kinds and kinds & {"mlp", "gelu"}
    work.train_step()
    assert all(p.grad is not None for p in work.model.parameters() if p.requires_grad)


def test_hf_without_transformers(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails
    with pytest.raises(SystemExit, match="--model gpt2 needs Hugging Face transformers"):
        demo.workload("gpt2", torch.device("cpu"), torch.float32, True, None)


@pytest.mark.parametrize(
    "replacement, kind",
    [
        ("fusedops.nn.LayerNorm", "layer_norm"),
        ("fusedops.nn.RMSNorm", "rms_norm"),
        ("fusedops.nn.Softmax", "softmax"),
        ("fusedops.nn.LogSoftmax", "log_softmax"),
        ("fusedops.swap.FusedSequential: fused_mlp(0, 1, 2; none)", "mlp"),
        ("fusedops.swap.FusedChain: bias_gelu(dense, act; none)", "gelu"),
    ],
)
def test_kind_of(replacement, kind):
    assert demo.kind_of(replacement) == kind


def test_kind_of_unknown():
    with pytest.raises(ValueError, match="kind_of: unknown replacement 'Foo'"):
        demo.kind_of("Foo")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_absent_device_is_an_error():
    with pytest.raises(SystemExit, match="--device cuda: no cuda device on this machine"):
        demo.resolve_device("cuda", None)


def test_default_dtype():
    assert demo.resolve_device("cpu", None) == (torch.device("cpu"), torch.float32)
    assert demo.resolve_device("cpu", "bf16") == (torch.device("cpu"), torch.bfloat16)
