"""Tensors with a size-0 axis: what a graph computes from them, folded to constants before the compile.

A tensor of no elements needs no kernel. Only two ops make elements out of none: a sum over an empty axis (every
element 0, as in NumPy and PyTorch; a mean divides that by 0 after it, giving NaN) and a pad of an empty tensor
(every element the fill, 0). Every other op of an empty operand is empty itself (broadcasting and expanding grow
only unit axes; a max over an empty axis is refused when the graph is built). So once those two are constants, an
empty value is read by nothing but empty values and the outputs: the compile gives such outputs buffers and no
kernel, and computes the rest as usual.
"""
from __future__ import annotations

from dataclasses import replace

from . import primitives as P
from .graph import Graph, rebuilt
from .node import Node
from .ops import Op

FILLS = {Op.SUM: 0, Op.PAD: 0}   # the value of every element each op makes out of an empty operand


def is_empty(node: Node) -> bool:
    """Whether `node` has no elements: some axis of size 0."""
    return 0 in node.shape


def empties_folded(graph: Graph) -> Graph:
    """`graph` with each non-empty value computed from an empty one replaced by the constant it equals; the same
    graph where there is none."""
    return rebuilt(graph, _fill)


def _fill(node: Node, new: dict[int, Node]) -> Node | None:
    """The constant a value with elements computed from an empty operand equals; None for any other value."""
    if is_empty(node) or not any(is_empty(src) for src in node.srcs):
        return None
    if node.op not in FILLS:
        raise AssertionError(f"{node} has elements but an empty operand; only {sorted(map(str, FILLS))} can")
    return replace(P.constant(FILLS[node.op], node.shape, node.dtype), where=node.where, api=node.api)
