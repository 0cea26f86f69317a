"""Graph construction: dtype promotion, structural hashing, node order, summary, and recorded user lines."""
import os

import numpy as np
import pytest

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.ir import Op
from tensorsmith.ir.node import toposort

F16, BF16, F32, I32, BOOL = (ts.DType(d) for d in ("float16", "bfloat16", "float32", "int32", "bool"))


def two_inputs(a_dtype: str, b_dtype: str) -> tuple[ts.Tensor, ts.Tensor]:
    g = ts.Graph("g")
    return g.input("a", (2, 3), a_dtype), g.input("b", (2, 3), b_dtype)


# dtype promotion --------------------------------------------------------------------------------

PROMOTIONS = [
    ("float16", "float32", F32), ("float32", "float16", F32), ("float16", "bfloat16", F32),
    ("bfloat16", "float16", F32), ("bfloat16", "float32", F32), ("float32", "bfloat16", F32),
    ("float16", "float16", F16), ("bfloat16", "bfloat16", BF16), ("int32", "int32", I32),
]
OPERATORS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
             "div": lambda a, b: a / b, "matmul": lambda a, b: a @ b.T, "maximum": nn.maximum}


@pytest.mark.parametrize("a, b, expected", PROMOTIONS, ids=[f"{a}+{b}" for a, b, _ in PROMOTIONS])
@pytest.mark.parametrize("op", list(OPERATORS))
def test_binary_promotion(a, b, expected, op):
    x, y = two_inputs(a, b)
    if op == "div" and expected == I32:
        with pytest.raises(ts.DTypeError):  # division is a recip, and recip is float only
            x / y
        return
    assert OPERATORS[op](x, y).dtype == expected


@pytest.mark.parametrize("a, b, _", PROMOTIONS, ids=[f"{a}<{b}" for a, b, _ in PROMOTIONS])
def test_comparisons_give_bool(a, b, _):
    x, y = two_inputs(a, b)
    for out in (x < y, x > y, x <= y, x >= y):
        assert out.dtype == BOOL


def test_promotion_casts_the_narrow_operand():
    x, y = two_inputs("float16", "float32")
    z = x + y
    add = z.node
    assert add.op == Op.ADD
    assert [s.dtype for s in add.srcs] == [F32, F32]
    assert add.srcs[0].op == Op.CAST and add.srcs[0].srcs[0] is x.node
    assert add.srcs[1] is y.node


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "int32"])
@pytest.mark.parametrize("scalar", [2, 3.0, np.float64(1.0), np.int64(4)],
                         ids=["int", "float", "np.float64", "np.int64"])
def test_python_scalar_takes_the_tensor_dtype(dtype, scalar):
    g = ts.Graph("g")
    x = g.input("x", (3,), dtype)
    for out in (x + scalar, scalar + x, x * scalar, scalar * x, x - scalar, scalar - x, x % scalar):
        assert out.dtype == ts.DType(dtype) and out.shape == (3,)
    constants = [n for n in toposort([(x + scalar).node]) if n.op == Op.CONSTANT]
    assert len(constants) == 1 and constants[0].dtype == ts.DType(dtype) and constants[0].shape == ()
    assert constants[0].arg == scalar and type(constants[0].arg) is (int if dtype == "int32" else float)


def test_bool_compared_with_python_bool():
    x, y = two_inputs("float32", "float32")
    mask = x < y
    assert (mask < True).dtype == BOOL


def test_float16_times_python_float_stays_float16_in_the_reference():
    g = ts.Graph("g")
    x = g.input("x", (2,), "float16")
    g.output("y", x * 1e-3 + 65504.0)  # 65504 is float16's largest value; the reference computes in float64
    xv = np.array([1.0, -2.0], np.float16)
    np.testing.assert_array_equal(ts.evaluate(g, {"x": xv})["y"], xv.astype(np.float64) * 1e-3 + 65504.0)


# structural hash --------------------------------------------------------------------------------

def mlp(name: str = "mlp", slope: float = 0.5, width: int = 8, dtype: str = "float16", out: str = "y") -> ts.Graph:
    g = ts.Graph(name)
    x = g.input("x", (4, width), dtype)
    w = g.input("w", (width, width), dtype)
    h = nn.linear(x, w)
    g.output(out, nn.softmax(h * slope + nn.gelu(h), axis=-1))
    return g


def test_structural_hash_equal_for_identical_graphs():
    a, b = mlp(), mlp()
    assert a is not b
    assert a.structural_hash() == b.structural_hash()
    assert a.structural_hash() == a.structural_hash()
    assert len(a.structural_hash()) == 64 and int(a.structural_hash(), 16) >= 0


def test_structural_hash_ignores_the_source_lines():
    g1 = ts.Graph("g")
    x1 = g1.input("x", (3,), "float32")
    g1.output("y", (x1 * 2.0).exp())
    g2 = ts.Graph("g")
    x2 = g2.input("x", (3,), "float32")
    y2 = x2 * 2.0
    y2 = y2.exp()
    g2.output("y", y2)
    assert g1.outputs["y"].where != g2.outputs["y"].where
    assert g1.structural_hash() == g2.structural_hash()


@pytest.mark.parametrize("change", [
    dict(slope=0.25), dict(width=16), dict(dtype="float32"), dict(name="other"), dict(out="z"),
], ids=["constant", "shape", "dtype", "graph-name", "output-name"])
def test_structural_hash_differs_when_something_changes(change):
    assert mlp(**change).structural_hash() != mlp().structural_hash()


def test_structural_hash_differs_for_another_op_and_another_wiring():
    def graph(build):
        g = ts.Graph("g")
        a, b = g.input("a", (3,), "float32"), g.input("b", (3,), "float32")
        g.output("y", build(a, b))
        return g.structural_hash()

    hashes = {graph(lambda a, b: a + b), graph(lambda a, b: a * b), graph(lambda a, b: b + a),
              graph(lambda a, b: a + a), graph(lambda a, b: (a + b).exp2()), graph(lambda a, b: (a + b).log2())}
    assert len(hashes) == 6


def test_structural_hash_sees_an_unused_input():
    g1, g2 = mlp(), mlp()
    g2.input("unused", (1,), "float32")
    assert g1.structural_hash() != g2.structural_hash()


# nodes ------------------------------------------------------------------------------------------

def test_nodes_are_topological_and_unique():
    g = mlp()
    order = g.nodes()
    position = {id(n): i for i, n in enumerate(order)}
    assert len(position) == len(order)
    for node in order:
        for src in node.srcs:
            assert position[id(src)] < position[id(node)], f"{src} must come before {node}"
    for out in g.outputs.values():
        assert id(out) in position
    assert {id(n) for n in g.inputs.values()} <= set(position)


def test_nodes_include_everything_reachable_once():
    g = ts.Graph("diamond")
    x = g.input("x", (4,), "float32")
    shared = x.exp2()
    g.output("y", shared * shared.sin() + shared.sqrt())
    order = g.nodes()
    reachable, stack = set(), [g.outputs["y"]]
    while stack:
        node = stack.pop()
        if id(node) not in reachable:
            reachable.add(id(node))
            stack.extend(node.srcs)
    assert {id(n) for n in order} == reachable
    assert sum(n is shared.node for n in order) == 1


def test_unused_inputs_come_last():
    g = ts.Graph("g")
    unused = g.input("unused", (2,), "float32")
    x = g.input("x", (2,), "float32")
    g.output("y", x + 1.0)
    order = g.nodes()
    assert order[-1] is unused.node
    assert ts.evaluate(g, {"x": np.ones(2, np.float32), "unused": np.ones(2, np.float32)})["y"].tolist() == [2, 2]


def test_nodes_of_a_deep_graph():
    g = ts.Graph("deep")
    x = g.input("x", (2,), "float32")
    y = x
    for _ in range(5000):
        y = y * 1.0
    g.output("y", y)
    assert len(g.nodes()) == 1 + 4 * 5000  # per step: constant, reshape to (1,), expand to (2,), mul


def test_outputs_and_inputs_are_recorded_in_order():
    g = ts.Graph("g")
    b = g.input("b", (2,), "float32")
    a = g.input("a", (2,), "float32")
    g.output("second", a + b)
    g.output("first", a)
    g.output("again", a)  # one value under two names is fine
    assert list(g.inputs) == ["b", "a"] and list(g.outputs) == ["second", "first", "again"]
    assert g.outputs["first"] is g.outputs["again"] is a.node


# summary, repr, and recorded lines ---------------------------------------------------------------

def test_summary_mentions_every_node_and_op():
    g = ts.Graph("everything")
    x = g.input("x", (2, 3), "float32")
    i = g.input("i", (2, 3), "int32")
    y = x.exp2() + x.abs().log2() * x.sin() + x.abs().sqrt().recip()
    y = y + (i % 3).cast("float32") + ts.iota((2, 3), 1).cast("float32") + (x < 0).cast("float32")
    y = y.pad([(1, 0), (0, 1)])[1:, :3].permute(1, 0).reshape(2, 3).expand(4, 2, 3).contiguous()
    g.output("y", y.sum(0).max(-1))
    text = g.summary()
    lines = text.splitlines()
    assert lines[0] == "graph everything"
    ops_used = {n.op for n in g.nodes()}
    assert ops_used == set(Op), f"the test graph should use every op; missing {set(Op) - ops_used}"
    for op in Op:
        assert f"= {op}" in text, op
    assert len([line for line in lines if " = " in line and not line.strip().startswith("output")]) == len(g.nodes())
    assert lines[-1].strip().startswith("output y = %")
    assert "int32[2, 3]" in text and "float32[2, 3]" in text


def test_repr_of_graph_and_tensor():
    g = ts.Graph("r")
    x = g.input("x", (2, 3), "float16")
    g.output("y", x.sum(-1))
    assert repr(g) == "Graph('r', inputs=[x[2, 3]:float16], outputs=[y[2]:float16])"
    assert repr(x) == "Tensor(input, shape=(2, 3), dtype=float16)"


def test_nodes_record_the_user_line():
    g = ts.Graph("g")
    x = g.input("x", (2,), "float32")
    y = nn.softmax(x)  # every node softmax makes points here, not into nn.py
    g.output("y", y)
    wheres = {n.where for n in g.nodes() if n.op != Op.INPUT}
    assert len(wheres) == 1 and wheres.pop().endswith(f"{os.path.basename(__file__)}:{_line_of('y = nn.softmax(x)')}")


def _line_of(text: str) -> int:
    with open(__file__) as source:
        return next(i for i, line in enumerate(source, start=1) if text in line)


def test_tensor_properties():
    g = ts.Graph("g")
    x = g.input("x", (2, 3, 4), "bfloat16")
    assert x.shape == (2, 3, 4) and x.ndim == 3 and x.dtype == BF16
    assert x.node.size == 24 and x.node.op == Op.INPUT and x.node.arg == "x"
    assert hash(x) == hash(x) and x in {x}
