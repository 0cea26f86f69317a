"""A matrix product written as sum(expand(a) * expand(b)) whose operand is broadcast along M, N or K (a row, a
column or a value repeated along the contraction), or whose batch is broadcast on both sides: the reference's
np.matmul shortcut, the error bound and the compiled program give the product numpy gives."""
import numpy as np
import pytest

import tensorsmith as ts
from kernel_launch import assert_cpu_predicts
from tensorsmith.search.verify import compare, random_inputs

# (lhs source shape, rhs source shape) as the expands' sources: lhs (B, M, K, 1), rhs (B, 1, K, N); product (B, M, K, N)
B, M, K, N = 3, 4, 6, 5
CASES = {
    "rhs_broadcast_along_k": ((B, M, K, 1), (B, 1, 1, N)),
    "lhs_broadcast_along_k": ((B, M, 1, 1), (B, 1, K, N)),
    "lhs_one_row": ((B, 1, K, 1), (B, 1, K, N)),
    "rhs_one_column": ((B, M, K, 1), (B, 1, K, 1)),
    "batch_broadcast_on_both": ((1, M, K, 1), (1, 1, K, N)),
}


def _product(lhs_shape: tuple[int, ...], rhs_shape: tuple[int, ...]) -> ts.Graph:
    g = ts.Graph("broadcast_product")
    a, b = g.input("a", lhs_shape, "float32"), g.input("b", rhs_shape, "float32")
    g.output("y", (a.expand((B, M, K, N)) * b.expand((B, M, K, N))).sum(axis=2))
    return g


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_product_with_a_broadcast_operand_is_the_product(case: str) -> None:
    lhs_shape, rhs_shape = CASES[case]
    graph = _product(lhs_shape, rhs_shape)
    rng = np.random.default_rng(0)
    inputs = {"a": rng.standard_normal(lhs_shape).astype(np.float32),
              "b": rng.standard_normal(rhs_shape).astype(np.float32)}
    want = (inputs["a"].astype(np.float64) * inputs["b"]).sum(axis=2)
    want = np.broadcast_to(want, (B, M, N))
    np.testing.assert_allclose(ts.evaluate(graph, inputs)["y"], want, rtol=1e-12, atol=1e-12)
    program = ts.compile(graph, budget_s=2)
    np.testing.assert_allclose(program(**inputs, device="cpu")["y"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_product_with_a_broadcast_operand_runs_on_the_gpu(case: str) -> None:
    graph = _product(*CASES[case])
    program = ts.compile(graph, budget_s=2, profile=False)
    inputs = random_inputs(graph, seed=7)
    outputs = program(device="cuda", **inputs)
    for check in compare(graph, outputs, ts.evaluate(graph, inputs)):
        assert check.ok, f"{case}: relative L2 {check.error:.3g} > {check.tolerance:g}"
    assert_cpu_predicts(program.kernel_program, inputs, outputs, label=case)
