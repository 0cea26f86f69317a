"""The compiler pipeline: a flat list of named stages, each a function from one plain data type to the next."""
from __future__ import annotations

import contextlib
import functools
import gc
import logging
import math
import multiprocessing
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from tensorsmith import rewrites, search
from tensorsmith.codegen.launch_cost import measured_launch_seconds
from tensorsmith.codegen.nvrtc import compile_many, prefetch
from tensorsmith.codegen.render import MEASURED_PLACEHOLDER, RenderedKernel, render_program
from tensorsmith.codegen.runtime import device_name, gpu_available
from tensorsmith.ir.errors import CompileError, DeviceError, GraphError, InputError, KernelFault, TensorsmithError
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.interpreter import evaluate
from tensorsmith.ir.kernel_program import KernelProgram
from tensorsmith.ir.layers import Layers, Piece, find_layers, inline, stitched
from tensorsmith.ir.node import Node
from tensorsmith.ir.targets import Target, get_target
from tensorsmith.search import refit
from tensorsmith.search.cost import kernel_features, kernel_seconds, program_seconds
from tensorsmith.search.exact import MAX_WORK as EXACT_MAX_WORK
from tensorsmith.search.exact import PRIME, ExactCheck, check_exact, evaluation_size, relative_cost
from tensorsmith.search.kernel_times import KERNEL_TIMES_FILE, KernelTimes
from tensorsmith.search.partition import unfused
from tensorsmith.search.verify import (Check, Draw, NoiseOnlyError, VerificationError, check_verifiable, compare,
                                       example_digest, example_draw, meets_tolerance, reference_draw,
                                       verify_program)

from .cache import ProgramCache, program_key
from .executor import InProcess, InWorker, Profiler
from .compiled import CompiledKernel
from .program import Program
from .progress import default_progress

VERSION = "0.1.0"
log = logging.getLogger("tensorsmith")


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
class Compilation:
    """Everything the stages have produced so far for one graph."""

    graph: Graph
    options: CompileOptions
    target: Target
    saturated: Any = None              # rewrites.Saturated, until extraction has read it
    saturation: Any = None             # its report, kept
    chosen: Graph | None = None
    forms: list[search.Form] = field(default_factory=list)   # the programs searched, as written first
    kernel_program: KernelProgram | None = None
    checks: list[Check] = field(default_factory=list)
    rendered: list[RenderedKernel] = field(default_factory=list)
    cubins: list[bytes] = field(default_factory=list)
    kernel_ms: list[float] | None = None
    total_ms: float | None = None
    unfused_ms: float | None = None
    search: Any = None                 # search.SearchResult
    seconds: dict[str, float] = field(default_factory=dict)
    launch_measured: bool = False      # whether target.launch_s was measured on this GPU (else the table's)
    exact_checks: list[ExactCheck] = field(default_factory=list)   # the exact check's, where it ran
    exact_against: str = ""            # which graph it compared with
    kernel_times_path: Path | None = None   # the measured kernel times beside the program cache (None: no cache)
    kernel_times: KernelTimes | None = None  # those the search measured or reused, where it measured on a GPU
    cost_fits: list[refit.Fit] = field(default_factory=list)   # the model refitted to this GPU's records, where it was
    deadline: float = math.inf         # time.monotonic() at which the budget is spent
    draws: dict[int, Draw | None] = field(default_factory=dict)   # random tests' inputs and reference outputs, by
                                       # draw: the search's, then the GPU's check (draw 0) and the exact check's cut
    left_out: dict[str, str] = field(default_factory=dict)   # checks and measurements the budget left out, and why
    reference_s: float | None = None   # one float64 evaluation of the user's graph on draw 0, as timed before searching
    found_layers: Layers | None = None  # the model's identical layers, where it has them (each searched once)
    layers: dict[str, Any] = field(default_factory=dict)   # their report: how many, how each distinct piece went

    def chosen_graph(self) -> Graph:
        """The graph the search partitions into kernels: extraction's first form, then the form that won."""
        if self.chosen is None:
            raise RuntimeError("no graph chosen yet: the extraction stage has not run")
        return self.chosen

    def program(self) -> KernelProgram:
        """The kernel program: the search's choice, or the one a baseline or a candidate was made with."""
        if self.kernel_program is None:
            raise RuntimeError("no kernel program yet: the search stage has not run")
        return self.kernel_program


def _find_layers(c: Compilation) -> None:
    c.found_layers = find_layers(c.graph) if c.options.layers else None


def _saturate(c: Compilation) -> None:
    if c.options.rewrites and c.found_layers is None:   # a layered model's pieces are saturated one by one (and
        # the model, should that fail, is searched as written)
        c.saturated = rewrites.saturate(c.graph)


def _extract(c: Compilation) -> None:
    if c.saturated is None:          # rewrites off, or a layered model
        c.forms, c.chosen = [search.Form(c.graph, None, WRITTEN)], c.graph
        return
    try:
        c.forms = search.extract_forms(c.saturated, c.target)   # the first: the graph as written, tidied
    finally:
        c.saturation, c.saturated = c.saturated.report, None
        gc.collect()   # egglog's EGraph, held in reference cycles, is freed here: dropped on another thread it raises
    c.chosen = c.forms[0].graph


WRITTEN = "as written"


def _kernel_times(c: Compilation) -> KernelTimes:
    """This GPU's kernel-time records, each new one with its kernel's features (for the model's refit)."""
    return KernelTimes(c.kernel_times_path, device_name(), features=partial(kernel_features, target=c.target))


def _search(c: Compilation) -> None:
    with InWorker() as gpu:   # candidates are untrusted: one that faults or hangs costs the worker, not us
        on_gpu = _profiles(c.options.profile) and gpu_available()
        if on_gpu:            # what one more kernel costs, as programs are called (a graph's replay), on this GPU
            c.target = replace(c.target, launch_s=measured_launch_seconds())
            c.launch_measured = True
            c.kernel_times = _kernel_times(c)
            c.cost_fits = refit.fit(c.kernel_times.records, c.options.seed)
            if c.cost_fits:   # the model as this GPU's measured kernels correct it
                c.target = replace(c.target, corrections=tuple(fit.correction for fit in c.cost_fits))
        if c.found_layers is not None:
            try:
                return _search_layers(c, c.found_layers, gpu if on_gpu else None)
            except (VerificationError, KernelFault, CompileError) as err:   # a piece with no verified program, or
                # a stitched program that is wrong, faults or does not compile: the whole model's search skips such
                log.warning("compiling %r layer by layer failed verification (%s); the model is searched whole, as"
                            " written", c.graph.name, err)
                c.left_out["layers"] = (f"compiling it layer by layer failed verification ({err}); the model was"
                                        f" searched whole, as written")
                c.layers, c.found_layers = {}, None
        _search_whole(c, gpu if on_gpu else None)


def _search_whole(c: Compilation, gpu: Profiler | None) -> None:
    """The search of the whole graph, its rewritten forms first, the graph as written where none of them passes."""
    measure = _measure_on_gpu(c, gpu) if gpu is not None else None
    try:
        c.search = _search_chosen(c, measure)
    except VerificationError as err:
        if [search.canonical_hash(form.graph) for form in c.forms] in ([], [search.canonical_hash(c.graph)]):
            raise   # the graph as written was all that was searched
        log.warning("the rewritten graph of %r failed random testing (%s); compiling the graph as written",
                    c.graph.name, err)
        c.left_out["rewrites"] = (f"the rewritten graph failed random testing ({err}); the graph as written was"
                                  f" compiled")
        c.chosen, c.forms = c.graph, [search.Form(c.graph, None, WRITTEN)]
        c.search = _search_chosen(c, measure)
    c.chosen = c.forms[c.search.form].graph if c.forms else c.chosen
    c.kernel_program = c.search.program


LAYER_STAGES = ("saturate", "extract", "search", "verify")   # what each distinct piece of a layered model goes through


def _search_layers(c: Compilation, layers: Layers, gpu: Profiler | None) -> None:
    """Each distinct piece of a model of identical layers (`ir.layers`: the prefix, one layer, the suffix) compiled
    through LAYER_STAGES in a share of what is left of the budget by its size, then the model's program stitched
    from them: every layer runs the kernels and schedules of the one searched, on its own weights. The stitched
    program is random-tested against the user's graph end to end before it counts: on the GPU, where one is
    present and draw 0 is random, and in numpy where no GPU is, where draw 0 is the user's example inputs, or where
    the GPU's outputs do not meet the dtypes' own tolerance (rounding noise alone may then explain them: the numpy
    test and the exact check judge)."""
    distinct = layers.distinct()
    sizes = [len(piece.graph.nodes()) for piece in distinct]
    titles = [piece.tag if piece.tag != "layer0" else f"layer (x{layers.identical()})" for piece in distinct]
    programs: dict[str, KernelProgram] = {}
    parts: list[Compilation] = []
    whole: dict[str, float] = {}   # the seconds of the whole-model work, which grows with depth
    with _switching(BACKGROUND_SWITCH_S), ThreadPoolExecutor(1, thread_name_prefix="end-to-end") as background:
        drawing = background.submit(_time_reference, c)   # the end-to-end test's draw: the whole model's float64
        # reference, made while the pieces are searched
        for i, piece in enumerate(distinct):
            left = c.deadline - time.monotonic() - END_TO_END_EVALUATIONS * _reference_estimate(c, layers,
                                                                                                 distinct, parts)
            part = _compile_piece(c, piece.graph, max(left, 0.0) * sizes[i] / sum(sizes[i:]), titles[i], gpu)
            programs[piece.structure] = part.program()
            parts.append(part)
        began = time.monotonic()
        drawing.result()
    assert c.reference_s is not None
    whole.update({"reference": c.reference_s, "waited for it": time.monotonic() - began})
    program = stitched(c.graph, layers, programs)
    chosen = _stitched_graph(c.graph, layers, {piece.structure: part.chosen_graph()
                                               for piece, part in zip(distinct, parts)})
    measured, checks = None, []
    if gpu is not None:   # the end-to-end random test on the GPU, where its outputs meet the dtypes' tolerance
        began = time.monotonic()
        measured = _measure_on_gpu(c, gpu, on_checks=checks.extend)(program)
        whole["gpu check"] = time.monotonic() - began
    random = c.options.example_inputs is None   # (draw 0 is random, not the user's examples, which may hide a fault)
    if not (random and meets_tolerance(c.graph, checks)):
        began = time.monotonic()   # in numpy, where no GPU ran it or its outputs are within rounding noise only
        checks = _random_test_stitched(c, program, chosen)
        whole["random test"] = time.monotonic() - began
    c.chosen, c.forms = chosen, [search.Form(chosen, None, WRITTEN)]   # each piece chose its own form
    c.kernel_program = program
    c.search = search.SearchResult(program, program_seconds(program, c.target) * 1e6,
                                   measured * 1e6 if measured is not None else None,
                                   [{**entry, "name": f"{title}: {entry['name']}"}
                                    for title, part in zip(titles, parts) for entry in part.search.history],
                                   _summed([part.search.stats for part in parts]), checks=checks)
    c.layers = {"identical": layers.identical(), "pieces": [
        {"piece": title, "nodes": size,
         "kernels": len(part.program().kernels), "predicted_us": part.search.predicted_us,
         "measured_us": part.search.measured_us, "stage_seconds": {k: round(v, 4) for k, v in part.seconds.items()}}
        for title, size, part in zip(titles, sizes, parts)],
        "whole_model_seconds": {k: round(v, 4) for k, v in whole.items()},
        "end_to_end": "numpy" if "random test" in whole else "gpu"}   # which run of draw 0 judged the stitching


BACKGROUND_SWITCH_S = 2e-4   # how long the search's thread keeps the interpreter lock while the draw's thread waits:
                             # at Python's 5 ms, a deep model's draw, thousands of numpy calls, took 4x as long beside
                             # the search as alone (a narrow 16-layer Llama: 3.4 s against 0.8 s; 1.7 s at this)


_switched = {"blocks": 0, "before": 0.0}   # the switch interval is the process's: compiles in threads share it
_switched_lock = threading.Lock()


@contextlib.contextmanager
def _switching(interval_s: float) -> Iterator[None]:
    """Python's thread switch interval at `interval_s` while any compile is in such a block, restored when the
    last one leaves."""
    with _switched_lock:
        if _switched["blocks"] == 0:
            _switched["before"] = sys.getswitchinterval()
            sys.setswitchinterval(interval_s)
        _switched["blocks"] += 1
    try:
        yield
    finally:
        with _switched_lock:
            _switched["blocks"] -= 1
            if _switched["blocks"] == 0:
                sys.setswitchinterval(_switched["before"])


def _reference_estimate(c: Compilation, layers: Layers, distinct: list[Piece], parts: list[Compilation]) -> float:
    """The seconds of the whole model's reference draw: as timed where it is made, else what the pieces compiled so
    far (`parts`, of the first `distinct` pieces) took for theirs, each as often as the model holds it."""
    if c.reference_s is not None:
        return c.reference_s
    structures = [piece.structure for piece in layers.pieces]
    return sum((part.reference_s or 0.0) * structures.count(piece.structure) for piece, part in zip(distinct, parts))


def _random_test_stitched(c: Compilation, program: KernelProgram, chosen: Graph) -> list[Check]:
    """The stitched program run in numpy on the end-to-end draws (draw 0, and a random one where draw 0 is the
    user's example inputs) against the user's graph; the exact check decides where rounding noise is all it shows."""
    try:
        return verify_program(c.graph, program, c.options.seed, memo=c.draws,
                              draws=END_TO_END_DRAWS + (c.options.example_inputs is not None))
    except NoiseOnlyError as err:   # rounding noise only, as deep models' outputs may be: the exact check decides
        if evaluation_size(chosen) > EXACT_MAX_WORK:
            raise
        check_exact(chosen, program, c.options.seed)   # ExactMismatch (a VerificationError) where they differ
        return err.checks


END_TO_END_DRAWS = 1         # the stitched program's random tests in numpy: each piece was tested on its own draws,
                             # so this test is of the stitching
END_TO_END_EVALUATIONS = 3   # reference evaluations' time kept for that test and the GPU's check
MIN_PIECE_S = 1.0            # the least budget a piece is searched in


def _compile_piece(c: Compilation, graph: Graph, budget_s: float, title: str, gpu: Profiler | None) -> Compilation:
    """One distinct piece of a layered model through LAYER_STAGES in `budget_s` (at least MIN_PIECE_S), its search
    progress named `title`, measured on `gpu` into the model's kernel times."""
    budget_s = max(budget_s, MIN_PIECE_S)
    options = replace(c.options, budget_s=budget_s, began=None, example_inputs=None,
                      progress=_titled(c.options.progress, title))
    part = Compilation(graph, options, c.target, kernel_times_path=c.kernel_times_path, kernel_times=c.kernel_times,
                       deadline=time.monotonic() + budget_s, launch_measured=c.launch_measured)
    for stage in STAGES:
        if stage.name in LAYER_STAGES:
            began = time.perf_counter()
            if stage.name == "search":
                _search_whole(part, gpu)
            else:
                stage.run(part)
            part.seconds[stage.name] = time.perf_counter() - began
    return part


def _stitched_graph(model: Graph, layers: Layers, chosen: dict[str, Graph]) -> Graph:
    """The graph a stitched program computes: each piece's chosen form (`chosen`, by structure) on the model's
    inputs, what the exact check compares the program with."""
    graph = Graph(model.name)
    graph.inputs = dict(model.inputs)
    values: dict[int, Node] = {id(node): node for node in model.inputs.values()}
    for piece in layers.pieces:
        made = inline(chosen[piece.structure], {name: values[id(node)] for name, node in piece.binding.items()})
        values.update({id(node): made[name] for name, node in piece.results.items()})
    graph.outputs = {name: values[id(node)] for name, node in model.outputs.items()}
    return graph


def _titled(progress: Callable[[object], None] | None, title: str) -> Callable[[object], None] | None:
    """A piece's search progress, named by its piece; its stages' names are not the model's stages."""
    if progress is None:
        return None
    return lambda event: progress(replace(event, piece=title)) if isinstance(event, search.SearchProgress) else None


def _summed(stats: list[search.SearchStats]) -> search.SearchStats:
    """The search counters of several searches added up (budget_hit: any of them)."""
    total = search.SearchStats()
    for one in stats:
        for name, value in vars(one).items():
            setattr(total, name, (getattr(total, name) or value) if isinstance(value, bool) else
                    getattr(total, name) + value)
    return total


def _search_chosen(c: Compilation, measure: Callable[[KernelProgram], float] | None) -> Any:
    """search_program on the chosen graph, its candidates tested against the user's, in what is left of the budget."""
    budget = max(c.deadline - time.monotonic(), MIN_SEARCH_SHARE * c.options.budget_s)
    _time_reference(c)
    return search.search_program(c.chosen_graph(), c.target, budget, c.options.seed, measure=measure,
                                 progress=c.options.progress, reference=c.graph, draws=c.draws,
                                 reference_s=c.reference_s, forms=[form.graph for form in c.forms[1:]],
                                 on_leader=partial(_prefetch, c))


def _time_reference(c: Compilation) -> None:
    """Draw 0 and its reference outputs, timed once (`reference_s`) and held whatever their size: the search, a
    second search (the fallback), the GPU's checks and the profile all read it."""
    if c.reference_s is None:
        began = time.monotonic()
        c.draws[0] = reference_draw(c.graph, c.options.seed, 0)
        c.reference_s = time.monotonic() - began


def _prefetch(c: Compilation, program: KernelProgram) -> None:
    """NVRTC started on the kernels of the program the search will most likely return, in worker processes while
    the search goes on, so that the nvrtc stage finds them compiled (a deep model's kernels took seconds)."""
    try:
        rendered = render_program(program, VERSION, c.target.arch)
    except Exception:   # NotFusable or a template's refusal: the search rejects such a candidate itself
        return
    prefetch([(k.build_source, k.name, k.arch or c.target.arch) for k in rendered], arch=c.target.arch)


MIN_SEARCH_SHARE = 0.5   # of the budget, left to the search however long saturation took


def _measure_on_gpu(c: Compilation, gpu: Profiler,
                    on_checks: Callable[[list[Check]], None] | None = None) -> Callable[[KernelProgram], float]:
    """MCTS's reward on a GPU: the sum of a candidate's kernel times in seconds (each a median of a few, L2 flushed)
    plus one launch each; a candidate whose kernels were all measured before (`search.kernel_times`: in this compile,
    or in an earlier one on this GPU, kept beside the program cache) is run once, untimed, not timed again.

    Every candidate's outputs are checked against the reference before its times count (each run's checks go to
    `on_checks`); a mismatch raises VerificationError, a fault or a hang KernelFault (from an InWorker `gpu`), and
    the search skips it.
    """
    draw = functools.cache(partial(_gpu_draw, c))   # at the first measurement: the search times that draw's reference
    if c.kernel_times is None:   # a layered model's pieces and its stitched program share one
        c.kernel_times = _kernel_times(c)
    times = c.kernel_times

    def run(program: KernelProgram, timed: bool) -> list[float]:   # each kernel's seconds where `timed`, else []
        inputs, reference = draw()
        candidate = Compilation(c.graph, c.options, c.target, kernel_program=program)
        _render(candidate)
        _nvrtc(candidate)
        outputs, kernel_ms, _ = gpu.profile(to_program(candidate, report=False), inputs, warmup=3 if timed else 0,
                                            repeat=10 if timed else 1, per_kernel=timed,
                                            expected_s=program_seconds(program, c.target))
        checks = _check(c.graph, outputs, reference, inputs)
        if on_checks is not None:
            on_checks(checks)
        return [ms / 1e3 for ms in kernel_ms]

    def measure(program: KernelProgram) -> float:
        return times.program_seconds(program, partial(run, timed=True), partial(run, timed=False), c.target.launch_s)
    return measure


def _gpu_draw(c: Compilation) -> Draw:
    """The inputs, and the reference's outputs, that GPU runs are checked on: the random tests' first draw (the
    numpy executor's check of it and the GPU's are independent: two implementations of the program)."""
    found = reference_draw(c.graph, c.options.seed, 0, memo=c.draws)
    assert found is not None   # an ordinary draw always exists
    return found


EXACT_DRAWS = 2
EXACT_ALWAYS_S = 1.0             # exact draws expected to take less than this each run even past the budget


def _verify(c: Compilation) -> None:
    """The program against the graph it was built from, exactly (over a prime field), then by random tests against
    the user's graph (the rewrites between the two are proved in the real numbers, not in the field): those the
    search made of its winner, on the same draws, else (a program given, not searched) made here.

    The exact check makes as many of its EXACT_DRAWS as are expected to fit in what is left of the budget (all of
    them where one is expected to take under EXACT_ALWAYS_S), each timed as 2 * exact.relative_cost reference
    evaluations (`reference_s`); the report says what it left out."""
    chosen = c.chosen_graph() if c.chosen is not None else c.graph
    draw_s = 2 * relative_cost(chosen) * (c.reference_s or 0.0)
    left = c.deadline - time.monotonic()
    draws = EXACT_DRAWS if draw_s <= EXACT_ALWAYS_S else min(EXACT_DRAWS, max(0, int(left // draw_s)))
    if evaluation_size(chosen) > EXACT_MAX_WORK:
        c.left_out["exact"] = f"more than {EXACT_MAX_WORK} elements to evaluate"
    elif draws == 0:
        c.left_out["exact"] = (f"a draw would take about {draw_s:.1f} s and {max(left, 0.0):.1f} s of the budget was"
                               f" left; a larger --budget includes it")
    else:
        c.exact_checks = check_exact(chosen, c.program(), c.options.seed, draws)
        c.exact_against = "the user's graph" if chosen.structural_hash() == c.graph.structural_hash() else \
            "the rewritten graph extraction chose"
    # the search tested its winner's boundary set on these draws (numpy ignores schedules), against this graph
    searched = c.search is not None and c.search.program is c.kernel_program
    c.checks = c.search.checks if searched else verify_program(c.graph, c.program(), c.options.seed, memo=c.draws)
    if not c.checks:   # the search accepted it on the exact check alone
        c.left_out["random tests"] = ("the graph overflows its own dtypes on every random draw, where the float64"
                                      " reference does not, so no draw could judge the program; the exact check"
                                      " showed it right (example inputs at the scale it is used at let the float"
                                      " checks judge it)")


def _render(c: Compilation) -> None:
    c.rendered = render_program(c.program(), VERSION, c.target.arch)


def _nvrtc(c: Compilation) -> None:
    c.cubins = compile_many([(k.build_source or k.source, k.name, k.arch or c.target.arch) for k in c.rendered],
                            arch=c.target.arch)   # one compile per build source: identical layers' kernels share one


def _profile(c: Compilation) -> None:
    if not _profiles(c.options.profile):
        return
    if not gpu_available():
        raise DeviceError("profiling needs an NVIDIA GPU and none was found; compile with profile=False")
    inputs, reference = _gpu_draw(c)
    gpu = InProcess()    # the chosen program was measured by the search already; the baseline is one op a kernel
    c.checks, c.kernel_ms, c.total_ms = measure(c.graph, to_program(c, report=False), inputs, gpu, reference)
    if time.monotonic() >= c.deadline:
        c.left_out["unfused"] = "the budget was spent; the unfused baseline was not compiled or timed"
        return
    baseline = Compilation(c.graph, c.options, c.target, kernel_program=unfused(c.graph))
    _render(baseline)
    _nvrtc(baseline)
    c.unfused_ms = measure(c.graph, to_program(baseline, report=False), inputs, gpu, reference)[2]


def measure(graph: Graph, program: Program, inputs: dict, gpu: Profiler | None = None,
            reference: dict | None = None) -> tuple[list[Check], list[float], float]:
    """Outputs checked against the reference (computed here unless given) first, then each kernel's and the
    program's median time in ms.

    `gpu` says where: InProcess() (the default) or InWorker().
    """
    outputs, kernel_ms, total_ms = (gpu or InProcess()).profile(program, inputs)
    checks = _check(graph, outputs, reference if reference is not None else evaluate(graph, inputs), inputs)
    return checks, kernel_ms, total_ms


GPU_ROUNDING_ALLOWANCE = 0.1   # the most a GPU output may differ where the graph's own rounding explains it: one draw,
                               # and a numpy-verified program, so what this check must catch is a kernel far off


def _check(graph: Graph, outputs: dict, reference: dict, inputs: dict) -> list[Check]:
    """Each output compared with the reference (on `inputs`); VerificationError naming the first that disagrees."""
    checks = compare(graph, outputs, reference, inputs, max_allowance=GPU_ROUNDING_ALLOWANCE)
    failed = [check for check in checks if not check.ok and not check.inconclusive]
    if failed:
        raise VerificationError(f"the GPU program for {graph.name!r} disagrees with the reference on output"
                                f" {failed[0].output!r}: relative L2 error {failed[0].error:.3g}"
                                f" > {failed[0].tolerance:g}; its timings are discarded")
    return checks


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[Compilation], None]


STAGES: list[Stage] = [
    Stage("layers", _find_layers),    # identical layers, each distinct one then compiled once (ir/layers.py)
    Stage("saturate", _saturate),     # grow the e-graph, bounded
    Stage("extract", _extract),       # the program forms the search chooses among
    Stage("search", _search),         # kernel boundaries, archetypes and schedules: beam search and MCTS
    Stage("verify", _verify),         # exact (prime field) and random tests of the kernel program
    Stage("render", _render),         # Jinja -> CUDA C
    Stage("nvrtc", _nvrtc),           # CUDA C -> cubin
    Stage("profile", _profile),       # only where a GPU is present: check outputs, then time
]


def compile(graph: Graph, target: str = "sm90", budget_s: float = 60.0, seed: int = 0,
            profile: bool | None = None, progress: Callable[[object], None] | bool | None = None,
            cache: bool = True, cache_dir: str | Path | None = None, rewrites: bool = True,
            example_inputs: Mapping[str, Any] | None = None, began: float | None = None,
            layers: bool = True) -> Program:
    """Compile `graph` for `target` into a verified Program (profiled where a GPU is present).

    `budget_s` bounds the whole compile but for the winner's verification (see `compile --help`). A graph compiled
    before with the same target and options comes from the cache at once. `progress` is called
    with each stage's name and the search's counts; by default they go to a progress line where standard error is
    a terminal, else to the "tensorsmith" logger at INFO; False says nothing. `rewrites=False` compiles the graph as
    written: no e-graph, only its kernel boundaries and schedules searched (to compare with, or to rule out a rewrite).
    `example_inputs` (arrays by input name, at the scale the program will see) are the first inputs every candidate
    is tested on, before random ones. `began` (a time.monotonic() reading) starts the budget earlier than the call:
    ts.from_torch and ts.from_onnx pass when their import began, so that the import is inside the budget.
    `layers=False` searches a model of identical layers whole rather than one distinct layer at a time.
    """
    reporter = default_progress(graph.name, len(STAGES)) if progress is None or progress is True else None
    callback = reporter if reporter is not None else progress if callable(progress) else None
    try:
        options = CompileOptions(target, budget_s, seed, profile, callback, rewrites, example_inputs, began, layers)
        store = ProgramCache(Path(cache_dir) if cache_dir else None) if cache else None
        return _compile(graph, options, store)
    finally:
        if reporter is not None:
            reporter.done()


def _compile(graph: Graph, options: CompileOptions, store: ProgramCache | None) -> Program:
    """compile() once its progress reporter and its cache (None: none) are settled."""
    target, budget_s, seed, profile, progress = (options.target, options.budget_s, options.seed, options.profile,
                                                 options.progress)
    if not graph.outputs:
        raise GraphError(f"graph {graph.name!r} has no outputs; register one with graph.output(name, tensor)")
    if not budget_s > 0:
        raise InputError(f"the search budget must be a positive number of seconds, got {budget_s!r}")
    empty = next((node for node in graph.nodes() if 0 in node.shape), None)
    if empty is not None:
        raise GraphError(f"graph {graph.name!r} has an empty tensor: {empty.op} of shape {empty.shape} at"
                         f" {empty.where or 'an unknown line'}; tensorsmith does not compile tensors with a size-0"
                         f" axis yet (ts.evaluate computes such a graph)")
    if getattr(multiprocessing.current_process(), "_inheriting", False):   # a spawned worker importing __main__
        raise TensorsmithError("compile() was called while a tensorsmith worker process imported the main script;"
                               " call it under `if __name__ == '__main__':`")
    compilation = Compilation(graph, options, get_target(target),
                              kernel_times_path=store.root / KERNEL_TIMES_FILE if store is not None else None)
    examples = options.example_inputs
    key = program_key(graph, target, {"seed": seed, "budget_s": budget_s, "profile": _profiles(profile),
                                      **({} if options.rewrites else {"rewrites": False}),
                                      **({} if options.layers else {"layers": False}),
                                      **({} if examples is None else {"examples": example_digest(examples)})},
                      VERSION)
    if store is not None and (hit := store.get(key, graph)) is not None:
        if progress:
            progress("cache")
        return hit
    check_verifiable(graph)
    if examples is not None:   # wrong names, shapes or dtypes are said before the search
        began = time.monotonic()
        compilation.draws[0] = example_draw(graph, examples)
        compilation.reference_s = time.monotonic() - began
    compilation.deadline = (options.began if options.began is not None else time.monotonic()) + budget_s
    for stage in STAGES:
        if progress:
            progress(stage.name)
        start = time.perf_counter()
        stage.run(compilation)
        compilation.seconds[stage.name] = time.perf_counter() - start
    program = to_program(compilation)
    if store is not None:
        store.put(key, program)
    return program


def _profiles(profile: bool | None) -> bool:
    return bool(profile) if profile is not None else gpu_available()


def to_program(c: Compilation, report: bool = True) -> Program:
    """The Program that the stages so far describe (timings written into each kernel's header).

    `report=False` leaves out the report (the unfused baseline's prediction, the search history): what a
    program that is only being timed does not need.
    """
    program = c.program()
    kernels = []
    for position, (rendered, cubin) in enumerate(zip(c.rendered, c.cubins)):
        measured = c.kernel_ms[position] if c.kernel_ms else None
        predicted = kernel_seconds(program.kernels[position], program, c.target) * 1e3
        source = rendered.source
        if measured is not None:
            source = source.replace(MEASURED_PLACEHOLDER, f"measured: {measured * 1000:.1f} us (median, L2 flushed),"
                                                          f" predicted {predicted * 1000:.1f} us")
        kernels.append(CompiledKernel(rendered.name, rendered.file_stem, rendered.archetype,
                                      rendered.schedule.as_dict(), source, cubin, rendered.grid, rendered.block,
                                      rendered.params, rendered.writes, measured, predicted,
                                      rendered.shared_bytes, rendered.tensor_maps, rendered.persistent,
                                      rendered.entry))
    return Program(c.graph.name, c.target.name, dict(program.buffers), program.inputs, tuple(program.outputs),
                   kernels, c.graph, program, c.options.seed, VERSION, _report(c) if report else {})


def _forms(c: Compilation) -> list[dict[str, Any]]:
    """The algebraic forms searched: how each differs from the first (the graph as written, tidied), whether it won,
    and its best candidate's predicted and measured time."""
    best = c.search.form_best if c.search is not None else []
    return [{"change": form.change or WRITTEN, "as_written": i == 0,
             "estimate_us": form.seconds * 1e6 if form.seconds is not None else None,
             "won": c.search is not None and c.search.form == i, **(best[i] if i < len(best) else {})}
            for i, form in enumerate(c.forms)]


def _history(c: Compilation) -> list[dict[str, Any]]:
    """Candidates in the order the search tried them, each with its measured time where it has one."""
    if c.search is None:
        return []
    return [{"name": h["name"], "description": h["description"], "verdict": h["verdict"],
             "us": h["measured_us"] if h["measured_us"] is not None else h["predicted_us"],
             "basis": "measured" if h["measured_us"] is not None else "predicted"} for h in c.search.history]


def _report(c: Compilation) -> dict[str, Any]:
    predicted = program_seconds(c.program(), c.target) * 1e3
    unfused_predicted = program_seconds(unfused(c.graph), c.target) * 1e3
    measured_speedup = (c.unfused_ms / c.total_ms if c.total_ms is not None and c.unfused_ms is not None
                        else None)
    report = {
        "stage_seconds": {k: round(v, 4) for k, v in c.seconds.items()},
        "checks": [{"output": ch.output, "relative_l2": ch.error, "tolerance": ch.tolerance} for ch in c.checks],
        "tested_on": "the example inputs, then random draws" if c.options.example_inputs is not None else
                     "random draws (weight matrices at fan-in scale)",
        "exact": ({"against": c.exact_against, "modulus": PRIME, "draws": len(c.exact_checks) // len(c.graph.outputs),
                   "outputs": list(dict.fromkeys(ch.output for ch in c.exact_checks))}
                  if c.exact_checks else {"skipped": c.left_out.get("exact", "not run")}),
        "left_out": dict(c.left_out),
        "total_ms": c.total_ms, "predicted_ms": predicted, "unfused_predicted_ms": unfused_predicted,
        "unfused_ms": c.unfused_ms,
        "speedup": measured_speedup if measured_speedup is not None else unfused_predicted / predicted,
        "speedup_basis": "measured" if measured_speedup is not None else "predicted by the cost model",
        "launch_us": round(c.target.launch_s * 1e6, 3),
        "launch_basis": "measured on this GPU" if c.launch_measured else "assumed (the target's table)",
        "search_history": _history(c),
        "search": c.search.summary() if c.search is not None else None,
        "forms": _forms(c),
        "layers": c.layers,
        "kernel_times": ({"measured_programs": c.kernel_times.measured_programs,
                          "reused_programs": c.kernel_times.reused_programs,
                          "kernels_known": len(c.kernel_times.seconds)} if c.kernel_times is not None else None),
        "cost_fit": [asdict(fit) for fit in c.cost_fits],
    }
    if c.saturation is not None:
        saturation = c.saturation
        report["saturation"] = (asdict(saturation) if is_dataclass(saturation) and not isinstance(saturation, type)
                                else saturation)
    return report
