#!/usr/bin/env bash
# Proves the oldest torch the README claims (pyproject's torch>=2.4): a venv with that torch in
# build/torch-floor, a copy of the checkout's tracked files built there CPU-only (the main
# build in fusedops/ stays as it is), and the CPU suite run against it. About 7 min on 2 cores.
#   scripts/torch_floor.sh [pytest args...]   (e.g. tests/test_bias_gelu.py -k same_bits)
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_FLOOR=2.4.1
DIR=$PWD/build/torch-floor
PY=$DIR/venv/bin/python

if ! "$PY" -c "import torch; assert torch.__version__.startswith('$TORCH_FLOOR')" 2>/dev/null; then
  rm -rf "$DIR/venv"
  python3 -m venv "$DIR/venv"
  # numpy 1.x: the ABI torch 2.4 was built against.
  "$PY" -m pip install -q "torch==$TORCH_FLOOR" "numpy<2" pytest expecttest hypothesis \
    "setuptools>=64" wheel ninja
fi
rm -rf "$DIR/src"
mkdir -p "$DIR/src"
git ls-files -z | xargs -0 cp --parents -t "$DIR/src"
cd "$DIR/src"
echo "torch_floor: building against torch $("$PY" -c 'import torch; print(torch.__version__)')"
FUSEDOPS_CUDA=0 FUSEDOPS_METAL=0 "$PY" setup.py -q build_ext --inplace >build.log 2>&1 ||
  { tail -n 40 build.log; exit 1; }
# The demo's optional packages are left out: its tests skip without them. Test paths given
# (tests/...) replace the whole suite.
targets=(tests)
for arg in "$@"; do
  case $arg in tests/*) targets=() ;; esac
done
"$PY" -m pytest "${targets[@]}" -q -p no:cacheprovider --ignore=tests/metal "$@" | tail -n 3
