#!/usr/bin/env bash
# Compiles each CUDA kernel file (csrc/cuda/*.cu, torch-free by design) with plain nvcc in C++17,
# the standard of the oldest toolchain the README claims (JetPack 6: CUDA 12.6, Orin = sm_87), so
# CI proves the kernels need nothing newer and build for that arch. Compiles only: no link, no run.
# Usage: scripts/compile_kernels.sh [ARCH...]   (default: sm_87; e.g. sm_87 sm_90 sm_110)
set -euo pipefail
cd "$(dirname "$0")/.."
archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(sm_87)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "$(nvcc --version | tail -n 1)"
status=0
total=$SECONDS
for arch in "${archs[@]}"; do
  for cu in csrc/cuda/*.cu; do
    start=$SECONDS
    if nvcc -std=c++17 -arch="$arch" -Icsrc -c "$cu" -o "$out/$(basename "$cu").o"; then
      echo "ok   $arch $cu ($((SECONDS - start)) s)"
    else
      echo "FAIL $arch $cu" >&2
      status=1
    fi
  done
done
echo "compile_kernels: $((SECONDS - total)) s"
exit $status
