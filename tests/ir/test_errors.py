"""API errors as behaviour: the class (a TensorsmithError and the right builtin), and what the message names."""
import os

import numpy as np
import pytest

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.ir import CompileError, DeviceError, TargetError

HERE = os.path.basename(__file__)


def user_line(info: pytest.ExceptionInfo) -> str:
    """`test_errors.py:N` for the innermost line of this file that the exception passed through."""
    entry = [e for e in info.traceback if os.path.basename(str(e.path)) == HERE][-1]
    return f"{HERE}:{entry.lineno + 1}"


def tensors(*specs: tuple[tuple[int, ...], str]) -> list[ts.Tensor]:
    g = ts.Graph("g")
    return [g.input(f"in{i}", shape, dtype) for i, (shape, dtype) in enumerate(specs)]


@pytest.mark.parametrize("cls, base", [
    (ts.ShapeError, ValueError), (ts.DTypeError, TypeError), (ts.GraphError, ValueError),
    (ts.InputError, ValueError), (TargetError, ValueError), (CompileError, RuntimeError),
    (DeviceError, RuntimeError),
])
def test_error_hierarchy(cls, base):
    assert issubclass(cls, ts.TensorsmithError) and issubclass(cls, base)


# shapes -----------------------------------------------------------------------------------------

def test_add_shape_mismatch_names_the_op_the_shapes_and_the_line():
    x, y = tensors(((3, 4), "float32"), ((5,), "float32"))
    with pytest.raises(ts.ShapeError) as info:
        x + y
    message = str(info.value)
    assert isinstance(info.value, ts.TensorsmithError) and isinstance(info.value, ValueError)
    assert message.startswith("add")
    assert "(3, 4)" in message and "(5,)" in message
    assert user_line(info) in message


@pytest.mark.parametrize("name, build", [
    ("mul", lambda x, y: x * y), ("mod", lambda x, y: x % y), ("less_than", lambda x, y: x < y),
    ("add", lambda x, y: x - y),
])
def test_other_binary_shape_mismatches_name_their_op(name, build):
    x, y = tensors(((2, 3), "float32"), ((2, 4), "float32"))
    with pytest.raises(ts.ShapeError, match=rf"^{name}: .*\(2, 3\).*\(2, 4\)"):
        build(x, y)


def test_error_location_is_the_user_line_even_from_deep_inside_nn():
    x, w = tensors(((4, 8), "float32"), ((7,), "float32"))
    with pytest.raises(ts.ShapeError) as info:
        nn.layer_norm(x, w)
    assert user_line(info) in str(info.value)
    assert "tensor.py" not in str(info.value) and "nn.py" not in str(info.value)


@pytest.mark.parametrize("a_shape, b_shape", [((3, 4), (5, 6)), ((4,), (3,)), ((2, 3, 4), (2, 5, 6)), ((3, 4), (3,))])
def test_matmul_inner_dimension_mismatch(a_shape, b_shape):
    a, b = tensors((a_shape, "float32"), (b_shape, "float32"))
    with pytest.raises(ts.ShapeError, match="matmul: inner dimensions differ") as info:
        a @ b
    assert str(a_shape) in str(info.value) and str(b_shape) in str(info.value)
    assert user_line(info) in str(info.value)


def test_matmul_batch_mismatch_and_scalars():
    a, b, s = tensors(((2, 3, 4), "float32"), ((3, 4, 5), "float32"), ((), "float32"))
    with pytest.raises(ts.ShapeError, match="matmul"):
        a @ b
    with pytest.raises(ts.ShapeError, match="matmul"):
        s @ a


@pytest.mark.parametrize("name, build", [
    ("sum", lambda x: x.sum(2)), ("sum-negative", lambda x: x.sum(-3)), ("max", lambda x: x.max(5)),
    ("mean", lambda x: x.mean((0, 2))), ("keepdim", lambda x: x.max(-4, keepdim=True)),
    ("softmax", lambda x: nn.softmax(x, axis=2)), ("transpose", lambda x: x.transpose(0, 2)),
    ("permute", lambda x: x.permute(0, 2)), ("iota", lambda x: ts.iota((3, 4), axis=2)),
    ("iota-scalar", lambda x: ts.iota((), axis=0)),
    # these took the axis modulo the rank: cumsum(x, 2) of a matrix summed along axis 0 (found writing the fuzzer)
    ("cumsum", lambda x: nn.cumsum(x, 2)), ("concat", lambda x: nn.concat([x, x], axis=2)),
    ("split", lambda x: nn.split(x, [1, 2], axis=-3)), ("var", lambda x: nn.var(x, 2)),
    ("std", lambda x: nn.std(x, -3)), ("argmin", lambda x: nn.argmin(x, 2)),
])
def test_axis_out_of_range(name, build):
    x, = tensors(((3, 4), "float32"))
    with pytest.raises(ts.ShapeError, match="out of range") as info:
        build(x)
    assert user_line(info) in str(info.value)
    assert "rank" in str(info.value)


@pytest.mark.parametrize("axis", ["0", 1.0, 0.5, [0.0]], ids=repr)
def test_axis_that_is_not_an_integer(axis):
    x, = tensors(((3, 4), "float32"))
    with pytest.raises(ts.ShapeError, match="axis"):
        x.sum(axis)
    with pytest.raises(ts.ShapeError, match="axis"):
        nn.softmax(x, axis=axis)


@pytest.mark.parametrize("build", [lambda s: nn.cumsum(s), lambda s: nn.concat([s, s]), lambda s: nn.split(s, [1]),
                                   lambda s: nn.var(s), lambda s: nn.argmax(s)], ids=["cumsum", "concat", "split",
                                                                                       "var", "argmax"])
def test_an_axis_of_a_scalar(build):
    """A rank-0 tensor has no axis: a ShapeError, not the ZeroDivisionError or IndexError these raised."""
    s, = tensors(((), "float32"))
    with pytest.raises(ts.ShapeError, match="out of range for rank 0"):
        build(s)


def test_reduce_of_a_scalar_over_axis_zero():
    s, = tensors(((), "float32"))
    with pytest.raises(ts.ShapeError, match="out of range for rank 0"):
        s.sum(0)


@pytest.mark.parametrize("name, build", [
    ("permute-repeat", lambda x: x.permute(0, 0)), ("permute-short", lambda x: x.permute(1,)),
])
def test_bad_permutation(name, build):
    x, = tensors(((3, 4), "float32"))
    with pytest.raises(ts.ShapeError, match="permute"):
        build(x)


@pytest.mark.parametrize("shape", [(5,), (4, 4), (-1, 5), (-1, -1), (0, -1), (2, -2, 3), (2.5, 4)], ids=str)
def test_bad_reshape(shape):
    x, = tensors(((3, 4), "float32"))
    with pytest.raises(ts.ShapeError, match="^reshape") as info:
        x.reshape(shape)
    assert str(tuple(shape)) in str(info.value)
    assert user_line(info) in str(info.value)
    if all(isinstance(d, int) and d >= -1 for d in shape):  # a well-formed shape of the wrong size
        assert "(3, 4)" in str(info.value)


@pytest.mark.parametrize("name, build", [
    ("expand-grow", lambda x: x.expand(4, 4)), ("expand-fewer", lambda x: x.expand(4)),
    ("broadcast", lambda x: x + ts.constant(1.0, (2, 4))),
    ("slice-past-end", lambda x: x[5]), ("slice-negative", lambda x: x[:, -5]),
    ("too-many-indices", lambda x: x[0, 0, 0]), ("two-ellipses", lambda x: x[..., ...]),
    ("step", lambda x: x[::2]), ("reverse", lambda x: x[::-1]),
    ("pad-negative", lambda x: x.pad([(0, -1), (0, 0)])), ("pad-rank", lambda x: x.pad([(1, 1)])),
])
def test_bad_views(name, build):
    x, = tensors(((3, 4), "float32"))
    with pytest.raises(ts.ShapeError) as info:
        build(x)
    assert user_line(info) in str(info.value)


@pytest.mark.parametrize("index", [True, 1.0, [0, 1], "a"], ids=repr)
def test_unsupported_index_types(index):
    x, = tensors(((3, 4), "float32"))
    with pytest.raises(TypeError, match="getitem"):
        x[index]


@pytest.mark.parametrize("shape", [(-1, 3), (2.5,), 5, (3, None), "ab"], ids=str)
def test_bad_input_shape(shape):
    g = ts.Graph("g")
    with pytest.raises(ts.ShapeError, match="input 'x'"):
        g.input("x", shape, "float32")


def test_rope_needs_an_even_last_axis_and_two_axes():
    x, v = tensors(((4, 5), "float32"), ((8,), "float32"))
    with pytest.raises(ts.ShapeError, match="rope") as info:
        nn.rope(x)
    assert user_line(info) in str(info.value)
    with pytest.raises(ts.ShapeError, match="rope"):
        nn.rope(v)


# dtypes -----------------------------------------------------------------------------------------

def test_int_plus_float_needs_a_cast():
    i, f = tensors(((3,), "int32"), ((3,), "float32"))
    with pytest.raises(ts.DTypeError) as info:
        i + f
    message = str(info.value)
    assert isinstance(info.value, TypeError) and isinstance(info.value, ts.TensorsmithError)
    assert message.startswith("add") and "int32" in message and "float32" in message and "cast" in message
    assert user_line(info) in message
    assert (i.cast("float32") + f).dtype == ts.DType.FLOAT32


@pytest.mark.parametrize("a, b", [("int32", "float16"), ("bool", "float32"), ("bool", "int32"), ("int32", "bfloat16")])
@pytest.mark.parametrize("op", [lambda a, b: a * b, lambda a, b: a < b, lambda a, b: b + a, lambda a, b: a @ b],
                         ids=["mul", "lt", "radd", "matmul"])
def test_mixed_kinds_need_a_cast(a, b, op):
    x, y = tensors(((3, 3), a), ((3, 3), b))
    with pytest.raises(ts.DTypeError, match="cast"):
        op(x, y)


@pytest.mark.parametrize("method", ["exp2", "log2", "sin", "sqrt", "recip", "exp", "log", "cos", "rsqrt"])
@pytest.mark.parametrize("dtype", ["int32", "bool"])
def test_float_math_on_int_or_bool(method, dtype):
    x, = tensors(((4,), dtype))
    with pytest.raises(ts.DTypeError) as info:
        getattr(x, method)()
    assert dtype in str(info.value)


def test_exp2_of_int32_names_the_op_and_the_line():
    x, = tensors(((4,), "int32"))
    with pytest.raises(ts.DTypeError) as info:
        x.exp2()
    assert str(info.value).startswith("exp2") and "cast" in str(info.value)
    assert user_line(info) in str(info.value)


@pytest.mark.parametrize("method", ["sum", "max", "mean"])
def test_reduce_of_bool(method):
    x, y = tensors(((3, 4), "float32"), ((3, 4), "float32"))
    with pytest.raises(ts.DTypeError, match="bool"):
        getattr(x < y, method)(-1)


@pytest.mark.parametrize("build", [lambda b: b + b, lambda b: b * b, lambda b: b + 1, lambda b: -b, lambda b: b % b],
                         ids=["add", "mul", "add-int", "neg", "mod"])
def test_arithmetic_on_bool(build):
    b, = tensors(((3,), "bool"))
    with pytest.raises(ts.DTypeError):
        build(b)


def test_int_tensor_with_a_fractional_scalar():
    i, = tensors(((3,), "int32"))
    with pytest.raises(ts.DTypeError, match="not an integer"):
        i * 0.5
    assert (i * 2.0).dtype == ts.DType.INT32


def test_where_needs_a_bool_condition():
    x, = tensors(((3,), "float32"))
    with pytest.raises(ts.DTypeError, match="where"):
        nn.where(x, x, x)


@pytest.mark.parametrize("dtype", ["float64", "int64", "half", "", np.float64, object])
def test_unknown_dtype(dtype):
    g = ts.Graph("g")
    with pytest.raises(ts.DTypeError, match="unknown dtype") as info:
        g.input("x", (3,), dtype)
    assert isinstance(info.value, TypeError)
    assert "float16" in str(info.value)  # it lists the known dtypes


def test_unsupported_operand_type():
    x, = tensors(((3,), "float32"))
    with pytest.raises(TypeError, match="list"):
        x + [1.0, 2.0, 3.0]


# graphs -----------------------------------------------------------------------------------------

def test_input_of_another_graph_in_output():
    g1, g2 = ts.Graph("first"), ts.Graph("second")
    x1 = g1.input("x", (3,), "float32")
    x2 = g2.input("x", (3,), "float32")  # same name, still another graph's node
    with pytest.raises(ts.GraphError) as info:
        g2.output("y", x1 * 2 + x2)
    message = str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, ts.TensorsmithError)
    assert "'x'" in message and "another graph" in message and "'second'" in message
    assert user_line(info) in message
    assert "y" not in g2.outputs


@pytest.mark.parametrize("first, second", [("input", "input"), ("input", "output"), ("output", "output"),
                                           ("output", "input")])
def test_duplicate_names(first, second):
    g = ts.Graph("g")
    x = g.input("x", (3,), "float32")

    def declare(kind):
        return g.input("name", (3,), "float32") if kind == "input" else g.output("name", x)

    declare(first)
    with pytest.raises(ts.GraphError, match="'name' is already used") as info:
        declare(second)
    assert user_line(info) in str(info.value)


@pytest.mark.parametrize("name", ["my graph", "1abc", "", "a-b", "x.y", 3, None], ids=repr)
def test_invalid_graph_name(name):
    with pytest.raises(ts.GraphError, match="graph name"):
        ts.Graph(name)


@pytest.mark.parametrize("name", ["my input", "0x", "", "a/b", 7], ids=repr)
def test_invalid_input_and_output_names(name):
    g = ts.Graph("g")
    x = g.input("x", (3,), "float32")
    with pytest.raises(ts.GraphError, match="input name"):
        g.input(name, (3,), "float32")
    with pytest.raises(ts.GraphError, match="output name"):
        g.output(name, x)


def test_output_must_be_a_tensor():
    g = ts.Graph("g")
    with pytest.raises(ts.GraphError, match="expected a Tensor"):
        g.output("y", np.ones(3))


def test_bool_of_a_tensor_raises():
    x, y = tensors(((3,), "float32"), ((3,), "float32"))
    with pytest.raises(TypeError, match="truth value"):
        bool(x < y)
    with pytest.raises(TypeError):
        if x:
            pass
    with pytest.raises(TypeError):
        x and y


# evaluate ---------------------------------------------------------------------------------------

def small_graph() -> ts.Graph:
    g = ts.Graph("small")
    x = g.input("x", (2, 3), "float32")
    i = g.input("i", (3,), "int32")
    m = g.input("m", (3,), "bool")
    g.output("y", x * i.cast("float32") * m.cast("float32"))
    return g


def good_inputs() -> dict[str, np.ndarray]:
    return {"x": np.full((2, 3), 1.5, np.float32), "i": np.arange(1, 4, dtype=np.int32),
            "m": np.array([True, False, True])}


@pytest.mark.parametrize("name, change, fragments", [
    ("wrong-shape", {"x": np.ones((3, 2), np.float32)}, ["'x'", "(2, 3)", "(3, 2)"]),
    ("wrong-rank", {"x": np.ones((6,), np.float32)}, ["'x'", "(2, 3)", "(6,)"]),
    ("int-for-float", {"x": np.ones((2, 3), np.int32)}, ["'x'", "float32", "int32"]),
    ("float-for-int", {"i": np.ones((3,), np.float32)}, ["'i'", "int32", "float32"]),
    ("float-for-bool", {"m": np.ones((3,), np.float32)}, ["'m'", "bool", "float32"]),
    ("bool-for-int", {"i": np.ones((3,), bool)}, ["'i'", "int32", "bool"]),
    ("int-for-bool", {"m": np.ones((3,), np.int32)}, ["'m'", "bool", "int32"]),
    ("missing", {"x": None}, ["missing ['x']"]),
    ("extra", {"z": np.ones(3)}, ["unexpected ['z']"]),
])
def test_evaluate_rejects_bad_inputs(name, change, fragments):
    inputs = good_inputs()
    for key, value in change.items():
        if value is None:
            del inputs[key]
        else:
            inputs[key] = value
    with pytest.raises(ts.InputError) as info:
        ts.evaluate(small_graph(), inputs)
    assert isinstance(info.value, ValueError) and isinstance(info.value, ts.TensorsmithError)
    assert "'small'" in str(info.value)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_evaluate_accepts_good_inputs():
    out = ts.evaluate(small_graph(), good_inputs())["y"]
    np.testing.assert_array_equal(out, [[1.5, 0.0, 4.5]] * 2)


def test_evaluate_a_graph_without_outputs():
    g = ts.Graph("empty")
    g.input("x", (3,), "float32")
    with pytest.raises(ts.TensorsmithError, match="no outputs") as info:
        ts.evaluate(g, {"x": np.ones(3, np.float32)})
    assert isinstance(info.value, ValueError)
