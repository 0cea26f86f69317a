"""Rank-0 values and reductions of 1-D tensors, end to end (issue 18, items 3 and 4): the reference interpreter
crashed on a loss written as .mean() ("return arrays must be of ArrayType"), contiguous() of a scalar came back
with shape (1,), a 0-d bfloat16 input failed compile's own check, and the row-reduce template raised IndexError
on the softmax or LayerNorm of a vector. Each is compared with an independent numpy evaluation."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import tensorsmith as ts
from tensorsmith import nn

RNG = np.random.default_rng(7)
X = RNG.standard_normal((8, 3)).astype(np.float32)
V = RNG.standard_normal(16).astype(np.float32)


def _softmax(v: np.ndarray) -> np.ndarray:
    e = np.exp(v - v.max())
    return e / e.sum()


# name: (input name, shape, dtype, the graph's output from its input, the numpy value from the same array)
CASES: dict[str, tuple[str, tuple[int, ...], str, Callable, Callable]] = {
    "loss_as_mean": ("x", X.shape, "float32", lambda x: (x * 2).mean(), lambda x: (x * 2).mean()),
    "sum_of_all_axes": ("x", X.shape, "float16", lambda x: x.sum(axis=(0, 1)), lambda x: x.sum()),
    "max_of_all_axes": ("x", X.shape, "float32", lambda x: x.max(axis=(0, 1)), lambda x: x.max()),
    "scalar_input": ("s", (), "float32", lambda s: s * 2 + 1, lambda s: s * 2 + 1),
    "scalar_bfloat16_input": ("s", (), "bfloat16", lambda s: s * 2, lambda s: s * 2),
    "contiguous_scalar": ("s", (), "float32", lambda s: s.contiguous(), lambda s: s),
    "softmax_of_a_vector": ("v", V.shape, "float16", lambda v: nn.softmax(v, axis=0), _softmax),
    "log_softmax_of_a_vector": ("v", V.shape, "float32", lambda v: nn.log_softmax(v, axis=0),
                                lambda v: np.log(_softmax(v))),
    "layer_norm_of_a_vector": ("v", V.shape, "float16", lambda v: nn.layer_norm(v),
                               lambda v: (v - v.mean()) / np.sqrt(v.var() + 1e-5)),
}


def _value(name: str, shape: tuple[int, ...]) -> np.ndarray:
    return {"x": X, "v": V}.get(name, np.array(1.5, np.float32)).reshape(shape)


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_small_ranks_evaluate_and_compile_to_what_numpy_computes(case: str) -> None:
    name, shape, dtype, build, expected = CASES[case]
    g = ts.Graph(case)
    g.output("y", build(g.input(name, shape, dtype)))
    value = _value(name, shape)
    want = np.asarray(expected(value.astype(np.float64)))
    tolerance = 1e-5 if dtype == "float32" else 2e-2
    got = ts.evaluate(g, {name: value})["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)
    program = ts.compile(g, profile=False, cache=False, budget_s=2)
    assert all(kernel.cubin[:4] == b"\x7fELF" for kernel in program.kernels)
    ran = program(device="cpu", **{name: value.astype(np.float16 if dtype == "float16" else np.float32)})["y"]
    assert ran.shape == want.shape
    np.testing.assert_allclose(np.asarray(ran, np.float64), want, rtol=tolerance, atol=tolerance)

