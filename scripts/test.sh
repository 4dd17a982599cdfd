#!/usr/bin/env bash
# Sets up .venv (torch, test deps, fusedops built in place) and runs the test suite.
#   scripts/test.sh [pytest args...]      e.g. scripts/test.sh -k softmax -x
#   scripts/test.sh tests/test_swap.py    test files or node ids given run instead of tests/
# Build switches pass through: FUSEDOPS_CUDA=0/1, TORCH_CUDA_ARCH_LIST, MAX_JOBS (see setup.py).
set -euo pipefail
source "$(dirname "$0")/env.sh"

fusedops_venv
fusedops_pip "${FUSEDOPS_TEST_DEPS[@]}"
fusedops_build

targets=(tests)
for arg in "$@"; do
  if [ -e "${arg%%::*}" ]; then targets=(); fi  # a path (or path::test) was given: run only that
done
rc=0
"$PY" -m pytest "${targets[@]}" -q "$@" || rc=$?
if [ "$rc" = 5 ]; then
  # pytest's "no tests collected": a suite that runs nothing must not look green.
  echo "scripts/test.sh: pytest collected no tests (broken suite, or -k/-m/paths matched none)" >&2
fi
exit "$rc"
