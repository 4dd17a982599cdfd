"""The DRAM traffic model (fusedops.tools.traffic): hand-computed cases, the unfused model against
a count of what its torch composition runs, the compositions against the fused ops, and the
parsing of Nsight Compute's CSV on recorded-format fixtures."""

from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from fusedops.tools import traffic
from fusedops.tools.traffic import Traffic

NCU = Path(__file__).parent / "data" / "ncu"


def test_hand_computed_softmax():
    # 4 x 8 fp32: a full tensor is 128 bytes, a value per row 16.
    m = traffic.model("softmax_fwd", 4, 8, torch.float32)
    assert m.fused == Traffic(128, 128)
    assert m.unfused == Traffic(5 * 128 + 2 * 16, 3 * 128 + 2 * 16)
    m = traffic.model("log_softmax_bwd", 4, 8, torch.float32)
    assert m.fused == Traffic(256, 128)
    assert m.unfused == Traffic(5 * 128 + 16, 3 * 128 + 16)


def test_hand_computed_layer_norm():
    # 1024 x 4096 bf16: x 8 MiB, a row vector 2 KiB, a parameter 8 KiB, fp32 stats 4 KiB each.
    x, v, p, s = 8 << 20, 2048, 8192, 4096
    m = traffic.model("layer_norm_fwd", 1024, 4096, torch.bfloat16)
    assert m.fused == Traffic(x + 2 * p, x + 2 * s)
    assert m.unfused == Traffic(8 * x + 4 * v + 2 * p, 5 * x + 4 * v)
    m = traffic.model("rms_norm_bwd", 1024, 4096, torch.bfloat16)
    assert m.fused == Traffic(2 * x + p + s, x + p)
    assert m.fused.total == 25186304


def test_hand_computed_bias_gelu_and_param_dtype():
    m = traffic.model("bias_gelu_bwd", 2, 3, torch.float16)  # x 12 bytes, bias 6
    assert m.fused == Traffic(30, 18)
    assert m.unfused == Traffic(54, 30)
    m = traffic.norm_traffic(
        2, 3, torch.bfloat16, rms=True, backward=False, param_dtype=torch.float32
    )
    assert m.fused == Traffic(12 + 12, 12 + 8)  # fp32 weight: 12 bytes


def test_unknown_op():
    with pytest.raises(ValueError, match="unknown op 'gelu_fwd'"):
        traffic.model("gelu_fwd", 4, 8, torch.float32)


class _CountBytes(TorchDispatchMode):
    """Bytes each non-view aten op reads (tensor arguments) and writes (tensor results)."""

    def __init__(self):
        super().__init__()
        self.read = self.write = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not any(r.alias_info for r in func._schema.returns):  # views move nothing
            for t in tree_leaves((args, kwargs)):
                self.read += t.nbytes if isinstance(t, torch.Tensor) else 0
            for t in tree_leaves(out):
                self.write += t.nbytes if isinstance(t, torch.Tensor) else 0
        return out


@pytest.mark.parametrize("op", traffic.OPS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_unfused_model_counts_its_composition(op, dtype):
    rows, n = 6, 40
    call = traffic.calls(op, rows, n, dtype, "meta")["unfused"]
    with _CountBytes() as counted:
        call()
    assert Traffic(counted.read, counted.write) == traffic.model(op, rows, n, dtype).unfused


@pytest.mark.parametrize("op", traffic.OPS)
def test_compositions_match_the_fused_ops(op):
    # Fresh inputs for both variants come from one seed: the same tensors.
    results = {}
    for variant in ("fused", "unfused"):
        torch.manual_seed(0)
        out = traffic.calls(op, 5, 33, torch.float64, "cpu")[variant]()
        results[variant] = [out] if isinstance(out, torch.Tensor) else list(out)
    fused, unfused = results["fused"], results["unfused"]
    if op.startswith("layer_norm_fwd") or op.startswith("rms_norm_fwd"):
        fused = fused[:1]  # the fused forward also returns its statistics
    assert len(fused) == len(unfused)
    for a, b in zip(fused, unfused, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_parse_ncu_details_page():
    kernels = traffic.parse_ncu_csv((NCU / "softmax_fwd-16384x8192-bf16-fused.csv").read_text())
    assert len(kernels) == 1
    assert "softmax_block_kernel" in kernels[0]["kernel"]
    assert kernels[0]["metrics"] == {
        "dram__bytes_read.sum": 268502784,
        "dram__bytes_write.sum": 268441856,
    }


def test_parse_ncu_raw_page_with_scaled_units():
    text = (NCU / "softmax_fwd-16384x8192-bf16-unfused.csv").read_text()
    assert len(traffic.parse_ncu_csv(text)) == 5
    measured = traffic.dram_bytes(text)
    assert measured == Traffic(
        round(1e6 * (268.48 + 268.51 + 268.47 + 268.49 + 268.52)),
        round(1e6 * (0.03 + 268.45 + 268.44 + 0.03 + 268.46)),
    )


def test_stalls_from_an_ncu_raw_page():
    """A real capture (H100, the staged rms_norm forward, 4096x32768 bf16; bench/ncu_stalls.sh's
    metrics, beside the ~300 device and launch columns ncu adds to a raw page)."""
    text = (NCU.parent / "ncu-stalls" / "rms_norm_fwd-4096x32768-bf16-stalls.csv").read_text()
    (k,) = traffic.stalls(text)
    assert "staged_rows_kernel" in k["kernel"] and "NormFwdStaged" in k["kernel"]
    assert k["us"] == pytest.approx(181.056)
    assert (k["dram_pct"], k["issue_pct"], k["occupancy_pct"]) == (84.99, 48.16, 48.98)
    assert k["registers"] == 62
    assert k["stalls"][:2] == [("long_scoreboard", 6.53), ("barrier", 3.74)]
    assert all(w >= 0.05 for _, w in k["stalls"])
    table = traffic.stalls_table([k])
    assert "long_scoreboard 6.53" in table and "181.1" in table


def test_source_lines_from_an_ncu_source_page():
    """A real capture, trimmed to 22 of its 1016 instructions (H200, the staged rms_norm backward,
    16384x4096 bf16: `ncu -i REPORT --page source --csv --print-source sass`, as
    bench/ncu_lines.sh exports it)."""
    path = NCU.parent / "ncu-stalls" / "rms_norm_bwd-16384x4096-bf16-source.csv"
    (k,) = traffic.source_lines(path.read_text(), top=3)
    assert "norm_bwd_staged_kernel" in k["kernel"]
    # The kept instructions' samples, and each reason's: what the page holds, summed.
    assert k["samples"] == sum(
        n for _, _, n, _ in traffic.source_lines(path.read_text(), 99)[0]["lines"]
    )
    assert k["samples"] == sum(n for _, n in k["reasons"])
    assert [n for _, _, n, _ in k["lines"]] == [1910, 1260, 913]
    addr, src, n, reasons = k["lines"][0]
    assert src.startswith("@!P4") and "BRA" in src and addr.startswith("0x")
    assert reasons[0] == ("long_sb", 1879)  # waiting on the stage's bulk copies
    assert k["lines"][2][1].startswith("LDS.64") and k["lines"][2][3][0] == ("barrier", 883)
    assert k["reasons"][0][0] == "long_sb" and all(n > 0 for _, n in k["reasons"])
    table = traffic.source_lines_table([k])
    assert "norm_bwd_staged_kernel" in table and "long_sb 1879" in table


def test_source_lines_sections_and_errors():
    page = (NCU.parent / "ncu-stalls" / "rms_norm_bwd-16384x4096-bf16-source.csv").read_text()
    two = page + page.replace("norm_bwd_staged_kernel", "second_kernel", 1)
    first, second = traffic.source_lines(two)
    assert "norm_bwd_staged_kernel" in first["kernel"] and "second_kernel" in second["kernel"]
    assert first["samples"] == second["samples"] and first["lines"] == second["lines"]
    with pytest.raises(ValueError, match="no ncu source page"):
        traffic.source_lines("==PROF== Disconnected\n")


def test_stalls_needs_its_metrics():
    text = (NCU / "softmax_fwd-16384x8192-bf16-fused.csv").read_text()
    with pytest.raises(ValueError, match="not in the CSV"):
        traffic.stalls(text)


def test_parse_ncu_errors():
    with pytest.raises(ValueError, match="no ncu CSV header"):
        traffic.parse_ncu_csv("==PROF== Disconnected\n")
    bad = (
        '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n"0","k","m","furlong","1"\n'
    )
    with pytest.raises(ValueError, match="unknown ncu unit 'furlong'"):
        traffic.parse_ncu_csv(bad)
    na = '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n"0","k","m","byte","N/A"\n'
    with pytest.raises(ValueError, match="no value for m"):
        traffic.parse_ncu_csv(na)
    other = (
        '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n"0","k","m","byte","1"\n'
    )
    with pytest.raises(ValueError, match="not in the ncu CSV"):
        traffic.dram_bytes(other)


def test_compare_fixtures_within_goal():
    results = {r["variant"]: r for r in traffic.compare(NCU)}
    assert set(results) == {"fused", "unfused"}
    x = 16384 * 8192 * 2
    assert results["fused"]["model"] == 2 * x
    assert results["unfused"]["model"] == 8 * x + 4 * 16384 * 2
    for r in results.values():
        assert abs(r["ratio"] - 1) < 0.10
    table = traffic.compare_table(list(results.values()))
    assert "softmax_fwd" in table and "%" in table
