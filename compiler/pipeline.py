"""The compiler pipeline: a flat list of named stages (`STAGES`), each a function whose signature names the results
it reads and whose return value is a frozen record of what it made (`stages.py`); `run_stages` hands each one's
result to the next, and the Program and its report are made from them."""
from __future__ import annotations

import contextlib
import functools
import gc
import logging
import multiprocessing
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from dataclasses import asdict, dataclass, is_dataclass, replace
from pathlib import Path
from typing import Any, Callable, Generic, Iterator, Mapping, NamedTuple, TypeVar

from tensorsmith import rewrites, search
from tensorsmith.codegen.launch_cost import measured_launch_seconds
from tensorsmith.codegen.nvrtc import compile_many, prefetch
from tensorsmith.codegen.render import MEASURED_PLACEHOLDER, render_program
from tensorsmith.codegen.runtime import device_name, gpu_available
from tensorsmith.ir.empty import empties_folded, is_empty
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
from .empty_outputs import with_empty_outputs
from .program import Program
from .progress import default_progress
from .stages import (Calibration, Compilation, CompileOptions, Context, Cubins, Derived, Forms, Layered, Profiled,
                     Rendered, Saturation, Searched, Verified)

VERSION = "0.1.0"
log = logging.getLogger("tensorsmith")


def identical_layers(context: Context) -> Layered:
    """A model of identical layers, cut into pieces, each distinct one then compiled once (ir/layers.py)."""
    return Layered(find_layers(context.graph) if context.options.layers else None)


def saturate(context: Context, layered: Layered) -> Saturation:
    """The graph's e-graph grown by sound rules, bounded; none where rewrites are off or the model is layered (its
    pieces are saturated one by one, and the model, should that fail, is searched as written)."""
    if context.options.rewrites and layered.layers is None:
        return Saturation(rewrites.saturate(context.graph))
    return Saturation(None)


def extract(context: Context, saturation: Saturation) -> Forms:
    """The program forms the search chooses among, the graph as written (tidied) first; the caller frees the e-graph
    (`_extracted`)."""
    saturated = saturation.saturated
    if saturated is None:          # rewrites off, or a layered model
        return Forms([search.Form(context.graph, None, WRITTEN)], context.graph)
    forms = search.extract_forms(saturated, context.target, seed=context.options.seed)   # the first: as written, tidied
    return Forms(forms, forms[0].graph, saturated.report)


WRITTEN = "as written"


def _kernel_times(path: Path | None, target: Target) -> KernelTimes:
    """This GPU's kernel-time records, each new one with its kernel's features (for the model's refit)."""
    return KernelTimes(path, device_name(), features=partial(kernel_features, target=target))


def search_stage(context: Context, layered: Layered, forms: Forms) -> Searched:
    """Kernel boundaries, archetypes and schedules (beam search and MCTS, measured where a GPU is present): each
    distinct piece of a layered model on its own, else the whole graph's forms."""
    with InWorker() as gpu:   # candidates are untrusted: one that faults or hangs costs the worker, not us
        on_gpu = _profiles(context.options.profile) and gpu_available()
        calibration = _calibrated(context) if on_gpu else Calibration(context.target)
        left_out: dict[str, str] = {}
        if layered.layers is not None:
            try:
                return _search_layers(context, calibration, layered.layers, gpu if on_gpu else None)
            except (VerificationError, KernelFault, CompileError) as err:   # a piece with no verified program, or
                # a stitched program that is wrong, faults or does not compile: the whole model's search skips such
                log.warning("compiling %r layer by layer failed verification (%s); the model is searched whole, as"
                            " written", context.graph.name, err)
                left_out["layers"] = (f"compiling it layer by layer failed verification ({err}); the model was"
                                      f" searched whole, as written")
        return _search_whole(context, calibration, forms, gpu if on_gpu else None, left_out)


def _calibrated(context: Context) -> Calibration:
    """The target as this GPU runs it: what one more kernel costs, as programs are called (a graph's replay), and the
    cost model as this GPU's kernels measured before correct it."""
    target = replace(context.target, launch_s=measured_launch_seconds(context.target.programmatic_launch))
    times = _kernel_times(context.kernel_times_path, target)
    fits = refit.fit(times.records, context.options.seed)
    if fits:   # the model as this GPU's measured kernels correct it
        target = replace(target, corrections=tuple(fit.correction for fit in fits))
    return Calibration(target, launch_measured=True, cost_fits=fits, kernel_times=times)


def _search_whole(context: Context, calibration: Calibration, forms: Forms, gpu: Profiler | None,
                  left_out: Mapping[str, str] | None = None) -> Searched:
    """The search of the whole graph, its rewritten forms first, the graph as written where none of them passes."""
    target = calibration.target
    measure = _measure_on_gpu(context, target, gpu, calibration.kernel_times) if gpu is not None else None
    gave_up = dict(left_out or {})
    try:
        result = _search_chosen(context, target, forms, measure)
    except VerificationError as err:
        if [search.canonical_hash(form.graph) for form in forms.forms] in ([], [search.canonical_hash(context.graph)]):
            raise   # the graph as written was all that was searched
        log.warning("the rewritten graph of %r failed random testing (%s); compiling the graph as written",
                    context.graph.name, err)
        gave_up["rewrites"] = (f"the rewritten graph failed random testing ({err}); the graph as written was"
                               f" compiled")
        forms = replace(forms, forms=[search.Form(context.graph, None, WRITTEN)], chosen=context.graph)
        result = _search_chosen(context, target, forms, measure)
    chosen = forms.forms[result.form].graph if forms.forms else forms.chosen
    return Searched(result, replace(forms, chosen=chosen), calibration, left_out=gave_up)


def derive(context: Context, searched: Searched) -> Derived:
    """The rewrites the chosen form depends on, in order from the graph as written (rewrites/derivation.py), where the
    search chose a form other than the one written; bounded by DERIVATION_SECONDS and what is left of the budget (a
    derivation cut short says so), its e-graphs freed on this thread."""
    forms, result = searched.forms, searched.result
    saturation = forms.saturation
    if saturation is None or result.form == 0 or not forms.forms or (
            search.canonical_hash(forms.chosen) == search.canonical_hash(forms.forms[0].graph)):
        return Derived(None)
    fired = [name for name, count in saturation.matches if count]
    seconds = min(rewrites.DERIVATION_SECONDS, max(0.0, context.deadline - time.monotonic()))   # within the budget
    try:
        return Derived(rewrites.derivation(context.graph, forms.chosen, fired, seconds))
    finally:
        gc.collect()


LAYER_STAGES = ("saturate", "extract", "search", "verify")   # what each distinct piece of a layered model goes through


def _search_layers(context: Context, calibration: Calibration, layers: Layers, gpu: Profiler | None) -> Searched:
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
    parts: list[tuple[Context, Searched]] = []
    whole: dict[str, float] = {}   # the seconds of the whole-model work, which grows with depth
    with _switching(BACKGROUND_SWITCH_S), ThreadPoolExecutor(1, thread_name_prefix="end-to-end") as background:
        drawing = background.submit(_time_reference, context)   # the end-to-end test's draw: the whole model's
        # float64 reference, made while the pieces are searched
        for i, piece in enumerate(distinct):
            left = context.deadline - time.monotonic() - END_TO_END_EVALUATIONS * _reference_estimate(
                context, layers, distinct, parts)
            part = _compile_piece(context, calibration, piece.graph, max(left, 0.0) * sizes[i] / sum(sizes[i:]),
                                  titles[i], gpu)
            programs[piece.structure] = part[1].program
            parts.append(part)
        began = time.monotonic()
        drawing.result()
    assert context.reference_s is not None
    whole.update({"reference": context.reference_s, "waited for it": time.monotonic() - began})
    program = stitched(context.graph, layers, programs)
    chosen = _stitched_graph(context.graph, layers, {piece.structure: searched.forms.chosen
                                                     for piece, (_, searched) in zip(distinct, parts)})
    measured, checks = None, []
    if gpu is not None:   # the end-to-end random test on the GPU, where its outputs meet the dtypes' tolerance
        began = time.monotonic()
        measured = _measure_on_gpu(context, calibration.target, gpu, calibration.kernel_times,
                                   on_checks=checks.extend)(program)
        whole["gpu check"] = time.monotonic() - began
    random = context.options.example_inputs is None   # (draw 0 is random, not the user's examples, which may hide a
    # fault)
    if not (random and meets_tolerance(context.graph, checks)):
        began = time.monotonic()   # in numpy, where no GPU ran it or its outputs are within rounding noise only
        checks = _random_test_stitched(context, program, chosen)
        whole["random test"] = time.monotonic() - began
    result = search.SearchResult(program, program_seconds(program, calibration.target) * 1e6,
                                 measured * 1e6 if measured is not None else None,
                                 [{**entry, "name": f"{title}: {entry['name']}"}
                                  for title, (_, part) in zip(titles, parts) for entry in part.result.history],
                                 _summed([part.result.stats for _, part in parts]), checks=checks)
    report = {"identical": layers.identical(), "pieces": [
        {"piece": title, "nodes": size,
         "kernels": len(part.program.kernels), "predicted_us": part.result.predicted_us,
         "measured_us": part.result.measured_us,
         "stage_seconds": {k: round(v, 4) for k, v in piece_context.seconds.items()}}
        for title, size, (piece_context, part) in zip(titles, sizes, parts)],
        "whole_model_seconds": {k: round(v, 4) for k, v in whole.items()},
        "end_to_end": "numpy" if "random test" in whole else "gpu"}   # which run of draw 0 judged the stitching
    # each piece chose its own form: the model's is their stitching
    return Searched(result, Forms([search.Form(chosen, None, WRITTEN)], chosen), calibration, report)


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


def _reference_estimate(context: Context, layers: Layers, distinct: list[Piece],
                        parts: list[tuple[Context, Searched]]) -> float:
    """The seconds of the whole model's reference draw: as timed where it is made, else what the pieces compiled so
    far (`parts`, of the first `distinct` pieces) took for theirs, each as often as the model holds it."""
    if context.reference_s is not None:
        return context.reference_s
    structures = [piece.structure for piece in layers.pieces]
    return sum((part.reference_s or 0.0) * structures.count(piece.structure)
               for piece, (part, _) in zip(distinct, parts))


def _random_test_stitched(context: Context, program: KernelProgram, chosen: Graph) -> list[Check]:
    """The stitched program run in numpy on the end-to-end draws (draw 0, and a random one where draw 0 is the
    user's example inputs) against the user's graph; the exact check decides where rounding noise is all it shows."""
    try:
        return verify_program(context.graph, program, context.options.seed, memo=context.draws,
                              draws=END_TO_END_DRAWS + (context.options.example_inputs is not None))
    except NoiseOnlyError as err:   # rounding noise only, as deep models' outputs may be: the exact check decides
        if evaluation_size(chosen) > EXACT_MAX_WORK:
            raise
        check_exact(chosen, program, context.options.seed)   # ExactMismatch (a VerificationError) where they differ
        return err.checks


END_TO_END_DRAWS = 1         # the stitched program's random tests in numpy: each piece was tested on its own draws,
                             # so this test is of the stitching
END_TO_END_EVALUATIONS = 3   # reference evaluations' time kept for that test and the GPU's check
MIN_PIECE_S = 1.0            # the least budget a piece is searched in


def _compile_piece(context: Context, calibration: Calibration, graph: Graph, budget_s: float, title: str,
                   gpu: Profiler | None) -> tuple[Context, Searched]:
    """One distinct piece of a layered model through LAYER_STAGES in `budget_s` (at least MIN_PIECE_S), its search
    progress named `title`, measured on `gpu` into the model's kernel times: its context (its stages' seconds, its
    reference's) and its search's result."""
    budget_s = max(budget_s, MIN_PIECE_S)
    options = replace(context.options, budget_s=budget_s, began=None, example_inputs=None,
                      progress=_titled(context.options.progress, title))
    part = Context(graph, options, calibration.target, deadline=time.monotonic() + budget_s,
                   kernel_times_path=context.kernel_times_path)
    forms = _extracted(part, Layered(None))
    with _announced(part, STAGES.search.name):   # the model's calibration, not the piece's own
        searched = _search_whole(part, calibration, forms, gpu)
    _run(part, STAGES.verify, part, searched)
    return part, searched


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


def _search_chosen(context: Context, target: Target, forms: Forms,
                   measure: Callable[[KernelProgram], float] | None) -> search.SearchResult:
    """search_program on the chosen graph, its candidates tested against the user's, in what is left of the budget."""
    budget = max(context.deadline - time.monotonic(), MIN_SEARCH_SHARE * context.options.budget_s)
    _time_reference(context)
    return search.search_program(forms.chosen, target, budget, context.options.seed, measure=measure,
                                 progress=context.options.progress, reference=context.graph, draws=context.draws,
                                 reference_s=context.reference_s, forms=[form.graph for form in forms.forms[1:]],
                                 on_leader=partial(_prefetch, target))


def _time_reference(context: Context) -> None:
    """Draw 0 and its reference outputs, timed once (`reference_s`) and held whatever their size: the search, a
    second search (the fallback), the GPU's checks and the profile all read it."""
    if context.reference_s is None:
        began = time.monotonic()
        context.draws[0] = reference_draw(context.graph, context.options.seed, 0)
        context.reference_s = time.monotonic() - began


def _prefetch(target: Target, program: KernelProgram) -> None:
    """NVRTC started on the kernels of the program the search will most likely return, in worker processes while
    the search goes on, so that the nvrtc stage finds them compiled (a deep model's kernels took seconds)."""
    try:
        rendered = render_program(program, VERSION, target.arch)
    except Exception:   # NotFusable or a template's refusal: the search rejects such a candidate itself
        return
    prefetch([(k.build_source, k.name, k.arch or target.arch) for k in rendered], arch=target.arch)


MIN_SEARCH_SHARE = 0.5   # of the budget, left to the search however long saturation took


def _measure_on_gpu(context: Context, target: Target, gpu: Profiler, times: KernelTimes | None = None,
                    on_checks: Callable[[list[Check]], None] | None = None) -> Callable[[KernelProgram], float]:
    """MCTS's reward on a GPU: the sum of a candidate's kernel times in seconds (each a median of a few, L2 flushed)
    plus one launch each; a candidate whose kernels were all measured before (`times`: in this compile, or in an
    earlier one on this GPU, kept beside the program cache; a new store where none is given) is run once, untimed,
    not timed again.

    Every candidate's outputs are checked against the reference before its times count (each run's checks go to
    `on_checks`); a mismatch raises VerificationError, a fault or a hang KernelFault (from an InWorker `gpu`), and
    the search skips it.
    """
    draw = functools.cache(partial(_gpu_draw, context))   # at the first measurement: the search times that draw's
    # reference
    store = times if times is not None else _kernel_times(context.kernel_times_path, target)

    def run(program: KernelProgram, timed: bool) -> list[float]:   # each kernel's seconds where `timed`, else []
        inputs, reference = draw()
        outputs, kernel_ms, _ = gpu.profile(built_program(context.graph, target, program, context.options.seed),
                                            inputs, warmup=3 if timed else 0, repeat=10 if timed else 1,
                                            per_kernel=timed, expected_s=program_seconds(program, target))
        checks = _check(context.graph, outputs, reference, inputs)
        if on_checks is not None:
            on_checks(checks)
        return [ms / 1e3 for ms in kernel_ms]

    def measure(program: KernelProgram) -> float:
        return store.program_seconds(program, partial(run, timed=True), partial(run, timed=False), target.launch_s)
    return measure


def _gpu_draw(context: Context) -> Draw:
    """The inputs, and the reference's outputs, that GPU runs are checked on: the random tests' first draw (the
    numpy executor's check of it and the GPU's are independent: two implementations of the program)."""
    found = reference_draw(context.graph, context.options.seed, 0, memo=context.draws)
    assert found is not None   # an ordinary draw always exists
    return found


EXACT_DRAWS = 2
EXACT_ALWAYS_S = 1.0             # exact draws expected to take less than this each run even past the budget


def verify(context: Context, searched: Searched) -> Verified:
    """The program against the graph it was built from, exactly (over a prime field), then by random tests against
    the user's graph (the rewrites between the two are proved in the real numbers, not in the field): those the
    search made of its winner, on the same draws.

    The exact check makes as many of its EXACT_DRAWS as are expected to fit in what is left of the budget (all of
    them where one is expected to take under EXACT_ALWAYS_S), each timed as 2 * exact.relative_cost reference
    evaluations (`reference_s`); the result says what it left out."""
    chosen = searched.forms.chosen
    draw_s = 2 * relative_cost(chosen) * (context.reference_s or 0.0)
    left = context.deadline - time.monotonic()
    draws = EXACT_DRAWS if draw_s <= EXACT_ALWAYS_S else min(EXACT_DRAWS, max(0, int(left // draw_s)))
    left_out: dict[str, str] = {}
    exact_checks: list[ExactCheck] = []
    exact_against = ""
    if evaluation_size(chosen) > EXACT_MAX_WORK:
        left_out["exact"] = f"more than {EXACT_MAX_WORK} elements to evaluate"
    elif draws == 0:
        left_out["exact"] = (f"a draw would take about {draw_s:.1f} s and {max(left, 0.0):.1f} s of the budget was"
                             f" left; a larger --budget includes it")
    else:
        exact_checks = check_exact(chosen, searched.program, context.options.seed, draws)
        exact_against = "the user's graph" if chosen.structural_hash() == context.graph.structural_hash() else \
            "the rewritten graph extraction chose"
    # the search tested its winner's boundary set on these draws (numpy ignores schedules), against this graph
    checks = searched.result.checks
    if not checks:   # the search accepted it on the exact check alone
        left_out["random tests"] = ("the graph overflows its own dtypes on every random draw, where the float64"
                                    " reference does not, so no draw could judge the program; the exact check"
                                    " showed it right (example inputs at the scale it is used at let the float"
                                    " checks judge it)")
    return Verified(checks, exact_checks, exact_against, left_out)


def render(program: KernelProgram, target: Target) -> Rendered:
    """Jinja -> CUDA C, once per kernel structure and schedule (render.py's cache: the search rendered most)."""
    return Rendered(render_program(program, VERSION, target.arch))


def nvrtc(rendered: Rendered, target: Target) -> Cubins:
    """CUDA C -> cubin, cached by content (the search's prefetch compiled the likely winner's already)."""
    return Cubins(compile_many([(k.build_source or k.source, k.name, k.arch or target.arch) for k in rendered.kernels],
                               arch=target.arch))   # one compile per build source: identical layers' kernels share one


def profile(context: Context, searched: Searched, rendered: Rendered, cubins: Cubins) -> Profiled:
    """Only where a GPU is present (profile=None) or asked for: the program's outputs checked, then timed, in this
    process, and the unfused baseline's, for the report's speedup."""
    if not _profiles(context.options.profile):
        return Profiled()
    if not gpu_available():
        raise DeviceError("profiling needs an NVIDIA GPU and none was found; compile with profile=False")
    inputs, reference = _gpu_draw(context)
    gpu = InProcess()    # the chosen program was measured by the search already; the baseline is one op a kernel
    graph, target, seed = context.graph, searched.target, context.options.seed
    chosen = _assembled(graph, target, seed, searched.program, rendered, cubins)
    checks, kernel_ms, total_ms = measure(graph, chosen, inputs, gpu, reference)
    if time.monotonic() >= context.deadline:
        return Profiled(checks, kernel_ms, total_ms, left_out={
            "unfused": "the budget was spent; the unfused baseline was not compiled or timed"})
    baseline = built_program(graph, target, unfused(graph), seed)
    return Profiled(checks, kernel_ms, total_ms, measure(graph, baseline, inputs, gpu, reference)[2])


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


R = TypeVar("R")


@dataclass(frozen=True)
class Stage(Generic[R]):
    """One named stage: `function`, whose parameters are the results it reads and whose return value is its own."""

    name: str
    function: Callable[..., R]


class Stages(NamedTuple):
    """The pipeline's stages in the order they run, each by its name."""

    layers: Stage[Layered]
    saturate: Stage[Saturation]
    extract: Stage[Forms]
    search: Stage[Searched]
    derive: Stage[Derived]
    verify: Stage[Verified]
    render: Stage[Rendered]
    nvrtc: Stage[Cubins]
    profile: Stage[Profiled]


STAGES = Stages(
    Stage("layers", identical_layers),   # identical layers, each distinct one then compiled once (ir/layers.py)
    Stage("saturate", saturate),         # grow the e-graph, bounded
    Stage("extract", extract),           # the program forms the search chooses among
    Stage("search", search_stage),       # kernel boundaries, archetypes and schedules: beam search and MCTS
    Stage("derive", derive),             # the rewrites the chosen form depends on, where it is not the written one
    Stage("verify", verify),             # exact (prime field) and random tests of the kernel program
    Stage("render", render),             # Jinja -> CUDA C
    Stage("nvrtc", nvrtc),               # CUDA C -> cubin
    Stage("profile", profile),           # only where a GPU is present: check outputs, then time
)


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
    graph = empties_folded(graph)
    if any(is_empty(node) for node in graph.outputs.values()):
        return with_empty_outputs(graph, target, VERSION, seed, lambda rest: _compile(rest, options, store))
    if getattr(multiprocessing.current_process(), "_inheriting", False):   # a spawned worker importing __main__
        raise TensorsmithError("compile() was called while a tensorsmith worker process imported the main script;"
                               " call it under `if __name__ == '__main__':`")
    context = Context(graph, options, get_target(target),
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
        context.draws[0] = example_draw(graph, examples)
        context.reference_s = time.monotonic() - began
    context.deadline = (options.began if options.began is not None else time.monotonic()) + budget_s
    program = to_program(run_stages(context))
    if store is not None:
        store.put(key, program)
    return program


def run_stages(context: Context) -> Compilation:
    """Every stage in STAGES' order on `context.graph`, each announced to the progress callback and timed into
    `context.seconds`, each one's result handed to those that read it."""
    layered = _run(context, STAGES.layers, context)
    forms = _extracted(context, layered)
    searched = _run(context, STAGES.search, context, layered, forms)
    derived = _run(context, STAGES.derive, context, searched)
    verified = _run(context, STAGES.verify, context, searched)
    rendered = _run(context, STAGES.render, searched.program, searched.target)
    cubins = _run(context, STAGES.nvrtc, rendered, searched.target)
    profiled = _run(context, STAGES.profile, context, searched, rendered, cubins)
    return Compilation(context, layered, forms, searched, derived, verified, rendered, cubins, profiled)


def _extracted(context: Context, layered: Layered) -> Forms:
    """The saturate and extract stages, the e-graph freed as extraction ends: egglog's EGraph, held in reference
    cycles, is collected here, on this thread (dropped on another thread it raises)."""
    saturation = _run(context, STAGES.saturate, context, layered)
    with _announced(context, STAGES.extract.name):
        built = saturation.saturated is not None
        try:
            return STAGES.extract.function(context, saturation)
        finally:
            del saturation
            if built:
                gc.collect()


def _run(context: Context, stage: Stage[R], *inputs: Any) -> R:
    """`stage` on its inputs, announced and timed."""
    with _announced(context, stage.name):
        return stage.function(*inputs)


@contextlib.contextmanager
def _announced(context: Context, name: str) -> Iterator[None]:
    """A stage's name to the progress callback as it starts, its seconds into `context.seconds` where it ends."""
    if context.options.progress:
        context.options.progress(name)
    start = time.perf_counter()
    yield
    context.seconds[name] = time.perf_counter() - start


def _profiles(profile: bool | None) -> bool:
    return bool(profile) if profile is not None else gpu_available()


def to_program(c: Compilation) -> Program:
    """The Program the stages made, its report with it (measured times written into each kernel's header)."""
    searched = c.searched
    return _assembled(c.context.graph, searched.target, c.context.options.seed, searched.program, c.rendered,
                      c.cubins, c.profiled.kernel_ms, _report(c))


def built_program(graph: Graph, target: Target, program: KernelProgram, seed: int = 0) -> Program:
    """`program` rendered and compiled for `target`, without a report: what a program that is only being timed (a
    candidate, the unfused baseline) needs."""
    rendered = render(program, target)
    return _assembled(graph, target, seed, program, rendered, nvrtc(rendered, target))


def _assembled(graph: Graph, target: Target, seed: int, program: KernelProgram, rendered: Rendered, cubins: Cubins,
               kernel_ms: list[float] | None = None, report: dict[str, Any] | None = None) -> Program:
    """The Program of `program`'s rendered and compiled kernels, each kernel's measured time (`kernel_ms`) where it
    has one written into its header beside the prediction."""
    kernels = []
    for position, (kernel, cubin) in enumerate(zip(rendered.kernels, cubins.cubins)):
        measured = kernel_ms[position] if kernel_ms else None
        predicted = kernel_seconds(program.kernels[position], program, target) * 1e3
        source = kernel.source
        if measured is not None:
            source = source.replace(MEASURED_PLACEHOLDER, f"measured: {measured * 1000:.1f} us (median, L2 flushed),"
                                                          f" predicted {predicted * 1000:.1f} us")
        kernels.append(CompiledKernel(kernel.name, kernel.file_stem, kernel.archetype,
                                      kernel.schedule.as_dict(), source, cubin, kernel.grid, kernel.block,
                                      kernel.params, kernel.writes, measured, predicted,
                                      kernel.shared_bytes, kernel.tensor_maps, kernel.persistent,
                                      kernel.entry, target.programmatic_launch))
    return Program(graph.name, target.name, dict(program.buffers), program.inputs, tuple(program.outputs),
                   kernels, graph, program, seed, VERSION, report if report is not None else {})


def _forms(c: Compilation) -> list[dict[str, Any]]:
    """The algebraic forms searched: how each differs from the first (the graph as written, tidied), whether it won,
    its best candidate's predicted and measured time, and the winner's derivation where it has one."""
    result = c.searched.result
    best = result.form_best
    derivation = c.derived.derivation
    return [{"change": form.change or WRITTEN, "as_written": i == 0,
             "estimate_us": form.seconds * 1e6 if form.seconds is not None else None,
             "won": result.form == i, **(best[i] if i < len(best) else {}),
             **({"derivation": asdict(derivation)} if derivation is not None and result.form == i else {})}
            for i, form in enumerate(c.searched.forms.forms)]


def _history(c: Compilation) -> list[dict[str, Any]]:
    """Candidates in the order the search tried them, each with its measured time where it has one."""
    return [{"name": h["name"], "description": h["description"], "verdict": h["verdict"],
             "us": h["measured_us"] if h["measured_us"] is not None else h["predicted_us"],
             "basis": "measured" if h["measured_us"] is not None else "predicted"} for h in c.searched.result.history]


def _report(c: Compilation) -> dict[str, Any]:
    context, searched, verified, profiled = c.context, c.searched, c.verified, c.profiled
    graph, target, calibration = context.graph, searched.target, searched.calibration
    predicted = program_seconds(searched.program, target) * 1e3
    unfused_predicted = program_seconds(unfused(graph), target) * 1e3
    measured_speedup = (profiled.unfused_ms / profiled.total_ms
                        if profiled.total_ms is not None and profiled.unfused_ms is not None else None)
    checks = profiled.checks if profiled.checks is not None else verified.checks   # the GPU's, where it ran
    left_out = {**searched.left_out, **verified.left_out, **profiled.left_out}     # in the order the stages ran
    report = {
        "stage_seconds": {k: round(v, 4) for k, v in context.seconds.items()},
        "checks": [{"output": ch.output, "relative_l2": ch.error, "tolerance": ch.tolerance} for ch in checks],
        "tested_on": "the example inputs, then random draws" if context.options.example_inputs is not None else
                     "random draws (weight matrices at fan-in scale)",
        "exact": ({"against": verified.exact_against, "modulus": PRIME,
                   "draws": len(verified.exact_checks) // len(graph.outputs),
                   "outputs": list(dict.fromkeys(ch.output for ch in verified.exact_checks))}
                  if verified.exact_checks else {"skipped": left_out.get("exact", "not run")}),
        "left_out": left_out,
        "total_ms": profiled.total_ms, "predicted_ms": predicted, "unfused_predicted_ms": unfused_predicted,
        "unfused_ms": profiled.unfused_ms,
        "speedup": measured_speedup if measured_speedup is not None else unfused_predicted / predicted,
        "speedup_basis": "measured" if measured_speedup is not None else "predicted by the cost model",
        "launch_us": round(target.launch_s * 1e6, 3),
        "launch_basis": "measured on this GPU" if calibration.launch_measured else "assumed (the target's table)",
        "search_history": _history(c),
        "search": searched.result.summary(),
        "forms": _forms(c),
        "layers": searched.layers,
        "kernel_times": ({"measured_programs": calibration.kernel_times.measured_programs,
                          "reused_programs": calibration.kernel_times.reused_programs,
                          "kernels_known": len(calibration.kernel_times.seconds)}
                         if calibration.kernel_times is not None else None),
        "cost_fit": [asdict(fit) for fit in calibration.cost_fits],
    }
    saturation = c.forms.saturation
    if saturation is not None:
        report["saturation"] = (asdict(saturation) if is_dataclass(saturation) and not isinstance(saturation, type)
                                else saturation)
    return report
