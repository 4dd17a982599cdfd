"""fusedops: hand-written fused kernels for PyTorch (CUDA, CPU), behind torch's dispatcher."""

import torch

from fusedops import nn
from fusedops._ops import ops as _ops
from fusedops.functional import (
    bias_gelu,
    fully_fused_mlp,
    fused_mlp,
    layer_norm,
    log_softmax,
    rms_norm,
    softmax,
)
from fusedops.nn import FullyFusedMLP, FusedMLP
from fusedops.swap import swap

__version__ = "0.1.0"

__all__ = [
    "FullyFusedMLP",
    "FusedMLP",
    "bias_gelu",
    "build_info",
    "fully_fused_mlp",
    "fused_mlp",
    "layer_norm",
    "log_softmax",
    "nn",
    "rms_norm",
    "softmax",
    "swap",
]


def build_info() -> dict:
    """What this build of fusedops holds: backends with kernels, CUDA archs, torch and CUDA."""
    info = dict(kv.split("=", 1) for kv in _ops.build_info().split(";"))
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    info["backends"] = [k for k in ("CPU", "CUDA", "MPS") if has("fusedops::softmax_fwd", k)]
    info["runtime_torch"] = torch.__version__
    info["fusedops"] = __version__
    return info
