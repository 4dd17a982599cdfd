#!/usr/bin/env bash
# Where in a fused kernel its warps wait, instruction by instruction: Nsight Compute's source
# counters (warp-state samples per SASS instruction) for one call, summed per reason, and the
# instructions that gathered the most. A sample counts a warp waiting to issue that instruction:
# long_sb on it waits on the global load (or bulk copy's barrier) that feeds it, barrier on the
# one after a __syncthreads.
#   bench/ncu_lines.sh OP ROWSxN DTYPE [fused|unfused] [KERNEL]   (e.g. layer_norm_fwd 1024x131072
#   bf16 fused staged_rows; KERNEL: a regex of the kernel names to profile, default every kernel)
# Environment: OUT (default fusedops-bench/ncu-lines, untracked), PYTHON (default python), NCU
# (default ncu), TOP (instructions listed per kernel, default 12). Needs access to the GPU's
# performance counters (see bench/ncu_traffic.sh); each kernel replays ~40 times.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
NCU=${NCU:-ncu}
OUT=${OUT:-fusedops-bench/ncu-lines}
op=$1 shape=$2 dtype=$3 variant=${4:-fused} kernel=${5:-}
mkdir -p "$OUT"
report="$OUT/$op-$shape-$dtype-$variant"
"$NCU" --set full --import-source yes --profile-from-start off --clock-control none \
  ${kernel:+-k "regex:$kernel"} -f -o "$report" \
  "$PYTHON" -m fusedops.tools.traffic run "$op" "$shape" "$dtype" "$variant"
"$NCU" -i "$report.ncu-rep" --page source --csv --print-source sass > "$report-source.csv"
"$PYTHON" -m fusedops.tools.traffic lines "$report-source.csv" --top "${TOP:-12}"
