"""The cost of one more kernel in a program, measured on this GPU: a launch's share of a replayed CUDA graph.

Programs are called as CUDA graphs (compiler/device_call.py), so what a kernel boundary costs is the gap the
graph leaves between two kernels, not Python's launch: it is measured as a graph of LAUNCHES empty kernels,
replayed, divided by LAUNCHES. The cost model counts it once per kernel (`Target.launch_s`).
"""
from __future__ import annotations

import functools
from statistics import median

from . import runtime
from .nvrtc import compile_cubin

LAUNCHES = 64
EMPTY_KERNEL = 'extern "C" __global__ void tensorsmith_empty_kernel() {}\n'


@functools.cache
def measured_launch_seconds() -> float:
    """Seconds one kernel adds to a replayed graph of back-to-back kernels on device 0 (measured once a process)."""
    function = runtime.Module(compile_cubin(EMPTY_KERNEL, "tensorsmith_empty_kernel")).function(
        "tensorsmith_empty_kernel")
    graph = runtime.LaunchGraph([runtime.Launch(function, (1, 1, 1), (32, 1, 1), ())] * LAUNCHES)
    return median(runtime.time_kernel(graph.replay, warmup=3, repeat=20, flush_l2=False)) * 1e-3 / LAUNCHES
