"""The rewrites a chosen form depends on: the fewest of the rules that fired which still derive it from the graph as
written, in the order they first apply (issue 19: the discovery shown, not every rule that fired).

A set of rules derives a form where saturating the written graph with those rules alone grows an e-graph that holds
the form in the e-classes of its outputs (`eclasses.classes_of` with contractions: the form could be extracted from it; a MatMul
counts as the contraction extraction builds it as). From every rule that fired, rules are dropped while the form stays
derived: first a stage's rules at once (reassociation's, which grow the e-graph most, then the algebra's), then
halves, quarters, down to one rule at a time (delta debugging; fewer rules derive less, so a rule whose
dropping once lost the form is needed by every smaller set, and each rule left is needed). What is left is ordered
by a replay: the written graph saturated with those rules alone, one iteration a call, each rule where it first
matched. Each trial is one bounded saturation and all of them share `SECONDS`; a search cut short says so, and its
rules may then include some that are not needed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal, Sequence

from tensorsmith.ir.graph import Graph

from .eclasses import classes_of, read_eclasses
from .rules import RULES, Rule
from .saturate import saturate

STAGES_FIRST_DROPPED = ("reassociate", "algebra")   # tried first: the stages that grow the e-graph most
SECONDS = 2.0   # the most a derivation's trials take together (one saturation may run past it: it is not interrupted)
Stopped = Literal["minimal", "time_limit", "not_derived"]


@dataclass(frozen=True)
class Derivation:
    """The rules a form depends on, in the order they apply from the graph as written, and how their search ended:
    "minimal" (dropping any one of them loses the form), "time_limit" (cut short: some may not be needed) or
    "not_derived" (the rules that fired do not derive the form again within the limits; `rules` is then empty)."""

    rules: tuple[str, ...]
    stopped: Stopped
    trials: int         # saturations run, the replay included
    seconds: float


def derivation(written: Graph, chosen: Graph, fired: Sequence[str], seconds: float = SECONDS) -> Derivation:
    """The fewest of the `fired` rules (by name) that derive `chosen` from `written`, ordered as they apply."""
    began = time.perf_counter()
    end = began + seconds
    kept = [rule for rule in RULES if rule.name in set(fired)]
    trials = 1

    def done(rules: Sequence[Rule], stopped: Stopped) -> Derivation:
        return Derivation(tuple(rule.name for rule in rules), stopped, trials, time.perf_counter() - began)

    def still_derives(fewer: list[Rule]) -> bool | None:
        """Whether `fewer` still derive the form (None: no time left to tell)."""
        nonlocal trials
        if time.perf_counter() >= end:
            return None
        trials += 1
        return _derives(written, chosen, fewer, end)

    first = _derives(written, chosen, kept, end)
    if first is None:
        return done(kept, "time_limit")
    if not first:
        return done((), "not_derived")
    for stage in STAGES_FIRST_DROPPED:   # a stage's rules at once: without reassociation, every later trial is cheap
        fewer = [rule for rule in kept if rule.stage != stage]
        derives = still_derives(fewer) if len(fewer) < len(kept) else False
        if derives is None:
            return done(kept, "time_limit")
        if derives:
            kept = fewer
    size = max(len(kept) // 2, 1)
    while size >= 1:
        start = 0
        while start < len(kept):
            fewer = kept[:start] + kept[start + size:]
            derives = still_derives(fewer)
            if derives is None:
                return done(kept, "time_limit")
            if derives:
                kept = fewer
            else:
                start += size
        size //= 2
    if time.perf_counter() >= end:
        return done(kept, "minimal")   # each is needed; in the rules' own order (their stages')
    trials += 1
    return done(_replayed(written, kept, end), "minimal")


def _derives(written: Graph, chosen: Graph, rules: Sequence[Rule], end: float) -> bool | None:
    """Whether `rules`, saturating `written`, grow an e-graph that holds `chosen` in the e-classes of its outputs
    (None: the saturation was cut short by the time left; one that stopped on a conflict derives nothing)."""
    saturated = saturate(written, rules, time_limit_s=max(end - time.perf_counter(), 0.0))
    if saturated.report.stopped == "time_limit":
        return None
    if saturated.report.stopped == "conflict":
        return False
    classes = read_eclasses(saturated.egraph, saturated.roots)
    held = classes_of(classes, chosen.nodes(), contractions=True)
    return all(held.get(id(node)) == classes.roots[name] for name, node in chosen.outputs.items())


def _replayed(written: Graph, rules: Sequence[Rule], end: float) -> list[Rule]:
    """`rules` in the order they first match as the written graph is saturated with them alone, one iteration a call
    (any that did not match, the replay cut short, after, in their own order)."""
    fired = saturate(written, rules, iterations_per_run=1,
                     time_limit_s=max(end - time.perf_counter(), 0.0)).report.first_fired
    place = {name: k for k, name in enumerate(fired)}
    return sorted(rules, key=lambda rule: place.get(rule.name, len(place)))


def chain_text(rules: Sequence[str], stopped: str, seconds: float) -> str:
    """A derivation as one line for people: its rules in order, and how their search ended where that is not plain."""
    if stopped == "not_derived":
        return "not found (the rules that fired did not derive the form again within the limits)"
    chain = " -> ".join(rules) if rules else "none (the form is the graph as written, tidied)"
    if stopped == "time_limit":
        chain += f" (cut short after {seconds:.1f} s: some of these may not be needed)"
    return chain
