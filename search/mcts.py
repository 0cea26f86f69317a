"""Monte-Carlo tree search over the same decision tree, rewarded by measured time where a GPU is present.

Level 1 chooses a program form (one of the equivalent graphs extraction gave, search/extract.py: an e-class
choice) together with its kernel boundaries (among the pairs it is given, typically each form's beam frontier and
the neighbours of the best); level i+1 chooses the schedule of kernel i among its `schedules_per_kernel` cheapest
feasible ones. Selection is UCT; a rollout completes the remaining schedules at random (seeded); the reward of a
full candidate is t_ref / t, where t is what `evaluate` returns (measured seconds, or the cost model's)
and t_ref the first time seen, so rewards near 1 or above mean "as good as the first candidate or better".
`evaluate` may return None to reject a candidate (it failed verification): reward 0.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .space import Boundaries, Candidate, CandidateSpace

Root = tuple[int, Boundaries]   # a form (an index into the spaces) and boundaries of its graph


@dataclass(frozen=True)
class MCTSConfig:
    iterations: int = 64
    exploration: float = 0.7
    schedules_per_kernel: int = 3
    seed: int = 0


@dataclass
class _TreeNode:
    boundaries: Boundaries | None
    form: int = 0
    chosen: tuple = ()
    children: list["_TreeNode"] = field(default_factory=list)
    untried: list = field(default_factory=list)
    visits: int = 0
    reward: float = 0.0
    expanded: bool = False


def mcts(spaces: Sequence[CandidateSpace], roots: list[Root], evaluate: Callable[[Candidate], float | None],
         cfg: MCTSConfig, deadline: float = math.inf) -> dict[Candidate, float | None]:
    """Every full candidate it evaluated, with its time (None where `evaluate` rejected it)."""
    rng = random.Random(cfg.seed)
    root = _TreeNode(None, untried=list(roots), expanded=True)
    seen: dict[Candidate, float | None] = {}
    reference: list[float] = []
    for _ in range(cfg.iterations):
        if time.monotonic() > deadline or (not root.untried and not root.children):
            break
        path = [root]
        node = root
        while True:   # select down the tree, expanding the first node with an untried move
            _expand(spaces, node, cfg)
            if node.untried:
                move = node.untried.pop(0)
                child = _child(node, move)
                node.children.append(child)
                path.append(child)
                node = child
                break
            if not node.children:
                break
            node = max(node.children, key=lambda c: _uct(c, node.visits, cfg.exploration))
            path.append(node)
        candidate = _rollout(spaces, node, cfg, rng)
        if candidate is None:
            reward = 0.0
        else:
            if candidate not in seen:
                seen[candidate] = evaluate(candidate)
            seconds = seen[candidate]
            if seconds is not None and math.isfinite(seconds) and not reference:
                reference.append(seconds)
            reward = reference[0] / seconds if seconds and reference and math.isfinite(seconds) else 0.0
        for visited in path:
            visited.visits += 1
            visited.reward += reward
    return seen


def _child(parent: _TreeNode, move) -> _TreeNode:
    if parent.boundaries is None:
        form, boundaries = move
        return _TreeNode(boundaries, form)
    return _TreeNode(parent.boundaries, parent.form, parent.chosen + (move,))


def _expand(spaces: Sequence[CandidateSpace], node: _TreeNode, cfg: MCTSConfig) -> None:
    if node.expanded or node.boundaries is None:
        return
    node.expanded = True
    space = spaces[node.form]
    kernels = len(space.program(node.boundaries).kernels)
    if len(node.chosen) < kernels:
        node.untried = list(space.options(node.boundaries, len(node.chosen)).schedules[:cfg.schedules_per_kernel])


def _uct(child: _TreeNode, parent_visits: int, exploration: float) -> float:
    if child.visits == 0:
        return math.inf
    return child.reward / child.visits + exploration * math.sqrt(math.log(max(1, parent_visits)) / child.visits)


def _rollout(spaces: Sequence[CandidateSpace], node: _TreeNode, cfg: MCTSConfig,
             rng: random.Random) -> Candidate | None:
    if node.boundaries is None:
        return None
    space = spaces[node.form]
    kernels = len(space.program(node.boundaries).kernels)
    chosen = list(node.chosen)
    for position in range(len(chosen), kernels):
        options = space.options(node.boundaries, position).schedules[:cfg.schedules_per_kernel]
        if not options:
            return None
        chosen.append(options[rng.randrange(len(options))])
    return Candidate(node.boundaries, tuple(chosen), node.form)
