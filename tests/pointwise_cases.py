"""Pointwise graphs for the vectorised (VEC elements per thread) pointwise archetype; shared by CPU and GPU tests.

Each is one pointwise kernel. The last axes are multiples of 8 (vectorised with 16-byte accesses) or not (a
smaller VEC, or none); operands are contiguous along the last axis (vector loads), broadcast along it (read once
per thread), permuted or sliced (read element by element).
"""
from __future__ import annotations

from typing import Callable

import tensorsmith as ts
from tensorsmith import nn


def _add_f16() -> ts.Graph:
    g = ts.Graph("pw_add_f16")
    x, y = g.input("x", (24, 64), "float16"), g.input("y", (24, 64), "float16")
    g.output("out", x + y)
    return g


def _gelu_bf16() -> ts.Graph:
    g = ts.Graph("pw_gelu_bf16")
    g.output("out", nn.gelu(g.input("x", (5, 3, 40), "bfloat16")))
    return g


def _bias_rows_and_columns() -> ts.Graph:
    g = ts.Graph("pw_bias")         # a row vector (vector loads), a column vector (once per thread), a scalar
    x = g.input("x", (33, 128), "float16")
    row, col = g.input("row", (128,), "float16"), g.input("col", (33, 1), "float32")
    s = g.input("s", (1,), "float16")
    g.output("out", (x + row) * col + s)
    return g


def _permuted_f32() -> ts.Graph:
    g = ts.Graph("pw_permuted_f32")  # x.T read element by element, y along the row
    x, y = g.input("x", (48, 20), "float32"), g.input("y", (20, 48), "float32")
    g.output("out", x.transpose(0, 1) * y + 1)
    return g


def _sliced_f16() -> ts.Graph:
    g = ts.Graph("pw_sliced_f16")    # a slice at an offset and one at 0 of a wider row: neither is 16-byte aligned
    x = g.input("x", (16, 70), "float16")
    g.output("out", x[:, 3:67] * 2 - x[:, :64])
    return g


def _int_and_bool_outputs() -> ts.Graph:
    g = ts.Graph("pw_int_bool")      # int32 and bool operands and outputs, float16 beside them
    n, h = g.input("n", (12, 32), "int32"), g.input("h", (12, 32), "float16")
    g.output("count", n * 3 + (n % 5))
    g.output("positive", h > 0)
    g.output("scaled", (h * n.cast("float16")).cast("float32"))
    return g


def _bool_input() -> ts.Graph:
    g = ts.Graph("pw_bool_input")
    m, x = g.input("m", (9, 16), "bool"), g.input("x", (9, 16), "float16")
    g.output("out", m.cast("float16") * x)
    return g


def _odd_last_axis() -> ts.Graph:
    g = ts.Graph("pw_odd_f16")       # 36 = 4 x 9: VEC 4 at most; 1-D 37: none
    x, y = g.input("x", (7, 36), "float16"), g.input("y", (37,), "float16")
    g.output("out", x * x + 1)
    g.output("flat", y.exp())
    return g


def _wide_one_dim() -> ts.Graph:
    g = ts.Graph("pw_flat_f32")
    x = g.input("x", (4096,), "float32")
    g.output("out", x.sqrt() * 0.5)
    return g


POINTWISE_CASES: dict[str, Callable[[], ts.Graph]] = {
    "add_f16": _add_f16, "gelu_bf16": _gelu_bf16, "bias": _bias_rows_and_columns, "permuted_f32": _permuted_f32,
    "sliced_f16": _sliced_f16, "int_bool": _int_and_bool_outputs, "bool_input": _bool_input,
    "odd_last_axis": _odd_last_axis, "flat_f32": _wide_one_dim,
}
