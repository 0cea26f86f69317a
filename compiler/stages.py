"""What the pipeline's stages read and return: the compile's options, the context its stages share, and each stage's
result as a frozen record (`pipeline.STAGES` lists the stages; each one's signature names the records it reads)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from tensorsmith import rewrites, search
from tensorsmith.codegen.render import RenderedKernel
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.kernel_program import KernelProgram
from tensorsmith.ir.layers import Layers
from tensorsmith.ir.targets import Target
from tensorsmith.search.exact import ExactCheck
from tensorsmith.search.kernel_times import KernelTimes
from tensorsmith.search.refit import Fit
from tensorsmith.search.verify import Check, Draw


@dataclass(frozen=True)
class CompileOptions:
    """What the user may choose; every field has a sensible default."""

    target: str = "sm90"
    budget_s: float = 60.0
    seed: int = 0
    profile: bool | None = None        # None: profile where a GPU is present
    progress: Callable[[object], None] | None = None   # a stage's name, or the search's SearchProgress
    rewrites: bool = True              # False: the graph as written is searched, the e-graph not built
    example_inputs: Mapping[str, Any] | None = None   # verification's first draw, where the user gives one
    began: float | None = None         # time.monotonic() when the budget began (an importer's start); None: now
    layers: bool = True                # False: a model of identical layers is searched whole, not layer by layer


@dataclass
class Context:
    """What every stage of one compile reads, and the state they share: the random tests' draws (made once, read by
    the search, the checks and the profile), the time draw 0's reference took, and each stage's seconds."""

    graph: Graph
    options: CompileOptions
    target: Target                     # as named; the search's Calibration holds it as measured on this GPU
    deadline: float = math.inf         # time.monotonic() at which the budget is spent
    kernel_times_path: Path | None = None   # the measured kernel times beside the program cache (None: no cache)
    draws: dict[int, Draw | None] = field(default_factory=dict)   # random tests' inputs and reference outputs, by
                                       # draw: the search's, then the GPU's check (draw 0) and the exact check's cut
    reference_s: float | None = None   # one float64 evaluation of the user's graph on draw 0, as timed before searching
    seconds: dict[str, float] = field(default_factory=dict)   # each stage's, as it ran


@dataclass(frozen=True)
class Layered:
    """The "layers" stage's result: the model's identical layers, each distinct piece then compiled once (None: it
    has none, or layers=False)."""

    layers: Layers | None


@dataclass(frozen=True)
class Saturation:
    """saturate's result, which extraction reads and the pipeline then frees (egglog's EGraph is large)."""

    saturated: rewrites.Saturated | None   # None: rewrites off, or a layered model (its pieces are saturated one
                                           # by one)


@dataclass(frozen=True)
class Forms:
    """The programs searched, as ir.Graphs: the graph as written (tidied) first, and the one chosen."""

    forms: list[search.Form]
    chosen: Graph                      # extraction's: the first form; the search's: the form that won
    saturation: rewrites.SaturationReport | None = None   # the e-graph's report, where one was built


@dataclass(frozen=True)
class Calibration:
    """The target as the search found it on this GPU: one launch's measured cost and the cost model refitted to the
    kernels timed here before, and where those times are kept (all as named where no GPU measured)."""

    target: Target
    launch_measured: bool = False      # whether target.launch_s was measured on this GPU (else the table's)
    cost_fits: list[Fit] = field(default_factory=list)   # the model refitted to this GPU's records, where it was
    kernel_times: KernelTimes | None = None   # those the search measured or reused, where it measured on a GPU


@dataclass(frozen=True)
class Searched:
    """The search's result: the kernel program it chose and how it got there."""

    result: search.SearchResult
    forms: Forms                       # the forms searched (the graph as written where the rewritten one failed)
    calibration: Calibration
    layers: dict[str, Any] = field(default_factory=dict)   # a layered model's report: how many, how each piece went
    left_out: dict[str, str] = field(default_factory=dict)   # what the search gave up on, and why

    @property
    def program(self) -> KernelProgram:
        return self.result.program

    @property
    def target(self) -> Target:
        return self.calibration.target


@dataclass(frozen=True)
class Derived:
    """derive's result: the rewrites the chosen form depends on, in order from the graph as written (None where the
    form as written won, rewrites were off, or the model was compiled layer by layer)."""

    derivation: rewrites.Derivation | None


@dataclass(frozen=True)
class Verified:
    """verify's result: the exact check's and the random tests' verdicts on the searched program."""

    checks: list[Check]                # the random tests' (empty: the exact check alone showed it right)
    exact_checks: list[ExactCheck] = field(default_factory=list)   # the exact check's, where it ran
    exact_against: str = ""            # which graph it compared with
    left_out: dict[str, str] = field(default_factory=dict)   # checks the budget or the dtypes left out, and why


@dataclass(frozen=True)
class Rendered:
    """render's result: each kernel as CUDA C, in the program's order."""

    kernels: list[RenderedKernel]


@dataclass(frozen=True)
class Cubins:
    """nvrtc's result: each rendered kernel's cubin, in the same order."""

    cubins: list[bytes]


@dataclass(frozen=True)
class Profiled:
    """profile's result, where a GPU ran the program (all None where it did not)."""

    checks: list[Check] | None = None  # its outputs on the GPU against the reference
    kernel_ms: list[float] | None = None
    total_ms: float | None = None
    unfused_ms: float | None = None    # one op a kernel, timed the same way
    left_out: dict[str, str] = field(default_factory=dict)   # measurements the budget left out, and why


@dataclass(frozen=True)
class Compilation:
    """Every stage's result for one graph, which the Program and its report are made from."""

    context: Context
    layered: Layered
    forms: Forms                       # extraction's
    searched: Searched
    derived: Derived
    verified: Verified
    rendered: Rendered
    cubins: Cubins
    profiled: Profiled
