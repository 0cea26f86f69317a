"""Constructors for every primitive and view: each infers the result's shape and dtype or raises.

These are the only places that create Nodes, so every graph is checked as it is built.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Sequence

from .dtypes import DType, as_dtype
from .errors import DTypeError, ShapeError, user_call, user_location
from .node import Node
from .ops import BINARY, REDUCE, UNARY, Op

Shape = tuple[int, ...]


def _shapes(*nodes: Node) -> str:
    return ", ".join(f"{n.shape} {n.dtype}" for n in nodes)


def _shape_error(op: Op, nodes: Sequence[Node], problem: str) -> ShapeError:
    return ShapeError(f"{op}: {problem} (operands: {_shapes(*nodes)}) at {user_location()}")


def _dtype_error(op: Op, nodes: Sequence[Node], problem: str) -> DTypeError:
    return DTypeError(f"{op}: {problem} (operands: {_shapes(*nodes)}) at {user_location()}")


def _node(op: Op, srcs: tuple[Node, ...], shape: Shape, dtype: DType, arg: object = None) -> Node:
    return Node(op, srcs, tuple(int(d) for d in shape), dtype, arg, *user_call())


def check_shape(shape: Sequence[int], what: str) -> Shape:
    """A static shape: a tuple of non-negative ints."""
    try:
        dims = tuple(int(d) for d in shape)
    except (TypeError, ValueError):  # not a sequence, or int("a") of a string
        raise ShapeError(f"{what}: shape must be a sequence of ints, got {shape!r} at {user_location()}") from None
    if any(d < 0 for d in dims) or any(int(d) != d for d in shape):
        raise ShapeError(f"{what}: shape must hold non-negative ints, got {tuple(shape)} at {user_location()}")
    return dims


def normalize_axis(axis: int, ndim: int, op: Op | str, nodes: Sequence[Node] = ()) -> int:
    """A Python-style axis (negative counts from the end) as a non-negative index."""
    if isinstance(axis, numbers.Integral):
        axis = int(axis)  # numpy integers too, e.g. from np.argmax or a shape
    if not isinstance(axis, int) or not -ndim <= axis < max(ndim, 0) or ndim == 0:
        raise ShapeError(f"{op}: axis {axis!r} is out of range for rank {ndim}"
                         f" (operands: {_shapes(*nodes)}) at {user_location()}")
    return axis % ndim


# leaves ------------------------------------------------------------------------------------------

def input_(name: str, shape: Sequence[int], dtype: DType | str) -> Node:
    return _node(Op.INPUT, (), check_shape(shape, f"input {name!r}"), as_dtype(dtype), name)


def constant(value: float | int | bool, shape: Sequence[int], dtype: DType | str) -> Node:
    dtype = as_dtype(dtype)
    if dtype == DType.BOOL:
        value = bool(value)
    elif dtype == DType.INT32:
        if float(value) != int(value):
            raise DTypeError(f"constant: {value!r} is not an integer, so it cannot be int32 at {user_location()}")
        value = int(value)
    else:
        value = float(value)
    return _node(Op.CONSTANT, (), check_shape(shape, "constant"), dtype, value)


def iota(shape: Sequence[int], axis: int) -> Node:
    dims = check_shape(shape, "iota")
    return _node(Op.IOTA, (), dims, DType.INT32, normalize_axis(axis, len(dims), Op.IOTA))


# compute -----------------------------------------------------------------------------------------

def unary(op: Op, x: Node) -> Node:
    assert op in UNARY
    if not x.dtype.is_float:
        raise _dtype_error(op, [x], f"needs a float operand; cast {x.dtype} first")
    return _node(op, (x,), x.shape, x.dtype)


def binary(op: Op, a: Node, b: Node) -> Node:
    assert op in BINARY
    if a.shape != b.shape:
        raise _shape_error(op, [a, b], "operands must have one shape (broadcast with expand first)")
    if a.dtype != b.dtype:
        raise _dtype_error(op, [a, b], "operands must have one dtype (cast first)")
    if op != Op.LESS_THAN and a.dtype == DType.BOOL:
        raise _dtype_error(op, [a, b], "arithmetic on bool; cast to a number first")
    dtype = DType.BOOL if op == Op.LESS_THAN else a.dtype
    return _node(op, (a, b), a.shape, dtype)


def reduce(op: Op, x: Node, axis: int) -> Node:
    assert op in REDUCE
    axis = normalize_axis(axis, x.ndim, op, [x])
    if x.dtype == DType.BOOL:
        raise _dtype_error(op, [x], "cannot reduce bool; cast to a number first")
    if op == Op.MAX and x.shape[axis] == 0:
        raise _shape_error(op, [x], f"max over empty axis {axis}")
    return _node(op, (x,), x.shape[:axis] + x.shape[axis + 1:], x.dtype, axis)


def cast(x: Node, dtype: DType | str) -> Node:
    dtype = as_dtype(dtype)
    if dtype == x.dtype:
        return x
    return _node(Op.CAST, (x,), x.shape, dtype)


# views -------------------------------------------------------------------------------------------

def reshape(x: Node, shape: Sequence[int]) -> Node:
    dims = list(shape)
    if dims.count(-1) > 1:
        raise _shape_error(Op.RESHAPE, [x], f"at most one -1 in {tuple(shape)}")
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        if known == 0 or x.size % known:
            raise _shape_error(Op.RESHAPE, [x], f"cannot infer -1 in {tuple(shape)}")
        dims[dims.index(-1)] = x.size // known
    new = check_shape(dims, str(Op.RESHAPE))
    if math.prod(new) != x.size:
        raise _shape_error(Op.RESHAPE, [x], f"cannot reshape {x.size} elements to {new}")
    if new == x.shape:
        return x
    return _node(Op.RESHAPE, (x,), new, x.dtype, new)


def permute(x: Node, axes: Sequence[int]) -> Node:
    order = tuple(normalize_axis(a, x.ndim, Op.PERMUTE, [x]) for a in axes)
    if sorted(order) != list(range(x.ndim)):
        raise _shape_error(Op.PERMUTE, [x], f"{tuple(axes)} is not a permutation of {x.ndim} axes")
    if order == tuple(range(x.ndim)):
        return x
    return _node(Op.PERMUTE, (x,), tuple(x.shape[a] for a in order), x.dtype, order)


def expand(x: Node, shape: Sequence[int]) -> Node:
    new = check_shape(shape, str(Op.EXPAND))
    if len(new) != x.ndim or any(old != n and old != 1 for old, n in zip(x.shape, new)):
        raise _shape_error(Op.EXPAND, [x], f"cannot expand to {new}: only size-1 axes may grow, rank kept")
    if new == x.shape:
        return x
    return _node(Op.EXPAND, (x,), new, x.dtype, new)


def slice_(x: Node, bounds: Sequence[tuple[int, int]]) -> Node:
    bounds = tuple((int(lo), int(hi)) for lo, hi in bounds)
    if len(bounds) != x.ndim or any(not 0 <= lo <= hi <= d for (lo, hi), d in zip(bounds, x.shape)):
        raise _shape_error(Op.SLICE, [x], f"bounds {bounds} do not fit")
    if all(lo == 0 and hi == d for (lo, hi), d in zip(bounds, x.shape)):
        return x
    return _node(Op.SLICE, (x,), tuple(hi - lo for lo, hi in bounds), x.dtype, bounds)


def pad(x: Node, widths: Sequence[tuple[int, int]]) -> Node:
    widths = tuple((int(lo), int(hi)) for lo, hi in widths)
    if len(widths) != x.ndim or any(lo < 0 or hi < 0 for lo, hi in widths):
        raise _shape_error(Op.PAD, [x], f"widths {widths} must be one non-negative pair per axis")
    if all(lo == 0 and hi == 0 for lo, hi in widths):
        return x
    return _node(Op.PAD, (x,), tuple(d + lo + hi for d, (lo, hi) in zip(x.shape, widths)), x.dtype, widths)


def contiguous(x: Node) -> Node:
    return _node(Op.CONTIGUOUS, (x,), x.shape, x.dtype)


def rebuild(node: Node, srcs: Sequence[Node]) -> Node:
    """The same op as `node` applied to new sources (shapes and dtypes re-inferred and re-checked)."""
    op, arg = node.op, node.arg
    if op == Op.INPUT:
        return input_(arg, node.shape, node.dtype)
    if op == Op.CONSTANT:
        return constant(arg, node.shape, node.dtype)
    if op == Op.IOTA:
        return iota(node.shape, arg)
    if op in UNARY:
        return unary(op, *srcs)
    if op in BINARY:
        return binary(op, *srcs)
    if op in REDUCE:
        return reduce(op, srcs[0], arg)
    if op == Op.CAST:
        return cast(srcs[0], node.dtype)
    if op == Op.CONTIGUOUS:
        return contiguous(srcs[0])
    views: dict[Op, Callable[[Node, Any], Node]] = {Op.RESHAPE: reshape, Op.PERMUTE: permute, Op.EXPAND: expand,
                                                    Op.SLICE: slice_, Op.PAD: pad}
    return views[op](srcs[0], arg)
