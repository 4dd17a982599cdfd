#!/usr/bin/env bash
# DRAM bytes each op moves, measured with Nsight Compute, beside the traffic model
# (fusedops/tools/traffic.py): the fused fusedops kernel and the unfused torch composition.
#   bench/ncu_traffic.sh [OUT_DIR]        (default: fusedops-bench/ncu-traffic, untracked)
# Environment: OPS (comma list; default every op of the model), SHAPE (default 16384x8192: one
# bf16 tensor is 256 MiB, five times an H100's L2, so every byte crosses DRAM), DTYPES (default
# "bf16 fp32"), PYTHON (default python), NCU (default ncu).
# Needs access to the GPU's performance counters (ERR_NVGPUCTRPERM: run as root, or allow
# profiling for all users in the driver). Prints one line per case: model MB, measured MB and
# the difference (goal: within 10%).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
NCU=${NCU:-ncu}
SHAPE=${SHAPE:-16384x8192}
DTYPES=${DTYPES:-bf16 fp32}
OUT=${1:-fusedops-bench/ncu-traffic}
OPS=${OPS:-$("$PYTHON" -c 'from fusedops.tools.traffic import OPS; print(",".join(OPS))')}

mkdir -p "$OUT"
for op in ${OPS//,/ }; do
  for dtype in $DTYPES; do
    for variant in fused unfused; do
      csv="$OUT/$op-$SHAPE-$dtype-$variant.csv"
      echo "ncu: $op $SHAPE $dtype $variant" >&2
      # --profile-from-start off: only the call between cudaProfilerStart/Stop is profiled, not
      # the input setup; --clock-control none: the GPU's own clocks, as in the benchmarks.
      "$NCU" --profile-from-start off --clock-control none \
        --metrics dram__bytes_read.sum,dram__bytes_write.sum \
        --csv --print-units base --log-file "$csv" \
        "$PYTHON" -m fusedops.tools.traffic run "$op" "$SHAPE" "$dtype" "$variant"
    done
  done
done
"$PYTHON" -m fusedops.tools.traffic compare "$OUT"
