"""The candidate space: kernel boundaries x per-kernel schedules, each point a KernelProgram.

A point is `Candidate(boundaries, schedules, form)`. Boundaries are the set of graph nodes that get a buffer of
their own (positions in `graph.nodes()` order, so that they are deterministic), always legalised: codegen's
refusals (`NotFusable`) add the nodes it names. Moves between boundary sets materialise one node more or
one fewer. Schedules come from each archetype's declaration (`codegen.spaces.ARCHETYPES`), filtered by its
rules (`prune.schedule_violations`) and by rendering the kernel; survivors are sorted by the cost model. Everything is cached by structure, so a kernel met again in another partition costs
nothing, and structurally identical programs are one candidate.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

from tensorsmith.codegen.emit import NotFusable
from tensorsmith.codegen.render import check_renders
from tensorsmith.codegen.schedules import default_schedule
from tensorsmith.codegen.spaces import ARCHETYPES
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.kernel_program import Kernel, KernelProgram, Schedule, kernel_structure, program_structure
from tensorsmith.ir.targets import Target

from .cost import KernelPricing
from .partition import (Bodies, absorbed, computed_operands, inside_operands, legalise, materialisable,
                        recomputed, vector_operands)
from .prune import AbstractChecker, kernel_facts, schedule_violations

RENDERED_PER_KERNEL = 6      # schedules per kernel that must render; more than any strategy branches on
DEFAULT_MARGIN = 1.25        # how much faster the model must predict a schedule than codegen's default (picked from
                             # measurements) to prefer it: on the H200 the model's choice among a matmul's TMA
                             # schedules, predicted 3% faster, measured up to 1.8x slower (2048 x 2048 x 2048 split
                             # in two: 54 against 30 us), while in the prologue path a 3.4x predicted gain measured 1.3x
MEASURED_DEFAULTS = ("matmul", "attention")   # the archetypes whose defaults were picked from measured sweeps
Boundaries = frozenset[int]   # positions in graph.nodes() of the nodes that get a buffer


@dataclass(frozen=True)
class Candidate:
    """One point of the space: kernel boundaries and a schedule per kernel (in kernel order), in the program form
    (`CandidateSpace.form`: which of the search's equivalent graphs) they partition."""

    boundaries: Boundaries
    schedules: tuple[Schedule, ...]
    form: int = 0


@dataclass
class SpaceStats:
    boundary_sets: int = 0
    kernels_scheduled: int = 0
    schedules_considered: int = 0
    pruned_schedule: int = 0             # schedule points that break a rule of their archetype's declaration
    render_failed: int = 0               # points codegen could not render
    pruned_expression_z3: int = 0        # boundary sets whose abstract expression differs from their form's graph's,
                                         # and forms whose graph's differs from the user's (each counted once)
    expression_undecided: int = 0        # Z3 could not decide in time: left to random testing
    duplicates: int = 0                  # boundary sets that legalise to a program seen before


@dataclass
class ScheduleOptions:
    """The schedules of one kernel that survive every check, preferred first, with predicted seconds; `ranks` are
    the seconds they are ordered by (a matmul's or an attention's default schedule at its prediction, any other
    DEFAULT_MARGIN times slower)."""

    schedules: tuple[Schedule, ...]
    seconds: tuple[float, ...]
    ranks: tuple[float, ...]


@dataclass
class CandidateSpace:
    """Lazily enumerated, cached candidate programs for one graph and target; `form` numbers the graph among the
    equivalent ones a search is given (0: the graph as written, tidied)."""

    graph: Graph
    target: Target
    checker: AbstractChecker = field(default_factory=AbstractChecker)
    stats: SpaceStats = field(default_factory=SpaceStats)
    form: int = 0
    scheduled: dict[tuple, ScheduleOptions] = field(default_factory=dict)   # by kernel structure; the spaces of one
                                                 # search's forms share it, since their kernels are often the same

    def __post_init__(self) -> None:
        self.nodes = self.graph.nodes()
        self.position = {id(node): i for i, node in enumerate(self.nodes)}
        outputs = {id(node) for node in self.graph.outputs.values()}
        self.points = tuple(self.position[id(n)] for n in materialisable(self.graph) if id(n) not in outputs)
        self._programs: dict[Boundaries, KernelProgram] = {}
        self._legal: dict[Boundaries, Boundaries] = {}
        self._by_structure: dict[str, Boundaries] = {}
        self._bodies: Bodies = {}     # kernel bodies by root, reused by every legalisation of this graph
        self._reference = self.checker.graph_terms(self.graph)
        self._expression_ok: dict[Boundaries, bool] = {}
        self.refuted = False     # the form's graph computes another function than the user's: no candidates

    # ---- boundaries ------------------------------------------------------------------------------------------
    def greedy(self) -> Boundaries:
        """The greedy partition's boundaries (fuse everything codegen takes)."""
        return self.legal(frozenset())

    def operands_materialised(self) -> Boundaries:
        """The greedy partition with every matmul operand that is computed given a buffer of its own, so that the
        matmuls read plain buffers (TMA, asynchronous copies), and what lies under those operands computed in their
        kernels (a norm's sum of squares and its scaled rows in one row kernel) where codegen takes it."""
        nodes = computed_operands(self.graph) + vector_operands(self.graph)
        operands = frozenset(self.position[id(node)] for node in nodes)
        inside = frozenset(self.position[id(node)] for node in inside_operands(self.graph, nodes))
        return self.legal((self.greedy() - inside) | (operands & frozenset(self.points)))

    def computed_once(self) -> Boundaries:
        """`operands_materialised` with every node that several of its kernels would compute each given a buffer
        (`partition.recomputed`: a residual stream), so that no value is computed twice, and what only those
        buffers' kernels read computed inside them (`partition.absorbed`: a matmul under a residual add)."""
        start = self.operands_materialised()
        materialised = {id(self.nodes[p]) for p in start}
        again = recomputed(self.graph, materialised)
        taken = frozenset(self.position[i] for i in absorbed(self.graph, materialised, again))
        return self.legal((start - taken) | (frozenset(self.position[id(node)] for node in again) & frozenset(self.points)))

    def unfused(self) -> Boundaries:
        """Every materialisable node its own kernel: each compute op, and each view a matmul reads (a copy)."""
        return self.legal(frozenset(self.points))

    def legal(self, wanted: Boundaries) -> Boundaries:
        """`wanted` grown until codegen takes every kernel; a duplicate of a program seen before maps to its first."""
        if wanted in self._legal:
            return self._legal[wanted]
        program, grown = legalise(self.graph, {id(self.nodes[p]) for p in wanted}, self._bodies)
        boundaries = frozenset(self.position[i] for i in grown) & frozenset(self.points)
        key = program_structure(program)
        first = self._by_structure.setdefault(key, boundaries)
        if first != boundaries:
            self.stats.duplicates += 1
        elif boundaries not in self._programs:
            self._programs[boundaries] = program
            self.stats.boundary_sets += 1      # counted, not len(): the search's forms can share one SpaceStats
        self._legal[wanted] = first
        return first

    def neighbours(self, boundaries: Boundaries, deadline: float = math.inf) -> list[Boundaries]:
        """Boundary sets one node away (materialise one more, or one fewer), legalised, deduplicated, sorted; those
        found by `deadline` (a large graph's legalisations take seconds)."""
        found: set[Boundaries] = set()
        for point in self.points:
            if time.monotonic() > deadline:
                break
            moved = boundaries - {point} if point in boundaries else boundaries | {point}
            legal = self.legal(frozenset(moved))
            if legal != boundaries:
                found.add(legal)
        return sorted(found, key=sorted)

    def program(self, boundaries: Boundaries) -> KernelProgram:
        """The (unscheduled) program of legal boundaries."""
        if boundaries not in self._programs:
            self.legal(boundaries)
        return self._programs[boundaries]

    def check_form(self, reference: Graph, seed: int = 0) -> bool:
        """Z3 check (a) of the form itself, once: its graph's abstract expression against `reference`'s (the user's
        graph it was rewritten from; `AbstractChecker.form_equivalent`), counted. A refuted form yields no
        candidates."""
        verdict = True if reference is self.graph else self.checker.form_equivalent(reference, self.graph, seed)
        if verdict is False:
            self.stats.pruned_expression_z3 += 1
        elif verdict is None:
            self.stats.expression_undecided += 1
        self.refuted = verdict is False
        return not self.refuted

    def leave_form_undecided(self) -> bool:
        """The form is not checked against the user's graph (no time is left for it): counted undecided."""
        self.stats.expression_undecided += 1
        return True

    def expression_ok(self, boundaries: Boundaries) -> bool:
        """Z3 check (a): the program's abstract expression is its graph's (or Z3 cannot tell), in a form not refuted."""
        if self.refuted:
            return False
        if boundaries not in self._expression_ok:
            self._expression_ok[boundaries] = self.check_program(self.program(boundaries))
        return self._expression_ok[boundaries]

    def check_program(self, program: KernelProgram) -> bool:
        """The abstract-expression check of any program against this space's graph, counted (undecided, unbuilt,
        where the graph's own terms were too large to build)."""
        verdict = None if self._reference is None else self.checker.equivalent(self._reference,
                                                                              self.checker.program_terms(program))
        if verdict is False:
            self.stats.pruned_expression_z3 += 1
        elif verdict is None:
            self.stats.expression_undecided += 1
        return verdict is not False

    # ---- schedules -------------------------------------------------------------------------------------------
    def options(self, boundaries: Boundaries, position: int) -> ScheduleOptions:
        """The feasible schedules of one kernel of `boundaries`' program, preferred first (`ScheduleOptions`)."""
        program = self.program(boundaries)
        kernel = program.kernels[position]
        key = kernel_structure(kernel)
        if key not in self.scheduled:
            self.scheduled[key] = self._schedule(program, position)
        return self.scheduled[key]

    def best_rank(self, boundaries: Boundaries) -> float:
        """The rank (`rank`) of `boundaries` with every kernel at its preferred (first) feasible schedule."""
        total = 0.0
        for position in range(len(self.program(boundaries).kernels)):
            options = self.options(boundaries, position)
            total += options.ranks[0] if options.ranks else math.inf
        return total

    def build(self, candidate: Candidate) -> KernelProgram:
        """The KernelProgram of a candidate: its boundaries' kernels with its schedules."""
        program = self.program(candidate.boundaries)
        kernels = [dataclasses.replace(k, schedule=s) for k, s in zip(program.kernels, candidate.schedules)]
        return dataclasses.replace(program, kernels=kernels, buffers=dict(program.buffers))

    def at_defaults(self, boundaries: Boundaries) -> Candidate | None:
        """The candidate of `boundaries` at codegen's default schedules, or None where a default is not among its
        kernel's feasible schedules (it breaks a rule, or does not render)."""
        program = self.program(boundaries)
        shapes = {name: buf.shape for name, buf in program.buffers.items()}
        defaults = []
        for position, kernel in enumerate(program.kernels):
            try:
                default = default_schedule(kernel, shapes, self.target.arch)
            except NotFusable:
                return None
            if default not in self.options(boundaries, position).schedules:
                return None
            defaults.append(default)
        return Candidate(boundaries, tuple(defaults), self.form)

    def seconds(self, candidate: Candidate) -> float:
        """The model's time for the candidate."""
        return self._total(candidate, "seconds")

    def rank(self, candidate: Candidate) -> float:
        """What unmeasured candidates are ordered by: the model's time with schedules other than codegen's defaults
        DEFAULT_MARGIN slower."""
        return self._total(candidate, "ranks")

    def _total(self, candidate: Candidate, column: str) -> float:
        program = self.program(candidate.boundaries)
        total = 0.0
        for position, schedule in enumerate(candidate.schedules):
            options = self.options(candidate.boundaries, position)
            total += getattr(options, column)[options.schedules.index(schedule)]
        return total if len(candidate.schedules) == len(program.kernels) else math.inf

    def describe(self, candidate: Candidate) -> str:
        program = self.program(candidate.boundaries)
        parts = [f"{k.name.removeprefix(self.graph.name + '_')}[{k.archetype}: {s}]"
                 for k, s in zip(program.kernels, candidate.schedules)]
        return f"{len(program.kernels)} kernels: " + "; ".join(parts)

    def _schedule(self, program: KernelProgram, position: int) -> ScheduleOptions:
        """The archetype's rules filter the whole space; the survivors are costed, and rendered cheapest first
        (codegen's default schedule first among equals) until RENDERED_PER_KERNEL of them render. Codegen's
        default, picked from measurements, is always among them where it survives, and first unless another is
        predicted DEFAULT_MARGIN faster: the model misprices some schedules (benchmarks/matmul.py's deep rings at
        M <= 128), and search must not lose the measured choice."""
        kernel = program.kernels[position]
        shapes = {name: buf.shape for name, buf in program.buffers.items()}
        self.stats.kernels_scheduled += 1
        try:
            facts = kernel_facts(kernel, shapes)
            default = default_schedule(kernel, shapes, self.target.arch)
        except NotFusable:
            return ScheduleOptions((), (), ())
        self.stats.schedules_considered += ARCHETYPES[kernel.archetype].size
        costed: list[tuple[float, int, Schedule]] = []
        pricing = KernelPricing(kernel, program, self.target)
        for order, (schedule, violated) in enumerate(schedule_violations(facts, self.target)):
            if violated is not None:
                self.stats.pruned_schedule += 1
                continue
            seconds = pricing.cost(schedule).seconds
            if math.isfinite(seconds):
                costed.append((seconds, -1 if schedule == default else order, schedule))
        costed.sort(key=lambda item: (item[0], item[1]))
        kept: list[tuple[float, Schedule]] = []
        for seconds, _, schedule in costed:
            if not self._renders(program, position, schedule):
                continue
            kept.append((seconds, schedule))
            if len(kept) == RENDERED_PER_KERNEL:
                break
        measured_choice = next(((seconds, schedule) for seconds, _, schedule in costed if schedule == default), None)
        if measured_choice is not None and measured_choice not in kept and self._renders(program, position, default):
            kept = kept[:RENDERED_PER_KERNEL - 1] + [measured_choice]
        margin = DEFAULT_MARGIN if kernel.archetype in MEASURED_DEFAULTS else 1.0
        ranked = sorted(((seconds if schedule == default else seconds * margin, seconds, schedule)
                         for seconds, schedule in kept), key=lambda item: item[0])
        return ScheduleOptions(tuple(s for _, _, s in ranked), tuple(t for _, t, _ in ranked),
                               tuple(r for r, _, _ in ranked))

    def _renders(self, program: KernelProgram, position: int, schedule: Schedule) -> bool:
        trial = dataclasses.replace(program.kernels[position], schedule=schedule)
        try:
            check_renders(_with_kernel(program, position, trial), position)
        except Exception:    # NotFusable, or a template that cannot take this schedule
            self.stats.render_failed += 1
            return False
        return True


def _with_kernel(program: KernelProgram, position: int, kernel: Kernel) -> KernelProgram:
    return dataclasses.replace(program, kernels=[*program.kernels[:position], kernel, *program.kernels[position + 1:]])
