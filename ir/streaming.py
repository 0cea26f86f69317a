"""Which reductions the reference evaluates in chunks, and the index arithmetic that maps a chunk through views.

A reduction over a broadcast (a cumulative sum written as a masked sum over (n, n, d), attention written without
its pattern) computes an array far larger than the graph's inputs and outputs. The interpreter evaluates such a
reduction block by block of its source: each block of the source is computed from the blocks of the values it is
made of (its *cone*: elementwise ops, views, constants and iotas down to the *frontier*, the values evaluated
whole: inputs, other reductions, matrix products), reduced, and written into its place in the output. Blocks are
cut along axes the reduction keeps, so each output element sums the same values in the same order as a whole
evaluation does: the result is the same, bit for bit.

A region is one (start, stop) pair per axis of a node's shape.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

from .node import Node
from .ops import ELEMENTWISE, REDUCE, VIEWS, Op

STREAM_ELEMENTS = 1 << 20   # a reduction whose source has more elements than this is evaluated in blocks of about
                            # this many: 8 MiB per float64 value of its cone, whatever the broadcast's size
CONE_OPS = ELEMENTWISE | VIEWS | frozenset({Op.CONSTANT, Op.IOTA})   # what a block is computed through

Region = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Stream:
    """A reduction evaluated in blocks: the nodes of its cone, and the frontier values its blocks are cut from."""

    reduction: Node
    cone: tuple[Node, ...]
    frontier: tuple[Node, ...]


def full_region(shape: tuple[int, ...]) -> Region:
    return tuple((0, d) for d in shape)


def region_shape(region: Region) -> tuple[int, ...]:
    return tuple(hi - lo for lo, hi in region)


def region_slices(region: Region) -> tuple[slice, ...]:
    return tuple(slice(lo, hi) for lo, hi in region)


def streams(order: list[Node], whole: set[int]) -> dict[int, Stream]:
    """The reductions of `order` (a topological order) to evaluate in blocks, by id; `whole` holds the ids of the
    nodes evaluated whole by other means (matrix products), which a cone stops at."""
    found: dict[int, Stream] = {}
    for node in order:
        if node.op in REDUCE and id(node) not in whole and _streamable(node, whole):
            cone, frontier = _cone(node.srcs[0], whole)
            found[id(node)] = Stream(node, cone, frontier)
    return found


def _streamable(reduction: Node, whole: set[int]) -> bool:
    """Whether blocking pays: the source is computed (not a value held anyway), large, and has an axis to cut."""
    source = reduction.srcs[0]
    return (source.op in CONE_OPS and id(source) not in whole and math.prod(source.shape) > STREAM_ELEMENTS
            and any(d > 1 for axis, d in enumerate(source.shape) if axis != reduction.arg))


def _cone(source: Node, whole: set[int]) -> tuple[tuple[Node, ...], tuple[Node, ...]]:
    cone: dict[int, Node] = {}
    frontier: dict[int, Node] = {}
    stack = [source]
    while stack:
        node = stack.pop()
        if id(node) in cone or id(node) in frontier:
            continue
        if node.op in CONE_OPS and id(node) not in whole:
            cone[id(node)] = node
            stack += node.srcs
        else:
            frontier[id(node)] = node
    return tuple(cone.values()), tuple(frontier.values())


def blocks(stream: Stream) -> Iterator[Region]:
    """Regions of the reduction's source, about STREAM_ELEMENTS each, covering it: the reduced axis whole, the
    outermost kept axes cut first."""
    shape = stream.reduction.srcs[0].shape
    axis = stream.reduction.arg
    step = list(shape)
    for cut in (a for a in range(len(shape)) if a != axis):
        if math.prod(step) <= STREAM_ELEMENTS:
            break
        rest = math.prod(step) // max(step[cut], 1)
        step[cut] = max(1, STREAM_ELEMENTS // max(rest, 1))
    starts = [range(0, d, s) if d else range(1) for d, s in zip(shape, step)]
    for corner in itertools.product(*starts):
        yield tuple((lo, min(lo + s, d)) for lo, s, d in zip(corner, step, shape))


def reduced_region(region: Region, axis: int) -> Region:
    """Where a block of the source lands in the reduction's output: its region without the reduced axis."""
    return region[:axis] + region[axis + 1:]


def view_source_region(node: Node, region: Region) -> Region | None:
    """The region of `node`'s source that `region` of the view `node` reads, or None where a reshape cannot say
    (its block is not a block of the source): then the source is read whole."""
    source = node.srcs[0].shape
    if node.op == Op.PERMUTE:
        inverse = [0] * len(region)
        for out_axis, src_axis in enumerate(node.arg):
            inverse[src_axis] = out_axis
        return tuple(region[inverse[a]] for a in range(len(source)))
    if node.op == Op.EXPAND:
        return tuple((0, 1) if d == 1 and n != 1 else r for d, n, r in zip(source, node.shape, region))
    if node.op == Op.SLICE:
        return tuple((lo + s, lo + e) for (lo, _), (s, e) in zip(node.arg, region))
    if node.op == Op.PAD:
        return tuple(_padded_source(before, d, r)[0] for (before, _), d, r in zip(node.arg, source, region))
    if node.op == Op.RESHAPE:
        return _reshape_source(source, node.shape, region)
    raise AssertionError(f"not a view: {node.op}")


def pad_widths(node: Node, region: Region) -> tuple[tuple[int, int], ...]:
    """The zeros a PAD node's `region` has before and after the part of its source it reads, per axis."""
    return tuple(_padded_source(before, d, r)[1] for (before, _), d, r in zip(node.arg, node.srcs[0].shape, region))


def _padded_source(before: int, length: int, region: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
    start, stop = region
    lo, hi = min(max(start - before, 0), length), min(max(stop - before, 0), length)
    leading = min(max(before + lo - start, 0), stop - start)
    return (lo, hi), (leading, stop - start - leading - (hi - lo))


def _reshape_source(source: tuple[int, ...], shape: tuple[int, ...], region: Region) -> Region | None:
    """A reshape's region mapped group by group (runs of axes whose sizes multiply to the same count on both sides,
    size-1 axes aside), where each group's block is one contiguous run of elements that is also a block of the
    source's group."""
    kept_out = [a for a, d in enumerate(shape) if d != 1]
    kept_src = [a for a, d in enumerate(source) if d != 1]
    out, src = tuple(shape[a] for a in kept_out), tuple(source[a] for a in kept_src)
    within = tuple(region[a] for a in kept_out)
    mapped: dict[int, tuple[int, int]] = {}
    for (o0, o1), (s0, s1) in _groups(out, src):
        interval = _interval(out[o0:o1], within[o0:o1])
        block = None if interval is None else _block(src[s0:s1], *interval)
        if block is None:
            return None
        mapped.update(zip(kept_src[s0:s1], block))
    return tuple(mapped.get(a, (0, 1)) for a in range(len(source)))


def _groups(a: tuple[int, ...], b: tuple[int, ...]) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Runs of axes of `a` and `b` (no size-1 axes, the same element count) whose sizes multiply to the same count."""
    groups = []
    i = j = 0
    while i < len(a):
        i0, j0 = i, j
        pa, pb = a[i], b[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                pa, i = pa * a[i], i + 1
            else:
                pb, j = pb * b[j], j + 1
        groups.append(((i0, i), (j0, j)))
    return groups


def _interval(shape: tuple[int, ...], region: Region) -> tuple[int, int] | None:
    """The row-major interval [first, last + 1) of elements `region` covers, where they are contiguous."""
    first = last = 0
    for d, (lo, hi) in zip(shape, region):
        first, last = first * d + lo, last * d + hi - 1
    if math.prod(region_shape(region)) != last - first + 1:
        return None
    return first, last + 1


def _block(shape: tuple[int, ...], start: int, stop: int) -> list[tuple[int, int]] | None:
    """The region of `shape` whose row-major elements are exactly [start, stop), where there is one."""
    if not shape:
        return []
    if start >= stop:
        return None
    for cut in range(len(shape)):
        inner = math.prod(shape[cut + 1:])
        if start % inner or stop % inner:
            continue
        first, last = start // inner, stop // inner - 1
        if first // shape[cut] != last // shape[cut]:
            continue
        outer, coords = first // shape[cut], []
        for d in reversed(shape[:cut]):
            coords.append((outer % d, outer % d + 1))
            outer //= d
        return [*reversed(coords), (first % shape[cut], last % shape[cut] + 1), *((0, d) for d in shape[cut + 1:])]
    return None
