#!/usr/bin/env bash
# One full check on a CUDA machine: build with every core, run the whole test suite with the
# CUDA tests live, compute-sanitizer on the kernel tests, the benchmark, and a short table.
# Logs and results go to $RESULTS (default: build/gpu_check). Usage:
#   scripts/gpu_check.sh [--no-tests] [--no-sanitizer] [--no-bench] [-- bench args...]
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=${RESULTS:-build/gpu_check}
mkdir -p "$RESULTS"
tests=1 sanitizer=1 bench=1
while [ $# -gt 0 ]; do
  case "$1" in
    --no-tests) tests=0 ;;
    --no-sanitizer) sanitizer=0 ;;
    --no-bench) bench=0 ;;
    --) shift; break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
status=0
step() { echo; echo "=== $* ($(date +%T))"; }

step "device"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

step "build"
arch=$(python3 -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')
TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$arch} FUSEDOPS_CUDA=1 MAX_JOBS=$(nproc) \
  python3 setup.py -q build_ext --inplace 2>&1 | tee "$RESULTS/build.log" | grep -Ei "error|warning" | head -40
python3 -m fusedops || exit 1

if [ $tests = 1 ]; then
  step "tests (CUDA live)"
  xdist=$(python3 -c 'import xdist' 2>/dev/null && echo "-n 8")
  python3 -m pytest tests -q -ra -p no:cacheprovider $xdist 2>&1 | tee "$RESULTS/pytest.log" | tail -40
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi

if [ $sanitizer = 1 ]; then
  # The kernel-tier tests of each op, in parallel (python + torch under a sanitizer start
  # slowly; the whole suite would take hours). The profiler-based test sees no events there.
  step "compute-sanitizer memcheck + racecheck on the kernel tests"
  run_tool() {  # tool name pytest-args...
    local tool=$1 name=$2
    shift 2
    compute-sanitizer --tool "$tool" --error-exitcode 9 \
      python3 -m pytest -q -p no:cacheprovider -x "$@" > "$RESULTS/$tool-$name.log" 2>&1
    local rc=$?
    echo "$rc" >> "$RESULTS/sanitizer.rc"
    echo "$tool $name: exit $rc; $(grep -E 'SUMMARY|passed|failed' "$RESULTS/$tool-$name.log" |
      tail -2 | tr '\n' ' ')"
  }
  rm -f "$RESULTS/sanitizer.rc"
  run_tool memcheck softmax tests/test_softmax.py -k "every_kernel_path or raises or range" &
  run_tool memcheck norms tests/test_norms.py \
    -k "cuda_kernel_tiers and bfloat16 or misaligned_pointer or deterministic" &
  run_tool racecheck norms tests/test_norms.py -k "cuda_kernel_tiers and bfloat16 or deterministic" &
  run_tool memcheck mlp tests/test_mlp.py tests/test_bias_gelu.py -m cuda \
    -k "not compile and not epilogues_used" &
  wait
  grep -qv '^0$' "$RESULTS/sanitizer.rc" && status=1
fi

if [ $bench = 1 ]; then
  step "benchmark"
  python3 -m fusedops.bench --out "$RESULTS" "$@" 2>&1 | tee "$RESULTS/bench.log" | tail -60
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  python3 -m fusedops.bench_mlp --no-max-autotune --out "$RESULTS" 2>&1 |
    tee "$RESULTS/bench_mlp.log" | tail -45
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
exit $status
