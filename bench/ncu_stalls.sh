#!/usr/bin/env bash
# Where a fused kernel's warps wait, measured with Nsight Compute: time, DRAM throughput, issue
# use, occupancy, registers and the largest warp-stall reasons, per kernel of one call.
#   bench/ncu_stalls.sh OP ROWSxN DTYPE [fused|unfused]   (e.g. rms_norm_fwd 4096x32768 bf16)
# Environment: OUT (default fusedops-bench/ncu-stalls, untracked), PYTHON (default python),
# NCU (default ncu). Needs access to the GPU's performance counters (see bench/ncu_traffic.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
NCU=${NCU:-ncu}
OUT=${OUT:-fusedops-bench/ncu-stalls}
op=$1 shape=$2 dtype=$3 variant=${4:-fused}
metrics=$("$PYTHON" -c 'from fusedops.tools.traffic import STALL_METRICS; print(",".join(STALL_METRICS))')
mkdir -p "$OUT"
csv="$OUT/$op-$shape-$dtype-$variant.csv"
"$NCU" --profile-from-start off --clock-control none --metrics "$metrics" \
  --csv --page raw --print-units base --log-file "$csv" \
  "$PYTHON" -m fusedops.tools.traffic run "$op" "$shape" "$dtype" "$variant"
"$PYTHON" -m fusedops.tools.traffic stalls "$csv"
