"""The kernel resource report (fusedops.tools.kernels): parsing, per-resource limits and the
table in pure Python on a hand-written report; the runtime report itself on CUDA."""

import pytest
import torch

import fusedops
from fusedops.tools import kernels
from fusedops.tools.kernels import Kernel

# An H100 SXM's limits, as cuda_kernel_report prints them.
DEVICE_LINE = (
    "device\tcc=9.0\tsm_count=132\tregs_per_sm=65536\tsmem_per_sm=233472\tthreads_per_sm=2048"
    "\tblocks_per_sm=32\treserved_smem_per_block=1024"
)


def _kernel_line(name, threads, regs, dynamic_smem=0, static_smem=0, active=1, cluster=1, extra=""):
    return (
        f"kernel\tname={name}\tthreads={threads}\tdynamic_smem={dynamic_smem}\tcluster={cluster}"
        f"\tcalls=3\tregs={regs}\tstatic_smem={static_smem}\tlocal_bytes=0\tmax_threads=1024"
        f"\tmax_dynamic_smem=49152\tactive_blocks_per_sm={active}{extra}"
    )


def _parse(*kernel_lines):
    return kernels.parse_report("\n".join([DEVICE_LINE, *kernel_lines]) + "\n")


def test_parse_report():
    name = "void fusedops::(anonymous namespace)::norm_fwd_kernel<float, float, true, 4, 4, true>"
    dev, ks = _parse(
        _kernel_line(name, 128, 40, active=12, cluster=2, extra="\tactive_clusters=66")
    )
    assert dev.sm_count == 132 and dev.cc == "9.0" and dev.reserved_smem_per_block == 1024
    assert ks == [
        Kernel(name, 128, 0, 2, 3, 40, 0, 0, 1024, 49152, 12, active_clusters=66),
    ]


def test_parse_errors():
    with pytest.raises(ValueError, match="no device line"):
        kernels.parse_report(_kernel_line("k", 32, 8) + "\n")
    with pytest.raises(ValueError, match="unknown line kind 'launch'"):
        kernels.parse_report(DEVICE_LINE + "\nlaunch\tname=k\n")


def test_limits_threads_and_registers_tie():
    # 256 threads x 32 registers: 1024 per warp, 16 warps per scheduler = 64 warps = 8 blocks;
    # 2048 threads / 256 = 8 blocks too.
    dev, (k,) = _parse(_kernel_line("k", 256, 32, active=8))
    assert kernels.block_limits(k, dev) == {
        "threads": 8,
        "blocks": 32,
        "registers": 8,
        "shared memory": 228,  # 233472 // (0 + 1024 reserved)
    }
    assert kernels.limiter(k, dev) == "threads/registers"
    assert kernels.occupancy(k, dev) == 1.0


def test_limits_registers():
    # 1024 threads x 64 registers: 2048 per warp, 8 warps per scheduler = 32 warps = 1 block.
    dev, (k,) = _parse(_kernel_line("k", 1024, 64, active=1))
    assert kernels.block_limits(k, dev)["registers"] == 1
    assert kernels.limiter(k, dev) == "registers"
    assert kernels.occupancy(k, dev) == 0.5


def test_limits_register_granularity():
    # 40 registers: 1280 per warp; 16384 // 1280 = 12 warps per scheduler (not 65536 // 1280 =
    # 51 per SM), 48 warps = 3 blocks of 512 threads.
    dev, (k,) = _parse(_kernel_line("k", 512, 40, active=3))
    assert kernels.block_limits(k, dev)["registers"] == 3


def test_limits_shared_memory():
    # 100 KiB dynamic + 1 KiB static + 1 KiB reserved = 104448 bytes: 2 blocks in 228 KiB.
    dev, (k,) = _parse(_kernel_line("k", 128, 16, dynamic_smem=102400, static_smem=1024, active=2))
    assert kernels.block_limits(k, dev)["shared memory"] == 2
    assert kernels.limiter(k, dev) == "shared memory"
    assert kernels.occupancy(k, dev) == pytest.approx(8 / 64)


def test_short_name():
    assert (
        kernels.short_name(
            "void fusedops::(anonymous namespace)::bias_gelu_fwd_kernel<float, 4, "
            "(fusedops::GeluApprox)1>(const float *, const float *, float *, long, long)"
        )
        == "bias_gelu_fwd_kernel<float, 4, (GeluApprox)1>"
    )
    assert kernels.short_name("plain_kernel") == "plain_kernel"
    assert kernels.short_name("k" * 80, width=10) == "k" * 9 + "…"


def test_table_fits_and_flags_runtime_below_limits():
    long = "void fusedops::softmax_rows::softmax_block_kernel<fusedops::softmax_rows::SoftmaxFwd"
    dev, ks = _parse(
        _kernel_line(long + "<__nv_bfloat16>, 8, 4>(Args, long, int)", 256, 32, active=8),
        _kernel_line("void fusedops::norm_bwd_kernel<float>(Args)", 1024, 64, 65536, active=1),
        _kernel_line("void fusedops::norm_bwd_loop_kernel<float>(Args)", 512, 40, active=2),
    )
    text = kernels.table(dev, ks)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert lines[0].startswith("sm_90, 132 SMs")

    def config_row(kernel):  # each kernel's name, then a row per launch configuration
        return lines[next(i for i, line in enumerate(lines) if line.startswith(kernel)) + 1]

    assert " 2* " in config_row("norm_bwd_loop_kernel")  # the runtime: 2 blocks; each limit: 3
    block = config_row("softmax_block_kernel<SoftmaxFwd<__nv_bfloat16>, 8, 4>")
    assert "threads/registers" in block and " 100 " in block


needs_cuda_report = pytest.mark.skipif(
    not (torch.cuda.is_available() and hasattr(torch.ops.fusedops, "cuda_kernel_report")),
    reason="no CUDA device or no CUDA kernels in this build",
)


@pytest.mark.cuda
@needs_cuda_report
def test_runtime_report():
    dev, ks = kernels.report(torch.device("cuda"))
    props = torch.cuda.get_device_properties(0)
    assert dev.sm_count == props.multi_processor_count
    names = " ".join(k.name for k in ks)
    # Each op family's forward and backward kernels were seen.
    for part in (
        "SoftmaxFwd",
        "SoftmaxBwd",
        "norm_fwd",
        "norm_bwd",
        "bias_gelu_fwd",
        "bias_gelu_bwd",
    ):
        assert part in names, part
    for k in ks:
        assert k.calls >= 1 and k.regs > 0 and k.threads <= k.max_threads, k
        # The runtime never places more blocks than any single resource allows.
        assert 1 <= k.active_blocks_per_sm <= min(kernels.block_limits(k, dev).values()), k
        assert (k.active_clusters is not None) == (k.cluster > 1), k
        if "staged_rows_kernel" in k.name and k.cluster > 1:
            # The row engine's plan: registers hold as many of a cluster's blocks per SM as
            # shared memory does (16-bit layer_norm takes 256 threads, not 512, for that).
            limits = kernels.block_limits(k, dev)
            assert limits["registers"] >= limits["shared memory"], (k, limits)
    assert "limited by" in kernels.table(dev, ks)


@pytest.mark.cuda
@needs_cuda_report
def test_recording_only_while_on():
    torch.ops.fusedops.cuda_kernel_recording(True)
    torch.ops.fusedops.cuda_kernel_recording(False)  # cleared, then off
    fusedops.softmax(torch.randn(8, 256, device="cuda"))
    torch.cuda.synchronize()
    _, ks = kernels.parse_report(torch.ops.fusedops.cuda_kernel_report(0))
    assert ks == []
