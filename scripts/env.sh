# Sourced by scripts/test.sh, scripts/bench.sh and .ci/run: makes ./.venv ready and fusedops built.
#   fusedops_venv            .venv with torch (reused if present)
#   fusedops_pip PKG...      pip install into .venv
#   fusedops_build           build fusedops._C in place, put the checkout on .venv's path
#                            (setup.py decides CPU/CUDA/Metal from the env: FUSEDOPS_CUDA,
#                            FUSEDOPS_METAL, TORCH_CUDA_ARCH_LIST, MAX_JOBS)
# Package lists mirror pyproject.toml's optional dependencies.
# nvidia-cutlass: headers for fused_mlp's Hopper GEMM (setup.py builds it for 9.0 when found);
# pinned, as CUTLASS's templates change between releases.
FUSEDOPS_BUILD_DEPS=("setuptools>=64" wheel ninja nvidia-cutlass==4.2.0.0)
FUSEDOPS_DEMO_DEPS=(scikit-learn tqdm matplotlib)
# The tests run the demo (tests/test_demo.py), so they need its packages too.
FUSEDOPS_TEST_DEPS=(pytest numpy expecttest hypothesis "${FUSEDOPS_DEMO_DEPS[@]}")
FUSEDOPS_BENCH_DEPS=(pytest-benchmark matplotlib)

cd "$(dirname "${BASH_SOURCE[0]}")/.."
FUSEDOPS_ROOT=$PWD
PY=$FUSEDOPS_ROOT/.venv/bin/python

fusedops_pip() {
  "$PY" -m pip install -q "$@"
}

fusedops_venv() {
  if [ ! -x "$PY" ]; then
    if python3 -c 'import torch' 2>/dev/null; then
      # A torch that is already there (NVIDIA's Jetson wheel, or the user's own build) is the
      # one that matches this machine: see it from the venv, never replace it.
      echo "fusedops: using the torch of $(command -v python3)"
      python3 -m venv --system-site-packages .venv
      if ! "$PY" -c 'import torch' 2>/dev/null; then
        # python3 is itself a venv, which --system-site-packages doesn't reach: add its paths.
        python3 -c 'import site; print("\n".join(site.getsitepackages()))' \
          >"$("$PY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/_base_torch.pth"
      fi
    else
      python3 -m venv .venv
    fi
  fi
  if ! "$PY" -c 'import torch' 2>/dev/null; then
    echo "fusedops: installing torch into .venv"
    fusedops_pip "torch>=2.4"
  fi
}

# Builds fusedops._C in place and puts the checkout on .venv's path (what `pip install -e .`
# does, but pip rebuilds everything in a fresh temp dir each time): ninja keeps its state in
# build/, so test.sh and bench.sh share one build and a rebuild compiles only what changed.
fusedops_build() {
  fusedops_pip "${FUSEDOPS_BUILD_DEPS[@]}"
  mkdir -p build
  local log=build/build.log cuda
  cuda=$("$PY" -c 'import torch; print(int(torch.version.cuda is not None))')
  if [ "${FUSEDOPS_CUDA:-$cuda}" != 0 ]; then
    echo "fusedops: building CPU + CUDA kernels (archs: ${TORCH_CUDA_ARCH_LIST:-those of the local GPU," \
      "else 8.7;9.0}); the first build takes about 7 min on 2 cores (nvcc compiles each .cu once" \
      "per arch; FUSEDOPS_CUDA=0 builds CPU only in about 2 min), later ones only what changed"
  else
    echo "fusedops: building CPU kernels; the first build takes about 2 min on 2 cores"
  fi
  echo "fusedops: full compiler log in $log; one line per source file:"
  # --force: setuptools compares only the .cpp/.cu files' times; ninja's depfiles see headers.
  "$PY" setup.py build_ext --inplace --force 2>&1 | tee "$log" |
    sed -unE "s#^(\[[0-9]+/[0-9]+\]) .* -c ($FUSEDOPS_ROOT/)?([^ ]+) .*\$#  \1 \3#p"
  [ "${PIPESTATUS[0]}" = 0 ] ||
    { tail -n 60 "$log"; echo "fusedops: build failed (full log: $log)" >&2; return 1; }
  echo "$FUSEDOPS_ROOT" >"$("$PY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/fusedops-checkout.pth"
  "$PY" -m fusedops  # prints what the build holds (torch, CUDA, archs)
}
