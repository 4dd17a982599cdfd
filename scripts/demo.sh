#!/usr/bin/env bash
# Sets up .venv (torch, demo deps, fusedops built in place) and runs the demo: profile a trained
# model, predict the gain of fused kernels (Amdahl), swap them in, verify, re-profile.
#   scripts/demo.sh [--quick] [--model predictor|gpt2|bert|vit] [--device cuda|mps|cpu] ...
# Build switches pass through: FUSEDOPS_CUDA=0/1, TORCH_CUDA_ARCH_LIST, MAX_JOBS (see setup.py).
set -euo pipefail
source "$(dirname "$0")/env.sh"

fusedops_venv
fusedops_pip "${FUSEDOPS_DEMO_DEPS[@]}"
fusedops_build

exec "$PY" -m fusedops.demo "$@"
