"""What a rewrite rule is: its egglog rewrites, its proof obligations, the model they are proved in, the
saturation stage it runs in, and an example graph for the random numeric check."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from egglog import RewriteOrRule

from tensorsmith.ir.graph import Graph
from tensorsmith.ir.node import Node
from tensorsmith.ir.tensor import Tensor

from .eclasses import EClasses
from .proofs import Claim
from .term import TExpr

Model = Literal["ieee", "real", "index"]
Stage = Literal["algebra", "reassociate", "patterns", "contractions"]
Derive = Callable[[EClasses], list[tuple[TExpr, TExpr]]]


@dataclass(frozen=True, eq=False)
class Rule:
    """A named rewrite with the claims that make it sound and an example graph that exercises it.

    `model` says how its claims are proved (rewrites/proofs.py): "ieee" (every float value, specials included),
    "real" (real arithmetic; deviates from the reference only by rounding and overflow) or "index" (views, as
    integer index maps). A rule over reductions is proved at every length (a claim with `lengths`, by induction)
    or says why its proof stays at fixed lengths (`bounded_because`). `stage` is the saturation stage it runs in
    (rewrites/saturate.py). A rule that egglog cannot state (it computes a float, as constant folding does) has no
    rewrites and a `derive` pass instead: given the e-graph's tables it returns pairs of literal terms to merge.
    """

    name: str
    doc: str
    rewrite: RewriteOrRule | tuple[RewriteOrRule, ...]
    claims: tuple[Claim, ...]
    example: Callable[[], Graph]
    model: Model = "ieee"
    stage: Stage = "algebra"
    derive: Derive | None = None
    bounded_because: str = ""   # for a rule over reductions proved at fixed lengths only: why not at every length

    @property
    def rewrites(self) -> tuple[RewriteOrRule, ...]:
        """Its egglog rewrites (rank-specialised rules have one per rank)."""
        return self.rewrite if isinstance(self.rewrite, tuple) else (self.rewrite,)


def tensor_example(name: str, build: Callable[[Graph], Tensor]) -> Callable[[], Graph]:
    """An example built with the Tensor API: a graph named `name` whose single output "out" is build(graph)."""
    def make() -> Graph:
        g = Graph(name)
        g.outputs["out"] = build(g).node
        return g
    return make


def example_graph(name: str, out: Callable[..., Node], shape: tuple[int, ...] = (3, 4), dtype: str = "float32",
                  inputs: int = 1) -> Graph:
    """A graph with inputs x (and y, z) of one shape and the single output out(x[, y[, z]])."""
    g = Graph(name)
    nodes = [g.input(n, shape, dtype).node for n in ("x", "y", "z")[:inputs]]
    g.outputs["out"] = out(*nodes)
    return g
