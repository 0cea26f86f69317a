"""Bounded equality saturation: grow the e-graph of a Graph with the rules, a few iterations per egglog call.

One egglog `run` cannot be interrupted, and one iteration of a rule set with associativity and
commutativity can multiply the e-graph many times over. So each call runs `iterations_per_run`
iterations (the back-off scheduler inside the call: egglog resets a scheduler at every `run`), and the
limits are checked between calls. The e-graph is pushed before each call and popped if the call crossed
`node_limit`, so the result never holds more e-nodes than the limit (unless the graph itself does).

Because the scheduler starts afresh at every call, a rule banned in a call's first iteration (more matches
than the match limit) and banned for longer than the call lasts would never run at all. So, unless one is
given, the match limit grows with the e-graph: max(MIN_MATCH_LIMIT, e-nodes) at each call.
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Sequence

from egglog import EGraph, Ruleset, back_off, run, ruleset

from tensorsmith.ir.graph import Graph

from .eclasses import read_eclasses
from .rules import RULES, Rule
from .term import TExpr, analysis, to_egglog

DEFAULT_ITERATIONS = 8
DEFAULT_NODE_LIMIT = 50_000
DEFAULT_TIME_LIMIT_S = 10.0
MIN_MATCH_LIMIT = 1000


@dataclass(frozen=True)
class StageReport:
    """One egglog call: rule iterations run, e-graph size after it, and its wall time.

    A `discarded` stage crossed the node limit and was rolled back; its sizes say how far it got.
    """

    iterations: int
    enodes: int
    eclasses: int
    seconds: float
    discarded: bool = False


@dataclass(frozen=True)
class SaturationReport:
    """Every stage (the first is loading the graph), and why saturation stopped."""

    stages: tuple[StageReport, ...]
    stopped: str  # "saturated", "iterations", "node_limit" or "time_limit"

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


def _stage(egraph: EGraph, roots: dict[str, TExpr], iterations: int, seconds: float) -> StageReport:
    classes = read_eclasses(egraph, roots)
    return StageReport(iterations, classes.num_enodes, len(classes.nodes), seconds)


def saturate(graph: Graph, rules: Sequence[Rule] = RULES, iterations: int = DEFAULT_ITERATIONS,
             node_limit: int = DEFAULT_NODE_LIMIT, time_limit_s: float = DEFAULT_TIME_LIMIT_S,
             iterations_per_run: int = 2, match_limit: int | None = None, ban_length: int = 5) -> Saturated:
    """Load `graph` into an e-graph and apply `rules` until saturated or a limit is reached."""
    start = time.perf_counter()
    egraph, roots = to_egglog(graph)
    egraph.run(analysis.saturate())
    stages = [_stage(egraph, roots, 0, time.perf_counter() - start)]
    rules_run = rule_set(tuple(rules))
    done, stopped = 0, "iterations"
    while done < iterations:
        if time.perf_counter() - start > time_limit_s:
            stopped = "time_limit"
            break
        k = min(iterations_per_run, iterations - done)
        limit = match_limit if match_limit is not None else max(MIN_MATCH_LIMIT, stages[-1].enodes)
        scheduler = back_off(match_limit=limit, ban_length=ban_length)
        began = time.perf_counter()
        egraph.push()
        report = egraph.run((run(rules_run, scheduler=scheduler) + analysis.saturate()) * k)
        stage = _stage(egraph, roots, k, time.perf_counter() - began)
        if stage.enodes > node_limit:
            egraph.pop()
            stages.append(StageReport(k, stage.enodes, stage.eclasses, stage.seconds, discarded=True))
            stopped = "node_limit"
            break
        stages.append(stage)
        done += k
        if not report.updated:
            stopped = "saturated"
            break
    return Saturated(egraph, roots, graph, SaturationReport(tuple(stages), stopped))
