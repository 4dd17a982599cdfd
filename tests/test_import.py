"""`import fusedops` where numpy is not installed prints nothing that `import torch` alone does
not: fusedops never imports numpy, and adds no "Failed to initialize NumPy" warning of torch's.

numpy is hidden by running a child interpreter without its site hooks (-S) on a copy of this
environment's site-packages made of links to everything but numpy, which is what a virtual
environment without numpy looks like to torch. Every site directory on sys.path goes into the
copy (the first of a name wins, as on sys.path): torch's own dependencies may sit in another
one (a venv over a system Python, or a Jetson's dist-packages). (torch 2.4 and 2.14 print the
warning themselves on `import torch` there; whether they do is torch's business, what fusedops
adds is ours.)
"""

import os
import subprocess
import sys
from pathlib import Path

import fusedops

WARNING = "Failed to initialize NumPy"


def _stderr_without_numpy(code: str, tmp_path: Path) -> str:
    site = tmp_path / "site-packages"
    if not site.exists():
        site.mkdir()
        dirs = [Path(p) for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
        for d in filter(Path.is_dir, dirs):
            for entry in d.iterdir():
                if not entry.name.startswith("numpy") and not os.path.lexists(site / entry.name):
                    (site / entry.name).symlink_to(entry)
    repo = Path(fusedops.__file__).parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(repo)])}
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def test_import_without_numpy_adds_no_warning(tmp_path):
    hidden = "import importlib.util; assert importlib.util.find_spec('numpy') is None; "
    torch_alone = _stderr_without_numpy(hidden + "import torch", tmp_path)
    with_fusedops = _stderr_without_numpy(
        hidden + "import sys, torch, fusedops; assert 'numpy' not in sys.modules", tmp_path
    )
    assert with_fusedops.count(WARNING) == torch_alone.count(WARNING), with_fusedops[-3000:]
