"""Compilation targets: the GPU facts that codegen and the cost model need, one record per target."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import TargetError


@dataclass(frozen=True)
class Target:
    """A GPU generation. Bandwidth and FLOP rates are measured ceilings where we have them."""

    name: str
    arch: str                   # NVRTC's --gpu-architecture
    description: str
    sm_count: int
    shared_bytes_per_block: int
    l2_bytes: int
    hbm_bytes_per_s: float
    fp32_flops: float
    # Occupancy limits (CUDA programming guide, compute capability table) and latencies for the cost model.
    max_threads_per_block: int = 1024
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    registers_per_sm: int = 65536
    max_registers_per_thread: int = 255
    shared_bytes_per_sm: int = 228 * 1024
    l2_bytes_per_s: float = 10e12       # re-reads that hit L1/L2; an estimate from published microbenchmarks
    dram_latency_s: float = 600e-9      # a global load that misses the caches (estimate)
    cache_latency_s: float = 200e-9     # a load that hits L2 (estimate)
    tensor_flops: float = 790e12        # fp16/bf16 matmul on tensor cores (measured ~790 TFLOP/s bf16, H200)
    # What our own tensor-core kernels reach at best (H200, fp16, 2026-11-29): mma.sync 295 TFLOP/s at 4096^3,
    # wgmma on TMA 690 TFLOP/s at 4096 x 4096 x 11008 (fitted: 640); the cost model prices our kernels, not cuBLAS's.
    mma_sync_flops: float = 300e12
    wgmma_flops: float = 640e12
    launch_s: float = 3e-6              # one launch and its gap on the stream (measured ~4 us with events, H200)
    gpcs: int = 8                       # graphics processing clusters: a thread-block cluster runs within one
    # programmatic dependent launch (sm_90): a kernel may start while the one before it finishes, waiting in its
    # first statement (griddepcontrol.wait) for that kernel's writes, so that launches overlap
    programmatic_launch: bool = True
    # the model refitted to this GPU's measured kernels (search/refit.py): (archetype, scale, power), a kernel's time
    # t priced scale * t ** power; none where no records were fitted
    corrections: tuple[tuple[str, float, float], ...] = ()


TARGETS: dict[str, Target] = {
    # H200 figures measured on this project's lent H200 (device copy 4.3 TB/s); FP32 from the datasheet.
    "sm90": Target("sm90", "sm_90", "NVIDIA Hopper (H100, H200)", 132, 227 * 1024, 60 * 2**20, 4.3e12, 67e12),
    "sm80": Target("sm80", "sm_80", "NVIDIA Ampere (A100)", 108, 163 * 1024, 40 * 2**20, 1.9e12, 19.5e12,
                   shared_bytes_per_sm=164 * 1024, l2_bytes_per_s=5e12, tensor_flops=312e12,
                   mma_sync_flops=220e12, wgmma_flops=0.0, gpcs=7,   # mma.sync: an estimate (70%), not measured
                   programmatic_launch=False),
}


def get_target(name: str) -> Target:
    """The target called `name`, or a TargetError that lists the known ones."""
    try:
        return TARGETS[name]
    except KeyError:
        known = ", ".join(f"{t.name} ({t.description})" for t in TARGETS.values())
        raise TargetError(f"unknown target {name!r}; known targets: {known}") from None
