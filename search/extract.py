"""Extraction: the cheapest program in a saturated e-graph, by a simple per-op cost.

Views cost almost nothing (they are free until materialised), elementwise ops one unit, reductions two;
the cost of a term is the sum over its tree (a shared subterm counts once per use). This is the
placeholder for the search proper (beam search and MCTS over the same e-class tables).

Pattern nodes (MatMul, OnlineSoftmax) cost infinity: partition lowers only primitives and views, and every
pattern's e-class also holds the primitive form it was recognised from, so that form is chosen. A graph
whose extraction fails raises `ExtractionError` (rewrites/eclasses.py); there is no fallback to the input
graph, which would hide an unsound rule. (Where saturation itself caught a rule merging two shapes, its report says
"conflict" and its e-graph is already the input graph's.)
"""
from __future__ import annotations

import dataclasses
import math

from tensorsmith.ir.graph import Graph
from tensorsmith.ir.node import Node
from tensorsmith.ir.ops import Op
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
    chosen = from_egglog(saturated.egraph, saturated.roots, saturated.graph, choose=choose_cheapest)
    return carry_locations(saturated.graph, chosen)


REWRITTEN = "(rewritten)"   # marks a node that only a rewrite made, after the line of the code it serves


def carry_locations(original: Graph, chosen: Graph) -> Graph:
    """`chosen` with each node's `where` (the user's file:line) taken from the original node of the same
    structure, so that errors and kernel headers still point at the model. A node that only a rewrite
    made takes the line of the node that consumes it (an output: the original output's line), marked
    REWRITTEN."""
    interned: dict[tuple, int] = {}      # structure -> a small int, so keys stay flat however deep the graph

    def key(node: Node, keys: dict[int, int]) -> int:
        shape = (node.op, repr(node.arg), node.shape, node.dtype, tuple(keys[id(src)] for src in node.srcs))
        return interned.setdefault(shape, len(interned))

    keys: dict[int, int] = {}
    known: dict[int, str] = {}
    for node in original.nodes():
        keys[id(node)] = key(node, keys)
        known.setdefault(keys[id(node)], node.where)
    order = chosen.nodes()
    new_keys: dict[int, int] = {}
    where: dict[int, str] = {}
    for node in order:
        new_keys[id(node)] = key(node, new_keys)
        if new_keys[id(node)] in known:
            where[id(node)] = known[new_keys[id(node)]]
    for name, node in chosen.outputs.items():
        where.setdefault(id(node), f"{original.outputs[name].where.split(' ')[0]} {REWRITTEN}")
    for node in reversed(order):          # consumers come later in `order`: pass their lines down
        for src in node.srcs:
            where.setdefault(id(src), f"{where.get(id(node), '').split(' ')[0]} {REWRITTEN}".strip())
    copies: dict[int, Node] = {}
    for node in order:
        copies[id(node)] = node if node.op == Op.INPUT else dataclasses.replace(
            node, srcs=tuple(copies[id(src)] for src in node.srcs), where=where.get(id(node), REWRITTEN))
    located = Graph(chosen.name)
    located.inputs = dict(chosen.inputs)
    located.outputs = {name: copies[id(node)] for name, node in chosen.outputs.items()}
    return located
