#!/usr/bin/env bash
# The demo under Nsight Systems (CUDA API and kernels, NVTX ranges), then its GPU kernel and
# NVTX range summaries (python -m fusedops.tools.nsys; either nsys report naming).
#   bench/nsys_profile.sh [DEMO ARGS...]        e.g. bench/nsys_profile.sh --quick
# Writes $OUT/demo.nsys-rep (default OUT=fusedops-bench/nsys, untracked). Environment: PYTHON
# (default python), NSYS (default nsys). The summaries need `nsys stats`, which exports the report
# to SQLite first; where that fails (some locked-down GPU hosts), copy the .nsys-rep to a machine
# with Nsight Systems and run: python -m fusedops.tools.nsys demo.nsys-rep
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
NSYS=${NSYS:-nsys}
OUT=${OUT:-fusedops-bench/nsys}

mkdir -p "$OUT"
"$NSYS" profile -t cuda,nvtx --force-overwrite true -o "$OUT/demo" \
  "$PYTHON" -m fusedops.demo "$@"
"$PYTHON" -m fusedops.tools.nsys --nsys "$NSYS" "$OUT/demo.nsys-rep" || {
  echo "nsys_profile.sh: no summaries from nsys stats here; the report is $OUT/demo.nsys-rep:" \
    "copy it and run python -m fusedops.tools.nsys on it" >&2
  exit 1
}
