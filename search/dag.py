"""Choices of e-nodes priced as the DAG they build: each e-class used once, its cost counted once.

A tree cost (rewrites/eclasses.py's `cheapest`) counts a subterm once per use, so of two forms of a program the one
that shares a product between two consumers can lose to one that computes two smaller products apart, although it
does less work when the shared product is computed once, as a program does. `DagPrice` prices a whole choice the way
a program runs it: each chosen e-class's arithmetic once, its output written once (a computed term, not a view or a
leaf) and read once by each consumer (through views, the bytes of what is stored, not of the view). `dag_cheapest`
improves a start choice by that price, and `sample` draws other choices, weighted by their price, as further roots of
the search. Everything here is deterministic: e-classes are visited in id order and a sample depends on its seed.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from tensorsmith.ir.dtypes import DType
from tensorsmith.ir.targets import Target
from tensorsmith.rewrites.eclasses import EClasses, ENode, enode_classes
from tensorsmith.rewrites.term import LEAVES, VIEWS

Choice = dict[int, ENode]
MAX_PASSES = 4          # of single-choice improvement over the reachable e-classes (each pass is a full sweep)
IMPROVEMENT = 1e-9      # relative: a choice is kept only where the DAG's price falls by more than this


@dataclass
class DagPrice:
    """The seconds a choice's program costs: per e-class it uses, `arithmetic` of its e-node, plus the bytes of its
    output written (computed terms only) and read by each consumer, at the target's memory bandwidth."""

    classes: EClasses
    arithmetic: Callable[[ENode], float]
    target: Target
    evaluations: int = 0
    _bytes: dict[int, int] = field(default_factory=dict)

    def nbytes(self, c: int) -> int:
        """The bytes of e-class c's value (its shape and dtype by the analysis; 0 where the analysis has none)."""
        if c not in self._bytes:
            dtype = self.classes.dtypes.get(c)
            size = DType(dtype).itemsize if dtype else 0
            self._bytes[c] = math.prod(self.classes.shapes.get(c, ())) * size
        return self._bytes[c]

    def written_seconds(self, c: int, enode: ENode) -> float:
        """What e-class c's chosen e-node costs itself, reads left out: its arithmetic and its output written (a view
        or a leaf writes nothing). The tree price a start choice is extracted by."""
        writes = 0 if enode.op in LEAVES or enode.op in VIEWS else self.nbytes(c)
        return self.arithmetic(enode) + writes / self.target.hbm_bytes_per_s

    def seconds(self, choice: Mapping[int, ENode]) -> float:
        """The DAG price of `choice` from the roots (inf where it is cyclic or leaves a used e-class unchosen)."""
        self.evaluations += 1
        order = reachable(self.classes, choice)
        if order is None:
            return math.inf
        stored: dict[int, float] = {}
        total = 0.0
        for c in reversed(order):          # children before parents
            enode = choice[c]
            if enode.op in VIEWS:          # a view stores nothing of its own: reading it reads its source (or less)
                stored[c] = min(self.nbytes(c), stored[enode.children[0]])
            elif enode.op in LEAVES:
                stored[c] = self.nbytes(c) if enode.op == "Input" else 0   # constants and iotas live in the kernel
            else:
                stored[c] = self.nbytes(c)
            reads = sum(stored[k] for k in enode.children)
            total += self.written_seconds(c, enode) + reads / self.target.hbm_bytes_per_s
        return total


def reachable(classes: EClasses, choice: Mapping[int, ENode]) -> list[int] | None:
    """The e-classes the choice uses, each once, every e-class before its children (a topological order from the
    roots); None where the choice is cyclic or an e-class it uses has no e-node chosen."""
    state: dict[int, int] = {}        # 1: on the path, 2: done
    post: list[int] = []
    for root in classes.roots.values():
        stack: list[tuple[int, bool]] = [(root, False)]
        while stack:
            c, leaving = stack.pop()
            if leaving:
                state[c] = 2
                post.append(c)
                continue
            if state.get(c) == 2:
                continue
            if state.get(c) == 1 or c not in choice:
                return None
            state[c] = 1
            stack.append((c, True))
            stack.extend((k, False) for k in choice[c].children if state.get(k) != 2)
    return post[::-1]


def _parents(classes: EClasses) -> dict[int, list[tuple[int, ENode]]]:
    """For each e-class, the (e-class, e-node) pairs whose e-node reads it, in id order."""
    found: dict[int, list[tuple[int, ENode]]] = {c: [] for c in classes.nodes}
    for c in sorted(classes.nodes):
        for enode in classes.nodes[c]:
            for child in dict.fromkeys(enode.children):
                found[child].append((c, enode))
    return found


def _same_work(a: ENode, b: ENode) -> bool:
    """Whether two e-nodes are one operation on the same operands in another order (a * b, b * a): the same price."""
    return a.op == b.op and a.lits == b.lits and sorted(a.children) == sorted(b.children)


def dag_cheapest(classes: EClasses, starts: list[Choice], price: DagPrice, deadline: float = math.inf) -> Choice:
    """The choice of least DAG price found by local search from each start (the cheapest is kept; the first on ties).

    A move sets one e-class's e-node; where that brings in e-classes the program did not use, the e-classes it uses
    that could read one of them try to as well, one by one (a product shared by two consumers pays only once both
    read it, so one consumer alone never would). A move is kept where the price falls. The sweeps stop after
    MAX_PASSES or at `deadline`."""
    parents = _parents(classes)
    best: Choice | None = None
    best_seconds = math.inf
    for start in starts:
        choice = dict(start)
        seconds = price.seconds(choice)
        for _ in range(MAX_PASSES):
            seconds, improved = _sweep(classes, choice, seconds, price, parents, deadline)
            if not improved or time.monotonic() > deadline:
                break
        if seconds < best_seconds:
            best, best_seconds = choice, seconds
    return best if best is not None else dict(starts[0])


def _sweep(classes: EClasses, choice: Choice, seconds: float, price: DagPrice,
           parents: Mapping[int, list[tuple[int, ENode]]], deadline: float) -> tuple[float, bool]:
    """One pass of moves over the e-classes `choice` uses (changed in place); its new price and whether it fell."""
    improved = False
    used = set(reachable(classes, choice) or ())
    for c in sorted(used):
        if c not in used:
            continue
        for enode in classes.nodes[c]:
            if time.monotonic() > deadline:
                return seconds, improved
            old = choice[c]
            if _same_work(enode, old) or not all(child in choice for child in enode.children):
                continue
            changed = {c: old}
            choice[c] = enode
            trial = price.seconds(choice)
            after = reachable(classes, choice)
            if after is not None:
                trial = _adopt(classes, choice, trial, set(after) - set(used), set(after), price, parents, changed)
            if trial < seconds * (1 - IMPROVEMENT):
                seconds, improved, used = trial, True, set(reachable(classes, choice) or ())
                if c not in used:
                    break
            else:
                choice.update(changed)   # undo every part of the move
    return seconds, improved


def _adopt(classes: EClasses, choice: Choice, seconds: float, brought: set[int], used: set[int], price: DagPrice,
           parents: Mapping[int, list[tuple[int, ENode]]], changed: dict[int, ENode]) -> float:
    """After a move brought e-classes into the program, each used e-class with an e-node that reads one of them
    switches to it where the price falls (recorded in `changed` for undoing); the price after."""
    for new in sorted(brought):
        for d, enode in parents[new]:
            if d not in used or choice.get(d) == enode or not all(k in choice for k in enode.children):
                continue
            changed.setdefault(d, choice[d])
            old, choice[d] = choice[d], enode
            trial = price.seconds(choice)
            if trial < seconds:
                seconds = trial
            else:
                choice[d] = old
    return seconds


SAMPLE_TEMPERATURE = 0.5   # a choice's weight is (cheapest / its price) ** (1 / T): lower T keeps closer to the best


def sample(classes: EClasses, base: Choice, price: DagPrice, rng: random.Random, free: Callable[[ENode, ENode], bool],
           tree: Mapping[int, float]) -> Choice:
    """A choice drawn from the roots down: in each e-class the program reaches where `free(base e-node, other)`
    allows another choice, an e-node drawn with weight (cheapest / its tree price) ** (1 / SAMPLE_TEMPERATURE), its
    tree price its own cost plus its children's `tree` prices; elsewhere `base`'s. Deterministic for `rng`'s seed."""
    choice = dict(base)
    seen: set[int] = set()
    stack = sorted(classes.roots.values(), reverse=True)
    while stack:
        c = stack.pop()
        if c in seen or c not in choice:
            continue
        seen.add(c)
        options = [enode for enode in classes.nodes[c]
                   if enode == base[c] or (free(base[c], enode) and all(k in tree for k in enode.children))]
        if len(options) > 1:
            prices = [price.written_seconds(c, e) + sum(tree[k] for k in e.children) for e in options]
            floor = min(prices)
            weights = [(floor / p) ** (1 / SAMPLE_TEMPERATURE) if p > 0 and math.isfinite(p) else 0.0
                       for p in prices]
            if floor > 0 and sum(weights) > 0:
                choice[c] = rng.choices(options, weights)[0]
        stack.extend(sorted(choice[c].children, reverse=True))
    return choice


def tree_prices(classes: EClasses, choice: Mapping[int, ENode], price: DagPrice) -> dict[int, float]:
    """The tree price (each use counted) of every e-class's chosen term, by `price.written_seconds` (cyclic ones
    left out)."""
    totals: dict[int, float] = {}
    for c in choice:
        stack, on_path = [c], set()
        while stack:
            top = stack[-1]
            if top in totals:
                stack.pop()
                continue
            on_path.add(top)
            pending = [k for k in choice[top].children if k not in totals and k in choice]
            if any(k in on_path for k in pending) or not all(k in choice for k in choice[top].children):
                break
            if pending:
                stack.extend(pending)
                continue
            totals[top] = price.written_seconds(top, choice[top]) + sum(totals[k] for k in choice[top].children)
            on_path.discard(top)
            stack.pop()
    return totals
