"""Slices sunk toward the inputs: a graph that computes a value whole and then keeps a part of it (a model's logits at
the last position, `logits[:, -1]`) computes only that part, through elementwise ops, views and reductions over other
axes (a matrix product over fewer rows, a norm over fewer rows). Each step computes the same elements, so the graph's
function is unchanged; a node that something else reads too is computed whole and sliced there, never twice."""
from __future__ import annotations

from dataclasses import replace

from .graph import Graph, rebuilt
from .node import Node, squeezed, toposort
from .ops import ELEMENTWISE, REDUCE, Op
from .patterns import match_gather

Bounds = tuple[tuple[int, int], ...]


def slices_sunk(graph: Graph) -> Graph:
    """`graph` with its slices moved below what they slice wherever that computes fewer elements; the same graph
    where none moves."""
    order = toposort(graph.outputs.values())
    readers: dict[int, int] = {}
    for node in order:
        for src in node.srcs:
            readers[id(src)] = readers.get(id(src), 0) + 1
    for node in graph.outputs.values():
        readers[id(node)] = readers.get(id(node), 0) + 1

    def sunk(node: Node, new: dict[int, Node]) -> Node | None:
        source = node.srcs[0] if node.op == Op.SLICE else None
        if source is not None and readers[id(source)] == 1 and _sources_bounds(source, node.arg) is not None:
            return _sunk(source, node.arg, readers, new)
        return None
    return rebuilt(graph, sunk)


def _sunk(node: Node, bounds: Bounds, readers: dict[int, int], new: dict[int, Node]) -> Node:
    """The slice `bounds` of `node` (an original node; `new` holds the rebuilt nodes below it), computed from slices
    of its sources where only this slice reads it."""
    shape = tuple(hi - lo for lo, hi in bounds)
    if shape == node.shape:
        return new[id(node)]
    srcs = _sources_bounds(node, bounds) if readers.get(id(node), 0) <= 1 else None
    if srcs is None:   # read elsewhere too, or nothing below computes fewer elements: sliced here
        return replace(node, op=Op.SLICE, srcs=(new[id(node)],), shape=shape, arg=bounds)
    sliced = tuple(_sunk(src, src_bounds, readers, new) for src, src_bounds in zip(node.srcs, srcs))
    if node.op in (Op.EXPAND, Op.RESHAPE):
        return replace(node, srcs=sliced, shape=shape, arg=shape)
    if node.op in (Op.CONSTANT, Op.IOTA):
        return replace(node, shape=shape)
    return replace(node, srcs=sliced, shape=shape)


def _sources_bounds(node: Node, bounds: Bounds) -> list[Bounds] | None:
    """For each source, the slice of it that `node`'s slice `bounds` is computed from; None where none is smaller."""
    if node.op in ELEMENTWISE:
        return [bounds] * len(node.srcs)    # an elementwise op's sources have its shape
    if node.op == Op.CONSTANT or (node.op == Op.IOTA and bounds[node.arg] == (0, node.shape[node.arg])):
        return []    # every element alike, or an index along an axis the slice keeps whole: the same values
    src = node.srcs[0] if node.srcs else None
    if node.op == Op.EXPAND:                # a broadcast axis (size 1 below) keeps its one element
        return [tuple((0, 1) if size == 1 else bound for size, bound in zip(src.shape, bounds))]
    if node.op == Op.PERMUTE:               # output axis i is the source's axis arg[i]
        below = [(0, size) for size in src.shape]
        for out_axis, src_axis in enumerate(node.arg):
            below[src_axis] = bounds[out_axis]
        return [tuple(below)]
    if node.op == Op.RESHAPE and squeezed(node.shape) == squeezed(src.shape):   # unit axes come or go
        kept = iter(bound for bound, size in zip(bounds, node.shape) if size != 1)
        return [tuple((0, 1) if size == 1 else next(kept) for size in src.shape)]
    if node.op in REDUCE and match_gather(node) is None:   # the reduced axis whole; a lookup stays one, whole
        return [bounds[:node.arg] + ((0, src.shape[node.arg]),) + bounds[node.arg:]]
    return None
