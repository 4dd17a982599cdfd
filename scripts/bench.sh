#!/usr/bin/env bash
# Sets up .venv (torch, bench deps, fusedops built in place) and runs the benchmark harness.
#   scripts/bench.sh [--quick] [--dtypes ...] [--shapes ...] [--out DIR]
# Build switches pass through: FUSEDOPS_CUDA=0/1, TORCH_CUDA_ARCH_LIST, MAX_JOBS (see setup.py).
set -euo pipefail
source "$(dirname "$0")/env.sh"

fusedops_venv
fusedops_pip "${FUSEDOPS_TEST_DEPS[@]}" "${FUSEDOPS_BENCH_DEPS[@]}"
fusedops_build

exec "$PY" -m fusedops.bench "$@"
