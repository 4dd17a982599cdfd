"""Parsing of `nsys stats` summaries (fusedops.tools.nsys) on recorded-format fixtures: the
report names and columns of newer nsys (cuda_gpu_kern_sum, nvtx_sum) and of older releases
(gpukernsum), and the fallback from one name to the other."""

import stat
from pathlib import Path

import pytest

from fusedops.tools import nsys

DATA = Path(__file__).parent / "data" / "nsys"


def test_parse_new_kernel_summary():
    rows = nsys.parse_stats_csv((DATA / "cuda_gpu_kern_sum.csv").read_text())
    assert len(rows) == 5
    softmax = rows[1]
    assert softmax["name"].startswith("void fusedops::softmax_rows::softmax_block_kernel")
    assert softmax["instances"] == 384
    assert softmax["total_ns"] == 3727104
    assert softmax["avg_ns"] == 9706.0 and softmax["med_ns"] == 9696.0
    assert softmax["time_pct"] == 18.7


def test_parse_old_kernel_summary():
    rows = nsys.parse_stats_csv((DATA / "gpukernsum.csv").read_text())
    assert [r["instances"] for r in rows] == [384, 256]
    assert rows[1]["avg_ns"] == 14358.0 and rows[1]["max_ns"] == 14816
    assert "med_ns" not in rows[1]  # the old report has no median
    assert "vectorized_layer_norm_kernel" in rows[1]["name"]


def test_parse_nvtx_summary():
    rows = nsys.parse_stats_csv((DATA / "nvtx_sum.csv").read_text())
    assert [r["name"] for r in rows] == ["train", "profile before", "profile after"]
    assert rows[0]["style"] == "PushPop" and rows[0]["total_ns"] == 2.5e9


def test_parse_error_names_the_function():
    with pytest.raises(ValueError, match="parse_stats_csv: no summary header"):
        nsys.parse_stats_csv("ERROR: Report 'cuda_gpu_kern_sum' could not be found.\n")


def test_table():
    text = nsys.table(nsys.parse_stats_csv((DATA / "cuda_gpu_kern_sum.csv").read_text()), "k", 3)
    lines = text.splitlines()
    assert lines[0] == "k"
    assert lines[2].split()[:4] == ["41.2", "8.212", "640", "12.83"]  # sorted by total time
    assert "softmax_block_kernel<SoftmaxFwd<__nv_bfloat16>, 8, 2>" in lines[3]
    assert lines[5] == "... 2 more"
    assert lines[6] == "fusedops kernels: 41.2% of the time above"
    assert max(map(len, lines)) <= 100


def _fake_nsys(tmp_path: Path, known: str, fixture: str) -> str:
    """An nsys that knows one report name and prints a fixture for it."""
    path = tmp_path / "nsys"
    path.write_text(
        "#!/bin/sh\n"
        f'if [ "$3" = "{known}" ]; then cat "{DATA / fixture}"; exit 0; fi\n'
        "echo \"ERROR: Report '$3' could not be found.\" >&2; exit 1\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.mark.parametrize(
    "known, fixture, count",
    [("cuda_gpu_kern_sum", "cuda_gpu_kern_sum.csv", 5), ("gpukernsum", "gpukernsum.csv", 2)],
)
def test_run_stats_takes_either_report_name(tmp_path, known, fixture, count):
    rows = nsys.run_stats("demo.nsys-rep", "kernels", _fake_nsys(tmp_path, known, fixture))
    assert len(rows) == count


def test_run_stats_reports_both_failures(tmp_path):
    fake = _fake_nsys(tmp_path, "no_such_report", "gpukernsum.csv")
    with pytest.raises(RuntimeError, match="cuda_gpu_kern_sum: ERROR.*gpukernsum: ERROR"):
        nsys.run_stats("demo.nsys-rep", "kernels", fake)


def test_main_on_saved_csv(capsys):
    nsys.main(["--csv", str(DATA / "gpukernsum.csv"), "--nvtx-csv", str(DATA / "nvtx_sum.csv")])
    out = capsys.readouterr().out
    assert out.index("NVTX ranges") < out.index("GPU kernels")
    assert "fusedops kernels: 55.3% of the time above" in out
