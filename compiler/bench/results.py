"""The results of `tensorsmith bench` as data: one Row per case, each way of running it a Measured."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

NOT_RUN = "not run"


@dataclass
class Measured:
    """One way of running a case: its median time as its caller sees it (`ms`) and, where measured, the GPU's time
    alone (`gpu_ms`, the runs queued behind a sleeping kernel); its first call's compile time; its error against
    float32 PyTorch; and, where there is no time, why (`wrong`: the output was checked and is wrong; `slow_path`: a
    baseline that ran a path its users would not get, SDPA's math say). A baseline's `gpu_kernels` are those its
    profile shows for one call, name -> microseconds."""

    ms: float | None = None
    compile_s: float | None = None
    error: float | None = None
    failure: str | None = None     # one line: why there is no time
    wrong: bool = False
    gpu_ms: float | None = None
    slow_path: bool = False
    gpu_kernels: dict[str, float] = field(default_factory=dict)


@dataclass
class KernelTime:
    """One of tensorsmith's kernels as the compile measured it alone."""

    name: str
    archetype: str
    ms: float | None
    schedule: dict[str, int] = field(default_factory=dict)


@dataclass
class Row:
    """One case of the suite, measured: tensorsmith's kernels and call, and each baseline."""

    case: str
    family: str
    floor_ms: float
    floor_bound: str                      # "memory" or "matmul": which term of the floor is larger
    kernels: Measured = field(default_factory=Measured)
    call: Measured = field(default_factory=Measured)
    kernel_count: int | None = None
    compile_warm_s: float | None = None
    compile_stages: dict[str, float] = field(default_factory=dict)   # the cold compile's seconds per stage
    kernel_times: list[KernelTime] = field(default_factory=list)
    baselines: dict[str, Measured] = field(default_factory=dict)
    note: str = ""
    commit: str | None = None             # what ran, where rows of several runs are joined
    budget_s: float | None = None
    forms: list[dict[str, Any]] = field(default_factory=list)   # the program report's algebraic forms searched
    written: Measured | None = None       # the graph as written compiled with rewrites off, where the form differs
    backend: Measured | None = None       # the model through torch.compile(backend="tensorsmith"), as called

    def best_baseline(self, gpu_time: bool = False) -> tuple[str, float] | None:
        """The fastest baseline that ran and was right, with its ms (as called, or with `gpu_time` the GPU's alone
        where the run measured that)."""
        timed: list[tuple[str, float]] = []
        for name, m in self.baselines.items():
            ms = _time(m, gpu_time)
            if m.failure is None and ms:
                timed.append((name, ms))
        return min(timed, key=lambda t: t[1]) if timed else None

    def best_modes(self) -> str:
        """The best baseline's name for our kernels' comparison and for our call's, one name where they agree."""
        names = [best[0] if (best := self.best_baseline(gpu_time)) else "-" for gpu_time in (True, False)]
        return names[0] if names[0] == names[1] else " / ".join(names)

    def speedup(self, ours: Measured) -> float | None:
        """The best baseline's time over `ours` (above 1: tensorsmith is faster): our kernels' GPU time against the
        baselines' GPU time (their time as called, in runs that did not measure it), our call against theirs."""
        best = self.best_baseline(gpu_time=ours is self.kernels)
        if best is None or not ours.ms or ours.failure is not None:
            return None
        return best[1] / ours.ms

    def of_floor(self) -> float | None:
        """The floor over tensorsmith's kernel time: 1.0 would be a program at the hardware's limit."""
        return self.floor_ms / self.kernels.ms if self.kernels.ms and self.kernels.failure is None else None

    def why_slower(self) -> str:
        """Where tensorsmith's kernels lose to the best baseline, from its own measurements: the kernel that takes
        the most time, and how far the program is from its floor."""
        speedup = self.speedup(self.kernels)
        if speedup is None or speedup >= 1.0:
            return ""
        floor = f"{self.of_floor():.0%} of its {self.floor_bound} floor"
        timed = [k for k in self.kernel_times if k.ms is not None]
        if not timed:
            return f"{self.kernel_count or 'its'} kernels, none timed alone; {floor}"
        slowest = max(timed, key=lambda k: k.ms or 0.0)
        if len(timed) == 1:
            return f"its one kernel ({slowest.archetype}) runs at {floor}"
        share = (slowest.ms or 0.0) / sum(k.ms or 0.0 for k in timed)
        return (f"{len(timed)} kernels at {floor}; {slowest.name} ({slowest.archetype}) takes {us(slowest.ms)}, "
                f"{share:.0%} of their sum")


def unmeasured_row(case: str, family: str, baselines: list[str], why: str, **row: Any) -> Row:
    """The row of a case that was not measured (not run, or not built): `why` in every column."""
    return Row(case, family, 0.0, "-", Measured(failure=why), Measured(failure=why),
               baselines={name: Measured(failure=why) for name in baselines}, **row)


def _time(m: Measured, gpu_time: bool) -> float | None:
    return (m.gpu_ms or m.ms) if gpu_time else m.ms


def geomean(values: list[float]) -> float | None:
    """The geometric mean, None for no values."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def us(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms * 1000:.1f} us" if ms < 1 else f"{ms:.2f} ms"


def ratio(value: float | None) -> str:
    """A speedup as printed: two decimals and an x, '-' for none."""
    return f"{value:.2f}x" if value is not None else "-"
