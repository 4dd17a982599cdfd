#!/usr/bin/env bash
# A/B of two builds on one machine: REF (any commit) is built in build/ab/ref beside the working
# tree's own in-place build, both at once, then a benchmark command runs ROUNDS times in each,
# alternating (so that clocks, heat and neighbours fall on both alike), and every round's two
# results are compared cell by cell (python -m fusedops.compare).
#   scripts/ab.sh REF ROUNDS -- python3 -m fusedops.bench --quick --no-compile --no-host \
#       --no-plot --ops softmax_fwd --dtypes bf16
#   scripts/ab.sh HEAD~1 2 -- python3 -m fusedops.bench_mlp --fully-fused --quick --no-compile
# The command must take --out DIR and write one result JSON there (both benchmarks do). Results:
# build/ab/out/{ref,work}-N. REF may also be a tar file of a tree (`git archive REF -o FILE`, for
# a copy of the checkout without its .git). Build switches pass through (FUSEDOPS_CUDA,
# TORCH_CUDA_ARCH_LIST); MAX_JOBS defaults to half the cores for each build; PYTHON (default
# python3) builds and compares; METRIC picks what is compared (fusedops.compare --metric, e.g.
# device_pct_copy: kernel-only).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 4 ] || [ "$3" != -- ]; then
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
ref=$1 rounds=$2
shift 3
root=$PWD ab=$PWD/build/ab PYTHON=${PYTHON:-python3}
rm -rf "$ab/ref" "$ab/out"
mkdir -p "$ab/ref" "$ab/out"
if [ -f "$ref" ]; then tar -xf "$ref" -C "$ab/ref"; else git archive "$ref" | tar -x -C "$ab/ref"; fi
export MAX_JOBS=${MAX_JOBS:-$(($(nproc) / 2 > 0 ? $(nproc) / 2 : 1))}
build() {  # dir log
  (cd "$1" && "$PYTHON" setup.py -q build_ext --inplace >"$2" 2>&1) ||
    { echo "ab: the build in $1 failed; the end of $2:"; tail -20 "$2"; return 1; }
}
build "$ab/ref" "$ab/build-ref.log" &
ref_build=$!
build "$root" "$ab/build-work.log"
wait "$ref_build"
for i in $(seq "$rounds"); do
  (cd "$ab/ref" && PYTHONPATH=$ab/ref "$@" --out "$ab/out/ref-$i" >"$ab/out/ref-$i.log" 2>&1)
  PYTHONPATH=$root "$@" --out "$ab/out/work-$i" >"$ab/out/work-$i.log" 2>&1
  echo "== round $i: $ref (#1) against the working tree (#2)"
  PYTHONPATH=$root "$PYTHON" -m fusedops.compare ${METRIC:+--metric "$METRIC"} \
    "$ab/out/ref-$i"/*.json "$ab/out/work-$i"/*.json
done
