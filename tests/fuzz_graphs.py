"""Random graphs built through the public API, each with an independent numpy evaluation (issue 18's fuzzer).

`random_graph(seed, ops)` draws one to three inputs (ranks 0 to 5, sizes 1, primes and powers of two, every dtype:
float32, float16, bfloat16, int32 and bool) and applies `ops` random operations of the public API to them:
elementwise math (power, clamp, erf among it), arithmetic with broadcasting and Python scalars on either side (`%`,
maximum and minimum among it), comparisons, where, reductions over any axes and cumsum, views (reshape, permute,
transpose, slices and indexing, pads, expands), casts between any two dtypes, leaves (iota, constant,
causal_mask), matrix products, nn layers (the norms with and without their weights, softmaxes, var, std, rope,
attention), concat and split, argmax, argmin and embedding. Every operation is applied twice, once to the
tensorsmith Tensor and once by numpy's own functions to an array (float64, int64 for int32, bool), so that the
expected outputs owe nothing to tensorsmith. As in the reference interpreter (the oracle of what a graph means),
values are rounded to their dtype only where they enter (inputs).

Values are kept in ranges where float16 does not overflow (arguments of exp are bounded, divisors are at least 1,
powers and variances only of moderate values) and where int32 is exact in the kernels' float32 arithmetic
(`Value.bound`, on every input verification may draw). A comparison, a float `%`, argmax and argmin and a cast from
a float to int32 or bool jump where their operand crosses a tie, so they take only values that every program computes
bit for bit (`Value.exact`): inputs and what views, maxima, negation, where and widening casts make of them, and
every int32 and bool value.

`check(fuzzed)` compares ts.evaluate and the compiled program (run by the numpy executor) with that expectation
and says which of "crash", "compile error", "rejected", "wrong" or "ok" it is.
"""
from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.ir.dtypes import round_to_host
from tensorsmith.ir.ops import Op
from tensorsmith.search.error_bound import relative_error_bounds
from tensorsmith.search.verify import ROUNDING_NOISE, VerificationError, relative_l2, rounding_noise

SIZES = (1, 2, 3, 5, 7, 8, 16)
MAX_RANK = 5
FLOATS = ("float32", "float16", "bfloat16")
DTYPES = FLOATS + ("int32", "bool")
INPUT_WEIGHTS = (1.0, 1.0, 1.0, 0.4, 0.3)   # of DTYPES: mostly floats, so that the float graphs keep their share
MAX_ELEMENTS = 4096          # keeps a graph's values small enough that hundreds compile in a CI run
TOLERANCE = {"float32": 1e-4, "float16": 3e-2, "bfloat16": 6e-2, "int32": 0.0, "bool": 0.0}   # relative L2
GELU_C = math.sqrt(2 / math.pi)
INT_DRAW = 100               # int32 inputs lie in [-100, 100), as verification draws them
FLOAT_AS_INT = 100           # |trunc(x)| of an exact float: inputs, and verification's large draw (+-80)
INT_LIMIT = 2**24            # int32 values stay below this, where the kernels' float32 arithmetic is exact
INT_AS_FLOAT = 256           # an int32 becomes a float only up to this: bfloat16 holds it exactly, float16 its square
FLOAT_SCALARS = (0.5, -0.25, 1.5, 2.0, 0.0)          # exact in every float dtype
INT_SCALARS = (3, -2, 0, 7)
MODULI = (0.75, 1.5, 2.0)
PRODUCT_LIMIT = 4096.0       # a product of two of the graph's own floats only up to K |a| |b| of this (float16: 65504)
MASKED = -1e9                # nn.attention's score where the causal mask hides a key


@dataclass(eq=False)   # values compare by identity (== on a Tensor builds a node)
class Value:
    tensor: ts.Tensor
    array: np.ndarray        # what numpy says the tensor holds: float64 for floats, int64 for int32, bool for bool
    dtype: str
    exact: bool = False      # every program computes it bit for bit (see the module's docstring)
    bound: int = 0           # int32: the largest magnitude it takes on any input verification draws; an exact float:
                             # that of an int32 it was cast from (0: no more than an input's)

    @property
    def kind(self) -> str:
        return "float" if self.dtype in FLOATS else self.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)


@dataclass
class Fuzzed:
    seed: int
    graph: ts.Graph
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]
    tolerance: float
    steps: list[str] = field(default_factory=list)
    error: str = ""          # an exception the public API raised while the graph was built


def _round(array: np.ndarray, dtype: str) -> np.ndarray:
    """What storing `array` in `dtype` keeps, as float64 (numpy rounds float16 itself; bfloat16 by its bits)."""
    if dtype == "float16":
        return array.astype(np.float16).astype(np.float64)
    if dtype == "bfloat16":
        bits = np.asarray(array, np.float32).view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32)
        return rounded.view(np.float32).astype(np.float64)
    return array.astype(np.float32).astype(np.float64)


class _Builder:
    def __init__(self, rng: np.random.Generator, graph: ts.Graph):
        self.rng, self.graph = rng, graph
        self.inputs: dict[str, np.ndarray] = {}
        self.input_values: list[Value] = []
        self.steps: list[str] = []

    def shape(self, rank: int | None = None) -> tuple[int, ...]:
        rank = int(self.rng.integers(0, MAX_RANK + 1)) if rank is None else rank
        while True:
            shape = tuple(int(self.rng.choice(SIZES)) for _ in range(rank))
            if math.prod(shape) <= MAX_ELEMENTS:
                return shape

    def input(self, shape: tuple[int, ...], dtype: str, std: float = 1.0) -> Value:
        name = f"in{len(self.inputs)}"
        self.steps.append(f"{name} = input({shape}, {dtype})")
        if dtype in FLOATS:
            drawn = round_to_host((self.rng.standard_normal(shape) * std).astype(np.float32), ts.DType(dtype))
            array, bound = _round(np.asarray(drawn, np.float64), dtype), 0
        elif dtype == "int32":
            drawn = self.rng.integers(-INT_DRAW, INT_DRAW, shape).astype(np.int32)
            array, bound = drawn.astype(np.int64), INT_DRAW
        else:
            drawn = self.rng.random(shape) < 0.5
            array, bound = drawn, 1
        self.inputs[name] = np.asarray(drawn)
        value = Value(self.graph.input(name, shape, dtype), array, dtype, exact=True, bound=bound)
        self.input_values.append(value)
        return value

    def pick(self, values: list[Value]) -> Value:
        return values[int(self.rng.integers(len(values)))]

    def choice(self, options: list | tuple) -> object:
        return options[int(self.rng.integers(len(options)))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def float_dtype(self) -> str:
        return str(self.choice(FLOATS))

    def input_dtype(self) -> str:
        weights = np.array(INPUT_WEIGHTS)
        return DTYPES[int(self.rng.choice(len(DTYPES), p=weights / weights.sum()))]

    def like(self, v: Value) -> str:
        """A dtype of `v`'s kind for a fresh operand: any float beside a float, else `v`'s own."""
        return self.float_dtype() if v.kind == "float" else v.dtype

    def scalar(self, dtype: str) -> float | int | bool:
        """A Python number that every dtype of its kind holds exactly."""
        if dtype in FLOATS:
            return float(self.choice(FLOAT_SCALARS))
        return int(self.choice(INT_SCALARS)) if dtype == "int32" else self.chance(0.5)

    def axis(self, rank: int) -> int:
        """An axis of `rank`, counted from the end a third of the time (the API takes both)."""
        axis = int(self.rng.integers(rank))
        return axis - rank if self.chance(0.3) else axis


def _fits(*shapes: tuple[int, ...]) -> bool:
    """The shapes broadcast together, to at most MAX_ELEMENTS elements."""
    try:
        return math.prod(np.broadcast_shapes(*shapes)) <= MAX_ELEMENTS
    except ValueError:
        return False


def _broadcastable(b: _Builder, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts against `shape`: some of its trailing axes, some of them 1."""
    keep = int(b.rng.integers(0, len(shape) + 1))
    return tuple(1 if b.rng.random() < 0.4 else n for n in shape[len(shape) - keep:])


def _promote(*dtypes: str) -> str:
    if len(set(dtypes)) == 1:
        return dtypes[0]
    return "float32"           # float16 with bfloat16, or either with float32, is float32 (as PyTorch promotes)


def _as_value(x: Value | float | int | bool) -> Value | None:
    """A partner that is a Value, else None (a Python scalar)."""
    return x if isinstance(x, Value) else None


def _magnitude(v: Value) -> float:
    return float(np.abs(v.array).max(initial=0))


# Elementwise functions ------------------------------------------------------------------------------------------

def _erf(a: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(a)


# Unary float operations: (name, on the tensor, on the array); each keeps values in a range float16 holds well.
UNARY: list[tuple[str, Callable, Callable]] = [
    ("abs", lambda t: t.abs(), np.abs),
    ("neg", lambda t: -t, np.negative),
    ("sin", lambda t: t.sin(), np.sin),
    ("cos", lambda t: t.cos(), np.cos),
    ("tanh", nn.tanh, np.tanh),
    ("sigmoid", nn.sigmoid, lambda a: 1 / (1 + np.exp(-a))),
    ("relu", nn.relu, lambda a: np.maximum(a, 0)),
    ("silu", nn.silu, lambda a: a / (1 + np.exp(-a))),
    ("gelu", nn.gelu, lambda a: 0.5 * a * (1 + np.tanh(GELU_C * (a + 0.044715 * a**3)))),
    ("gelu_exact", nn.gelu_exact, lambda a: 0.5 * a * (1 + _erf(a / math.sqrt(2)))),
    ("erf", nn.erf, _erf),
    ("exp_of_tanh", lambda t: nn.tanh(t).exp(), lambda a: np.exp(np.tanh(a))),
    ("exp2_of_sin", lambda t: t.sin().exp2(), lambda a: np.exp2(np.sin(a))),
    ("log1p_abs", lambda t: (t.abs() + 1).log(), lambda a: np.log(np.abs(a) + 1)),
    ("log2", lambda t: (t * t + 1).log2(), lambda a: np.log2(a * a + 1)),
    ("sqrt", lambda t: (t.abs() + 0.5).sqrt(), lambda a: np.sqrt(np.abs(a) + 0.5)),
    ("rsqrt", lambda t: (t * t + 1).rsqrt(), lambda a: 1 / np.sqrt(a * a + 1)),
    ("recip", lambda t: (t.abs() + 1).recip(), lambda a: 1 / (np.abs(a) + 1)),
    ("scale", lambda t: t * 0.5 + 0.25, lambda a: a * 0.5 + 0.25),
    ("rsub", lambda t: 1.5 - t, lambda a: 1.5 - a),
    ("rdiv", lambda t: 2 / (t.abs() + 1), lambda a: 2 / (np.abs(a) + 1)),
]
EXACT_UNARY = frozenset({"abs", "neg", "relu"})   # exact functions of an exact value

# Unary int32 operations: (name, on the tensor, on the array, the bound of the result from the operand's).
INT_UNARY: list[tuple[str, Callable, Callable, Callable[[int], int]]] = [
    ("neg", lambda t: -t, np.negative, lambda n: n),
    ("abs", lambda t: t.abs(), np.abs, lambda n: n),
    ("relu", nn.relu, lambda a: np.maximum(a, 0), lambda n: n),
    ("times3", lambda t: t * 3, lambda a: a * 3, lambda n: 3 * n),
    ("plus7", lambda t: t + 7, lambda a: a + 7, lambda n: n + 7),
    ("rsub7", lambda t: 7 - t, lambda a: 7 - a, lambda n: n + 7),
    ("mod5", lambda t: t % 5, lambda a: np.fmod(a, 5), lambda n: min(n, 4)),
]
POWERS = (2, 3, 0, -1, 0.5, -0.5, 1.5)
SMALL = 8.0                  # x**2 and x**3 only where |x| stays below this on the draw (float16 holds 8**3 well)
SQUARABLE = 100.0            # var and std only where |x| stays below this (float16 holds its square)


def _unary(b: _Builder, v: Value, values: list[Value]) -> Value:
    if b.chance(0.08):
        return _clamp(b, v)
    if v.kind == "int32":
        name, on_tensor, on_array, bound = b.choice(INT_UNARY)   # type: ignore[misc]
        if bound(v.bound) > INT_LIMIT:
            name, on_tensor, on_array, bound = INT_UNARY[0]
        b.steps.append(name)
        return Value(on_tensor(v.tensor), on_array(v.array), v.dtype, True, bound(v.bound))
    if b.chance(0.08):
        return _power(b, v)
    name, on_tensor, on_array = b.choice(UNARY)   # type: ignore[misc]
    b.steps.append(name)
    exact = v.exact and name in EXACT_UNARY
    return Value(on_tensor(v.tensor), on_array(v.array), v.dtype, exact, v.bound if exact else 0)


def _power(b: _Builder, v: Value) -> Value:
    """nn.power: integer powers of moderate values, other powers of a positive base |x| + 0.5."""
    e = b.choice(POWERS)
    if e in (2, 3) and _magnitude(v) > SMALL:
        e = 0.5
    b.steps.append(f"power({e})")
    if e in (2, 3, 0):
        return Value(nn.power(v.tensor, e), np.power(v.array, e), v.dtype)   # type: ignore[arg-type]
    return Value(nn.power(v.tensor.abs() + 0.5, e), np.power(np.abs(v.array) + 0.5, e), v.dtype)   # type: ignore


def _clamp(b: _Builder, v: Value) -> Value:
    if v.kind == "int32":
        lo, hi = b.choice([(-20, 30), (None, 5), (0, None)])   # type: ignore[misc]
    else:
        lo, hi = b.choice([(-0.5, 0.75), (None, 0.5), (0.0, None), (-1.5, -0.25)])   # type: ignore[misc]
    b.steps.append(f"clamp({lo}, {hi})")
    bound = max(v.bound, abs(lo or 0), abs(hi or 0))
    return Value(nn.clamp(v.tensor, lo, hi), np.clip(v.array, lo, hi), v.dtype, v.exact, bound)


def _pos(x: ts.Tensor | float) -> ts.Tensor | float:
    """|x| + 1: a divisor at least 1."""
    return x.abs() + 1 if isinstance(x, ts.Tensor) else abs(x) + 1


def _modulus(x: ts.Tensor | float) -> ts.Tensor | float:
    """max(|x|, 0.5): a float divisor that is exact where x is, and never 0."""
    return nn.maximum(x.abs(), 0.5) if isinstance(x, ts.Tensor) else max(abs(x), 0.5)


# Binary operations: (name, on the tensors, on the arrays); the operands may be Python scalars (either, for ARITHMETIC).
ARITHMETIC: list[tuple[str, Callable, Callable]] = [
    ("add", operator.add, np.add),
    ("sub", operator.sub, np.subtract),
    ("mul", operator.mul, np.multiply),
    ("div", lambda a, b: a / _pos(b), lambda a, b: a / (np.abs(b) + 1)),
    ("maximum", nn.maximum, np.maximum),
    ("minimum", nn.minimum, np.minimum),
]
INT_ARITHMETIC = [op for op in ARITHMETIC if op[0] != "div"]
FLOAT_MOD = ("mod", lambda a, b: a % _modulus(b), lambda a, b: np.fmod(a, np.maximum(np.abs(b), 0.5)))
INT_MOD = ("mod", lambda a, b: a % _pos(b), lambda a, b: np.fmod(a, np.abs(b) + 1))
BINARY = {"float": ARITHMETIC + [FLOAT_MOD], "int32": INT_ARITHMETIC + [INT_MOD], "bool": []}
EXACT_BINARY = frozenset({"maximum", "minimum", "mod"})   # exact functions of exact floats
COMPARISONS: list[tuple[str, Callable, Callable]] = [
    ("less", operator.lt, np.less),
    ("greater", operator.gt, np.greater),
    ("less_equal", operator.le, np.less_equal),
    ("greater_equal", operator.ge, np.greater_equal),
    ("equal", operator.eq, np.equal),
    ("not_equal", operator.ne, np.not_equal),
]
COMPARED = frozenset(name for name, _, _ in COMPARISONS)


def _binary(b: _Builder, v: Value, values: list[Value]) -> Value:
    name, on_tensor, on_array = b.choice(BINARY[v.kind] + COMPARISONS)   # type: ignore[misc]
    needs_exact = name == "mod" or name in COMPARED
    if needs_exact and not v.exact:
        # a computed float is rounded differently by the float64 reference, the kernels' float32 registers and the
        # program's float16 temporaries, so a comparison (or a remainder) near a tie would flip: exact ones only
        v = b.pick([w for w in values if w.exact and w.kind == v.kind] or [b.input(v.shape, v.dtype)])
    other = _partner(b, v, values, exact=needs_exact, scalar=0.2, no_zero=name == "mod")
    partner = _as_value(other)
    other_bound = partner.bound if partner else abs(int(other))
    if v.kind == "int32" and _int_bound(name, v.bound, other_bound) > INT_LIMIT:
        name, on_tensor, on_array = ARITHMETIC[4]   # a sum or product past float32's exact integers: maximum
    left = partner is None and name != "mod" and b.chance(0.3)   # a scalar on the left (`0.5 - x`, `2 < x`)
    other_t, other_a = (partner.tensor, partner.array) if partner else (other, other)
    b.steps.append(f"{name} {'from' if left else 'with'} {partner.shape if partner else repr(other)}")
    if left:
        tensor, array = on_tensor(other_t, v.tensor), on_array(other_a, v.array)
    else:
        tensor, array = on_tensor(v.tensor, other_t), on_array(v.array, other_a)
    if name in COMPARED:
        return Value(tensor, np.asarray(array, bool), "bool", True, 1)
    dtype = _promote(v.dtype, partner.dtype) if partner else v.dtype
    exact = v.kind == "int32" or (v.exact and (partner is None or partner.exact) and name in EXACT_BINARY)
    return Value(tensor, np.asarray(array, v.array.dtype), dtype, exact, _int_bound(name, v.bound, other_bound))


def _int_bound(name: str, a: int, b: int) -> int:
    """The bound of an int32 result of `name` from its operands' bounds."""
    if name == "mul":
        return a * b
    if name == "mod":
        return min(a, b)
    if name in ("maximum", "minimum"):
        return max(a, b)
    return a + b


def _partner(b: _Builder, v: Value, values: list[Value], exact: bool = False, scalar: float = 0.0,
             no_zero: bool = False) -> Value | float | int | bool:
    """A second operand of `v`'s kind that broadcasts with it: a value of the graph, a fresh input or a scalar."""
    if b.chance(scalar):
        if no_zero and v.kind == "float":
            return float(b.choice(MODULI))
        return b.scalar(v.dtype)
    partners = [w for w in values if w.kind == v.kind and _fits(v.shape, w.shape) and (w.exact or not exact)]
    if partners and b.chance(0.7):
        return b.pick(partners)
    return b.input(_broadcastable(b, v.shape), b.like(v))


# Where and leaves -----------------------------------------------------------------------------------------------

def _where(b: _Builder, v: Value, values: list[Value]) -> Value:
    other = _partner(b, v, values, scalar=0.25)
    other_shape = other.shape if isinstance(other, Value) else ()
    cond = _condition(b, v, values, np.broadcast_shapes(v.shape, other_shape))
    first, second = (v, other) if b.chance(0.7) else (other, v)
    pick = [(x.tensor, x.array) if isinstance(x, Value) else (x, x) for x in (first, second)]
    b.steps.append(f"where {cond.shape} of {other_shape if isinstance(other, Value) else other}")
    partner = _as_value(other)
    dtype = _promote(v.dtype, partner.dtype) if partner else v.dtype
    array = np.where(cond.array, pick[0][1], pick[1][1]).astype(v.array.dtype)
    exact = v.exact and (partner is None or partner.exact)
    bound = max(v.bound, partner.bound if partner else abs(int(other)))
    return Value(nn.where(cond.tensor, pick[0][0], pick[1][0]), array, dtype, exact, bound)


def _condition(b: _Builder, v: Value, values: list[Value], shape: tuple[int, ...]) -> Value:
    """A bool value that broadcasts with `shape`: one of the graph's, or a fresh input, comparison or mask."""
    bools = [w for w in values if w.dtype == "bool" and _fits(w.shape, shape)]
    if bools and b.chance(0.5):
        return b.pick(bools)
    how = b.choice(["input", "compare", "mask", "iota"] if len(shape) >= 2 else ["input", "compare", "iota"])
    if how == "compare":
        exact = [w for w in values if w.exact and w.kind == "float" and _fits(w.shape, shape)]
        if exact:
            w = b.pick(exact)
            b.steps.append(f"less than 0.25 of {w.shape}")
            return Value(w.tensor < 0.25, w.array < 0.25, "bool", True, 1)
    if how == "mask":
        return _causal_mask(b, shape[-2], shape[-1])
    if how == "iota" and shape:
        axis = b.axis(len(shape))
        cut = int(b.rng.integers(0, shape[axis] + 1))
        b.steps.append(f"iota{shape} axis {axis} below {cut}")
        return Value(ts.iota(shape, axis) < cut, _iota(shape, axis) < cut, "bool", True, 1)
    return b.input(_broadcastable(b, shape), "bool")


def _iota(shape: tuple[int, ...], axis: int) -> np.ndarray:
    """Each element's index along `axis`."""
    return np.indices(shape, dtype=np.int64)[axis] if shape else np.zeros((), np.int64)


def _hidden(q_len: int, k_len: int) -> np.ndarray:
    """Where query i may not see key j: j after i, the last query seeing the last key."""
    return np.arange(k_len)[None, :] > np.arange(q_len)[:, None] + (k_len - q_len)


def _causal_mask(b: _Builder, q_len: int, k_len: int) -> Value:
    b.steps.append(f"causal_mask({q_len}, {k_len})")
    return Value(nn.causal_mask(q_len, k_len), _hidden(q_len, k_len), "bool", True, 1)


def _leaf(b: _Builder, v: Value, values: list[Value]) -> Value:
    """iota, constant or causal_mask of `v`'s shape, most often combined with `v` (else a leaf of its own)."""
    how = b.choice(["iota", "constant", "causal_mask"] if v.array.ndim >= 2 else ["iota", "constant"])
    if how == "iota":
        shape = v.shape or (int(b.choice(SIZES)),)
        axis = b.axis(len(shape))
        b.steps.append(f"iota{shape} axis {axis}")
        leaf = Value(ts.iota(shape, axis), _iota(shape, axis % len(shape)), "int32", True, shape[axis] - 1)
    elif how == "constant":
        c = b.scalar(v.dtype)
        b.steps.append(f"constant {c!r} {v.dtype}{v.shape}")
        leaf = Value(ts.constant(c, v.shape, v.dtype), np.full(v.shape, c, v.array.dtype), v.dtype, True, abs(int(c)))
    else:
        leaf = _causal_mask(b, *v.shape[-2:])
    if b.chance(0.25):
        return leaf
    return _combine(b, v, leaf)


def _combine(b: _Builder, v: Value, leaf: Value) -> Value:
    """`v` and a leaf of its shape in one elementwise op that suits their dtypes."""
    if leaf.dtype == "bool":
        if v.dtype == "bool":
            b.steps.append("not_equal")
            return Value(v.tensor != leaf.tensor, v.array != leaf.array, "bool", True, 1)
        b.steps.append("masked where")
        zero = 0.0 if v.kind == "float" else 0
        return Value(nn.where(leaf.tensor, zero, v.tensor), np.where(leaf.array, zero, v.array), v.dtype,
                     v.exact, v.bound)
    if v.dtype == "bool":
        b.steps.append("less")
        other = leaf.tensor if leaf.dtype == "bool" else leaf.tensor.cast("bool")
        return Value(v.tensor < other, v.array < (leaf.array != 0), "bool", True, 1)
    if leaf.dtype != v.dtype:                      # an int32 iota beside a float: cast, exactly
        leaf = Value(leaf.tensor.cast(v.dtype), leaf.array.astype(np.float64), v.dtype, True)
    b.steps.append("add" if v.kind != "float" or b.chance(0.5) else "maximum")
    if b.steps[-1] == "maximum":
        return Value(nn.maximum(v.tensor, leaf.tensor), np.maximum(v.array, leaf.array), v.dtype, v.exact,
                     max(v.bound, leaf.bound))
    return Value(v.tensor + leaf.tensor, v.array + leaf.array, v.dtype, v.kind != "float", v.bound + leaf.bound)


# Reductions and views -------------------------------------------------------------------------------------------

def _reduce(b: _Builder, v: Value, values: list[Value]) -> Value:
    rank = v.array.ndim
    how = str(b.choice(["sum", "max", "mean", "cumsum"] if v.kind == "float" else ["sum", "max", "cumsum"]))
    if how == "cumsum":
        return _cumsum(b, v) if rank else v
    if rank == 0 or b.rng.random() < 0.2:
        axes = None
    else:
        count = int(b.rng.integers(1, rank + 1))
        axes = tuple(sorted(int(a) for a in b.rng.choice(rank, size=count, replace=False)))
    count = math.prod(v.shape[a] for a in axes) if axes is not None else v.array.size
    if how == "sum" and v.kind == "int32" and v.bound * count > INT_LIMIT:
        how = "max"
    keepdim = bool(b.rng.random() < 0.5)
    b.steps.append(f"{how}(axis={axes}, keepdim={keepdim})")
    tensor = getattr(v.tensor, how)(axis=tuple(a - rank if b.chance(0.2) else a for a in axes) if axes else axes,
                                    keepdim=keepdim)
    array = getattr(np, how if how != "max" else "amax")(v.array, axis=axes, keepdims=keepdim)
    bound = v.bound * count if how == "sum" else v.bound
    return Value(tensor, np.asarray(array, v.array.dtype), v.dtype, v.kind == "int32" or (v.exact and how == "max"),
                 bound)


def _cumsum(b: _Builder, v: Value) -> Value:
    axis = b.axis(v.array.ndim)
    n = v.shape[axis]
    if v.kind == "int32" and v.bound * n > INT_LIMIT:
        return v
    b.steps.append(f"cumsum(axis={axis})")
    return Value(nn.cumsum(v.tensor, axis), np.cumsum(v.array, axis=axis), v.dtype, v.kind == "int32", v.bound * n)


def _view(b: _Builder, v: Value, values: list[Value]) -> Value:
    shape, rank = v.shape, v.array.ndim
    kind = b.choice(["reshape", "permute", "transpose", "slice", "index", "pad", "expand", "contiguous"] if rank else
                    ["reshape", "index", "expand", "contiguous"])
    if kind == "reshape":
        new = _refactor(b, v.array.size)
        b.steps.append(f"reshape{new}")
        return _same(v, v.tensor.reshape(*new) if new else v.tensor.reshape(()), v.array.reshape(new))
    if kind == "permute":
        axes = tuple(int(a) for a in b.rng.permutation(rank))
        b.steps.append(f"permute{axes}")
        return _same(v, v.tensor.permute(*axes), np.transpose(v.array, axes))
    if kind == "transpose":
        if b.chance(0.3):
            b.steps.append("transpose T")
            return _same(v, v.tensor.T, v.array.T)
        a0, a1 = b.axis(rank), b.axis(rank)
        b.steps.append(f"transpose({a0}, {a1})")
        return _same(v, v.tensor.transpose(a0, a1), np.swapaxes(v.array, a0, a1))
    if kind == "slice":
        axis = int(b.rng.integers(rank))
        start = int(b.rng.integers(0, shape[axis]))
        stop = int(b.rng.integers(start + 1, shape[axis] + 1))
        index = tuple(slice(start, stop) if a == axis else slice(None) for a in range(rank))
        b.steps.append(f"slice axis {axis} [{start}:{stop}]")
        return _same(v, v.tensor[index], v.array[index])
    if kind == "index":
        index = _index_items(b, shape)
        b.steps.append(f"index[{', '.join(_spell(i) for i in index)}]")
        return _same(v, v.tensor[index], v.array[index])
    if kind == "pad":
        return _pad(b, v)
    if kind == "expand":
        return _expand(b, v)
    b.steps.append("contiguous")
    return _same(v, v.tensor.contiguous(), v.array.copy())


def _same(v: Value, tensor: ts.Tensor, array: np.ndarray) -> Value:
    """A view of `v`: its dtype, exactness and bound."""
    return Value(tensor, np.asarray(array), v.dtype, v.exact, v.bound)


def _index_items(b: _Builder, shape: tuple[int, ...]) -> tuple:
    """A basic index of `shape`: per axis an int (maybe negative), a slice (maybe with negative bounds) or all of it,
    with a None axis inserted and a run of whole axes written as `...` now and then; never an empty slice."""
    items: list[object] = []
    for n in shape:
        roll = b.rng.random()
        if roll < 0.3:
            i = int(b.rng.integers(n))
            items.append(i - n if b.chance(0.4) else i)
        elif roll < 0.6:
            start = int(b.rng.integers(n))
            stop = int(b.rng.integers(start + 1, n + 1))
            items.append(slice(start - n if b.chance(0.3) else start, stop - n if stop < n and b.chance(0.3) else stop))
        else:
            items.append(slice(None))
    if b.chance(0.3):
        items.insert(int(b.rng.integers(len(items) + 1)), None)
    whole = [i for i, item in enumerate(items) if isinstance(item, slice) and item == slice(None)]
    if whole and b.chance(0.3):   # one run of whole axes written as ...
        at = int(b.choice(whole))
        end = at
        while end < len(items) and isinstance(items[end], slice) and items[end] == slice(None):
            end += 1
        items[at:end] = [Ellipsis]
    return tuple(items)


def _spell(item: object) -> str:
    if isinstance(item, slice):
        return f"{'' if item.start is None else item.start}:{'' if item.stop is None else item.stop}"
    return "..." if item is Ellipsis else repr(item)


def _pad(b: _Builder, v: Value) -> Value:
    rank, shape = v.array.ndim, v.shape
    axis = int(b.rng.integers(rank))
    widths = [(0, 0)] * rank
    widths[axis] = (int(b.rng.integers(0, 3)), int(b.rng.integers(0, 3)))
    if math.prod(n + sum(w) for n, w in zip(shape, widths)) > MAX_ELEMENTS:
        return v
    b.steps.append(f"pad{widths}")
    return _same(v, v.tensor.pad(widths), np.pad(v.array, widths))


def _expand(b: _Builder, v: Value) -> Value:
    """Grow a size-1 axis, or put a new leading axis in front (expand's numpy rule)."""
    shape = v.shape
    ones = [a for a in range(len(shape)) if shape[a] == 1]
    if ones and b.chance(0.7):
        axis = int(b.choice(ones))
        new = tuple(int(b.choice(SIZES)) if a == axis else n for a, n in enumerate(shape))
    elif len(shape) < MAX_RANK:
        new = (int(b.choice(SIZES)),) + shape
    else:
        return v
    if math.prod(new) > MAX_ELEMENTS:
        return v
    b.steps.append(f"expand{new}")
    return _same(v, v.tensor.expand(*new), np.broadcast_to(v.array, new).copy())


def _refactor(b: _Builder, size: int) -> tuple[int, ...]:
    """A random shape of `size` elements, rank 0 to 5 (rank 0 only for one element)."""
    factors, p, rest = [], 2, size
    while rest > 1:
        while rest % p == 0:
            factors.append(p)
            rest //= p
        p += 1
    b.rng.shuffle(factors)
    groups = int(b.rng.integers(1 if factors else 0, min(MAX_RANK, max(1, len(factors))) + 1))
    shape = [1] * groups
    for i, f in enumerate(factors):
        shape[i % groups] *= f
    if len(shape) < MAX_RANK and b.rng.random() < 0.3:
        shape.insert(int(b.rng.integers(len(shape) + 1)), 1)
    return tuple(shape)


# Casts ----------------------------------------------------------------------------------------------------------

def _cast(b: _Builder, v: Value, values: list[Value]) -> Value:
    targets = [d for d in DTYPES if d != v.dtype and _castable(v, d)]
    return _cast_to(b, v, str(b.choice(targets)))


def _castable(v: Value, dtype: str) -> bool:
    """A cast that every program computes alike, into values the float dtypes hold: to int32 or bool only from exact
    values, from int32 to a float only up to INT_AS_FLOAT."""
    if dtype in ("int32", "bool") and v.kind == "float":
        return v.exact
    if v.kind == "int32" and dtype in FLOATS:
        return v.bound <= INT_AS_FLOAT
    return True


def _cast_to(b: _Builder, v: Value, dtype: str) -> Value:
    b.steps.append(f"cast({dtype})")
    tensor = v.tensor.cast(dtype)
    if dtype == "bool":
        return Value(tensor, v.array != 0, dtype, True, 1)
    if dtype == "int32" and v.kind == "float":
        return Value(tensor, np.trunc(v.array).astype(np.int64), dtype, True, max(FLOAT_AS_INT, v.bound))
    if dtype == "int32":
        return Value(tensor, v.array.astype(np.int64), dtype, True, 1)
    if v.kind != "float":
        return Value(tensor, v.array.astype(np.float64), dtype, True, v.bound)
    # the reference interpreter does not round at a cast to a narrower float (its CAST is x.astype(float64)), while
    # the kernels do; the expectation follows the interpreter, and the tolerance covers the kernels' rounding
    # (issue 17: the CPU's numerics should be what runs)
    exact = v.exact and dtype == "float32"   # a widening cast
    return Value(tensor, v.array, dtype, exact, v.bound if exact else 0)


def _convert(b: _Builder, v: Value, kinds: frozenset[str]) -> Value:
    """`v` made one of `kinds` by a cast (a float from an int32 or a bool, an int32 or bool from an exact float, ...),
    or a fresh input of the first kind where no cast computes exactly."""
    floats = [str(d) for d in b.rng.permutation(FLOATS)] if "float" in kinds else []
    for dtype in floats + [d for d in ("int32", "bool") if d in kinds]:
        if _castable(v, dtype):
            return _cast_to(b, v, dtype)
    first = "float" if "float" in kinds else sorted(kinds)[0]
    return b.input(v.shape, b.float_dtype() if first == "float" else first)


# Layers and products --------------------------------------------------------------------------------------------

def _softmax(a: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _layer(b: _Builder, v: Value, values: list[Value]) -> Value:
    if v.array.ndim == 0:
        return v
    axis = -1 if b.rng.random() < 0.6 else int(b.rng.integers(v.array.ndim))
    kind = b.choice(["softmax", "log_softmax", "layer_norm", "rms_norm", "var", "std", "rope"])
    a = v.array
    if kind in ("softmax", "log_softmax"):
        shifted = a - a.max(axis=axis, keepdims=True)
        array = _softmax(a, axis) if kind == "softmax" else shifted - np.log(np.exp(shifted).sum(axis, keepdims=True))
        b.steps.append(f"{kind}(axis={axis})")
        return Value(getattr(nn, kind)(v.tensor, axis=axis), array, v.dtype)
    if kind == "layer_norm":
        return _layer_norm(b, v)
    if kind == "rms_norm":
        return _rms_norm(b, v)
    if kind == "rope" and v.shape[-1] > 1:
        return _rope(b, _rows(b, v))
    if kind in ("var", "std") and _magnitude(v) <= SQUARABLE:
        n = v.shape[axis]
        correction, keepdim = (int(b.rng.integers(0, 2)) if n > 1 else 0), b.chance(0.4)
        b.steps.append(f"{kind}(axis={axis}, correction={correction}, keepdim={keepdim})")
        array = getattr(np, kind)(a, axis=axis, ddof=correction, keepdims=keepdim)
        return Value(getattr(nn, kind)(v.tensor, axis, correction, keepdim), np.asarray(array), v.dtype)
    return v


def _layer_norm(b: _Builder, v: Value) -> Value:
    a, d = v.array, v.shape[-1]
    centred = a - a.mean(axis=-1, keepdims=True)
    array = centred / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + 1e-5)
    weight = b.input((d,), b.float_dtype()) if b.chance(0.4) else None
    bias = b.input((d,), b.float_dtype()) if b.chance(0.4) else None
    dtypes = [v.dtype] + [w.dtype for w in (weight, bias) if w is not None]
    b.steps.append("layer_norm" + " with weight" * (weight is not None) + " with bias" * (bias is not None))
    array = array * (weight.array if weight else 1) + (bias.array if bias else 0)
    tensor = nn.layer_norm(v.tensor, weight.tensor if weight else None, bias.tensor if bias else None)
    return Value(tensor, array, _promote(*dtypes))


def _rms_norm(b: _Builder, v: Value) -> Value:
    a, d = v.array, v.shape[-1]
    array = a / np.sqrt((a * a).mean(axis=-1, keepdims=True) + 1e-6)
    weight = b.input((d,), b.float_dtype()) if b.chance(0.4) else None
    b.steps.append("rms_norm" + " with weight" * (weight is not None))
    if weight is None:
        return Value(nn.rms_norm(v.tensor), array, v.dtype)
    return Value(nn.rms_norm(v.tensor, weight.tensor), array * weight.array, _promote(v.dtype, weight.dtype))


def _rows(b: _Builder, v: Value) -> Value:
    """`v` as (..., T, D) with D even, as rope takes it: a vector as one row, an odd last axis cut by one."""
    if v.array.ndim == 1:
        b.steps.append(f"reshape(1, {v.shape[0]})")
        v = _same(v, v.tensor.reshape(1, v.shape[0]), v.array.reshape(1, v.shape[0]))
    if v.shape[-1] % 2:
        b.steps.append(f"index[..., :{v.shape[-1] - 1}]")
        v = _same(v, v.tensor[..., :v.shape[-1] - 1], v.array[..., :v.shape[-1] - 1])
    return v


def _rope(b: _Builder, v: Value) -> Value:
    """Rotary embedding, rotate-half form: pairs (x[i], x[i + D/2]) turned by position t times base**(-2i/D)."""
    base = float(b.choice([10000.0, 100.0]))
    seq, dim = v.shape[-2:]
    half = dim // 2
    angle = np.arange(seq)[:, None] * base ** (-2.0 * np.arange(half)[None, :] / dim)
    x1, x2 = v.array[..., :half], v.array[..., half:]
    array = np.concatenate([x1 * np.cos(angle) - x2 * np.sin(angle), x2 * np.cos(angle) + x1 * np.sin(angle)], -1)
    b.steps.append(f"rope(base={base:g})")
    return Value(nn.rope(v.tensor, base), array, v.dtype)


def _matmul(b: _Builder, v: Value, values: list[Value]) -> Value:
    if v.array.ndim == 0:
        return v
    how = b.choice(["linear", "matmul", "rmatmul"] if v.kind == "float" else ["matmul", "rmatmul"])
    if how == "linear":
        return _linear(b, v)
    left = how == "rmatmul"
    k = v.shape[-2] if left and v.array.ndim >= 2 else v.shape[-1]
    other = _operand(b, v, values, k, left)
    if other is None:
        return v
    first, second = (other, v) if left else (v, other)
    b.steps.append(f"matmul {first.shape} @ {second.shape}")
    return Value(first.tensor @ second.tensor, np.matmul(first.array, second.array), _promote(v.dtype, other.dtype),
                 v.kind == "int32", k * v.bound * other.bound)


def _product_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape of a @ b by numpy's rules, or None where they do not multiply or the product is too large."""
    try:
        shape = np.matmul(np.zeros(a), np.zeros(b)).shape
    except ValueError:
        return None
    return shape if math.prod(shape) <= MAX_ELEMENTS else None


def _operand(b: _Builder, v: Value, values: list[Value], k: int, left: bool) -> Value | None:
    """The other operand of a product with `v` over `k` terms: a value of the graph that fits, or a fresh input (a
    vector, a matrix, or a batch of them that broadcasts with `v`'s batch), weight-scaled as verification draws it;
    None where the fresh one's product would be too large."""
    def fits(shape: tuple[int, ...], bound: int) -> bool:
        pair = (shape, v.shape) if left else (v.shape, shape)
        return bool(shape) and _product_shape(*pair) is not None and (v.kind != "int32" or k * v.bound * bound
                                                                       <= INT_LIMIT)
    known = [w for w in values if w.kind == v.kind and fits(w.shape, w.bound)
             and (v.kind != "float" or k * _magnitude(v) * _magnitude(w) <= PRODUCT_LIMIT)]
    if known and b.chance(0.3):
        return b.pick(known)
    n = int(b.choice(SIZES))
    if b.chance(0.2):
        shape: tuple[int, ...] = (k,)
    else:
        batch = _broadcastable(b, v.shape[:-2]) if b.chance(0.5) else ()
        shape = batch + ((n, k) if left else (k, n))
    if not fits(shape, INT_DRAW):
        return None
    dtype = b.like(v) if v.kind == "int32" or v.dtype == "float32" else v.dtype
    return b.input(shape, dtype, std=k ** -0.5)


def _linear(b: _Builder, v: Value) -> Value:
    k = v.shape[-1]
    n = int(b.choice(SIZES))
    if v.array.size // k * n > MAX_ELEMENTS:
        return v
    weight = b.input((n, k), v.dtype if v.dtype != "float32" else b.float_dtype(), std=k ** -0.5)
    bias = b.input((n,), b.float_dtype()) if b.chance(0.3) else None
    b.steps.append(f"linear to {n}" + " with bias" * (bias is not None))
    array = v.array @ weight.array.T + (bias.array if bias else 0)
    dtype = _promote(v.dtype, weight.dtype, *([bias.dtype] if bias else []))
    return Value(nn.linear(v.tensor, weight.tensor, bias.tensor if bias else None), array, dtype)


def _attention(b: _Builder, v: Value, values: list[Value]) -> Value:
    """nn.attention with `v` as the queries (..., Tq, D); keys and values fresh inputs, or `v` itself."""
    q = v
    if v.array.ndim < 2:
        new = (1,) * (2 - v.array.ndim) + v.shape
        b.steps.append(f"reshape{new}")
        q = _same(v, v.tensor.reshape(new), v.array.reshape(new))
    batch, (tq, d) = q.shape[:-2], q.shape[-2:]
    itself = b.chance(0.25)
    longer = [s for s in SIZES if s >= tq]
    tk = tq if itself else int(b.choice(longer if longer and b.chance(0.5) else SIZES))
    dv = d if itself else int(b.choice(SIZES))
    if math.prod(batch) * max(tq * tk, tk * d, tk * dv, tq * dv) > MAX_ELEMENTS:
        return q
    if itself:
        k = vv = q
    else:
        kv_batch = tuple(1 if b.chance(0.2) else n for n in batch)
        k = b.input(kv_batch + (tk, d), q.dtype if b.chance(0.7) else b.float_dtype())
        vv = b.input(kv_batch + (tk, dv), q.dtype if b.chance(0.7) else b.float_dtype())
    causal = tk >= tq and b.chance(0.4)   # with fewer keys than queries a causal row would hide every key
    scale = b.choice([None, 0.5, 0.125])
    b.steps.append(f"attention(k {k.shape}, v {vv.shape}, causal={causal}, scale={scale})")
    scores = np.matmul(q.array, np.swapaxes(k.array, -1, -2)) * (d ** -0.5 if scale is None else scale)
    if causal:
        scores = scores + _hidden(tq, tk) * MASKED
    array = np.matmul(_softmax(scores, -1), vv.array)
    tensor = nn.attention(q.tensor, k.tensor, vv.tensor, causal=causal, scale=scale)   # type: ignore[arg-type]
    return Value(tensor, array, vv.dtype)


# Indices, embedding, concat and split ---------------------------------------------------------------------------

def _index(b: _Builder, v: Value, values: list[Value]) -> Value:
    how = b.choice(["argmax", "argmin", "embedding"])
    if how != "embedding":
        exact = [w for w in values if w.exact and w.kind in ("float", "int32") and w.array.ndim]
        if not exact:
            return _embedding(b, v, values) if v.array.ndim else v
        w = v if any(w is v for w in exact) else b.pick(exact)
        axis, keepdim = b.axis(w.array.ndim), b.chance(0.4)
        b.steps.append(f"{how}(axis={axis}, keepdim={keepdim})")
        array = getattr(np, str(how))(w.array, axis=axis, keepdims=keepdim)   # numpy also takes the first
        tensor = getattr(nn, str(how))(w.tensor, axis, keepdim)
        return Value(tensor, np.asarray(array, np.int64), "int32", True, w.shape[axis] - 1)
    return _embedding(b, v, values) if v.array.ndim else v


def _embedding(b: _Builder, v: Value, values: list[Value]) -> Value:
    """nn.embedding with `v` as the table (V, ...): ids of the graph's or fresh, most often brought into [0, V) (and
    always where they are an input: out of range, they are refused)."""
    vocab, row = v.shape[0], math.prod(v.shape[1:])
    ids_ok = [w for w in values if w.dtype == "int32" and w.array.size * max(vocab, row) <= MAX_ELEMENTS]
    ids = b.pick(ids_ok) if ids_ok and b.chance(0.5) else None
    if ids is None:
        shape = b.shape(int(b.rng.integers(0, 3)))
        if math.prod(shape) * max(vocab, row) > MAX_ELEMENTS:
            return v
        ids = b.input(shape, "int32")
    if b.chance(0.7) or ids.tensor.node.op == Op.INPUT:   # ids given out of range are an error; computed, zeros
        ids = Value(ids.tensor.abs() % vocab, np.fmod(np.abs(ids.array), vocab), "int32", True, vocab - 1)
        b.steps.append(f"abs mod {vocab}")
    b.steps.append(f"embedding of {ids.shape}")
    valid = (ids.array >= 0) & (ids.array < vocab)
    rows = v.array[np.clip(ids.array, 0, vocab - 1)]
    array = np.where(valid.reshape(valid.shape + (1,) * (v.array.ndim - 1)), rows, 0)   # an id outside: zeros
    return Value(nn.embedding(v.tensor, ids.tensor), array.astype(v.array.dtype), v.dtype, v.exact, v.bound)


def _join(b: _Builder, v: Value, values: list[Value]) -> Value:
    if v.array.ndim == 0:
        return v
    how = b.choice(["concat", "split", "rotate"])
    axis = b.axis(v.array.ndim)
    if how == "concat":
        return _concat(b, v, values, axis)
    n = v.shape[axis]
    cuts = sorted(int(c) for c in b.rng.choice(np.arange(1, n), size=min(n - 1, int(b.rng.integers(1, 3))),
                                                 replace=False)) if n > 1 else []
    sizes = [hi - lo for lo, hi in zip([0] + cuts, cuts + [n])]
    parts = nn.split(v.tensor, sizes, axis)
    arrays = np.split(v.array, cuts, axis=axis)
    if how == "rotate":   # the parts joined the other way round
        b.steps.append(f"rotate by split{sizes} and concat(axis={axis})")
        return _same(v, nn.concat(parts[::-1], axis), np.concatenate(arrays[::-1], axis=axis))
    i = int(b.rng.integers(len(parts)))
    b.steps.append(f"split{sizes}(axis={axis}) part {i}")
    return _same(v, parts[i], arrays[i])


def _concat(b: _Builder, v: Value, values: list[Value], axis: int) -> Value:
    at = axis % v.array.ndim
    per_index = v.array.size // v.shape[at]   # elements per position along the axis

    def joins(w: Value) -> bool:
        return (w.array.ndim == v.array.ndim and w.kind == v.kind and (w.kind == "float" or w.dtype == v.dtype)
                and all(m == n for a, (m, n) in enumerate(zip(w.shape, v.shape)) if a != at))
    parts, length = [v], v.shape[at]
    for _ in range(int(b.rng.integers(1, 3))):
        fits = [w for w in values if joins(w) and (length + w.shape[at]) * per_index <= MAX_ELEMENTS]
        size = int(b.choice(SIZES))
        if fits and b.chance(0.5):
            parts.append(b.pick(fits))
        elif (length + size) * per_index <= MAX_ELEMENTS:
            parts.append(b.input(v.shape[:at] + (size,) + v.shape[at + 1:], b.like(v)))
        else:
            break
        length += parts[-1].shape[at]
    if len(parts) == 1:
        return v
    b.steps.append(f"concat{[p.shape for p in parts]}(axis={axis})")
    return Value(nn.concat([p.tensor for p in parts], axis), np.concatenate([p.array for p in parts], axis=axis),
                 _promote(*(p.dtype for p in parts)), all(p.exact for p in parts), max(p.bound for p in parts))


FLOAT = frozenset({"float"})
NUMBERS = frozenset({"float", "int32"})
ANY = frozenset({"float", "int32", "bool"})
# (step, weight, the kinds of value it takes); a step never met by a value of its kinds takes one cast to them
STEPS: list[tuple[Callable, float, frozenset[str]]] = [
    (_unary, 3, NUMBERS), (_binary, 3, ANY), (_reduce, 1.5, NUMBERS), (_view, 2.5, ANY), (_cast, 0.7, ANY),
    (_layer, 1, FLOAT), (_matmul, 1, NUMBERS), (_where, 0.8, ANY), (_leaf, 0.5, ANY), (_index, 0.6, NUMBERS),
    (_join, 0.6, ANY), (_attention, 0.6, FLOAT),
]


def random_graph(seed: int, ops: int = 6) -> Fuzzed:
    """A graph of `ops` random operations on one to three random inputs, with numpy's value of its outputs."""
    rng = np.random.default_rng(seed)
    graph = ts.Graph(f"fuzz_{seed}")
    b = _Builder(rng, graph)
    values = [b.input(b.shape(), b.input_dtype()) for _ in range(int(rng.integers(1, 4)))]
    weights = np.array([w for _, w, _ in STEPS])
    error = ""
    for _ in range(ops):
        step, _, kinds = STEPS[int(rng.choice(len(STEPS), p=weights / weights.sum()))]
        try:
            takers = [w for w in values if w.kind in kinds]
            v = b.pick(takers) if takers else _convert(b, b.pick(values), kinds)
            values.append(step(b, v, values))
        except Exception as err:   # the public API refused an operation the generator takes to be valid
            error = f"{b.steps[-1] if b.steps else 'step'}: {type(err).__name__}: {err}"
            break
    outputs = [values[-1]] + ([b.pick(values[:-1])] if rng.random() < 0.3 and len(values) > 1 else [])
    expected = {}
    for i, out in enumerate(outputs):
        if any(out.tensor is o.tensor for o in outputs[:i]):
            continue
        graph.output(f"out{i}", out.tensor)
        expected[f"out{i}"] = out.array
    tolerance = max(TOLERANCE[v.dtype] for v in values)
    return Fuzzed(seed, graph, b.inputs, expected, tolerance, b.steps, error)


RMS_FLOOR = 0.1    # below this root-mean-square the error is taken as absolute: a value that cancels to near 0
                   # (the mean of a normalised row) keeps only rounding noise, in numpy and in tensorsmith alike


def error(got: np.ndarray, want: np.ndarray) -> float:
    """||got - want|| / max(||want||, RMS_FLOOR * sqrt(size)) in float64; inf for a shape mismatch or a NaN or an
    infinity on either side (the generator keeps every value finite)."""
    got64, want64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got64.shape != want64.shape or not np.isfinite(got64).all() or not np.isfinite(want64).all():
        return math.inf
    scale = max(float(np.linalg.norm(want64.ravel())), RMS_FLOOR * math.sqrt(max(want64.size, 1)))
    return float(np.linalg.norm((got64 - want64).ravel()) / scale)


def check(fuzzed: Fuzzed, budget_s: float = 1.0) -> tuple[str, str]:
    """(verdict, detail): "ok", "wrong" (a value differs from numpy's), "rejected" (verification refused every
    candidate), "compile error" (another TensorsmithError) or "crash" (any other exception, or one the public API
    raised while the graph was built)."""
    if fuzzed.error:
        return "crash", f"building the graph: {fuzzed.error}"
    try:
        reference = ts.evaluate(fuzzed.graph, fuzzed.inputs)
    except Exception as err:
        return "crash", f"ts.evaluate: {type(err).__name__}: {err}"
    for name, want in fuzzed.expected.items():
        if (e := error(reference[name], want)) > fuzzed.tolerance:
            return "wrong", f"ts.evaluate {name}: relative L2 {e:.3g} > {fuzzed.tolerance:g}"
    try:
        program = ts.compile(fuzzed.graph, profile=False, cache=False, budget_s=budget_s)
        outputs = program(device="cpu", **fuzzed.inputs)
    except VerificationError as err:
        return "rejected", str(err)
    except ts.TensorsmithError as err:
        return "compile error", f"{type(err).__name__}: {err}"
    except Exception as err:
        return "crash", f"compile: {type(err).__name__}: {err}"
    allowed: dict[str, float] | None = None
    for name, want in fuzzed.expected.items():
        if (e := error(outputs[name], want)) > fuzzed.tolerance:
            # a bfloat16 sum whose terms cancel: a program storing the graph's dtypes may lie ROUNDING_NOISE times the
            # graph's own rounding noise away, or as far as the bound on rounding allows (the rule verification applies)
            if allowed is None:
                noise = rounding_noise(fuzzed.graph, fuzzed.inputs, reference)
                bounds = relative_error_bounds(fuzzed.graph, fuzzed.inputs, reference)
                allowed = {out: max(ROUNDING_NOISE * noise[out], bounds[out] if math.isfinite(bounds[out]) else 0.0)
                           for out in noise}
            if not relative_l2(outputs[name], reference[name]) <= allowed[name]:   # the same measure
                return "wrong", (f"program {name}: relative L2 {e:.3g} > {fuzzed.tolerance:g} and >"
                                 f" {allowed[name]:.3g}, what rounding may move it")
    return "ok", ""
