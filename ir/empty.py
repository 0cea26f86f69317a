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
from .graph import Graph
from .node import Node, toposort
from .ops import Op

FILLS = {Op.SUM: 0, Op.PAD: 0}   # the value of every element each op makes out of an empty operand


def is_empty(node: Node) -> bool:
    """Whether `node` has no elements: some axis of size 0."""
    return 0 in node.shape


def empties_folded(graph: Graph) -> Graph:
    """`graph` with each non-empty value computed from an empty one replaced by the constant it equals; the same
    graph where there is none."""
    new: dict[int, Node] = {}
    for node in toposort(graph.outputs.values()):
        if not is_empty(node) and any(is_empty(src) for src in node.srcs):
            if node.op not in FILLS:
                raise AssertionError(f"{node} has elements but an empty operand; only {sorted(map(str, FILLS))} can")
            fill = P.constant(FILLS[node.op], node.shape, node.dtype)
            new[id(node)] = replace(fill, where=node.where, api=node.api)
        elif any(new[id(src)] is not src for src in node.srcs):
            new[id(node)] = replace(node, srcs=tuple(new[id(src)] for src in node.srcs))
        else:
            new[id(node)] = node
    if all(new[id(node)] is node for node in graph.outputs.values()):
        return graph
    folded = Graph(graph.name)
    folded.inputs.update(graph.inputs)
    folded.outputs.update((name, new[id(node)]) for name, node in graph.outputs.items())
    return folded
