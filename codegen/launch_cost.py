"""The cost of one more kernel in a program, measured on this GPU: a launch's share of a replayed CUDA graph.

Programs are called as CUDA graphs (compiler/device_call.py), so what a kernel boundary costs is the gap the
graph leaves between two kernels, not Python's launch: it is measured as a graph of LAUNCHES empty kernels,
replayed, divided by LAUNCHES. The empty kernel begins as every generated kernel does, and is launched as the
program's kernels are: programmatic dependent launches on sm90 (`Target.programmatic_launch`), where the next
kernel starts while the one before runs, so that part of the gap is hidden. The cost model counts it once per
kernel (`Target.launch_s`).
"""
from __future__ import annotations

import functools
from statistics import median

import numpy as np

from . import runtime
from .nvrtc import compile_cubin
from .render import render_template

LAUNCHES = 64
ENTRY = "tensorsmith_empty_kernel"
BLOCK = (32, 1, 1)


@functools.cache
def measured_launch_seconds(programmatic: bool = False) -> float:
    """Seconds one kernel adds to a replayed graph of back-to-back kernels on device 0, each a programmatic
    dependent launch or not (measured once a process)."""
    function = runtime.Module(compile_cubin(empty_kernel_source(), ENTRY)).function(ENTRY)
    launch = runtime.Launch(function, (1, 1, 1), BLOCK, (np.uint64(0),), programmatic=programmatic)  # a null pointer
    graph = runtime.LaunchGraph([launch] * LAUNCHES)
    return median(runtime.time_kernel(graph.replay, warmup=3, repeat=20, flush_l2=False)) * 1e-3 / LAUNCHES


def empty_kernel_source() -> str:
    """The empty kernel: one pointer parameter, which it never reads, so that it is declared as every kernel is."""
    return render_template("empty.cu.j2", k={"entry": ENTRY, "block": BLOCK,
                                             "params": [{"name": "unused", "ctype": "float", "const": True}]})
