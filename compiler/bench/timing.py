"""Timing on the GPU by CUDA events, with PyTorch's: one method for tensorsmith and every baseline.

Each run is preceded by an L2 flush and bracketed by two events on torch's current stream (the legacy default
stream, where tensorsmith's launches go too). Runs are taken in turns, `rounds` rounds of `repeat` runs of each
callable, so that a drift of the GPU's clocks falls on all alike, and the median of all a callable's runs is its
time. A run that stands for the GPU's work alone (`queued`) is queued behind a sleeping kernel, so that the
time between its events is the kernels', not Python's launch; every other run is timed as its caller sees it,
starting with the device idle (the flush is waited for), so that its launch overhead counts.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

L2_FLUSH_BYTES = 2 * 60 * 2**20    # twice the H200's 60 MB of L2
SLEEP_CYCLES = 50_000_000          # about 30 ms at the H200's clocks: longer than Python takes to queue a round
COPY_BYTES = 2**30                 # the copy that measures bandwidth: far past L2
MATMUL_SIZE = 8192                 # the square float16 product that measures the matrix rate


def time_runs(torch: Any, runs: dict[str, Callable[[], object]], queued: frozenset[str] = frozenset(),
              rounds: int = 5, repeat: int = 10, warmup: int = 3) -> dict[str, float]:
    """Median milliseconds of each of `runs`, taken in turns; those named in `queued` behind a sleeping kernel."""
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    for run in runs.values():
        for _ in range(warmup):
            run()
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            events = []
            if name in queued:
                torch.cuda._sleep(SLEEP_CYCLES)
            for _ in range(repeat):
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
