"""Tensor: the user-facing handle on a Node, with operators and methods lowered to primitives."""
from __future__ import annotations

import math
from typing import Sequence, Union

from . import primitives as P
from .dtypes import DType, as_dtype, promote
from .errors import DTypeError, ShapeError, user_location
from .node import Node
from .ops import Op

LOG2_E = math.log2(math.e)   # exp(x) = exp2(x * LOG2_E)
LN_2 = math.log(2.0)         # log(x) = log2(x) * LN_2
HALF_PI = math.pi / 2        # cos(x) = sin(x + HALF_PI)

Scalar = Union[int, float, bool]
TensorLike = Union["Tensor", int, float, bool]


class Tensor:
    """A value in a graph under construction; every operation appends checked primitive nodes."""

    __slots__ = ("node",)
    __array_priority__ = 1000  # numpy scalars on the left defer to Tensor's reflected operators

    def __init__(self, node: Node):
        self.node = node

    # properties ------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.shape

    @property
    def dtype(self) -> DType:
        return self.node.dtype

    @property
    def ndim(self) -> int:
        return self.node.ndim

    def __repr__(self) -> str:
        return f"Tensor({self.node.op}, shape={self.shape}, dtype={self.dtype})"

    def __bool__(self) -> bool:
        raise TypeError("a Tensor has no truth value while the graph is built; use it in the graph instead")

    # elementwise arithmetic ------------------------------------------------------------------
    def __add__(self, other: TensorLike) -> "Tensor":
        return _binary(Op.ADD, self, other)

    def __radd__(self, other: TensorLike) -> "Tensor":
        return _binary(Op.ADD, other, self)

    def __mul__(self, other: TensorLike) -> "Tensor":
        return _binary(Op.MUL, self, other)

    def __rmul__(self, other: TensorLike) -> "Tensor":
        return _binary(Op.MUL, other, self)

    def __neg__(self) -> "Tensor":
        return self * -1

    def __sub__(self, other: TensorLike) -> "Tensor":
        return self + -as_tensor(other, like=self)

    def __rsub__(self, other: TensorLike) -> "Tensor":
        return as_tensor(other, like=self) + -self

    def __truediv__(self, other: TensorLike) -> "Tensor":
        return self * as_tensor(other, like=self).recip()

    def __rtruediv__(self, other: TensorLike) -> "Tensor":
        return as_tensor(other, like=self) * self.recip()

    def __mod__(self, other: TensorLike) -> "Tensor":
        return _binary(Op.MOD, self, other)

    def __rmod__(self, other: TensorLike) -> "Tensor":
        return _binary(Op.MOD, other, self)

    def __abs__(self) -> "Tensor":
        return self.abs()

    def __matmul__(self, other: "Tensor") -> "Tensor":
        return matmul(self, other)

    def __rmatmul__(self, other: "Tensor") -> "Tensor":
        return matmul(other, self)

    # comparisons (bool results; hashing stays by identity, so tensors can still key a dict) -----
    def __lt__(self, other: TensorLike) -> "Tensor":
        return _binary(Op.LESS_THAN, self, other)

    def __gt__(self, other: TensorLike) -> "Tensor":
        return _binary(Op.LESS_THAN, other, self)

    def __le__(self, other: TensorLike) -> "Tensor":
        return logical_not(_binary(Op.LESS_THAN, other, self))

    def __ge__(self, other: TensorLike) -> "Tensor":
        return logical_not(_binary(Op.LESS_THAN, self, other))

    def __eq__(self, other: object) -> "Tensor":  # type: ignore[override]
        return equal(self, other)  # type: ignore[arg-type]

    def __ne__(self, other: object) -> "Tensor":  # type: ignore[override]
        return logical_not(equal(self, other))  # type: ignore[arg-type]

    __hash__ = object.__hash__

    # unary math ------------------------------------------------------------------------------
    def exp2(self) -> "Tensor":
        return Tensor(P.unary(Op.EXP2, self.node))

    def log2(self) -> "Tensor":
        return Tensor(P.unary(Op.LOG2, self.node))

    def sin(self) -> "Tensor":
        return Tensor(P.unary(Op.SIN, self.node))

    def sqrt(self) -> "Tensor":
        return Tensor(P.unary(Op.SQRT, self.node))

    def recip(self) -> "Tensor":
        return Tensor(P.unary(Op.RECIP, self.node))

    def exp(self) -> "Tensor":
        """e**x, lowered to EXP2 so that search sees one exponential."""
        return (self * LOG2_E).exp2()

    def log(self) -> "Tensor":
        """Natural log, lowered to LOG2."""
        return self.log2() * LN_2

    def cos(self) -> "Tensor":
        """cos(x) = sin(x + pi/2): one trigonometric primitive."""
        return (self + HALF_PI).sin()

    def rsqrt(self) -> "Tensor":
        return self.sqrt().recip()

    def abs(self) -> "Tensor":
        return maximum(self, -self)

    # reductions ------------------------------------------------------------------------------
    def sum(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> "Tensor":
        return _reduce(Op.SUM, self, axis, keepdim)

    def max(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> "Tensor":
        return _reduce(Op.MAX, self, axis, keepdim)

    def mean(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> "Tensor":
        count = math.prod(self.shape[a] for a in _axes(self, axis))
        return self.sum(axis, keepdim) * (1.0 / count if count else math.nan)  # empty: nan, as numpy

    # views -----------------------------------------------------------------------------------
    def reshape(self, *shape: int | Sequence[int]) -> "Tensor":
        return Tensor(P.reshape(self.node, _varargs(shape)))

    def permute(self, *axes: int | Sequence[int]) -> "Tensor":
        return Tensor(P.permute(self.node, _varargs(axes)))

    def transpose(self, axis0: int = -2, axis1: int = -1) -> "Tensor":
        order = list(range(self.ndim))
        a = P.normalize_axis(axis0, self.ndim, Op.PERMUTE, [self.node])
        b = P.normalize_axis(axis1, self.ndim, Op.PERMUTE, [self.node])
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    @property
    def T(self) -> "Tensor":
        return self.permute(list(reversed(range(self.ndim))))

    def expand(self, *shape: int | Sequence[int]) -> "Tensor":
        """Broadcast to `shape`, numpy style: leading axes may be added, size-1 axes may grow."""
        target = tuple(_varargs(shape))
        if len(target) < self.ndim:
            raise ShapeError(f"expand: cannot expand {self.shape} to fewer axes {target} at {user_location()}")
        node = P.reshape(self.node, (1,) * (len(target) - self.ndim) + self.shape)
        return Tensor(P.expand(node, target))

    def pad(self, widths: Sequence[tuple[int, int]]) -> "Tensor":
        return Tensor(P.pad(self.node, widths))

    def contiguous(self) -> "Tensor":
        return Tensor(P.contiguous(self.node))

    def cast(self, dtype: DType | str) -> "Tensor":
        return Tensor(P.cast(self.node, dtype))

    def __getitem__(self, index: object) -> "Tensor":
        return _getitem(self, index)


# helpers ---------------------------------------------------------------------------------------

def _varargs(values: tuple) -> list[int]:
    if len(values) == 1 and isinstance(values[0], (tuple, list)):
        return list(values[0])
    return list(values)


def as_tensor(value: TensorLike, like: Tensor) -> Tensor:
    """A Tensor as is, or a Python scalar as a constant of `like`'s dtype (a scalar takes the tensor's dtype)."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (int, float, bool)) or hasattr(value, "item"):
        value = value.item() if hasattr(value, "item") else value
        if like.dtype == DType.BOOL and not isinstance(value, bool):
            raise DTypeError(f"cannot combine a bool tensor with the number {value!r}; cast first at {user_location()}")
        return Tensor(P.constant(value, (), like.dtype))
    raise TypeError(f"expected a Tensor or a Python number, got {type(value).__name__} at {user_location()}")


def broadcast_shapes(a: tuple[int, ...], b: tuple[int, ...], op: Op | str) -> tuple[int, ...]:
    """The numpy broadcast of two shapes, or a ShapeError naming both."""
    out = []
    for x, y in zip((1,) * (len(b) - len(a)) + a, (1,) * (len(a) - len(b)) + b):
        if x != y and 1 not in (x, y):
            raise ShapeError(f"{op}: shapes {a} and {b} do not broadcast at {user_location()}")
        out.append(max(x, y) if 0 not in (x, y) else 0)
    return tuple(out)


def _binary(op: Op, a: TensorLike, b: TensorLike) -> Tensor:
    if not isinstance(a, Tensor):
        a = as_tensor(a, like=b)  # type: ignore[arg-type]
    b = as_tensor(b, like=a)
    dtype = promote(a.dtype, b.dtype)
    if dtype is None:
        raise DTypeError(f"{op}: cannot mix {a.dtype} {a.shape} and {b.dtype} {b.shape}; cast one first"
                         f" at {user_location()}")
    shape = broadcast_shapes(a.shape, b.shape, op)
    a, b = a.cast(dtype).expand(shape), b.cast(dtype).expand(shape)
    return Tensor(P.binary(op, a.node, b.node))


def logical_not(x: Tensor) -> Tensor:
    """not x for a bool tensor, as x < True (only False is less than True)."""
    return _binary(Op.LESS_THAN, x, True)


def logical_and(x: Tensor, y: Tensor) -> Tensor:
    """x and y for bool tensors, as (not x) < y: only False < True holds, so both must be true."""
    return _binary(Op.LESS_THAN, logical_not(x), y)


def equal(a: TensorLike, b: TensorLike) -> Tensor:
    """a == b elementwise, as IEEE says: neither is less than the other and neither is NaN (so NaN != NaN)."""
    a_t = a if isinstance(a, Tensor) else as_tensor(a, like=b)  # type: ignore[arg-type]
    b_t = as_tensor(b, like=a_t)
    unordered = logical_and(logical_not(a_t < b_t), logical_not(b_t < a_t))
    if not (a_t.dtype.is_float or b_t.dtype.is_float):
        return unordered
    return logical_and(unordered, logical_and(_not_nan(a_t), _not_nan(b_t)))


def _not_nan(x: Tensor) -> Tensor:
    """x is a number: below +inf or above -inf (NaN is neither; each infinity is one of them)."""
    below, above = _binary(Op.LESS_THAN, x, math.inf), _binary(Op.LESS_THAN, -math.inf, x)
    return logical_not(logical_and(logical_not(below), logical_not(above)))


def maximum(a: TensorLike, b: TensorLike) -> Tensor:
    """Elementwise max, exact for infinities too: the two stacked on a new last axis, then MAX over it."""
    a_t = a if isinstance(a, Tensor) else as_tensor(a, like=b)  # type: ignore[arg-type]
    b_t = as_tensor(b, like=a_t)
    dtype = promote(a_t.dtype, b_t.dtype)
    if dtype is None:
        raise DTypeError(f"maximum: cannot mix {a_t.dtype} and {b_t.dtype}; cast one first at {user_location()}")
    shape = broadcast_shapes(a_t.shape, b_t.shape, "maximum")
    keep = [(0, 0)] * len(shape)
    first = a_t.cast(dtype).expand(shape).reshape(shape + (1,)).pad(keep + [(0, 1)])
    second = b_t.cast(dtype).expand(shape).reshape(shape + (1,)).pad(keep + [(1, 0)])
    return (first + second).max(-1)


def where(cond: Tensor, a: TensorLike, b: TensorLike) -> Tensor:
    """a where cond else b; both sides are evaluated, so each must be finite where it is not chosen."""
    if cond.dtype != DType.BOOL:
        raise DTypeError(f"where: condition must be bool, got {cond.dtype} at {user_location()}")
    a_t = a if isinstance(a, Tensor) else as_tensor(a, like=b)  # type: ignore[arg-type]
    b_t = as_tensor(b, like=a_t)
    dtype = promote(a_t.dtype, b_t.dtype) or a_t.dtype
    if dtype == DType.BOOL:   # the blend is arithmetic, which bools refuse: through int32 and back, as concat's are
        return where(cond, a_t.cast(DType.INT32), b_t.cast(DType.INT32)).cast(DType.BOOL)
    pick = cond.cast(dtype)
    return a_t * pick + b_t * (1 - pick)


def _axes(x: Tensor, axis: int | Sequence[int] | None) -> list[int]:
    if axis is None:
        return list(range(x.ndim))
    try:
        axes = list(axis)  # type: ignore[arg-type]
    except TypeError:  # one axis: an int or a numpy integer
        axes = [axis]  # type: ignore[list-item]
    return sorted({P.normalize_axis(a, x.ndim, "reduce", [x.node]) for a in axes})


def _reduce(op: Op, x: Tensor, axis: int | Sequence[int] | None, keepdim: bool) -> Tensor:
    axes = _axes(x, axis)
    node = x.node
    for a in reversed(axes):
        node = P.reduce(op, node, a)
    out = Tensor(node)
    if keepdim:
        out = out.reshape([1 if i in axes else d for i, d in enumerate(x.shape)])
    return out


def _getitem(x: Tensor, index: object) -> Tensor:
    items = list(index) if isinstance(index, tuple) else [index]
    if sum(item is Ellipsis for item in items) > 1:
        raise ShapeError(f"getitem: at most one ... in an index at {user_location()}")
    used = sum(1 for item in items if item is not None and item is not Ellipsis)
    if used > x.ndim:
        raise ShapeError(f"getitem: {used} indices for a tensor of shape {x.shape} at {user_location()}")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at:at + 1] = [slice(None)] * (x.ndim - used)
    items += [slice(None)] * (x.ndim - sum(1 for item in items if item is not None))
    bounds, out_shape, axis = [], [], 0
    for item in items:
        if item is None:
            out_shape.append(1)
            continue
        size = x.shape[axis]
        if isinstance(item, slice):
            start, stop, step = item.indices(size)
            if step != 1:
                raise ShapeError(f"getitem: only step 1 slices are supported, got {item} at {user_location()}")
            stop = max(stop, start)
            bounds.append((start, stop))
            out_shape.append(stop - start)
        elif isinstance(item, bool):
            # numpy reads a bool as a mask, not as the index 0 or 1; refuse rather than pick a row silently
            raise TypeError(f"getitem: bool index {item!r} is not supported at {user_location()}")
        elif isinstance(item, int):
            if not -size <= item < size:
                raise ShapeError(f"getitem: index {item} out of range for axis {axis} of {x.shape}"
                                 f" at {user_location()}")
            bounds.append((item % size, item % size + 1))
        else:
            raise TypeError(f"getitem: unsupported index {item!r} at {user_location()}")
        axis += 1
    return Tensor(P.reshape(P.slice_(x.node, bounds), out_shape))


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """a @ b with numpy semantics, as a broadcast multiply and a sum over K."""
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"matmul: operands must have at least one axis, got {a.shape} and {b.shape}"
                         f" at {user_location()}")
    a2 = a.reshape(1, a.shape[0]) if a.ndim == 1 else a
    b2 = b.reshape(b.shape[0], 1) if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ShapeError(f"matmul: inner dimensions differ: {a.shape} @ {b.shape} at {user_location()}")
    batch = broadcast_shapes(a2.shape[:-2], b2.shape[:-2], "matmul")
    (m, k), n = a2.shape[-2:], b2.shape[-1]
    lhs = a2.reshape(a2.shape[:-2] + (m, k, 1)).expand(batch + (m, k, n))
    rhs = b2.reshape(b2.shape[:-2] + (1, k, n)).expand(batch + (m, k, n))
    out = (lhs * rhs).sum(axis=-2)
    if a.ndim == 1:
        out = out.reshape(out.shape[:-2] + (n,))
    if b.ndim == 1:
        out = out.reshape(out.shape[:-1])
    return out


# free functions that make tensors without a graph input -----------------------------------------

def constant(value: Scalar, shape: Sequence[int] = (), dtype: DType | str = "float32") -> Tensor:
    """A tensor whose every element is `value`."""
    return Tensor(P.constant(value, shape, as_dtype(dtype)))


def iota(shape: Sequence[int], axis: int) -> Tensor:
    """An int32 tensor whose element is its own index along `axis` (for masks and positions)."""
    return Tensor(P.iota(shape, axis))


def concat(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """The tensors joined along `axis`, as a sum of zero-padded parts (bools through int32): exact, and fusible."""
    if not tensors:
        raise ShapeError(f"concat: no tensors to join at {user_location()}")
    axis = P.normalize_axis(axis, tensors[0].ndim, "concat", [t.node for t in tensors])
    total, before, parts = sum(t.shape[axis] for t in tensors), 0, []
    for t in tensors:
        widths = [(0, 0)] * t.ndim
        widths[axis] = (before, total - before - t.shape[axis])
        parts.append((t.cast(DType.INT32) if t.dtype == DType.BOOL else t).pad(widths))
        before += t.shape[axis]
    out = parts[0]
    for part in parts[1:]:
        out = out + part
    return out.cast(DType.BOOL) if tensors[0].dtype == DType.BOOL else out
