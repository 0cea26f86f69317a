"""Beam search over the decision tree: kernel boundaries first, then one schedule per kernel.

Boundaries: start from the greedy partition, the greedy partition with its matmuls' computed operands
materialised and every value several kernels compute given a buffer of its own, that without the latter, and the
unfused program (the last two only while time is left); each round expands every member of the beam by one move
(materialise one node more or one fewer) and keeps the `width` best, each scored by the rank of its preferred completion
(every kernel at the first of its schedule options: codegen's default where the model predicts nothing much
faster, else the cheapest; `space.rank`). Schedules: each kept boundary set is completed kernel by kernel,
keeping the `width` best partial assignments by their schedules' ranks (`space.ScheduleOptions`), decided
kernels plus the first options of the rest.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

from .space import Boundaries, Candidate, CandidateSpace


ALWAYS_STARTED = 2   # the starts scored even past the deadline: the greedy partition and `computed_once`


@dataclass(frozen=True)
class BeamConfig:
    width: int = 4
    rounds: int = 6
    schedules_per_kernel: int = 3   # branching of each schedule decision
    seed: int = 0                   # ties are broken by structure, so the seed changes nothing yet


def beam(space: CandidateSpace, cfg: BeamConfig, deadline: float = math.inf,
         on_candidate: Callable[[Candidate, float], None] | None = None) -> list[tuple[float, Candidate]]:
    """Full candidates, preferred first (`space.rank`), with their predicted seconds; stops early at `deadline`."""
    frontier = _boundary_beam(space, cfg, deadline)
    finished: dict[Candidate, float] = {}
    for boundaries in frontier:
        for seconds, candidate in _schedule_beam(space, boundaries, cfg):
            if candidate not in finished:
                finished[candidate] = seconds
                if on_candidate:
                    on_candidate(candidate, seconds)
        if time.monotonic() > deadline:
            break
    return sorted(((s, c) for c, s in finished.items()), key=lambda item: (space.rank(item[1]), _order(item[1])))


def _boundary_beam(space: CandidateSpace, cfg: BeamConfig, deadline: float) -> list[Boundaries]:
    scores: dict[Boundaries, float] = {}
    for order, start in enumerate((space.greedy, space.computed_once, space.operands_materialised, space.unfused)):
        if order >= ALWAYS_STARTED and time.monotonic() > deadline:
            break              # a deep model's starts take seconds each to legalise and schedule
        boundaries = start()
        if space.expression_ok(boundaries):
            scores[boundaries] = space.best_rank(boundaries)
    frontier = _top(scores, cfg.width)
    for _ in range(cfg.rounds):
        if time.monotonic() > deadline:
            break
        for boundaries in frontier:
            for child in space.neighbours(boundaries, deadline):
                if child not in scores and space.expression_ok(child):
                    scores[child] = space.best_rank(child)
                if time.monotonic() > deadline:
                    break
        kept = _top(scores, cfg.width)
        if kept == frontier:
            break
        frontier = kept
    return frontier


def _schedule_beam(space: CandidateSpace, boundaries: Boundaries, cfg: BeamConfig) -> list[tuple[float, Candidate]]:
    """Partial assignments ordered by their schedules' ranks (space.ScheduleOptions), returned with their seconds."""
    kernels = len(space.program(boundaries).kernels)
    options = [space.options(boundaries, position) for position in range(kernels)]
    if any(not o.schedules for o in options):
        return []
    bound = [o.ranks[0] for o in options]
    partial: list[tuple[float, float, tuple]] = [(0.0, 0.0, ())]
    for position, option in enumerate(options):
        rest = sum(bound[position + 1:])
        grown = [(ranked + rank, spent + seconds, chosen + (schedule,))
                 for ranked, spent, chosen in partial
                 for schedule, seconds, rank in list(zip(option.schedules, option.seconds,
                                                         option.ranks))[:cfg.schedules_per_kernel]]
        grown.sort(key=lambda item: (item[0] + rest, [str(s) for s in item[2]]))
        partial = grown[:cfg.width]
    return [(spent, Candidate(boundaries, chosen, space.form)) for _, spent, chosen in partial]


def _top(scores: dict[Boundaries, float], width: int) -> list[Boundaries]:
    finite = [(s, sorted(b), b) for b, s in scores.items() if math.isfinite(s)]
    finite.sort(key=lambda item: (item[0], item[1]))
    return [b for _, _, b in finite[:width]]


def _order(candidate: Candidate) -> tuple:
    return sorted(candidate.boundaries), [str(s) for s in candidate.schedules]
