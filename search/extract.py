"""Extraction: the cheapest program in a saturated e-graph, by a simple per-op cost.

Views cost almost nothing (they are free until materialised), elementwise ops one unit, reductions two;
the cost of a term is the sum over its tree (a shared subterm counts once per use). This is the
placeholder for the search proper (beam search and MCTS over the same e-class tables).

Pattern nodes (MatMul, OnlineSoftmax) cost infinity: partition lowers only primitives and views, and every
pattern's e-class also holds the primitive form it was recognised from, so that form is chosen. A graph
whose extraction fails raises `ExtractionError` (rewrites/eclasses.py); there is no fallback to the input
graph, which would hide an unsound rule.
"""
from __future__ import annotations

import math

from tensorsmith.ir.graph import Graph
from tensorsmith.rewrites.eclasses import EClasses, ENode, cheapest
from tensorsmith.rewrites.saturate import Saturated
from tensorsmith.rewrites.term import from_egglog

VIEW, ELEMENTWISE, REDUCTION, LEAF = 0.1, 1.0, 2.0, 0.1
OP_COSTS: dict[str, float] = {
    "Input": LEAF, "Const": LEAF, "Iota": LEAF,
    "Reshape": VIEW, "Permute": VIEW, "Expand": VIEW, "Slice": VIEW, "Pad": VIEW,
    "Sum": REDUCTION, "Max": REDUCTION,
    "Exp2": ELEMENTWISE, "Log2": ELEMENTWISE, "Sin": ELEMENTWISE, "Sqrt": ELEMENTWISE, "Recip": ELEMENTWISE,
    "Add": ELEMENTWISE, "Mul": ELEMENTWISE, "Mod": ELEMENTWISE, "LessThan": ELEMENTWISE,
    "Cast": ELEMENTWISE, "Contiguous": ELEMENTWISE,
    "MatMul": math.inf, "OnlineSoftmax": math.inf,   # no primitive Node yet: never chosen
}


def op_cost(enode: ENode) -> float:
    """The cost of one e-node by its constructor."""
    return OP_COSTS[enode.op]


def choose_cheapest(classes: EClasses) -> dict[int, ENode]:
    """The e-node of least total `op_cost` in each e-class."""
    return cheapest(classes, op_cost)


def extract(saturated: Saturated) -> Graph:
    """The cheapest program of the saturated e-graph, as a new Graph with the original's inputs and outputs."""
    return from_egglog(saturated.egraph, saturated.roots, saturated.graph, choose=choose_cheapest)
