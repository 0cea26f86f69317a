"""The compiler pipeline: a flat list of named stages, each a function from one plain data type to the next."""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from tensorsmith import codegen, rewrites, search
from tensorsmith.codegen.nvrtc import compile_cubin
from tensorsmith.codegen.render import MEASURED_PLACEHOLDER, RenderedKernel, render_program
from tensorsmith.ir.errors import DeviceError, GraphError
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.interpreter import evaluate
from tensorsmith.ir.kernel_program import KernelProgram
from tensorsmith.search.verify import Check, VerificationError, compare, random_inputs, verify_program

from .program import CompiledKernel, Program
from .targets import Target, get_target

VERSION = "0.1.0"


@dataclass(frozen=True)
class CompileOptions:
    """What the user may choose; every field has a sensible default."""

    target: str = "sm90"
    budget_s: float = 60.0
    seed: int = 0
    profile: bool | None = None        # None: profile where a GPU is present
    progress: Callable[[str], None] | None = None


@dataclass
class Compilation:
    """Everything the stages have produced so far for one graph."""

    graph: Graph
    options: CompileOptions
    target: Target
    saturated: Any = None
    chosen: Graph | None = None
    kernel_program: KernelProgram | None = None
    checks: list[Check] = field(default_factory=list)
    rendered: list[RenderedKernel] = field(default_factory=list)
    cubins: list[bytes] = field(default_factory=list)
    kernel_ms: list[float] | None = None
    total_ms: float | None = None
    seconds: dict[str, float] = field(default_factory=dict)


def _saturate(c: Compilation) -> None:
    c.saturated = rewrites.saturate(c.graph)


def _extract(c: Compilation) -> None:
    c.chosen = search.extract(c.saturated)


def _partition(c: Compilation) -> None:
    c.kernel_program = search.partition(c.chosen)


def _verify(c: Compilation) -> None:
    c.checks = verify_program(c.graph, c.kernel_program, c.options.seed)


def _render(c: Compilation) -> None:
    c.rendered = render_program(c.kernel_program, VERSION)


def _nvrtc(c: Compilation) -> None:
    c.cubins = [compile_cubin(k.source, k.name, arch=c.target.arch) for k in c.rendered]


def _profile(c: Compilation) -> None:
    from tensorsmith.codegen.runtime import gpu_available
    wanted = c.options.profile
    if wanted is False or (wanted is None and not gpu_available()):
        return
    if not gpu_available():
        raise DeviceError("profiling needs an NVIDIA GPU and none was found; compile with profile=False")
    from .executor import profile_on_gpu
    inputs = random_inputs(c.graph, c.options.seed + 1000)
    outputs, c.kernel_ms, c.total_ms = profile_on_gpu(to_program(c), inputs)
    checks = compare(c.graph, outputs, evaluate(c.graph, inputs))
    failed = [check for check in checks if not check.ok]
    if failed:
        raise VerificationError(f"the GPU program for {c.graph.name!r} disagrees with the reference on output"
                                f" {failed[0].output!r}: relative L2 error {failed[0].error:.3g}"
                                f" > {failed[0].tolerance:g}; its timings are discarded")
    c.checks = checks


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[Compilation], None]


STAGES: list[Stage] = [
    Stage("saturate", _saturate),     # grow the e-graph, bounded
    Stage("extract", _extract),       # choose one program from it
    Stage("partition", _partition),   # kernel boundaries and archetypes
    Stage("verify", _verify),         # random tests of the kernel program against the reference
    Stage("render", _render),         # Jinja -> CUDA C
    Stage("nvrtc", _nvrtc),           # CUDA C -> cubin
    Stage("profile", _profile),       # only where a GPU is present: check outputs, then time
]


def compile(graph: Graph, target: str = "sm90", budget_s: float = 60.0, seed: int = 0,
            profile: bool | None = None, progress: Callable[[str], None] | None = None) -> Program:
    """Compile `graph` for `target` into a verified Program (profiled where a GPU is present)."""
    if not graph.outputs:
        raise GraphError(f"graph {graph.name!r} has no outputs; register one with graph.output(name, tensor)")
    options = CompileOptions(target, budget_s, seed, profile, progress)
    compilation = Compilation(graph, options, get_target(target))
    for stage in STAGES:
        if progress:
            progress(stage.name)
        start = time.perf_counter()
        stage.run(compilation)
        compilation.seconds[stage.name] = time.perf_counter() - start
    return to_program(compilation)


def to_program(c: Compilation) -> Program:
    """The Program that the stages so far describe (timings written into each kernel's header)."""
    kernels = []
    for position, (rendered, cubin) in enumerate(zip(c.rendered, c.cubins)):
        measured = c.kernel_ms[position] if c.kernel_ms else None
        source = rendered.source
        if measured is not None:
            source = source.replace(MEASURED_PLACEHOLDER, f"measured: {measured * 1000:.1f} us (median, L2 flushed)")
        kernels.append(CompiledKernel(rendered.name, rendered.file_stem, rendered.archetype,
                                      rendered.schedule.as_dict(), source, cubin, rendered.grid, rendered.block,
                                      rendered.params, measured))
    program = c.kernel_program
    report = {"stage_seconds": {k: round(v, 4) for k, v in c.seconds.items()},
              "checks": [{"output": ch.output, "relative_l2": ch.error, "tolerance": ch.tolerance} for ch in c.checks],
              "total_ms": c.total_ms}
    if c.saturated is not None and hasattr(c.saturated, "report"):
        report["saturation"] = _plain(c.saturated.report)
    return Program(c.graph.name, c.target.name, dict(program.buffers), program.inputs, tuple(program.outputs),
                   kernels, c.options.seed, VERSION, c.graph, program, report)


def _plain(value: Any) -> Any:
    """A dataclass report as JSON-ready data."""
    from dataclasses import asdict, is_dataclass
    return asdict(value) if is_dataclass(value) else value
