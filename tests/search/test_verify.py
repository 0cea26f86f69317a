"""The random tests' parts: inputs drawn per dtype, the relative L2 error, and the draws remembered between calls."""
from __future__ import annotations

import numpy as np
import pytest
from graph_cases import CASES

import tensorsmith as ts
from tensorsmith.ir.dtypes import bfloat16_to_float, float_to_bfloat16
from tensorsmith.search.verify import random_inputs, reference_draw, relative_l2


def test_inputs_are_rounded_to_their_dtype_and_never_zero() -> None:
    g = ts.Graph("dtypes")
    for dtype in ("float16", "bfloat16", "float32"):
        g.output(f"y_{dtype}", g.input(f"x_{dtype}", (64, 64), dtype) * 2.0)
    inputs = random_inputs(g, seed=3)
    assert inputs["x_float16"].dtype == np.float16 and inputs["x_float32"].dtype == np.float32
    bf16 = inputs["x_bfloat16"]     # held as float32 values that bfloat16 represents exactly
    assert bf16.dtype == np.float32 and np.array_equal(bfloat16_to_float(float_to_bfloat16(bf16)), bf16)
    assert all(np.count_nonzero(array) == array.size for array in inputs.values())
    assert not np.array_equal(inputs["x_float32"], random_inputs(g, seed=4)["x_float32"])   # fresh per seed


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_relative_l2_is_the_norm_of_the_difference_and_leaves_its_arguments(dtype) -> None:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((300, 7)).astype(dtype)
    out = (ref + 1e-3 * rng.standard_normal(ref.shape)).astype(dtype)
    kept_out, kept_ref = out.copy(), ref.copy()
    expected = np.linalg.norm(out.astype(np.float64) - ref.astype(np.float64)) / np.linalg.norm(ref.astype(np.float64))
    assert relative_l2(out, ref) == pytest.approx(expected, rel=1e-12)
    assert np.array_equal(out, kept_out) and np.array_equal(ref, kept_ref)


def test_relative_l2_of_non_finite_values() -> None:
    ref = np.array([1.0, np.inf, 2.0])
    assert relative_l2(np.array([1.0, np.inf, 2.5]), ref) == pytest.approx(0.5 / np.sqrt(5.0))  # infinities agree
    assert np.isnan(relative_l2(np.array([1.0, 3.0, 2.0]), ref))          # a finite value where inf is expected
    assert np.isnan(relative_l2(np.array([np.nan, 1.0]), np.array([1.0, 1.0])))
    assert relative_l2(np.zeros(3), np.ones(2)) == np.inf                 # shapes differ


def test_a_remembered_draw_is_not_evaluated_again() -> None:
    graph = CASES["many_short_rows"]()
    memo: dict = {}
    first = reference_draw(graph, seed=1, draw=0, memo=memo)
    assert first is not None and memo[0] is first and reference_draw(graph, 1, 0, memo=memo) is first
    inputs, reference = first
    assert set(inputs) == set(graph.inputs) and set(reference) == set(graph.outputs)
