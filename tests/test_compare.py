"""fusedops.compare: benchmark results side by side, without timing anything."""

import json
import subprocess
import sys

import pytest

from fusedops.tools import compare


def _kernel_result(us: dict, copy_gbps=3000.0, device="GPU A"):
    """A kernel-benchmark result: one cell per (op, rows, n) with fusedops and eager times."""
    cells = []
    for (op, rows, n), (fused, eager) in us.items():
        nbytes = 2 * rows * n * 2
        times = {"fusedops": fused, "eager": eager}
        cells.append(
            {
                "op": op,
                "dtype": "bf16",
                "rows": rows,
                "n": n,
                "bytes": nbytes,
                "median_us": times,
                "pct_copy": {p: 100 * nbytes / t / 1e3 / copy_gbps for p, t in times.items()},
                "errors": {},
            }
        )
    return {"device": device, "copy_gbps": copy_gbps, "cells": cells}


def test_kernel_results_speed_over_the_first():
    before = _kernel_result({("softmax_fwd", 4096, 1024): (10.0, 20.0), ("x", 1, 8): (5.0, 5.0)})
    after = _kernel_result({("softmax_fwd", 4096, 1024): (8.0, 20.0), ("y", 1, 8): (5.0, 5.0)})
    lines, summary = compare.compare([before, after], "pct_copy", "fusedops")
    assert len(lines) == 2  # the header and the one cell both files have
    assert lines[1].split()[:3] == ["softmax_fwd", "bf16", "4096x1024"]
    assert lines[1].split()[-1] == "1.250"  # 10 us -> 8 us
    assert "median 1.250x" in summary[-1] and "eager moved 1.000-1.000x" in summary[-1]
    assert any("#1: 1 cells not in every file" in s for s in summary)
    # Times: the same speed, read the other way round.
    lines, _ = compare.compare([before, after], "median_us", "fusedops")
    assert lines[1].split()[-1] == "1.250"


def test_mlp_results_default_to_ms_and_label_by_field():
    def result(ms):
        cell = {"mode": "infer", "width": 64, "rows": 262144, "flops": 1, "ms": {"fusedops": ms}}
        return {"cells": [cell]}

    before, after = result(0.2), result(0.1)
    assert compare.default_metric(before) == "ms"
    lines, summary = compare.compare([before, after], "ms", "fusedops")
    assert lines[1].startswith("infer width 64 rows 262144")
    assert lines[1].split()[-1] == "2.000"
    assert "eager moved" not in summary[-1]  # no eager in these files


def test_notes_on_different_machines():
    a = _kernel_result({("op", 8, 8): (1.0, 1.0)}, copy_gbps=3000.0, device="GPU A")
    b = _kernel_result({("op", 8, 8): (1.0, 1.0)}, copy_gbps=4000.0, device="GPU B")
    _, summary = compare.compare([a, b], "pct_copy", "fusedops")
    assert any("different devices" in s for s in summary)
    assert any("copy rate differs" in s for s in summary)


def test_refuses_what_it_cannot_compare():
    kernel = _kernel_result({("op", 8, 8): (1.0, 1.0)})
    with pytest.raises(ValueError, match="at least two"):
        compare.compare([kernel], "pct_copy", "fusedops")
    with pytest.raises(ValueError, match="mix"):
        compare.compare([kernel, {"cells": [{"mode": "infer", "ms": {}}]}], "ms", "fusedops")
    other = _kernel_result({("other", 8, 8): (1.0, 1.0)})
    with pytest.raises(ValueError, match="no cell in common"):
        compare.compare([kernel, other], "pct_copy", "fusedops")


def test_cli(tmp_path):
    paths = []
    for i, us in enumerate((10.0, 5.0)):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(_kernel_result({("softmax_fwd", 64, 64): (us, 1.0)})))
    run = [sys.executable, "-m", "fusedops.compare", *map(str, paths)]
    out = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    assert "softmax_fwd bf16 64x64" in out and "2.000" in out
    assert max(len(line) for line in out.splitlines()[2:-1]) <= 100  # the table
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    err = subprocess.run([*run[:3], str(bad), str(paths[0])], capture_output=True, text=True)
    assert err.returncode == 2 and "bad.json is not JSON" in err.stderr
