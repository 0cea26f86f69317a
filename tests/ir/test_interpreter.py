"""The reference interpreter, op by op, against plain numpy formulas.

Every primitive is built through the public API, checked to be the primitive it claims to be,
evaluated on fresh random inputs and compared with numpy in float64.
"""
from typing import Callable

import numpy as np
import pytest

import tensorsmith as ts
from tensorsmith.ir import Op
from graph_cases import CASES
from tensorsmith.ir import primitives as P
from tensorsmith.ir.interpreter import check_inputs, evaluate_nodes
from tensorsmith.search.verify import random_inputs

EXACT = dict(rtol=1e-12, atol=0)


def run(fn: Callable[..., ts.Tensor], **arrays: np.ndarray) -> np.ndarray:
    """Build a graph whose inputs are `arrays` (named, typed as given), output fn(*inputs), and evaluate it."""
    g = ts.Graph("t")
    tensors = {name: g.input(name, a.shape, str(a.dtype)) for name, a in arrays.items()}
    g.output("y", fn(**tensors))
    return ts.evaluate(g, arrays)["y"]


def normal(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Standard normal float32 values, none of them zero."""
    x = rng.standard_normal(shape).astype(np.float32)
    return np.where(x == 0, np.float32(0.5), x)


def positive(rng: np.random.Generator, shape: tuple[int, ...], low: float = 0.1, high: float = 10.0) -> np.ndarray:
    return rng.uniform(low, high, shape).astype(np.float32)


def signed(rng: np.random.Generator, shape: tuple[int, ...], low: float = 0.25, high: float = 4.0) -> np.ndarray:
    """Values of either sign whose magnitude lies in [low, high): safe divisors."""
    sign = rng.choice(np.array([-1.0, 1.0], np.float32), shape)
    return (sign * rng.uniform(low, high, shape)).astype(np.float32)


SHAPES = [(), (7,), (3, 5), (2, 3, 4)]


# unary primitives ------------------------------------------------------------------------------

UNARY = [
    # (op, method, numpy formula, input maker)
    (Op.EXP2, "exp2", np.exp2, normal),
    (Op.LOG2, "log2", np.log2, positive),
    (Op.SIN, "sin", np.sin, lambda rng, s: normal(rng, s) * 4),
    (Op.SQRT, "sqrt", np.sqrt, positive),
    (Op.RECIP, "recip", lambda x: 1.0 / x, signed),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op, method, formula, make", UNARY, ids=[str(u[0]) for u in UNARY])
def test_unary(op, method, formula, make, shape, rng):
    x = make(rng, shape)

    def build(x):
        y = getattr(x, method)()
        assert y.node.op == op and y.node.srcs == (x.node,)
        assert y.shape == x.shape and y.dtype == x.dtype
        return y

    got = run(build, x=x)
    assert got.dtype == np.float64 and got.shape == shape
    np.testing.assert_allclose(got, formula(x.astype(np.float64)), **EXACT)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_unary_keeps_every_float_dtype(dtype):
    g = ts.Graph("t")
    x = g.input("x", (3,), dtype)
    for method in ("exp2", "log2", "sin", "sqrt", "recip"):
        assert getattr(x, method)().dtype == ts.DType(dtype)


def test_float_ops_do_not_round_to_the_declared_dtype(rng):
    # the reference computes in float64 whatever the declared dtype: 1 + 2**-20 is not a float16
    x = np.full((3,), 2.0 ** -20, np.float64).astype(np.float16).astype(np.float32)
    got = run(lambda x: x.cast("float16") + 1.0, x=x)
    np.testing.assert_array_equal(got, 1.0 + x.astype(np.float64))


def test_unary_special_values():
    x = np.array([0.0, -0.0, -1.0, np.inf, 1.0], np.float32)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(run(lambda x: x.recip(), x=x), 1.0 / x.astype(np.float64))
        np.testing.assert_array_equal(run(lambda x: x.log2(), x=x), np.log2(x.astype(np.float64)))
        np.testing.assert_array_equal(run(lambda x: x.sqrt(), x=x), np.sqrt(x.astype(np.float64)))


# binary primitives -----------------------------------------------------------------------------

BINARY = [
    (Op.ADD, lambda a, b: a + b, np.add),
    (Op.MUL, lambda a, b: a * b, np.multiply),
    (Op.MOD, lambda a, b: a % b, np.fmod),
    (Op.LESS_THAN, lambda a, b: a < b, np.less),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op, build, formula", BINARY, ids=[str(b[0]) for b in BINARY])
def test_binary_float(op, build, formula, shape, rng):
    a, b = normal(rng, shape) * 5, signed(rng, shape)

    def graph(a, b):
        y = build(a, b)
        assert y.node.op == op and y.node.srcs == (a.node, b.node)
        return y

    got = run(graph, a=a, b=b)
    expected = formula(a.astype(np.float64), b.astype(np.float64))
    assert got.dtype == expected.dtype and got.shape == shape
    np.testing.assert_allclose(got, expected, **EXACT)


@pytest.mark.parametrize("op, build, formula", BINARY, ids=[str(b[0]) for b in BINARY])
def test_binary_int32(op, build, formula, rng):
    a = rng.integers(-1000, 1000, (4, 6), dtype=np.int32)
    b = (rng.integers(1, 50, (4, 6)) * rng.choice([-1, 1], (4, 6))).astype(np.int32)
    got = run(build, a=a, b=b)
    expected = formula(a, b)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_int32_add_and_mul_wrap_around():
    a = np.array([2 ** 31 - 1, -2 ** 31, 65536], np.int32)
    b = np.array([1, -1, 65536], np.int32)
    np.testing.assert_array_equal(run(lambda a, b: a + b, a=a, b=b), np.array([-2 ** 31, 2 ** 31 - 1, 131072]))
    np.testing.assert_array_equal(run(lambda a, b: a * b, a=a, b=b), np.array([2 ** 31 - 1, -2 ** 31, 0]))


MOD_CASES = [(7, 3, 1), (-7, 3, -1), (7, -3, 1), (-7, -3, -1), (6, 3, 0), (2, 5, 2), (-2, 5, -2)]


@pytest.mark.parametrize("dtype", ["int32", "float32"])
def test_mod_is_c_fmod_not_python_modulo(dtype):
    # C fmod / truncated remainder: the result takes the dividend's sign (Python's % takes the divisor's)
    a = np.array([c[0] for c in MOD_CASES], dtype)
    b = np.array([c[1] for c in MOD_CASES], dtype)
    got = run(lambda a, b: a % b, a=a, b=b)
    np.testing.assert_array_equal(got, np.array([c[2] for c in MOD_CASES]))
    assert got.dtype == (np.int32 if dtype == "int32" else np.float64)


def test_mod_float_fractions(rng):
    a, b = normal(rng, (50,)) * 10, signed(rng, (50,))
    got = run(lambda a, b: a % b, a=a, b=b)
    np.testing.assert_allclose(got, np.fmod(a.astype(np.float64), b.astype(np.float64)), **EXACT)
    assert np.all((got == 0) | (np.sign(got) == np.sign(a)))
    assert np.all(np.abs(got) < np.abs(b))


def test_less_than_on_bool():
    a = np.array([False, False, True, True])
    b = np.array([False, True, False, True])
    np.testing.assert_array_equal(run(lambda a, b: a < b, a=a, b=b), [False, True, False, False])


COMPARISONS = [
    ("lt", lambda a, b: a < b, np.less),
    ("gt", lambda a, b: a > b, np.greater),
    ("le", lambda a, b: a <= b, np.less_equal),
    ("ge", lambda a, b: a >= b, np.greater_equal),
]


@pytest.mark.parametrize("name, build, formula", COMPARISONS, ids=[c[0] for c in COMPARISONS])
def test_comparisons_including_ties(name, build, formula, rng):
    a = rng.integers(-3, 4, (40,)).astype(np.float32)
    b = rng.integers(-3, 4, (40,)).astype(np.float32)  # many ties: <= and >= must get them right
    got = run(build, a=a, b=b)
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, formula(a, b))


# reductions ------------------------------------------------------------------------------------

@pytest.mark.parametrize("op, formula", [(Op.SUM, np.sum), (Op.MAX, np.max)], ids=["sum", "max"])
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
def test_reduce_primitive_one_axis(op, formula, axis, rng):
    x = normal(rng, (3, 4, 5))

    def build(x):
        y = getattr(x, str(op))(axis)
        assert y.node.op == op and y.node.arg == axis % 3
        return y

    got = run(build, x=x)
    np.testing.assert_allclose(got, formula(x.astype(np.float64), axis=axis), **EXACT)


@pytest.mark.parametrize("method, formula", [("sum", np.sum), ("max", np.max), ("mean", np.mean)])
@pytest.mark.parametrize("axis", [None, 0, -1, (0, 2), (-1, 1), (0, 1, 2), [2, -3], ()])
@pytest.mark.parametrize("keepdim", [False, True])
def test_reductions_several_axes_and_keepdim(method, formula, axis, keepdim, rng):
    x = normal(rng, (3, 4, 5))
    np_axis = tuple(axis) if isinstance(axis, list) else axis
    expected = formula(x.astype(np.float64), axis=np_axis, keepdims=keepdim)
    got = run(lambda x: getattr(x, method)(axis, keepdim=keepdim), x=x)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-15)


def test_numpy_integers_and_iterables_as_axes(rng):
    x = normal(rng, (3, 4, 5))
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(run(lambda x: x.sum(np.int64(-1)), x=x), x64.sum(-1), **EXACT)
    np.testing.assert_allclose(run(lambda x: x.max(np.array([0, 2])), x=x), x64.max((0, 2)), **EXACT)
    np.testing.assert_allclose(run(lambda x: x.mean(range(2)), x=x), x64.mean((0, 1)), **EXACT)
    np.testing.assert_array_equal(run(lambda x: x.permute(np.int32(2), 0, 1), x=x), x64.transpose(2, 0, 1))
    np.testing.assert_array_equal(run(lambda x: x.transpose(np.int64(0), -1), x=x), x64.swapaxes(0, -1))


def test_mean_over_an_empty_axis_is_nan():
    got = run(lambda x: x.mean(0), x=np.ones((0, 3), np.float32))
    assert got.shape == (3,) and np.isnan(got).all()


def test_max_of_all_negative_values(rng):
    x = -positive(rng, (6, 7))
    np.testing.assert_array_equal(run(lambda x: x.max(-1), x=x), x.max(-1))


@pytest.mark.parametrize("method", ["sum", "max"])
def test_reduce_int32_stays_int32(method, rng):
    x = rng.integers(-100, 100, (5, 6), dtype=np.int32)
    got = run(lambda x: getattr(x, method)(0), x=x)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, getattr(x, method)(0))


def test_sum_over_an_empty_axis_is_zero():
    got = run(lambda x: x.sum(0), x=np.ones((0, 3), np.float32))
    np.testing.assert_array_equal(got, np.zeros(3))


# leaves ----------------------------------------------------------------------------------------

def evaluate_leaf(tensor: ts.Tensor) -> np.ndarray:
    g = ts.Graph("leaf")
    g.output("y", tensor)
    return ts.evaluate(g, {})["y"]


@pytest.mark.parametrize("value, dtype, np_dtype", [
    (2.5, "float32", np.float64), (-3.25, "float16", np.float64), (0.1, "bfloat16", np.float64),
    (7, "int32", np.int32), (-4.0, "int32", np.int32), (True, "bool", np.bool_), (0, "bool", np.bool_),
    (3, "float32", np.float64),
])
@pytest.mark.parametrize("shape", [(), (4,), (2, 3)])
def test_constant(value, dtype, np_dtype, shape):
    c = ts.constant(value, shape, dtype)
    assert c.node.op == Op.CONSTANT and c.shape == shape and c.dtype == ts.DType(dtype)
    got = evaluate_leaf(c)
    assert got.dtype == np_dtype and got.shape == shape
    np.testing.assert_array_equal(got, np.full(shape, value, np_dtype))


@pytest.mark.parametrize("shape, axis", [((5,), 0), ((3, 4), 0), ((3, 4), 1), ((3, 4), -1), ((2, 3, 4), 1),
                                         ((2, 3, 4), -3)])
def test_iota(shape, axis):
    t = ts.iota(shape, axis)
    assert t.node.op == Op.IOTA and t.dtype == ts.DType.INT32
    got = evaluate_leaf(t)
    expected = np.indices(shape)[axis]
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, expected)


def test_input_passes_through_as_float64_copy(rng):
    x = normal(rng, (3, 4))
    got = run(lambda x: x, x=x)
    assert got.dtype == np.float64
    got[0, 0] = 123.0
    assert x[0, 0] != 123.0, "the output must not alias the caller's input"


def test_float16_input_values_are_exact(rng):
    x = normal(rng, (5, 5)).astype(np.float16)
    np.testing.assert_array_equal(run(lambda x: x * 1.0, x=x), x.astype(np.float64))


# cast ------------------------------------------------------------------------------------------

def test_cast_float_to_int_truncates_toward_zero():
    x = np.array([2.7, -2.7, 0.5, -0.5, 3.0, -3.0, 1e6 + 0.9], np.float64).astype(np.float32)
    got = run(lambda x: x.cast("int32"), x=x)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [2, -2, 0, 0, 3, -3, 1000000])


def test_cast_to_bool_is_not_equal_to_zero():
    f = np.array([0.0, -0.0, 1e-30, -2.5, np.nan], np.float32)
    i = np.array([0, 1, -1, 7], np.int32)
    np.testing.assert_array_equal(run(lambda f: f.cast("bool"), f=f), [False, False, True, True, True])
    np.testing.assert_array_equal(run(lambda i: i.cast("bool"), i=i), [False, True, True, True])


def test_cast_from_bool_and_int(rng):
    b = rng.random((10,)) < 0.5
    i = rng.integers(-50, 50, (10,), dtype=np.int32)
    got_f = run(lambda b: b.cast("float32"), b=b)
    got_i = run(lambda b: b.cast("int32"), b=b)
    assert got_f.dtype == np.float64 and got_i.dtype == np.int32
    np.testing.assert_array_equal(got_f, b.astype(np.float64))
    np.testing.assert_array_equal(got_i, b.astype(np.int32))
    np.testing.assert_array_equal(run(lambda i: i.cast("float16"), i=i), i.astype(np.float64))


def test_cast_node_and_no_op_cast():
    g = ts.Graph("t")
    x = g.input("x", (3,), "float16")
    assert x.cast("float16") is not None and x.cast("float16").node is x.node
    y = x.cast("float32")
    assert y.node.op == Op.CAST and y.dtype == ts.DType.FLOAT32 and y.node.srcs == (x.node,)


# views -----------------------------------------------------------------------------------------

VIEWS = [
    # (name, tensorsmith view, numpy view, op), on a (2, 3, 4) input
    ("reshape", lambda x: x.reshape(4, 6), lambda a: a.reshape(4, 6), Op.RESHAPE),
    ("reshape-infer", lambda x: x.reshape(-1, 2), lambda a: a.reshape(-1, 2), Op.RESHAPE),
    ("reshape-flat", lambda x: x.reshape((24,)), lambda a: a.reshape(24), Op.RESHAPE),
    ("permute", lambda x: x.permute(2, 0, 1), lambda a: a.transpose(2, 0, 1), Op.PERMUTE),
    ("permute-negative", lambda x: x.permute((-1, -3, -2)), lambda a: a.transpose(2, 0, 1), Op.PERMUTE),
    ("transpose", lambda x: x.transpose(0, 2), lambda a: a.swapaxes(0, 2), Op.PERMUTE),
    ("T", lambda x: x.T, lambda a: a.T, Op.PERMUTE),
    ("expand", lambda x: x[:, :1, :].expand(2, 5, 4), lambda a: np.broadcast_to(a[:, :1], (2, 5, 4)), Op.EXPAND),
    ("expand-lead", lambda x: x.expand(3, 2, 3, 4), lambda a: np.broadcast_to(a, (3, 2, 3, 4)), Op.EXPAND),
    ("slice", lambda x: x[1:, 0:2, 1:3], lambda a: a[1:, 0:2, 1:3], Op.SLICE),
    ("pad", lambda x: x.pad([(1, 0), (0, 2), (3, 1)]), lambda a: np.pad(a, [(1, 0), (0, 2), (3, 1)]), Op.PAD),
    ("contiguous", lambda x: x.contiguous(), lambda a: a, Op.CONTIGUOUS),
]


@pytest.mark.parametrize("name, view, np_view, op", VIEWS, ids=[v[0] for v in VIEWS])
def test_views(name, view, np_view, op, rng):
    x = normal(rng, (2, 3, 4))

    def build(x):
        y = view(x)
        assert y.node.op == op
        return y

    expected = np_view(x.astype(np.float64))
    got = run(build, x=x)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("bounds", [((0, 2), (1, 3), (0, 4)), ((1, 1), (0, 3), (0, 4)), ((0, 2), (2, 3), (3, 4))])
def test_slice_primitive(bounds, rng):
    x = normal(rng, (2, 3, 4))
    got = run(lambda x: ts.Tensor(P.slice_(x.node, bounds)), x=x)
    np.testing.assert_array_equal(got, x[tuple(slice(lo, hi) for lo, hi in bounds)])


def test_pad_fills_zero_for_every_dtype(rng):
    i = rng.integers(1, 9, (2, 2), dtype=np.int32)
    b = np.ones((2, 2), bool)
    np.testing.assert_array_equal(run(lambda i: i.pad([(1, 1), (0, 1)]), i=i), np.pad(i, [(1, 1), (0, 1)]))
    got_b = run(lambda b: b.pad([(0, 1), (2, 0)]), b=b)
    assert got_b.dtype == np.bool_
    np.testing.assert_array_equal(got_b, np.pad(b, [(0, 1), (2, 0)]))


def test_identity_views_add_no_node():
    g = ts.Graph("t")
    x = g.input("x", (2, 3), "float32")
    for same in (x.reshape(2, 3), x.permute(0, 1), x.expand(2, 3), x[:, :], x[...], x.pad([(0, 0), (0, 0)])):
        assert same.node is x.node


COMPOSED = [
    ("permute(slice(reshape(pad)))",
     lambda x: x.pad([(1, 1), (0, 2)]).reshape(3, 2, 7)[1:3, :, 1:].permute(2, 0, 1),
     lambda a: np.pad(a, [(1, 1), (0, 2)]).reshape(3, 2, 7)[1:3, :, 1:].transpose(2, 0, 1)),
    ("reshape(permute(expand(slice)))",
     lambda x: x[:1, 2:5].expand(3, 3).permute(1, 0).reshape(9),
     lambda a: np.broadcast_to(a[:1, 2:5], (3, 3)).T.reshape(9)),
    ("pad(permute(reshape(permute)))",
     lambda x: x.permute(1, 0).reshape(2, 5, 2).permute(2, 0, 1).pad([(0, 1), (2, 0), (1, 1)]),
     lambda a: np.pad(a.T.reshape(2, 5, 2).transpose(2, 0, 1), [(0, 1), (2, 0), (1, 1)])),
    ("slice(pad(slice(pad)))",
     lambda x: x.pad([(2, 2), (2, 2)])[1:5, 3:7].pad([(0, 3), (1, 0)])[2:, :4],
     lambda a: np.pad(np.pad(a, 2)[1:5, 3:7], [(0, 3), (1, 0)])[2:, :4]),
    ("arithmetic between views",
     lambda x: x.T.reshape(5, 2, 2)[:, 0, :] * x.reshape(2, 10)[:, 3:8].contiguous().T + x.sum(0)[3:5],
     lambda a: a.T.reshape(5, 2, 2)[:, 0, :] * a.reshape(2, 10)[:, 3:8].T + a.sum(0)[3:5]),
]


@pytest.mark.parametrize("name, view, np_view", COMPOSED, ids=[c[0] for c in COMPOSED])
def test_views_composed(name, view, np_view, rng):
    x = normal(rng, (4, 5))
    expected = np_view(x.astype(np.float64))
    got = run(view, x=x)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, **EXACT)


# broadcasting through the operators ------------------------------------------------------------

BROADCASTS = [((3, 1), (1, 4)), ((5,), (2, 5)), ((2, 1, 4), (3, 1)), ((), (3,)), ((4, 3), ()),
              ((1,), (2, 3)), ((2, 3, 1), (2, 1, 5)), ((1, 1, 6), (6,))]
OPERATORS = [
    ("add", lambda a, b: a + b), ("sub", lambda a, b: a - b), ("mul", lambda a, b: a * b),
    ("div", lambda a, b: a / b), ("mod", lambda a, b: a % b), ("lt", lambda a, b: a < b),
    ("gt", lambda a, b: a > b), ("le", lambda a, b: a <= b), ("ge", lambda a, b: a >= b),
]
NUMPY_OPERATORS = {"mod": np.fmod}


@pytest.mark.parametrize("a_shape, b_shape", BROADCASTS, ids=[f"{a}-{b}" for a, b in BROADCASTS])
@pytest.mark.parametrize("name, operator", OPERATORS, ids=[o[0] for o in OPERATORS])
def test_operators_broadcast_like_numpy(name, operator, a_shape, b_shape, rng):
    a, b = normal(rng, a_shape) * 3, signed(rng, b_shape)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    expected = NUMPY_OPERATORS.get(name, operator)(a64, b64)
    got = run(operator, a=a, b=b)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, **EXACT)


SCALARS = [
    ("x + s", lambda x, s: x + s, lambda x, s: x + s), ("s + x", lambda x, s: s + x, lambda x, s: s + x),
    ("x - s", lambda x, s: x - s, lambda x, s: x - s), ("s - x", lambda x, s: s - x, lambda x, s: s - x),
    ("x * s", lambda x, s: x * s, lambda x, s: x * s), ("s * x", lambda x, s: s * x, lambda x, s: s * x),
    ("x / s", lambda x, s: x / s, lambda x, s: x / s), ("s / x", lambda x, s: s / x, lambda x, s: s / x),
    ("x % s", lambda x, s: x % s, np.fmod), ("-x", lambda x, s: -x, lambda x, s: -x),
    ("x < s", lambda x, s: x < s, lambda x, s: x < s), ("s < x", lambda x, s: s < x, lambda x, s: s < x),
    ("abs", lambda x, s: x.abs(), lambda x, s: np.abs(x)),
    ("maximum", lambda x, s: ts.nn.maximum(x, s), np.maximum),
    ("where", lambda x, s: ts.nn.where(x < 0, x * s, x), lambda x, s: np.where(x < 0, x * s, x)),
]


@pytest.mark.parametrize("scalar", [1.75, -3, np.float32(0.5)], ids=["float", "int", "numpy"])
@pytest.mark.parametrize("name, build, formula", SCALARS, ids=[s[0] for s in SCALARS])
def test_python_scalars(name, build, formula, scalar, rng):
    x = signed(rng, (3, 4))
    got = run(lambda x: build(x, scalar), x=x)
    np.testing.assert_allclose(got, formula(x.astype(np.float64), float(scalar)), rtol=1e-12, atol=1e-15)


# getitem ---------------------------------------------------------------------------------------

INDICES = [
    1, -1, slice(1, 3), slice(None, -1), slice(-3, None), slice(2, 100), slice(3, 1),
    (0, 1), (-1, -2, -3), (slice(None), -2), (Ellipsis, 0), (Ellipsis, slice(1, 4)), (0, Ellipsis),
    (None,), (None, 1), (0, None, slice(1, None)), (Ellipsis, None), (slice(-3, -1), Ellipsis, 2),
    (None, Ellipsis, None), (1, slice(None), None, -1), Ellipsis, (slice(None), slice(None), slice(None)),
]


@pytest.mark.parametrize("index", INDICES, ids=[repr(i) for i in INDICES])
def test_getitem_matches_numpy(index, rng):
    x = normal(rng, (4, 5, 6))
    expected = x.astype(np.float64)[index]
    got = run(lambda x: x[index], x=x)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def test_getitem_of_getitem(rng):
    x = normal(rng, (4, 5, 6))
    got = run(lambda x: x[1:][..., ::1][None][0, -1][2:4], x=x)
    np.testing.assert_array_equal(got, x.astype(np.float64)[1:][..., ::1][None][0, -1][2:4])


# graphs with no input, shared nodes, deep chains -----------------------------------------------

def test_graph_without_inputs():
    g = ts.Graph("leafy")
    g.output("y", (ts.iota((3, 4), 1).cast("float32") + ts.constant(0.5, (3, 4))).sum(-1))
    np.testing.assert_array_equal(ts.evaluate(g, {})["y"], np.full(3, 8.0))


def test_shared_subexpression_and_several_outputs(rng):
    g = ts.Graph("t")
    x = g.input("x", (6,), "float32")
    e = x.exp2()
    g.output("a", e + e)
    g.output("b", e * x)
    g.output("c", e)
    xv = normal(rng, (6,))
    out = ts.evaluate(g, {"x": xv})
    e64 = np.exp2(xv.astype(np.float64))
    assert set(out) == {"a", "b", "c"}
    np.testing.assert_allclose(out["a"], 2 * e64, **EXACT)
    np.testing.assert_allclose(out["b"], e64 * xv, **EXACT)
    np.testing.assert_allclose(out["c"], e64, **EXACT)


def test_deep_chain_does_not_recurse(rng):
    g = ts.Graph("deep")
    x = g.input("x", (2,), "float32")
    y = x
    for _ in range(3000):
        y = y + 1.0
    g.output("y", y)
    xv = normal(rng, (2,))
    np.testing.assert_allclose(ts.evaluate(g, {"x": xv})["y"], xv.astype(np.float64) + 3000.0, rtol=1e-12)


def test_evaluate_accepts_lists_and_python_scalars():
    g = ts.Graph("t")
    x = g.input("x", (3,), "float32")
    s = g.input("s", (), "float32")
    g.output("y", x * s)
    np.testing.assert_array_equal(ts.evaluate(g, {"x": [1.5, -2.0, 3.0], "s": 2.0})["y"], [3.0, -4.0, 6.0])



@pytest.mark.parametrize("case", sorted(CASES))
def test_computing_into_dead_sources_gives_the_same_outputs_and_leaves_inputs_alone(case: str) -> None:
    graph = CASES[case]()
    leaves = check_inputs(graph, random_inputs(graph, seed=4))
    before = {name: array.copy() for name, array in leaves.items()}
    fresh = evaluate_nodes(graph.outputs.values(), leaves)
    reused = evaluate_nodes(graph.outputs.values(), leaves, roots_only=True)
    for node in graph.outputs.values():
        np.testing.assert_array_equal(reused[id(node)], fresh[id(node)])
    for name, array in leaves.items():
        np.testing.assert_array_equal(array, before[name])


def test_a_chain_of_elementwise_ops_reuses_one_array() -> None:
    g = ts.Graph("chain")
    x = g.input("x", (64, 64), "float32")
    g.output("y", ((x * 2 + 1).exp2() * x).sqrt())
    leaves = check_inputs(g, {"x": np.abs(np.random.default_rng(0).standard_normal((64, 64))).astype(np.float32)})
    (y,) = g.outputs.values()
    values = evaluate_nodes([y], leaves, roots_only=True)
    # x * 2 is new; + 1, exp2, * x and sqrt each write over their source's array, which is let go
    assert len(values) < len(evaluate_nodes([y], leaves))
    np.testing.assert_allclose(values[id(y)], np.sqrt(np.exp2(leaves["x"] * 2 + 1) * leaves["x"]))


def test_a_number_modulo_a_tensor_and_abs_of_a_tensor(rng):
    """`5 % x` and `abs(x)` build graphs as `x % 5` and `x.abs()` do (they raised TypeError: Tensor had neither
    __rmod__ nor __abs__)."""
    b = signed(rng, (20,))
    np.testing.assert_allclose(run(lambda b: 5.0 % b, b=b), np.fmod(5.0, b.astype(np.float64)), **EXACT)
    np.testing.assert_array_equal(run(lambda b: abs(b), b=b), np.abs(b.astype(np.float64)))


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("mode", ["reference", "registers", "rounded"])
def test_leaves_held_narrow_give_what_leaves_widened_first_give(case: str, mode: str) -> None:
    """An evaluation of the roots alone reads float16 and float32 leaves as they are held, widening them where an op
    reads them; its values are those of leaves widened before it began."""
    graph = CASES[case]()
    narrow = check_inputs(graph, random_inputs(graph, seed=5), narrow=True)
    width = np.float64 if mode == "reference" else np.float32
    wide = {name: a.astype(width) if a.dtype.kind == "f" else a for name, a in narrow.items()}
    flags = {"registers": mode == "registers", "rounded": mode == "rounded"}
    held = evaluate_nodes(graph.outputs.values(), narrow, roots_only=True, **flags)
    widened = evaluate_nodes(graph.outputs.values(), wide, roots_only=True, **flags)
    for node in graph.outputs.values():
        assert held[id(node)].dtype == widened[id(node)].dtype
        np.testing.assert_allclose(held[id(node)], widened[id(node)], rtol=1e-12 if mode == "reference" else 1e-6)


@pytest.mark.parametrize("transposed", [False, True])
def test_a_large_float16_weight_is_widened_a_block_at_a_time_not_whole(transposed: bool, monkeypatch) -> None:
    """The reference of x @ W (and of nn.linear's x @ W.T) with a 4096 x 4096 float16 W: the float64 product, W
    widened a block of 1024 columns at a time into one reused buffer, never whole (128 MiB in float64; a real-size
    model's weights widened whole were most of its reference's time)."""
    import tracemalloc
    from tensorsmith import nn
    from tensorsmith.ir import interpreter
    monkeypatch.setattr(interpreter, "WIDENED_BLOCK", 4096 * 1024)
    blocks: list[tuple[int, ...]] = []
    real_cast = interpreter.cast_into
    monkeypatch.setattr(interpreter, "cast_into", lambda target, source: blocks.append(target.shape) or
                        real_cast(target, source))
    g = ts.Graph("weight")
    x, w = g.input("x", (16, 4096), "float16"), g.input("w", (4096, 4096), "float16")
    g.output("y", nn.linear(x, w) if transposed else x @ w)
    inputs = random_inputs(g, seed=0)
    tracemalloc.start()
    try:
        y = ts.evaluate(g, inputs)["y"]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    weight = inputs["w"].astype(np.float64)
    expected = inputs["x"].astype(np.float64) @ (weight.T if transposed else weight)
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)
    assert len(blocks) == 4                                   # 4096 columns, 1024 at a time
    assert peak < weight.nbytes / 2, f"{peak / 2**20:.0f} MiB held at once"


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_a_lookup_copies_the_selected_slices_and_zeros_ids_out_of_the_table(axis: int) -> None:
    """take() of a table along each of its axes with 2-D computed ids, some out of the table: each id's slice, and
    zeros for the ids outside it (the table is read as slices, once per id, not an index per element)."""
    from tensorsmith.ir.nn import take
    g = ts.Graph("lookup")
    table = g.input("table", (3, 4, 5))
    ids = g.input("ids", (2, 3), "int32") - 1           # computed: -1 and the last id + 1 are out of the table
    g.output("y", take(table, ids, axis))
    rng = np.random.default_rng(axis)
    values = rng.standard_normal((3, 4, 5)).astype(np.float32)
    length = values.shape[axis]
    given = rng.integers(0, length + 2, (2, 3)).astype(np.int32)
    given[0, 0], given[1, 2] = 0, length + 1
    got = ts.evaluate(g, {"table": values, "ids": given})["y"]
    picked = np.take(values, np.clip(given - 1, 0, length - 1), axis)
    outside = ((given - 1 < 0) | (given - 1 >= length)).reshape((1,) * axis + (2, 3) + (1,) * (2 - axis))
    np.testing.assert_array_equal(got, np.where(outside, 0, picked))


@pytest.mark.parametrize("rhs_batch", [(1,), (3,)])   # one weight broadcast over the batch; a weight per batch
def test_a_narrow_right_operand_is_multiplied_as_its_widened_values(rhs_batch: tuple[int, ...]) -> None:
    """widening_matmul widens a large float16 operand a block (or a batch) at a time: the product is numpy's of the
    widened operands, for each batch its own matrix."""
    from tensorsmith.ir.interpreter import widening_matmul
    rng = np.random.default_rng(0)
    lhs = rng.standard_normal((3, 5, 300))
    rhs = rng.standard_normal(rhs_batch + (300, 400)).astype(np.float16)
    got = widening_matmul(lhs, rhs, np.dtype(np.float64))
    np.testing.assert_allclose(got, np.matmul(lhs, rhs.astype(np.float64)), rtol=1e-12, atol=1e-12)
