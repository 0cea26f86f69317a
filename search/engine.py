"""search_program: from a graph to the fastest verified KernelProgram the search can find in its budget.

The search is given one graph, or several equivalent ones (`forms`: the programs extraction took from the e-graph,
search/extract.py), each partitioned in a space of its own. The strategy, in order:
1. beam search over kernel boundaries and schedules of each form, scored by the cost model (`beam.py`);
2. MCTS whose first move chooses a form and its boundaries, among each form's beam frontier and the neighbours of
   the best (`mcts.py`), rewarded by `measure` where the caller gives one (a GPU is present) and by the cost model
   otherwise; with `measure`, each form's best candidate by the model is measured before MCTS starts (the first
   form's first), since a measured candidate outranks every unmeasured one;
3. the ranked candidates (measured time first where there is one, else the model's rank) are checked in turn:
   Z3 abstract expression (already applied to every boundary set the search scored against its form's graph, and to
   each form once against `reference`, the user's graph: a form refuted there yields no candidates, and with every
   form refuted the search raises VerificationError), then random tests
   (`verify_program`, with a large-magnitude draw for softmax-like graphs); the first that passes wins.
   A measured candidate is random-tested here, when it is chosen; its GPU outputs were checked against the
   reference on the first draw when it was measured.

`measure` may reject a candidate by raising KernelFault (it faulted or hung: verdict "faulted" or "timed
out") or VerificationError (its outputs on the GPU disagree with the reference: "wrong on GPU"); the
rejection is logged and counted, MCTS gets no reward for it, and it is never chosen.

Determinism: every choice is ordered by structure or by a `random.Random(seed)`; the wall-clock budget only
cuts the work short, and `stats.budget_hit` says when it did (then a slower machine may return another
program). The greedy partition is always a candidate, so the winner never ranks behind it (`space.rank`).
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from tensorsmith.ir.errors import KernelFault
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.kernel_program import ExecutionMemo, KernelProgram
from tensorsmith.ir.targets import Target, get_target

from .beam import BeamConfig, beam
from .cost import program_seconds
from .exact import MAX_WORK as EXACT_MAX_WORK
from .exact import check_exact, evaluation_size
from .mcts import MCTSConfig, Root, mcts
from .partition import unfused
from .prune import AbstractChecker
from .space import Boundaries, Candidate, CandidateSpace, ScheduleOptions, SpaceStats
from .verify import Check, Draw, NoiseOnlyError, VerificationError, reference_draw, softmax_like, verify_program

log = logging.getLogger(__name__)

Measure = Callable[[KernelProgram], float]
WRONG_ON_GPU = "wrong on GPU"


@dataclass(frozen=True)
class SearchConfig:
    beam: BeamConfig = BeamConfig()
    mcts: MCTSConfig = MCTSConfig()
    verify_draws: int = 2
    max_draws: int = 4           # draws made, where no candidate passed outright, while none has met the dtypes' own
                                 # tolerances (an output that cancels matches within its rounding noise only, on some)
    max_verified: int = 8        # candidates random-tested before giving up on the ranked list


@dataclass
class SearchStats:
    enumerated: int = 0            # distinct full candidates scored (boundaries x schedules)
    boundary_sets: int = 0         # distinct legal kernel partitions met
    pruned_schedule: int = 0       # schedule points that break a rule of their archetype (codegen/spaces.py)
    pruned_expression_z3: int = 0  # candidate programs Z3 showed compute something else
    expression_undecided: int = 0
    render_failed: int = 0
    failed_verification: int = 0
    noisy: int = 0                 # boundary sets that matched only within rounding noise on their first draws
    shown_exactly: int = 0         # of those, accepted on more draws only because the exact check passed
    verified: int = 0
    measured: int = 0
    faulted: int = 0               # measured candidates whose kernels faulted (an illegal address, a crash)
    timed_out: int = 0             # measured candidates that ran past their deadline (a hang)
    wrong_on_gpu: int = 0          # measured candidates whose GPU outputs disagree with the reference
    draws_cut: int = 0             # boundary sets random-tested on fewer ordinary draws than configured: no more fit
    defaults_kept: int = 0         # winners replaced by their kernels at codegen's defaults, measured faster
    reference_s: float = 0.0       # one float64 evaluation of the reference graph on one draw, as timed here
    seconds: float = 0.0
    budget_hit: bool = False


@dataclass(frozen=True)
class SearchProgress:
    """What a progress bar shows."""

    tried: int
    pruned_schedules: int      # schedule points their archetype's rules rule out
    pruned_by_z3: int          # candidate programs Z3 showed wrong
    verified: int
    best_us: float | None
    rejected: int = 0        # measured candidates that faulted, timed out or gave wrong outputs on the GPU
    piece: str = ""          # which piece of a model of identical layers is searched ("layer (x16)"), if one is


@dataclass
class SearchResult:
    program: KernelProgram
    predicted_us: float
    measured_us: float | None
    history: list[dict[str, Any]]
    stats: SearchStats
    form: int = 0                    # which of the forms the winner partitions (0: `graph`)
    form_best: list[dict[str, float | None]] = field(default_factory=list)   # per form: its best candidate's
                                     # predicted and measured microseconds (None: none of it measured)
    greedy_us: float = math.nan      # the greedy partition at codegen's default schedules, predicted
    unfused_us: float = math.nan     # one kernel per op at default schedules, predicted
    checks: list[Check] = field(default_factory=list)   # the winner's random tests against the reference graph

    def summary(self) -> dict[str, Any]:
        return {"predicted_us": self.predicted_us, "measured_us": self.measured_us, "greedy_us": self.greedy_us,
                "unfused_us": self.unfused_us, **asdict(self.stats)}


@dataclass
class _Run:
    """The mutable state of one search: the spaces of its forms, what was tried, the clock."""

    spaces: list[CandidateSpace]   # one per form
    graph: Graph              # what candidates are random-tested against: the caller's reference graph
    seed: int
    cfg: SearchConfig
    deadline: float           # when the search stops trying candidates (the budget less the verification reserve)
    end: float                # the end of the budget, which decides how many draws a candidate is tested on
    measure: Measure | None
    progress: Callable[[SearchProgress], None] | None
    predicted: dict[Candidate, float] = field(default_factory=dict)
    measured: dict[Candidate, float] = field(default_factory=dict)
    rejected: dict[Candidate, str] = field(default_factory=dict)    # verdicts of candidates measure refused
    verdicts: dict[Key, bool] = field(default_factory=dict)
    noisy: list[Key] = field(default_factory=list)   # failed only for matching within rounding noise, in order
    last_failure: str = ""                           # why the last candidate that failed random testing failed
    checks: dict[Key, list[Check]] = field(default_factory=dict)   # the last ordinary draw's, where they pass
    draws: dict[int, Draw | None] = field(default_factory=dict)   # verify_program's memo: inputs, reference per draw
    executions: dict[int, ExecutionMemo] = field(default_factory=dict)   # and of kernel outputs, per draw
    history: list[dict[str, Any]] = field(default_factory=list)
    stats: SearchStats = field(default_factory=SearchStats)

    def score(self, candidate: Candidate, seconds: float) -> None:
        if candidate in self.predicted:
            return
        self.predicted[candidate] = seconds
        self.stats.enumerated += 1
        self.history.append({"name": f"candidate {len(self.history)}", "description": self.describe(candidate),
                             "predicted_us": seconds * 1e6, "measured_us": None, "verdict": "scored"})
        self._entry[candidate] = self.history[-1]
        self.report()

    def verify(self, candidate: Candidate, more_draws: bool = False) -> bool:
        """Random tests of the candidate's program (per boundary set: the numpy executor ignores schedules). One that
        matches only within rounding noise fails, and is remembered in `noisy`; `more_draws` tests such a one again
        on up to `max_draws`, which `_choose` asks only where no candidate passed outright (so that of two right
        programs the one that shows itself within the dtypes' tolerance wins, not one that rounds more), and accepts
        it if still only within noise where the exact check shows it right."""
        boundaries = key(candidate)
        if more_draws and boundaries in self.noisy:
            del self.verdicts[boundaries]
        if boundaries not in self.verdicts:
            draws = self.draws_that_fit()
            self.stats.draws_cut += draws < self.cfg.verify_draws
            try:
                self.checks[boundaries] = verify_program(self.graph, self.space_of(candidate).build(candidate),
                                                         self.seed, draws,
                                                         large=True, memo=self.draws,
                                                         max_draws=self.cfg.max_draws if more_draws else draws,
                                                         executions=self.executions)
                self.verdicts[boundaries] = True
                self.stats.verified += 1
            except NoiseOnlyError as err:
                self.verdicts[boundaries] = more_draws and self.exactly_right(candidate)
                if self.verdicts[boundaries]:
                    self.checks[boundaries] = err.checks
                    self.stats.verified += 1
                elif not more_draws:
                    self.noisy.append(boundaries)
                    self.stats.noisy += 1
                else:
                    self.stats.failed_verification += 1
                    self.last_failure = (f"{err}; where the outputs are mostly rounding (a normalisation of nearly"
                                         f" equal values), pass example inputs at the scale the graph is used at,"
                                         f" or compute that part in float32")
            except VerificationError as err:
                self.verdicts[boundaries] = False
                self.stats.failed_verification += 1
                self.last_failure = str(err)
        entry = self._entry.get(candidate)
        if entry is not None:
            entry["verdict"] = "verified" if self.verdicts[boundaries] else "failed verification"
        self.report()
        return self.verdicts[boundaries]

    def exactly_right(self, candidate: Candidate) -> bool:
        """Whether the candidate's program computes its graph's function over the prime field (exact.py): what shows
        right a program whose outputs the float check cannot judge (they are all rounding noise, as a mean of
        normalised values is). False where the check is too large to make."""
        space = self.space_of(candidate)
        if evaluation_size(space.graph) > EXACT_MAX_WORK:
            return False
        try:
            check_exact(space.graph, space.build(candidate), self.seed)
        except VerificationError:
            return False
        self.stats.shown_exactly += 1
        return True

    def draws_that_fit(self) -> int:
        """The most ordinary draws, at least one, whose tests are expected to end within the budget: k draws cost
        about 2k - 1 reference evaluations (the first draw's reference is remembered; each execution costs one).
        A candidate that matches only within rounding noise on them may be tested on more (`verify`)."""
        left = self.end - time.monotonic()
        fits = [k for k in range(1, self.cfg.verify_draws + 1) if (2 * k - 1) * self.stats.reference_s <= left]
        return max(fits, default=1)

    def evaluate(self, candidate: Candidate) -> float | None:
        """MCTS's reward: measured seconds of a candidate, or the cost model's without `measure`. A measured
        candidate's GPU outputs are checked against the reference on the first draw (`measure` raises where they
        differ); its random tests on the numpy executor wait for `_choose`, which returns none that fails them (at a
        real model's size they took most of the budget, and left the search one candidate measured)."""
        seconds = self.space_of(candidate).seconds(candidate)
        self.score(candidate, seconds)
        if self.measure is None:
            return seconds
        if candidate in self.rejected or self.verdicts.get(key(candidate)) is False:
            return None
        if candidate not in self.measured:
            try:
                seconds = float(self.measure(self.space_of(candidate).build(candidate)))
            except KernelFault as err:
                self.reject(candidate, err.verdict, str(err))
                return None
            except VerificationError as err:
                self.reject(candidate, WRONG_ON_GPU, str(err))
                return None
            self.measured[candidate] = seconds
            self.stats.measured += 1
            self._entry[candidate]["measured_us"] = seconds * 1e6
        return self.measured[candidate]

    def reject(self, candidate: Candidate, verdict: str, reason: str) -> None:
        """Record that measuring `candidate` failed (`verdict`): logged, counted, never chosen."""
        self.rejected[candidate] = verdict
        counter = {"timed out": "timed_out", WRONG_ON_GPU: "wrong_on_gpu"}.get(verdict, "faulted")
        setattr(self.stats, counter, getattr(self.stats, counter) + 1)
        entry = self._entry[candidate]
        entry["verdict"] = verdict
        log.warning("%s is skipped (%s): %s [%s]", entry["name"], verdict, reason, entry["description"])
        self.report()

    def report(self) -> None:
        if self.progress is None:
            return
        best = min(self.measured.values(), default=None) if self.measured else min(self.predicted.values(),
                                                                                    default=None)
        space = self.spaces[0].stats
        self.progress(SearchProgress(self.stats.enumerated, space.pruned_schedule, space.pruned_expression_z3,
                                     self.stats.verified, best * 1e6 if best is not None else None,
                                     len(self.rejected)))

    def space_of(self, candidate: Candidate) -> CandidateSpace:
        return self.spaces[candidate.form]

    def describe(self, candidate: Candidate) -> str:
        text = self.space_of(candidate).describe(candidate)
        return f"form {candidate.form}, {text}" if len(self.spaces) > 1 else text

    def __post_init__(self) -> None:
        self._entry: dict[Candidate, dict[str, Any]] = {}


Key = tuple[int, Boundaries]   # a boundary set of one form: what a random test's verdict is kept by


def key(candidate: Candidate) -> Key:
    """Random tests run on the numpy executor, which ignores schedules: a verdict holds for the boundary set."""
    return candidate.form, candidate.boundaries


def search_program(graph: Graph, target: Target | str = "sm90", budget_s: float = 60.0, seed: int = 0,
                   measure: Measure | None = None, progress: Callable[[SearchProgress], None] | None = None,
                   config: SearchConfig | None = None, reference: Graph | None = None,
                   draws: dict[int, Draw | None] | None = None, reference_s: float | None = None,
                   forms: Sequence[Graph] = (), on_leader: Callable[[KernelProgram], None] | None = None
                   ) -> SearchResult:
    """The fastest verified KernelProgram for `graph`, or for one of `forms` (graphs equivalent to it, with its inputs
    and outputs), that the search finds within `budget_s` seconds; `result.form` says which (0: `graph`).

    Candidates are random-tested against `reference` (default `graph`): a graph with the same inputs and outputs
    that `graph` was rewritten from, such as the user's, whose tests of the winner the compiler then keeps.
    `draws` is verify_program's memo of those tests' inputs and reference outputs, where the caller keeps it to
    use the same draws after the search (`reference_s`: how long the first draw's reference took, where `draws`
    holds it already, since it sizes the verification's share of the budget). A candidate is tested on as many of
    `config.verify_draws` ordinary draws as are expected to end within the budget, at least one (and on the
    large-magnitude one where it applies): the budget can be overrun by that. `on_leader` is given the program the
    first form's beam ranks best, as soon as it is known: what the search most likely returns, which the caller may
    start compiling while the search goes on.

    >>> result = search_program(graph, "sm90", budget_s=10)
    >>> result.program.kernels[0].schedule, result.stats.verified
    """
    start = time.monotonic()
    target = get_target(target) if isinstance(target, str) else target
    cfg = config or SearchConfig(BeamConfig(seed=seed), MCTSConfig(seed=seed))
    checker, stats = AbstractChecker(budget_s=budget_s), SpaceStats()
    scheduled: dict[tuple, ScheduleOptions] = {}
    spaces = [CandidateSpace(g, target, checker, stats, form, scheduled) for form, g in enumerate([graph, *forms])]
    _check_forms(spaces, reference or graph, seed, start + FORM_CHECK_SHARE * budget_s)
    run = _Run(spaces, reference or graph, seed, cfg, start + budget_s, start + budget_s, measure, progress,
               draws=draws if draws is not None else {})
    run.deadline -= _verification_reserve(run, budget_s, reference_s)
    ranked = [beam(spaces[0], cfg.beam, _beam_deadline(run), run.score)]
    if on_leader is not None and ranked[0]:
        on_leader(spaces[0].build(ranked[0][0][1]))
    share = _form_share(run)   # every form's beam before any measurement, which may take what is left
    ranked += [beam(space, cfg.beam, min(run.deadline, time.monotonic() + share), run.score)
               if time.monotonic() < run.deadline else []        # a form met after the deadline is not searched
               for space in spaces[1:]]
    _measure_first(run, ranked[0])   # each form's choice by the model (codegen's measured defaults where near) first:
    for found in sorted(ranked[1:], key=lambda found: found[0][0] if found else math.inf):
        _measure_first(run, found)   # a candidate MCTS measures wins only by being faster
    roots = _mcts_roots(spaces, ranked, run.deadline)
    if roots and time.monotonic() < run.deadline:
        mcts(spaces, roots, run.evaluate, cfg.mcts, run.deadline)
    for space in spaces:
        if space.form > 0 and time.monotonic() > run.deadline:
            break              # another form's greedy partition, unscored, takes seconds to schedule at depth
        greedy = _greedy_candidate(space)
        if greedy is not None:
            run.score(greedy, space.seconds(greedy))
    winner = _no_slower_than_defaults(run, _choose(run))
    result = _result(run, winner, start)
    result.stats.budget_hit = time.monotonic() > start + budget_s
    return result


FORM_CHECK_SHARE = 0.1   # of the budget: the forms' Z3 checks begun after it are left undecided (a 16-layer model's
                         # four forms took 4.6 s of a 10 s budget, each check up to two Z3 timeouts)


def _check_forms(spaces: list[CandidateSpace], reference: Graph, seed: int, deadline: float = math.inf) -> None:
    """Each form's graph against the reference (`CandidateSpace.check_form`), the first always and the others while
    `deadline` has not passed (after it, undecided: left to random testing); raises VerificationError where every
    form computes another function, so that the caller can fall back to the graph as written."""
    refuted = [not (space.check_form(reference, seed) if form == 0 or time.monotonic() < deadline
                    else space.leave_form_undecided())
               for form, space in enumerate(spaces)]
    if all(refuted):
        raise VerificationError(f"every form of graph {reference.name!r} computes another function than it (the"
                                f" abstract-expression check refuted {len(spaces)})")


BEAM_SHARE = 0.5   # of the search's time, where it has several forms: what their beams may take, in equal shares


def _beam_deadline(run: _Run) -> float:
    """When the first form's beam stops: with one form, the search's deadline; with several, after BEAM_SHARE of
    the time, so that the other forms are searched too, their best candidates measured, and MCTS runs (on the H200
    two_branches_4096's second form, searched after the first form's measurement, found only a fused program
    predicted at 513 us, where the CPU's search finds one predicted at 65 us: 2026-12-01)."""
    if len(run.spaces) == 1:
        return run.deadline
    return time.monotonic() + max(0.0, run.deadline - time.monotonic()) * BEAM_SHARE


def _form_share(run: _Run) -> float:
    """Seconds each form after the first may spend in its beam: equal shares of BEAM_SHARE of what is left."""
    return max(0.0, run.deadline - time.monotonic()) * BEAM_SHARE / max(1, len(run.spaces) - 1)


def _measure_first(run: _Run, found: list[tuple[float, Candidate]]) -> None:
    """Measure a form's best candidate by the model, where there is a GPU, whatever the time (at most one per form,
    MAX_FORMS): a measured candidate outranks every unmeasured one, so a form left unmeasured is a form not chosen. On
    the H200 two_branches_4096's first form, measured, took the search past its deadline, and its second form's best
    (predicted 61 us against 110) went unmeasured and lost (2026-12-02)."""
    if run.measure is not None and found:
        run.evaluate(found[0][1])


def _no_slower_than_defaults(run: _Run, winner: Candidate) -> Candidate:
    """Where a GPU measures: the winner's kernels at codegen's default schedules are measured too (most often they
    were already: the beam's first choice), and replace the winner where they ran faster and pass its random tests.
    The model misprices some schedules, and the defaults were picked from measurements: a measured winner is never
    slower than its kernels at their defaults, where those are feasible and, past the search's deadline, already
    measured."""
    if run.measure is None or winner not in run.measured:
        return winner
    twin = run.space_of(winner).at_defaults(winner.boundaries)
    if twin is None or twin == winner or (time.monotonic() > run.deadline and twin not in run.measured):
        return winner
    seconds = run.evaluate(twin)
    if seconds is not None and seconds < run.measured[winner] and run.verify(twin):
        run.stats.defaults_kept += 1
        return twin
    return winner


MIN_SEARCH_SHARE = 0.25   # of the budget, kept for the search however long verification is expected to take


def _verification_reserve(run: _Run, budget_s: float, known_s: float | None = None) -> float:
    """Seconds of the budget to keep for random-testing the winner, so that a large graph's verification fits
    in it: the first draw's reference is evaluated now (the verification reads it from the memo) and timed,
    and each remaining draw's reference and each draw's program execution are expected to take as long."""
    remembered = 0 in run.draws
    began = time.monotonic()
    reference_draw(run.graph, run.seed, 0, memo=run.draws)
    run.stats.reference_s = known_s if remembered and known_s is not None else time.monotonic() - began
    draws = run.cfg.verify_draws + (1 if softmax_like(run.graph) else 0)
    reserve = run.stats.reference_s * (2 * draws - 1)
    return min(reserve, (1.0 - MIN_SEARCH_SHARE) * budget_s)


def _mcts_roots(spaces: list[CandidateSpace], ranked: list[list[tuple[float, Candidate]]],
                deadline: float) -> list[Root]:
    """Per form, best form first by the model (its best candidate's rank): the beam's best boundary set; then the
    greedy partition and the one with computed matmul operands materialised, whichever the beam did not rank first
    (the model may misjudge which of fusing an operand's computation into the matmul or giving it a kernel is
    faster, so both are measured early); then the beam's other sets. Last, up to NEIGHBOUR_ROOTS sets one move from
    the best form's best (those found by `deadline`)."""
    order = sorted((form for form in range(len(spaces)) if ranked[form]),
                   key=lambda form: (spaces[form].rank(ranked[form][0][1]), form))
    roots: list[Root] = []
    for form in order:
        space, sets = spaces[form], list(dict.fromkeys(candidate.boundaries for _, candidate in ranked[form]))
        shapes = [b for b in (space.greedy(), space.operands_materialised()) if space.expression_ok(b)]
        roots += [(form, b) for b in dict.fromkeys([sets[0], *shapes, *sets[1:]])]
    if roots:
        form, best = roots[0]
        near: list[Root] = []
        for b in spaces[form].neighbours(best, deadline):
            if len(near) == NEIGHBOUR_ROOTS or time.monotonic() > deadline:
                break
            if (form, b) not in roots and spaces[form].expression_ok(b):
                near.append((form, b))
        roots += near
    return list(dict.fromkeys(roots))


NEIGHBOUR_ROOTS = 4


def _greedy_candidate(space: CandidateSpace) -> Candidate | None:
    if space.refuted:
        return None
    greedy = space.greedy()
    options = [space.options(greedy, p) for p in range(len(space.program(greedy).kernels))]
    if any(not o.schedules for o in options):
        return None
    return Candidate(greedy, tuple(o.schedules[0] for o in options), space.form)


FORM_MARGIN = 1.25   # where a GPU measures, how much faster the model must predict an unmeasured candidate of another
                     # form than the first (the graph as written, tidied) to prefer it: on the H200 a Llama block's
                     # form with a norm's scale moved past its matmul, predicted 1.21x faster and unmeasured, ran at
                     # 532 us where the written form's program ran at 479 us (2026-12-01)


def _choose(run: _Run) -> Candidate:
    """The best candidate that passes random testing: by measured time where measured, else by the model's rank
    (its predicted time, schedules other than codegen's defaults counted DEFAULT_MARGIN slower, and where a GPU
    measures, candidates of forms other than the first FORM_MARGIN slower)."""
    def rank(candidate: Candidate) -> tuple:
        measured = run.measured.get(candidate)
        margin = FORM_MARGIN if run.measure is not None and candidate.form > 0 else 1.0
        return (0 if measured is not None else 1,
                measured if measured is not None else run.space_of(candidate).rank(candidate) * margin, candidate.form,
                sorted(candidate.boundaries), [str(s) for s in candidate.schedules])

    tried = 0
    for candidate in sorted(run.predicted, key=rank):
        if run.verdicts.get(key(candidate)) is False or candidate in run.rejected:
            continue
        if not run.space_of(candidate).expression_ok(candidate.boundaries):
            continue
        if run.verify(candidate):
            return candidate
        tried += 1
        if tried >= run.cfg.max_verified:
            break
    best = {key(c): c for c in sorted(run.predicted, key=rank)[::-1] if c not in run.rejected}   # per set
    noisy = sorted(run.noisy, key=lambda k: rank(best[k]))[:run.cfg.max_verified]   # none passed outright: those
    for boundaries in noisy:                                                        # within noise, best first
        if run.verify(best[boundaries], more_draws=True):
            return best[boundaries]
    raise VerificationError(f"no candidate program for graph {run.graph.name!r} passed random testing"
                            f" ({run.stats.failed_verification} failed; the last: {run.last_failure or 'none tried'})")


def _result(run: _Run, winner: Candidate, start: float) -> SearchResult:
    space, stats = run.spaces[0], run.stats
    stats.boundary_sets = space.stats.boundary_sets
    stats.pruned_schedule = space.stats.pruned_schedule
    stats.pruned_expression_z3 = space.stats.pruned_expression_z3
    stats.expression_undecided = space.stats.expression_undecided
    stats.render_failed = space.stats.render_failed
    stats.seconds = time.monotonic() - start
    run._entry[winner]["verdict"] = "winner"
    return SearchResult(run.space_of(winner).build(winner), run.predicted[winner] * 1e6,
                        run.measured[winner] * 1e6 if winner in run.measured else None, run.history, stats,
                        form=winner.form, form_best=[_form_best(run, form) for form in range(len(run.spaces))],
                        greedy_us=program_seconds(space.program(space.greedy()), space.target) * 1e6,
                        unfused_us=program_seconds(unfused(space.graph), space.target) * 1e6,
                        checks=run.checks[key(winner)])


def _form_best(run: _Run, form: int) -> dict[str, float | None]:
    """The best predicted and the best measured microseconds among the candidates of one form."""
    predicted = [s for c, s in run.predicted.items() if c.form == form]
    measured = [s for c, s in run.measured.items() if c.form == form]
    return {"predicted_us": min(predicted) * 1e6 if predicted else None,
            "measured_us": min(measured) * 1e6 if measured else None}
