"""The analytical cost model: a roofline time per kernel from the bytes it moves and the FLOPs it does."""
from __future__ import annotations

from tensorsmith.ir.kernel_program import Kernel, KernelProgram
from tensorsmith.ir.ops import COMPUTE, Op
from tensorsmith.ir.targets import Target

LAUNCH_SECONDS = 3e-6          # one launch and its gap on the stream, measured ~4 us with events on the H200
TRANSCENDENTAL_FLOPS = 8       # exp2/log2/sin/sqrt/recip cost several FP32 slots on the special-function unit


def kernel_flops(kernel: Kernel) -> float:
    """Floating-point work of one kernel: each compute node once per element it produces or reduces."""
    flops = 0.0
    for node in kernel.body:
        if node.op not in COMPUTE:
            continue
        elements = node.srcs[0].size if node.op in (Op.SUM, Op.MAX) else node.size
        flops += elements * (TRANSCENDENTAL_FLOPS if node.op in (Op.EXP2, Op.LOG2, Op.SIN, Op.SQRT, Op.RECIP) else 1)
    return flops


def kernel_bytes(kernel: Kernel, program: KernelProgram) -> float:
    """Device-memory traffic: every buffer the kernel touches, read or written once."""
    return float(sum(program.buffers[name].nbytes for name in kernel.reads + kernel.writes))


def kernel_seconds(kernel: Kernel, program: KernelProgram, target: Target) -> float:
    """max(bytes / bandwidth, FLOPs / FP32 rate) plus a launch."""
    return max(kernel_bytes(kernel, program) / target.hbm_bytes_per_s,
               kernel_flops(kernel) / target.fp32_flops) + LAUNCH_SECONDS


def program_seconds(program: KernelProgram, target: Target) -> float:
    return sum(kernel_seconds(kernel, program, target) for kernel in program.kernels)
