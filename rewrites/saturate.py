"""Bounded equality saturation: grow the e-graph of a Graph with the rules, a few iterations per egglog call.

One egglog `run` cannot be interrupted, and one iteration of a rule set with associativity and
commutativity can multiply the e-graph many times over. So each call runs `iterations_per_run`
iterations (the back-off scheduler inside the call: egglog resets a scheduler at every `run`), and the
limits are checked between calls. The e-graph is pushed before each call and popped if the call crossed
`node_limit`, so the result never holds more e-nodes than the limit (unless the graph itself does). A call that
merges terms of different shapes or dtypes (a "conflict": a rule is unsound) stops saturation, and the e-graph is
loaded from the graph again, so that extraction gives the graph back rather than a term of the wrong shape.

Because the scheduler starts afresh at every call, a rule banned in a call's first iteration (more matches
than the match limit) and banned for longer than the call lasts would never run at all. So, unless one is
given, the match limit grows with the e-graph: max(MIN_MATCH_LIMIT, e-nodes) at each call.

Saturation is staged (`STAGES`): "algebra" (identities, commutativity, views, folding, factoring, the laws of
sum and max) runs to saturation or its iteration limit; then "reassociate" (associativity, distribution,
exp2 splitting, which grow the e-graph exponentially) runs a couple of iterations under a growth limit of its
own, rolled back if crossed; then "patterns" (matmul, RMSNorm into matmul, online softmax) recognises the
forms the later stages match on; then "contractions" (matmul associativity, factoring and distribution over a
sum) rewrites those MatMul terms under a growth limit. (The fusion stage of issue 3 is not built yet.) A rule's
`derive` pass (constant folding) runs after every egglog call of its stage. The report has every call, tagged with its stage,
and how often each rule matched.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from egglog import EGraph, Ruleset, back_off, run, ruleset, union
from egglog.bindings import EggSmolError

from tensorsmith.ir.graph import Graph

from .eclasses import EClasses, read_eclasses
from .rules import RULES, Rule
from .term import TExpr, analysis, to_egglog

DEFAULT_ITERATIONS = 8
DEFAULT_NODE_LIMIT = 50_000
DEFAULT_TIME_LIMIT_S = 10.0
MIN_MATCH_LIMIT = 1000

log = logging.getLogger(__name__)
# egglog logs each command it runs at INFO: hundreds of records per compile, which would bury tensorsmith's own
# progress for a user who turns INFO on. They are kept for WARNING and above; `--debug` shows them all.
EGGLOG_LOGGER = logging.getLogger("egglog")
if EGGLOG_LOGGER.level == logging.NOTSET:
    EGGLOG_LOGGER.setLevel(logging.WARNING)


@dataclass(frozen=True)
class Stage:
    """A saturation stage: its name (rules say which stage they run in), its most iterations (the caller's
    `iterations` caps it too), and the e-graph growth it may cause (a factor of its size at the stage's start;
    a call that crosses it is rolled back and the stage ends)."""

    name: str
    max_iterations: int
    max_growth: float = float("inf")


STAGES: tuple[Stage, ...] = (
    Stage("algebra", DEFAULT_ITERATIONS),
    Stage("reassociate", 2, max_growth=3.0),
    Stage("patterns", 4),
    Stage("contractions", 4, max_growth=4.0),
)


@dataclass(frozen=True)
class StageReport:
    """One egglog call: rule iterations run, e-graph size after it, and its wall time.

    A `discarded` stage crossed the node limit and was rolled back; its sizes say how far it got.
    `stage` names the saturation stage the call belongs to ("load" for loading the graph).
    """

    iterations: int
    enodes: int
    eclasses: int
    seconds: float
    discarded: bool = False
    stage: str = "load"


@dataclass(frozen=True)
class SaturationReport:
    """Every stage (the first is loading the graph), and why saturation stopped."""

    stages: tuple[StageReport, ...]
    stopped: str  # "saturated", "iterations", "node_limit", "time_limit" or "conflict" (a misfired merge: the
    #               e-graph is the graph's as loaded, every call after the load is marked discarded)
    stage_stops: tuple[tuple[str, str], ...] = ()   # (stage, why it stopped: the above or "growth_limit")
    matches: tuple[tuple[str, int], ...] = ()       # (rule name, matches over the whole saturation)
    first_fired: tuple[str, ...] = ()               # the rules that matched, in the order they first did (by egglog
                                                    # call; within one call, in the order of the rules given)

    def per_stage(self) -> list[tuple[str, int, int, float]]:
        """(stage, iterations, e-nodes at its end, seconds) for the load and every stage that ran."""
        rows: dict[str, list] = {}
        for stage in self.stages:
            row = rows.setdefault(stage.stage, [stage.stage, 0, 0, 0.0])
            row[3] += stage.seconds
            if not stage.discarded:
                row[1] += stage.iterations
                row[2] = stage.enodes
        for row in rows.values():
            if row[2] == 0:
                row[2] = self.stages[0].enodes
        return [tuple(row) for row in rows.values()]  # type: ignore[misc]

    @property
    def kept(self) -> tuple[StageReport, ...]:
        return tuple(stage for stage in self.stages if not stage.discarded)

    @property
    def iterations(self) -> int:
        return sum(stage.iterations for stage in self.kept)

    @property
    def enodes(self) -> int:
        return self.kept[-1].enodes

    @property
    def eclasses(self) -> int:
        return self.kept[-1].eclasses

    @property
    def seconds(self) -> float:
        return sum(stage.seconds for stage in self.stages)

    def summary(self) -> str:
        """One line: iterations, final size, time and the reason for stopping."""
        return (f"{self.iterations} iterations, {self.enodes} e-nodes in {self.eclasses} e-classes, "
                f"{self.seconds:.2f} s, stopped: {self.stopped}")


@dataclass
class Saturated:
    """The saturated e-graph, the roots of the graph's outputs in it, the graph itself, and the report."""

    egraph: EGraph
    roots: dict[str, TExpr]
    graph: Graph
    report: SaturationReport


@functools.cache
def rule_set(rules: tuple[Rule, ...]) -> Ruleset:
    """One egglog ruleset of these rules (cached: a ruleset is declared once per set of rules)."""
    return ruleset(*(r for rule in rules for r in rule.rewrites))


@functools.cache
def _rule_names(rules: tuple[Rule, ...]) -> dict[object, str]:
    """egglog's key for each rewrite in a run report -> the name of its Rule."""
    return {r.decl: rule.name for rule in rules for r in rule.rewrites}


def _stage(egraph: EGraph, roots: dict[str, TExpr], iterations: int, seconds: float,
           name: str) -> tuple[StageReport, EClasses]:
    classes = read_eclasses(egraph, roots)
    return StageReport(iterations, classes.num_enodes, len(classes.nodes), seconds, stage=name), classes


def _derive(egraph: EGraph, rules: Sequence[Rule], classes: EClasses, matches: Counter[str]) -> bool:
    """Run the rules' derive passes once; True when they merged anything."""
    merges = []
    for rule in rules:
        if rule.derive is not None:
            found = rule.derive(classes)
            if found:
                matches[rule.name] += len(found)
            merges += [union(lhs).with_(rhs) for lhs, rhs in found]
    if merges:
        egraph.register(*merges)
        egraph.run(analysis.saturate())
    return bool(merges)


def _load(graph: Graph) -> tuple[EGraph, dict[str, TExpr]]:
    """A fresh e-graph of `graph` with the shape and dtype of every term."""
    egraph, roots = to_egglog(graph)
    egraph.run(analysis.saturate())
    return egraph, roots


def saturate(graph: Graph, rules: Sequence[Rule] = RULES, iterations: int = DEFAULT_ITERATIONS,
             node_limit: int = DEFAULT_NODE_LIMIT, time_limit_s: float = DEFAULT_TIME_LIMIT_S,
             iterations_per_run: int = 2, match_limit: int | None = None, ban_length: int = 5,
             stages: Sequence[Stage] = STAGES) -> Saturated:
    """Load `graph` into an e-graph and apply `rules`, stage by stage, until saturated or a limit is reached.

    `iterations` caps each stage; `node_limit` and `time_limit_s` hold for the whole saturation.
    """
    start = time.perf_counter()
    egraph, roots = _load(graph)
    load, classes = _stage(egraph, roots, 0, time.perf_counter() - start, "load")
    reports = [load]
    matches: Counter[str] = Counter()   # in insertion order: the order rules first matched (`first_fired`)
    stage_stops: list[tuple[str, str]] = []
    stopped = "saturated"
    for stage in stages:
        chosen = tuple(rule for rule in rules if rule.stage == stage.name)
        if not chosen:
            continue
        why, classes = _run_stage(egraph, roots, stage, chosen, classes, reports, matches, start,
                                  min(iterations, stage.max_iterations), node_limit, time_limit_s,
                                  iterations_per_run, match_limit, ban_length)
        stage_stops.append((stage.name, why))
        if why == "conflict":
            # The call that merged two shapes is rolled back, but the term of the wrong shape may be older: a rule
            # can make an ill-formed term whose class agrees on its shape, and only a later merge shows it. So none
            # of the rules' work is kept: the e-graph is the graph's again, and extraction gives the graph back.
            egraph, roots = _load(graph)
            reports = [load, *(dataclasses.replace(report, discarded=True) for report in reports[1:])]
        if why in ("node_limit", "time_limit", "conflict"):
            stopped = why
            break
        if why == "iterations":
            stopped = "iterations"
    report = SaturationReport(tuple(reports), stopped, tuple(stage_stops), tuple(sorted(matches.items())),
                              tuple(name for name, count in matches.items() if count))
    return Saturated(egraph, roots, graph, report)


def _run_stage(egraph: EGraph, roots: dict[str, TExpr], stage: Stage, rules: tuple[Rule, ...], classes: EClasses,
               reports: list[StageReport], matches: Counter[str], start: float, iterations: int, node_limit: int,
               time_limit_s: float, iterations_per_run: int, match_limit: int | None,
               ban_length: int) -> tuple[str, EClasses]:
    """Run one stage's rules in bounded egglog calls; append a report per call; say why it stopped."""
    rules_run, names = rule_set(rules), _rule_names(rules)
    growth_limit = stage.max_growth * classes.num_enodes
    done = 0
    while done < iterations:
        if time.perf_counter() - start > time_limit_s:
            return "time_limit", classes
        k = min(iterations_per_run, iterations - done)
        limit = match_limit if match_limit is not None else max(MIN_MATCH_LIMIT, classes.num_enodes)
        scheduler = back_off(match_limit=limit, ban_length=ban_length)
        began = time.perf_counter()
        egraph.push()
        try:
            run_report = egraph.run((run(rules_run, scheduler=scheduler) + analysis.saturate()) * k)
            report, after = _stage(egraph, roots, k, time.perf_counter() - began, stage.name)
            derived = _derive(egraph, rules, after, matches)
        except EggSmolError as err:
            # Two terms of different shapes or dtypes were merged: a rule misfired (or egglog did: the rare
            # conflicts of the transformer block came from colliding global names, see term._fixed_width_lets).
            # The call is rolled back and saturation stops here; `saturate` then starts over from the graph.
            egraph.pop()
            log.warning("saturation stage %s stopped: %s; the rewrites are discarded", stage.name, err)
            return "conflict", classes
        if derived:
            report, after = _stage(egraph, roots, k, time.perf_counter() - began, stage.name)
        if report.enodes > node_limit or report.enodes > growth_limit:
            egraph.pop()
            reports.append(dataclasses.replace(report, discarded=True))
            return ("node_limit" if report.enodes > node_limit else "growth_limit"), classes
        counts: Counter[str] = Counter()
        for key, count in run_report.num_matches_per_rule.items():
            if key in names:
                counts[names[key]] += count
        for rule in rules:   # the rules given's order, so that the first-fired order is deterministic
            if counts[rule.name]:
                matches[rule.name] += counts[rule.name]
        reports.append(report)
        classes = after
        done += k
        if not run_report.updated and not derived:
            return "saturated", classes
    return "iterations", classes
