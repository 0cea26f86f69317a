"""The compositions models need (issue 20): erf and exact GELU, minimum and clamp, power, concatenation, embedding
lookup, each against its independent numpy (or math) value in the float64 reference interpreter."""
from __future__ import annotations

import math

import numpy as np
import pytest

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.ir.errors import ShapeError

RNG = np.random.default_rng(0)


def _run(build, **arrays: np.ndarray) -> np.ndarray:
    g = ts.Graph("composition")
    inputs = {name: g.input(name, a.shape, "int32" if a.dtype.kind == "i" else "float32") for name, a in arrays.items()}
    g.output("y", build(**inputs))
    return ts.evaluate(g, arrays)["y"]


def test_erf_is_within_its_approximation_bound_of_math_erf() -> None:
    x = np.linspace(-6, 6, 2001).astype(np.float32)
    expected = np.array([math.erf(float(v)) for v in x])
    assert np.abs(_run(nn.erf, x=x) - expected).max() < 1.5e-7
    gelu = np.array([0.5 * float(v) * (1 + math.erf(float(v) / math.sqrt(2))) for v in x])
    assert np.abs(_run(nn.gelu_exact, x=x) - gelu).max() < 1e-6


@pytest.mark.parametrize("exponent", [2, 3, -1, 0, 0.5, -0.5, 1.7])
def test_power_with_a_constant_exponent(exponent: float) -> None:
    x = RNG.uniform(0.5, 2.0, (4, 5)).astype(np.float32)
    assert np.allclose(_run(lambda x: nn.power(x, exponent), x=x), x.astype(np.float64) ** exponent, rtol=1e-12)


def test_minimum_and_clamp() -> None:
    a, b = RNG.standard_normal((3, 4)).astype(np.float32), RNG.standard_normal((3, 4)).astype(np.float32)
    assert np.array_equal(_run(nn.minimum, a=a, b=b), np.minimum(a, b))
    assert np.array_equal(_run(lambda a: nn.clamp(a, -0.3, 0.4), a=a), np.clip(a.astype(np.float64), -0.3, 0.4))


def test_concat_along_any_axis_equals_numpys() -> None:
    a, b, c = (RNG.standard_normal((2, n, 3)).astype(np.float32) for n in (1, 4, 2))
    assert np.array_equal(_run(lambda a, b, c: nn.concat([a, b, c], axis=1), a=a, b=b, c=c),
                          np.concatenate([a, b, c], axis=1))


def test_embedding_reads_the_rows_the_ids_name() -> None:
    table = RNG.standard_normal((11, 6)).astype(np.float32)
    ids = RNG.integers(0, 11, (3, 4)).astype(np.int32)
    assert np.array_equal(_run(nn.embedding, weight=table, ids=ids), table[ids])


def test_split_cuts_consecutive_parts_and_refuses_sizes_that_do_not_add_up() -> None:
    x = RNG.standard_normal((4, 9)).astype(np.float32)
    parts = _run(lambda x: nn.concat(nn.split(x, [2, 3, 4], axis=1)[::-1], axis=1), x=x)
    assert np.array_equal(parts, np.concatenate([x[:, 5:], x[:, 2:5], x[:, :2]], axis=1))
    g = ts.Graph("bad_split")
    with pytest.raises(ts.ShapeError, match="do not add up"):
        nn.split(g.input("x", (4, 9), "float32"), [2, 3], axis=1)


def test_var_std_argmax_argmin_and_cumsum_equal_numpys() -> None:
    x = RNG.standard_normal((5, 7)).astype(np.float32)
    x[2, 3] = x[2, 5] = x[2].max() + 1.0                                   # a tie: the first index wins
    x64 = x.astype(np.float64)
    assert np.allclose(_run(lambda x: nn.var(x, axis=1), x=x), x64.var(axis=1, ddof=1), rtol=1e-12)
    assert np.allclose(_run(lambda x: nn.std(x, axis=0, correction=0), x=x), x64.std(axis=0), rtol=1e-12)
    assert np.array_equal(_run(lambda x: nn.argmax(x, axis=1), x=x), np.argmax(x, axis=1))
    assert np.array_equal(_run(lambda x: nn.argmin(x, axis=0), x=x), np.argmin(x, axis=0))
    assert np.allclose(_run(lambda x: nn.cumsum(x, axis=0), x=x), np.cumsum(x64, axis=0), rtol=1e-12)
    assert np.allclose(_run(lambda x: nn.cumsum(x, axis=1), x=x), np.cumsum(x64, axis=1), rtol=1e-12)


def test_topk_gives_the_k_extremes_in_order_with_the_first_index_of_ties() -> None:
    """Against a stable numpy sort: the k largest descending (smallest ascending), ties by the lesser index."""
    x = RNG.standard_normal((6, 9)).astype(np.float32)
    x[1, 2] = x[1, 7] = x[1].max() + 1.0              # a tie at the top: index 2 before 7
    x[4, 0] = x[4, 5] = x[4].min() - 1.0              # a tie at the bottom: index 0 before 5
    for largest in (True, False):
        order = np.argsort(-x if largest else x, axis=1, kind="stable")[:, :3]
        values = _run(lambda x: nn.topk(x, 3, axis=1, largest=largest)[0], x=x)
        indices = _run(lambda x: nn.topk(x, 3, axis=1, largest=largest)[1], x=x)
        assert np.array_equal(indices, order) and np.array_equal(values, np.take_along_axis(x, order, axis=1))
    columns = _run(lambda x: nn.topk(x, 2, axis=0)[1], x=x)      # along another axis
    assert np.array_equal(columns, np.argsort(-x, axis=0, kind="stable")[:2])
    with pytest.raises(ShapeError, match="topk: k = 10"):
        nn.topk(ts.Graph("g").input("x", (6, 9), "float32"), 10)


@pytest.mark.parametrize("ids", [[4, 0, -1], [6, 1, 3, -2, 0, 2]], ids=["a where each", "one-hot product"])
def test_put_writes_values_at_the_ids_and_keeps_the_rest(ids: list[int]) -> None:
    """x[:, ids] = values, as numpy's assignment, on a middle axis and with a negative id counted from the end: a
    few ids as a where() each, more as a one-hot product."""
    x = RNG.standard_normal((2, 7, 3)).astype(np.float32)
    values = RNG.standard_normal((2, len(ids), 3)).astype(np.float32)
    ids = np.array(ids, dtype=np.int32)
    expected = x.copy()
    expected[:, ids] = values
    out = _run(lambda x, ids, values: nn.put(x, ids, values, axis=1, wrap=True), x=x, ids=ids, values=values)
    assert np.array_equal(out, expected)
