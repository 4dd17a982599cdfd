# Sourced by scripts/test.sh, scripts/bench.sh and .ci/run: makes ./.venv ready and fusedops built.
#   fusedops_venv            .venv with torch (reused if present)
#   fusedops_pip PKG...      pip install into .venv
#   fusedops_build           build fusedops._C (setup.py decides CPU/CUDA/Metal from the env:
#                            FUSEDOPS_CUDA, FUSEDOPS_METAL, TORCH_CUDA_ARCH_LIST, MAX_JOBS)
# Package lists mirror pyproject.toml's optional dependencies.
FUSEDOPS_BUILD_DEPS=("setuptools>=64" wheel ninja)
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

# True when .venv has fusedops installed in editable mode from this checkout.
fusedops_installed_here() {
  "$PY" - "$FUSEDOPS_ROOT" <<'EOF' 2>/dev/null
import json, pathlib, sys
from importlib import metadata
url = json.loads(metadata.distribution("fusedops").read_text("direct_url.json"))["url"]
sys.exit(url != pathlib.Path(sys.argv[1]).as_uri())
EOF
}

fusedops_build() {
  fusedops_pip "${FUSEDOPS_BUILD_DEPS[@]}"
  mkdir -p build
  local log=build/build.log
  echo "fusedops: building fusedops._C (log: $log)"
  if ! fusedops_installed_here; then
    # --no-build-isolation: build against the torch in .venv. --no-deps: never touch torch.
    "$PY" -m pip install -e . --no-build-isolation --no-deps >"$log" 2>&1 ||
      { tail -n 60 "$log"; echo "fusedops: build failed (full log: $log)" >&2; return 1; }
  else
    # pip builds an editable install in a fresh temporary dir, so every reinstall recompiles
    # everything; build_ext keeps its ninja files in build/ and recompiles only what changed.
    "$PY" setup.py build_ext --inplace --force >"$log" 2>&1 ||
      { tail -n 60 "$log"; echo "fusedops: build failed (full log: $log)" >&2; return 1; }
  fi
  "$PY" -m fusedops  # prints what the build holds (torch, CUDA, archs)
}
