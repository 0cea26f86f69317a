"""Random graphs built through the public API, each with an independent numpy evaluation (issue 18's fuzzer).

`random_graph(seed, ops)` draws one to three inputs (ranks 0 to 4, sizes 1, primes and powers of two, every float
dtype) and applies `ops` random operations of the public API to them: elementwise math, arithmetic with
broadcasting, comparisons, reductions over any axes, views (reshape, permute, slices, pads, expands), casts, matrix
products and nn layers. Every operation is applied twice, once to the tensorsmith Tensor and once, in float64, by
numpy's own functions to an array, so that the expected outputs owe nothing to tensorsmith. As in the reference
interpreter (the oracle of what a graph means), values are rounded to their dtype only where they enter (inputs).
Values are kept in ranges where float16 does not overflow (arguments of exp are bounded, divisors are at least 1).

`check(fuzzed)` compares ts.evaluate and the compiled program (run by the numpy executor) with that expectation
and says which of "crash", "compile error", "rejected", "wrong" or "ok" it is.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.ir.dtypes import round_to_host
from tensorsmith.search.verify import ROUNDING_NOISE, VerificationError, relative_l2, rounding_noise

SIZES = (1, 2, 3, 5, 7, 8, 16)
FLOATS = ("float32", "float16", "bfloat16")
MAX_ELEMENTS = 4096          # keeps a graph's values small enough that hundreds compile in a CI run
TOLERANCE = {"float32": 1e-4, "float16": 3e-2, "bfloat16": 6e-2}   # relative L2 against float64
GELU_C = math.sqrt(2 / math.pi)


@dataclass
class Value:
    tensor: ts.Tensor
    array: np.ndarray        # float64, what numpy says the tensor holds
    dtype: str


@dataclass
class Fuzzed:
    seed: int
    graph: ts.Graph
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]
    tolerance: float
    steps: list[str] = field(default_factory=list)


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
        rank = int(self.rng.integers(0, 5)) if rank is None else rank
        while True:
            shape = tuple(int(self.rng.choice(SIZES)) for _ in range(rank))
            if math.prod(shape) <= MAX_ELEMENTS:
                return shape

    def input(self, shape: tuple[int, ...], dtype: str, std: float = 1.0) -> Value:
        name = f"in{len(self.inputs)}"
        drawn = round_to_host((self.rng.standard_normal(shape) * std).astype(np.float32), ts.DType(dtype))
        self.inputs[name] = np.asarray(drawn)
        self.steps.append(f"{name} = input({shape}, {dtype})")
        value = Value(self.graph.input(name, shape, dtype), _round(np.asarray(drawn, np.float64), dtype), dtype)
        self.input_values.append(value)
        return value

    def pick(self, values: list[Value]) -> Value:
        return values[int(self.rng.integers(len(values)))]

    def choice(self, options: list) -> object:
        return options[int(self.rng.integers(len(options)))]


# Unary operations: (name, on the tensor, on the array); each keeps values in a range float16 holds well.
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
    ("exp_of_tanh", lambda t: nn.tanh(t).exp(), lambda a: np.exp(np.tanh(a))),
    ("log1p_abs", lambda t: (t.abs() + 1).log(), lambda a: np.log(np.abs(a) + 1)),
    ("sqrt", lambda t: (t.abs() + 0.5).sqrt(), lambda a: np.sqrt(np.abs(a) + 0.5)),
    ("rsqrt", lambda t: (t * t + 1).rsqrt(), lambda a: 1 / np.sqrt(a * a + 1)),
    ("recip", lambda t: (t.abs() + 1).recip(), lambda a: 1 / (np.abs(a) + 1)),
    ("scale", lambda t: t * 0.5 + 0.25, lambda a: a * 0.5 + 0.25),
]

BINARY: list[tuple[str, Callable, Callable]] = [
    ("add", lambda a, b: a + b, np.add),
    ("sub", lambda a, b: a - b, np.subtract),
    ("mul", lambda a, b: a * b, np.multiply),
    ("div", lambda a, b: a / (b.abs() + 1), lambda a, b: a / (np.abs(b) + 1)),
    ("less", lambda a, b: (a < b).cast("float32"), lambda a, b: (a < b).astype(np.float64)),
    ("greater_equal", lambda a, b: (a >= b).cast("float32"), lambda a, b: (a >= b).astype(np.float64)),
    ("equal", lambda a, b: (a == b).cast("float32"), lambda a, b: (a == b).astype(np.float64)),
    ("not_equal", lambda a, b: (a != b).cast("float32"), lambda a, b: (a != b).astype(np.float64)),
]


def _promote(a: str, b: str) -> str:
    if a == b:
        return a
    return "float32"           # float16 with bfloat16, or either with float32, is float32 (as PyTorch promotes)


def _unary(b: _Builder, v: Value) -> Value:
    name, on_tensor, on_array = b.choice(UNARY)   # type: ignore[misc]
    b.steps.append(f"{name}")
    return Value(on_tensor(v.tensor), on_array(v.array), v.dtype)


COMPARISONS = ("less", "greater_equal", "equal", "not_equal")


def _binary(b: _Builder, v: Value, values: list[Value]) -> Value:
    name, on_tensor, on_array = b.choice(BINARY)   # type: ignore[misc]
    if name in COMPARISONS:
        # only inputs are compared: a computed value is rounded differently by the float64 reference, the
        # kernels' float32 registers and numpy's step-by-step rounding, so a comparison near a tie would flip
        v, values = b.pick(b.input_values), b.input_values
    partners = [w for w in values if _broadcasts(v.array.shape, w.array.shape)]
    other = b.pick(partners) if partners and b.rng.random() < 0.7 else b.input(_broadcastable(b, v.array.shape),
                                                                                b.choice(list(FLOATS)))
    dtype = "float32" if name in COMPARISONS else _promote(v.dtype, other.dtype)
    b.steps.append(f"{name} with {tuple(other.array.shape)}")
    return Value(on_tensor(v.tensor, other.tensor), on_array(v.array, other.array), dtype)


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    try:
        np.broadcast_shapes(a, b)
        return True
    except ValueError:
        return False


def _broadcastable(b: _Builder, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts against `shape`: some of its trailing axes, some of them 1."""
    keep = int(b.rng.integers(0, len(shape) + 1))
    return tuple(1 if b.rng.random() < 0.4 else n for n in shape[len(shape) - keep:])


def _reduce(b: _Builder, v: Value) -> Value:
    rank = v.array.ndim
    how = b.choice(["sum", "max", "mean"])
    if rank == 0 or b.rng.random() < 0.2:
        axes = None
    else:
        count = int(b.rng.integers(1, rank + 1))
        axes = tuple(sorted(int(a) for a in b.rng.choice(rank, size=count, replace=False)))
    keepdim = bool(b.rng.random() < 0.5)
    b.steps.append(f"{how}(axis={axes}, keepdim={keepdim})")
    tensor = getattr(v.tensor, how)(axis=axes, keepdim=keepdim)
    array = getattr(np, how if how != "max" else "amax")(v.array, axis=axes, keepdims=keepdim)
    return Value(tensor, np.asarray(array, np.float64), v.dtype)


def _view(b: _Builder, v: Value) -> Value:
    shape, rank = v.array.shape, v.array.ndim
    kind = b.choice(["reshape", "permute", "slice", "pad", "expand", "contiguous"] if rank else
                    ["reshape", "contiguous"])
    if kind == "reshape":
        new = _refactor(b, v.array.size)
        b.steps.append(f"reshape{new}")
        return Value(v.tensor.reshape(*new) if new else v.tensor.reshape(()), v.array.reshape(new), v.dtype)
    if kind == "permute":
        axes = tuple(int(a) for a in b.rng.permutation(rank))
        b.steps.append(f"permute{axes}")
        return Value(v.tensor.permute(*axes), np.transpose(v.array, axes), v.dtype)
    if kind == "slice":
        axis = int(b.rng.integers(rank))
        start = int(b.rng.integers(0, shape[axis]))
        stop = int(b.rng.integers(start + 1, shape[axis] + 1))
        index = tuple(slice(start, stop) if a == axis else slice(None) for a in range(rank))
        b.steps.append(f"slice axis {axis} [{start}:{stop}]")
        return Value(v.tensor[index], v.array[index], v.dtype)
    if kind == "pad":
        axis = int(b.rng.integers(rank))
        widths = [(0, 0)] * rank
        widths[axis] = (int(b.rng.integers(0, 3)), int(b.rng.integers(0, 3)))
        if math.prod(n + sum(w) for n, w in zip(shape, widths)) > MAX_ELEMENTS:
            return v
        b.steps.append(f"pad{widths}")
        return Value(v.tensor.pad(widths), np.pad(v.array, widths), v.dtype)
    if kind == "expand":
        ones = [a for a in range(rank) if shape[a] == 1]
        if not ones:
            return v
        axis = int(b.choice(ones))
        new = tuple(int(b.choice(SIZES)) if a == axis else n for a, n in enumerate(shape))
        if math.prod(new) > MAX_ELEMENTS:
            return v
        b.steps.append(f"expand{new}")
        return Value(v.tensor.expand(*new), np.broadcast_to(v.array, new).copy(), v.dtype)
    b.steps.append("contiguous")
    return Value(v.tensor.contiguous(), v.array.copy(), v.dtype)


def _refactor(b: _Builder, size: int) -> tuple[int, ...]:
    """A random shape of `size` elements, rank 0 to 4 (rank 0 only for one element)."""
    factors, p, rest = [], 2, size
    while rest > 1:
        while rest % p == 0:
            factors.append(p)
            rest //= p
        p += 1
    b.rng.shuffle(factors)
    groups = int(b.rng.integers(1 if factors else 0, min(4, max(1, len(factors))) + 1))
    shape = [1] * groups
    for i, f in enumerate(factors):
        shape[i % groups] *= f
    if len(shape) < 4 and b.rng.random() < 0.3:
        shape.insert(int(b.rng.integers(len(shape) + 1)), 1)
    return tuple(shape)


def _cast(b: _Builder, v: Value) -> Value:
    dtype = str(b.choice([d for d in FLOATS if d != v.dtype]))
    b.steps.append(f"cast({dtype})")
    # the reference interpreter does not round at a cast to a narrower float (its CAST is x.astype(float64)), while
    # the kernels do; the expectation follows the interpreter, and the tolerance covers the kernels' rounding
    # (issue 17: the CPU's numerics should be what runs)
    return Value(v.tensor.cast(dtype), v.array, dtype)


def _layer(b: _Builder, v: Value) -> Value:
    if v.array.ndim == 0:
        return v
    axis = -1 if b.rng.random() < 0.6 else int(b.rng.integers(v.array.ndim))
    kind = b.choice(["softmax", "log_softmax", "layer_norm", "rms_norm"])
    a = v.array
    if kind in ("softmax", "log_softmax"):
        e = np.exp(a - a.max(axis=axis, keepdims=True))
        s = e / e.sum(axis=axis, keepdims=True)
        array = s if kind == "softmax" else np.log(s)
        tensor = getattr(nn, kind)(v.tensor, axis=axis)
        b.steps.append(f"{kind}(axis={axis})")
    elif kind == "layer_norm":
        centred = a - a.mean(axis=-1, keepdims=True)
        array = centred / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + 1e-5)
        tensor = nn.layer_norm(v.tensor)
        b.steps.append("layer_norm")
    else:
        array = a / np.sqrt((a * a).mean(axis=-1, keepdims=True) + 1e-6)
        tensor = nn.rms_norm(v.tensor)
        b.steps.append("rms_norm")
    return Value(tensor, array, v.dtype)


def _matmul(b: _Builder, v: Value) -> Value:
    if v.array.ndim == 0:
        return v
    k = v.array.shape[-1]
    n = int(b.choice(SIZES))
    if v.array.size // k * n > MAX_ELEMENTS:
        return v
    weight = b.input((n, k), v.dtype if v.dtype != "float32" else str(b.choice(list(FLOATS))), std=k ** -0.5)
    dtype = _promote(v.dtype, weight.dtype)
    b.steps.append(f"linear to {n}")
    return Value(nn.linear(v.tensor, weight.tensor), v.array @ weight.array.T, dtype)


STEPS: list[tuple[Callable, float]] = [(_unary, 3), (_binary, 3), (_reduce, 1.5), (_view, 2.5), (_cast, 0.7),
                                       (_layer, 1), (_matmul, 1)]


def random_graph(seed: int, ops: int = 6) -> Fuzzed:
    """A graph of `ops` random operations on one to three random inputs, with numpy's value of its outputs."""
    rng = np.random.default_rng(seed)
    graph = ts.Graph(f"fuzz_{seed}")
    b = _Builder(rng, graph)
    values = [b.input(b.shape(), str(b.choice(list(FLOATS)))) for _ in range(int(rng.integers(1, 4)))]
    weights = np.array([w for _, w in STEPS])
    for _ in range(ops):
        step = STEPS[int(rng.choice(len(STEPS), p=weights / weights.sum()))][0]
        v = b.pick(values)
        values.append(step(b, v, values) if step is _binary else step(b, v))
    outputs = [values[-1]] + ([b.pick(values[:-1])] if rng.random() < 0.3 else [])
    expected = {}
    for i, out in enumerate(outputs):
        if any(out.tensor is o.tensor for o in outputs[:i]):
            continue
        graph.output(f"out{i}", out.tensor)
        expected[f"out{i}"] = out.array
    used = {o.dtype for o in values}
    tolerance = max(TOLERANCE[d] for d in used)
    return Fuzzed(seed, graph, b.inputs, expected, tolerance, b.steps)


RMS_FLOOR = 0.1    # below this root-mean-square the error is taken as absolute: a value that cancels to near 0
                   # (the mean of a normalised row) keeps only rounding noise, in numpy and in tensorsmith alike


def error(got: np.ndarray, want: np.ndarray) -> float:
    """||got - want|| / max(||want||, RMS_FLOOR * sqrt(size)) in float64; inf for a shape mismatch or a NaN."""
    got64, want64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got64.shape != want64.shape or not np.isfinite(got64).all():
        return math.inf
    scale = max(float(np.linalg.norm(want64.ravel())), RMS_FLOOR * math.sqrt(max(want64.size, 1)))
    return float(np.linalg.norm((got64 - want64).ravel()) / scale)


def check(fuzzed: Fuzzed, budget_s: float = 1.0) -> tuple[str, str]:
    """(verdict, detail): "ok", "wrong" (a value differs from numpy's), "rejected" (verification refused every
    candidate), "compile error" (another TensorsmithError) or "crash" (any other exception)."""
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
    noise: dict[str, float] | None = None
    for name, want in fuzzed.expected.items():
        if (e := error(outputs[name], want)) > fuzzed.tolerance:
            # a bfloat16 sum whose terms cancel: the graph evaluated at its own precision is as far off, and a program
            # storing the graph's dtypes may be ROUNDING_NOISE times that (the rule verification applies)
            noise = noise if noise is not None else rounding_noise(fuzzed.graph, fuzzed.inputs, reference)
            if not relative_l2(outputs[name], reference[name]) <= ROUNDING_NOISE * noise[name]:   # the same measure
                return "wrong", (f"program {name}: relative L2 {e:.3g} > {fuzzed.tolerance:g} and > {ROUNDING_NOISE:g}"
                                 f" x the graph's own rounding noise {noise[name]:.3g}")
    return "ok", ""
