"""The CPU executor computes as the kernels do (issue 17): float32 in registers, each buffer rounded where it is
stored, so `prog(device="cpu")` predicts the GPU, overflow included; the float64 interpreter stays the oracle."""
from __future__ import annotations

import numpy as np

import tensorsmith as ts
from tensorsmith.ir.interpreter import evaluate_nodes
from tensorsmith.ir.interpreter import check_inputs
from tensorsmith.ir.kernel_program import KernelProgram
from tensorsmith.search.partition import partition


def test_float32_logits_of_150_overflow_on_the_cpu_as_on_the_gpu() -> None:
    """exp(150) is 1.4e65, past float32's 3.4e38: the kernel's registers hold inf, and so does the CPU executor,
    where the float64 reference (and the CPU executor before issue 17) gave about 150."""
    graph = ts.Graph("naive_log_sum_exp")
    graph.output("y", graph.input("x", (16, 512), "float32").exp().sum(axis=1).log())
    program = ts.compile(graph, profile=False, cache=False, budget_s=2)
    x = np.random.default_rng(0).uniform(-150, 150, (16, 512)).astype(np.float32)
    assert np.isfinite(ts.evaluate(graph, {"x": x})["y"]).all()
    assert np.isposinf(program(device="cpu", x=x)["y"]).all()


def _one_kernel(graph: ts.Graph) -> KernelProgram:
    program = partition(graph)
    assert len(program.kernels) == 1, "a pointwise chain is one kernel"
    return program


def test_a_float16_value_inside_a_kernel_is_not_rounded_until_it_is_stored() -> None:
    """(x * 300) * 300 / 90000 in float16: the product passes 65504 in registers (float32) and comes back in range,
    so the stored output is x; the graph rounded at every value, as memory would hold it, makes the product inf."""
    graph = ts.Graph("wide_in_registers")
    x = graph.input("x", (256,), "float16")
    graph.output("y", (x * 300.0) * 300.0 * (1 / 90000))
    inputs = {"x": np.linspace(1, 2, 256).astype(np.float16)}
    stored = _one_kernel(graph).execute(inputs)["y"]
    np.testing.assert_allclose(stored, inputs["x"], rtol=1e-3)
    rounded = evaluate_nodes(graph.outputs.values(), check_inputs(graph, inputs), rounded=True)
    assert np.isinf(rounded[id(graph.outputs["y"])]).all()


def test_registers_compute_in_float32_where_the_reference_computes_in_float64() -> None:
    """(x + 1) - 1 for x near 1e-8: float32 loses x in the sum, float64 keeps it."""
    graph = ts.Graph("absorbed")
    x = graph.input("x", (64,), "float32")
    graph.output("y", (x + 1.0) - 1.0)
    leaves = {"x": np.full(64, 1e-8, np.float32)}
    node = graph.outputs["y"]
    in_registers = evaluate_nodes([node], leaves, registers=True)[id(node)]
    assert in_registers.dtype == np.float32 and (in_registers == 0).all()
    np.testing.assert_allclose(ts.evaluate(graph, leaves)["y"], 1e-8, rtol=1e-6)


def test_a_matrix_products_float16_operands_are_rounded_as_the_tensor_cores_take_them() -> None:
    """An operand computed in the kernel (x * 1.0001, a prologue) enters the product rounded to float16."""
    graph = ts.Graph("prologue")
    x, w = graph.input("x", (32, 64), "float16"), graph.input("w", (64, 16), "float16")
    graph.output("y", (x * 1.0001) @ w)
    rng = np.random.default_rng(1)
    inputs = {"x": rng.standard_normal((32, 64)).astype(np.float16),
              "w": rng.standard_normal((64, 16)).astype(np.float16)}
    leaves = {name: a.astype(np.float32) for name, a in inputs.items()}
    node = graph.outputs["y"]
    got = evaluate_nodes([node], leaves, registers=True)[id(node)]
    operand = (leaves["x"] * np.float32(1.0001)).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(got, operand @ leaves["w"])
