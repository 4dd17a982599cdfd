#!/usr/bin/env bash
# The Linux checks of the Metal backend (tests/metal), standing in for a Mac as far as Linux can:
#   1. shim compile: metal/kernels/*.metal as C++ through tests/metal/msl_shim.h, as Metal 3.0
#      and 3.1, and the kernel names against the names csrc/mps/*.mm asks for;
#   2. CPU emulator: every kernel run on fibers (ASan + UBSan), both thread orders, against the
#      fp64 references, for every op, dtype, tier and edge shape; planted bugs must be caught;
#   3. host: csrc/mps/*.mm syntax-checked as Objective-C++ against the macOS torch headers (the
#      macOS arm64 wheel, fetched once into build/macos-torch) and stub Foundation/Metal headers.
# What they cannot prove: that Apple's compiler accepts the MSL, that it runs on an Apple GPU,
# and how fast. Installs clang from Debian packages if missing (CI runs as root).
#   scripts/metal_check.sh [pytest args...]
set -euo pipefail
source "$(dirname "$0")/env.sh"

if ! command -v clang++ >/dev/null; then
  echo "metal_check: installing clang"
  apt-get update -qq && apt-get install -y -qq clang >/dev/null
fi
fusedops_venv
fusedops_pip "${FUSEDOPS_TEST_DEPS[@]}" pytest-xdist

# --confcutdir: tests/conftest.py imports the built fusedops, which these checks don't need.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
rc=0
FUSEDOPS_METAL_CHECK=1 "$PY" -m pytest tests/metal --confcutdir=tests/metal -q \
  -n "${MAX_JOBS:-2}" "$@" | tee "$log" || rc=$?
count() { # the number before "$1" in pytest's summary line, 0 if absent
  local n
  n=$(grep -oE "[0-9]+ $1" "$log" | tail -n 1 | cut -d' ' -f1 || true)
  echo "${n:-0}"
}
passed=$(count passed)
failed=$(($(count failed) + $(count error)))
if [ "$rc" != 0 ] && [ "$failed" = 0 ]; then
  failed=1  # pytest itself failed (collection, usage): count the run as one failed check
fi
echo "metal: $passed passed, $failed failed"
exit "$rc"
