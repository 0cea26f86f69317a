"""Timing on the GPU by CUDA events, with PyTorch's: one method for tensorsmith and every baseline.

Each run is preceded by an L2 flush and bracketed by two events on torch's current stream (the legacy default
stream, where tensorsmith's launches go too). Runs are taken in turns, `rounds` rounds of `repeat` runs of each
callable, so that a drift of the GPU's clocks falls on all alike, and the median of all a callable's runs is its
time. A run that stands for the GPU's work alone (`queued`) is queued behind a sleeping kernel of its own, long
enough to cover the run's launches (measured on the host in the warm-up), so that the time between its events is
the kernels', not Python's launch: one sleep for many runs let a 549-kernel program's launches outrun it and fill
the launch queue, and timed the host (32.9 ms of "GPU time" against 7.7 ms as called, H100, 2026-12-06). Every other
run is timed as its caller sees it, starting with the device idle (the flush is waited for), so that its launch
overhead counts.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

L2_FLUSH_BYTES = 2 * 60 * 2**20    # twice the H200's 60 MB of L2
SLEEP_CYCLES_PER_MS = 1_700_000    # the sleeping kernel's clock cycles a millisecond (H100 and H200, about 1.7 GHz)
MIN_SLEEP_MS = 2.0                 # the least a queued run waits behind
QUEUE_MARGIN = 3.0                 # the sleep: this many times as long as the host took to launch the run
SLEEP_CYCLES = 30 * SLEEP_CYCLES_PER_MS   # a round of a few short kernels (benchmarks/memory_bound.py) waits this long
COPY_BYTES = 2**30                 # the copy that measures bandwidth: far past L2
MATMUL_SIZE = 8192                 # the square float16 product that measures the matrix rate


def time_runs(torch: Any, runs: dict[str, Callable[[], object]], queued: frozenset[str] = frozenset(),
              rounds: int = 5, repeat: int = 10, warmup: int = 3) -> dict[str, float]:
    """Median milliseconds of each of `runs`, taken in turns; those named in `queued` behind a sleeping kernel."""
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    launch_ms: dict[str, float] = {}
    for name, run in runs.items():
        for _ in range(warmup):   # the quickest warm-up's host time: its launches (a first run may compile)
            torch.cuda.synchronize()
            began = time.perf_counter()
            run()
            launch_ms[name] = min(launch_ms.get(name, math.inf), (time.perf_counter() - began) * 1e3)
    torch.cuda.synchronize()
    sleeps = {name: int(max(MIN_SLEEP_MS, QUEUE_MARGIN * launch_ms.get(name, 0.0)) * SLEEP_CYCLES_PER_MS)
              for name in runs}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            events = []
            for _ in range(repeat):
                if name in queued:
                    torch.cuda._sleep(sleeps[name])
                flush.zero_()
                if name not in queued:
                    torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                run()
                end.record()
                events.append((start, end))
            torch.cuda.synchronize()
            times[name].extend(start.elapsed_time(end) for start, end in events)
    return {name: statistics.median(values) for name, values in times.items()}


def copy_bytes_per_s(torch: Any) -> float:
    """A device-to-device copy's rate, counting bytes read and written: the ceiling of memory-bound work."""
    src = torch.randn(COPY_BYTES // 2, device="cuda", dtype=torch.float16)
    dst = torch.empty_like(src)
    ms = time_runs(torch, {"copy": lambda: dst.copy_(src)}, rounds=2)["copy"]
    return 2 * COPY_BYTES / (ms * 1e-3)


def matmul_flops_per_s(torch: Any) -> float:
    """The rate of a large float16 product on random data through cuBLAS: the ceiling of contractions."""
    a, b = (torch.randn(MATMUL_SIZE, MATMUL_SIZE, device="cuda", dtype=torch.float16) for _ in range(2))
    ms = time_runs(torch, {"mm": lambda: a @ b}, rounds=2)["mm"]
    return 2 * MATMUL_SIZE**3 / (ms * 1e-3)
