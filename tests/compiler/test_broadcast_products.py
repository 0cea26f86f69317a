"""A matrix product written as sum(expand(a) * expand(b)) whose operand is broadcast along M, N or K (a row, a
column or a value repeated along the contraction), or whose batch is broadcast on both sides: the reference's
np.matmul shortcut, the error bound and the compiled program give the product numpy gives, in float32 at small
sizes and in float16 at sizes the tensor cores take (the matmul archetype)."""
import numpy as np
import pytest

import tensorsmith as ts
from kernel_launch import assert_cpu_predicts
from tensorsmith.search.verify import compare, random_inputs

# The expands' sources: lhs (B, M, K, 1), rhs (B, 1, K, N), a 1 where the operand is broadcast.
CASES = {
    "rhs_broadcast_along_k": ("BMK1", "B11N"),
    "lhs_broadcast_along_k": ("BM11", "B1KN"),
    "lhs_one_row": ("B1K1", "B1KN"),
    "rhs_one_column": ("BMK1", "B1K1"),
    "batch_broadcast_on_both": ("1MK1", "11KN"),
}
SIZES = {"float32": dict(B=3, M=4, K=6, N=5), "float16": dict(B=2, M=32, K=64, N=48)}


def _product(case: str, dtype: str) -> ts.Graph:
    size = SIZES[dtype]
    lhs, rhs = (tuple(size.get(axis, 1) for axis in pattern) for pattern in CASES[case])
    full = tuple(size[axis] for axis in "BMKN")
    g = ts.Graph(f"{case}_{dtype}")
    a, b = g.input("a", lhs, dtype), g.input("b", rhs, dtype)
    g.output("y", (a.expand(full) * b.expand(full)).sum(axis=2))
    return g


@pytest.mark.parametrize("dtype", sorted(SIZES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_product_with_a_broadcast_operand_is_the_product(case: str, dtype: str) -> None:
    graph = _product(case, dtype)
    inputs = random_inputs(graph, seed=0)
    a, b = (inputs[name].astype(np.float64) for name in ("a", "b"))
    size = SIZES[dtype]
    want = np.broadcast_to((a * b).sum(axis=2), (size["B"], size["M"], size["N"]))
    np.testing.assert_allclose(ts.evaluate(graph, inputs)["y"], want, rtol=1e-12, atol=1e-12)
    program = ts.compile(graph, budget_s=2, progress=False)
    tolerance = 1e-5 if dtype == "float32" else 1e-2
    np.testing.assert_allclose(program(**inputs, device="cpu")["y"], want, rtol=tolerance, atol=tolerance)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", sorted(SIZES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_product_with_a_broadcast_operand_runs_on_the_gpu(case: str, dtype: str) -> None:
    graph = _product(case, dtype)
    program = ts.compile(graph, budget_s=2, profile=False, progress=False)
    inputs = random_inputs(graph, seed=7)
    outputs = program(device="cuda", **inputs)
    for check in compare(graph, outputs, ts.evaluate(graph, inputs)):
        assert check.ok, f"{graph.name}: relative L2 {check.error:.3g} > {check.tolerance:g}"
    assert_cpu_predicts(program.kernel_program, inputs, outputs, label=graph.name)
