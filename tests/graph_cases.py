"""Small graphs that exercise every archetype, view and dtype path of codegen; shared by CPU and GPU tests.

Shapes are deliberately odd so that nothing divides a block or a row-thread count.
"""
from __future__ import annotations

from typing import Callable

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.suite.blocks import llama_block


def _pointwise_math() -> ts.Graph:
    g = ts.Graph("pointwise_math")
    x = g.input("x", (37, 53), "float32")
    y = g.input("y", (37, 53), "float32")
    g.output("out", (x.exp() + y.abs().sqrt() * x.sin() - (y * y + 1).log() + x % 0.75) / (y * y + 0.5))
    return g


def _views() -> ts.Graph:
    g = ts.Graph("views")
    x = g.input("x", (6, 10, 7), "float16")
    v = x.permute(2, 0, 1)[1:6, :, 2:9].pad([(1, 2), (0, 0), (3, 0)])    # (8, 6, 10)
    v = v.reshape(48, 10).transpose(0, 1).reshape(20, 24)                 # a reshape that scrambles axes
    g.output("out", v * 2 + 1)
    return g


def _broadcast_bf16() -> ts.Graph:
    g = ts.Graph("broadcast_bf16")
    x = g.input("x", (33, 65), "bfloat16")
    b = g.input("b", (65,), "bfloat16")
    c = g.input("c", (33, 1), "float32")
    g.output("out", (x + b) * c)
    return g


def _integers() -> ts.Graph:
    g = ts.Graph("integers")
    n = g.input("n", (19, 23), "int32")
    col = ts.iota((19, 23), axis=1)
    mask = (n % 7) < col
    g.output("out", mask.cast("float32") * n.cast("float32") + (n.max(axis=0) % 5).cast("float32"))
    g.output("count", (n < 0).cast("int32").sum(axis=-1))
    return g


def _lookups() -> ts.Graph:
    g = ts.Graph("lookups")
    ids = g.input("ids", (3, 37), "int32")
    table = g.input("table", (1001, 72), "float16")
    g.output("tokens", nn.layer_norm(nn.embedding(table, ids)))
    x = g.input("x", (5, 211, 9), "float32")
    g.output("picked", nn.take(x, g.input("j", (13,), "int32"), axis=1) * 2)
    return g


def _column_sum() -> ts.Graph:
    g = ts.Graph("column_sum")
    x = g.input("x", (129, 37), "float32")
    g.output("out", x.sum(axis=0) * 0.5)
    return g


def _full_sum() -> ts.Graph:
    g = ts.Graph("full_sum")
    x = g.input("x", (3001,), "float32")
    g.output("out", (x * x).sum())
    return g


def _norms() -> ts.Graph:
    g = ts.Graph("norms")
    x = g.input("x", (7, 1000), "float16")
    w = g.input("w", (1000,), "float16")
    b = g.input("b", (1000,), "float16")
    g.output("soft", nn.softmax(x, -1))
    g.output("logsoft", nn.log_softmax(x.cast("float32"), -1))
    g.output("rms", nn.rms_norm(x, w, eps=1e-6))
    g.output("ln", nn.layer_norm(x, w, b, eps=1e-5))
    return g


def _many_short_rows() -> ts.Graph:
    g = ts.Graph("many_short_rows")
    x = g.input("x", (1001, 45), "float32")
    g.output("out", nn.softmax(x, -1) * x.max(-1, keepdim=True))
    return g


def _rope() -> ts.Graph:
    g = ts.Graph("rope")
    x = g.input("x", (2, 3, 17, 8), "float16")
    g.output("out", nn.rope(x))
    return g


def _matmul() -> ts.Graph:
    g = ts.Graph("matmul")
    a = g.input("a", (33, 47), "float32")
    b = g.input("b", (47, 29), "float32")
    bias = g.input("bias", (29,), "float32")
    g.output("out", nn.gelu(a @ b + bias))
    return g


def _shared_outputs() -> ts.Graph:
    g = ts.Graph("shared_outputs")
    x = g.input("x", (5, 9), "float32")
    y = x * 3
    g.output("y", y)
    g.output("y_again", y)
    g.output("x_copy", x)
    g.output("z", y.sum(-1))
    return g


def _attention() -> ts.Graph:
    g = ts.Graph("attention_small")
    q = g.input("q", (2, 2, 19, 16), "float16")
    k = g.input("k", (2, 2, 23, 16), "float16")
    v = g.input("v", (2, 2, 23, 16), "float16")
    g.output("o", nn.attention(q, k, v, causal=True))
    return g


def _tensor_core_mlp() -> ts.Graph:
    g = ts.Graph("tensor_core_mlp")          # sizes that divide no tile
    x = g.input("x", (100, 72), "float16")
    w1 = g.input("w1", (136, 72), "float16")
    b1 = g.input("b1", (136,), "float16")
    w2 = g.input("w2", (40, 136), "float16")
    g.output("y", nn.linear(nn.gelu(nn.linear(x, w1, b1)), w2) + 1)
    return g


def _tensor_core_batched() -> ts.Graph:
    g = ts.Graph("tensor_core_batched")      # a batch of bf16 products against one shared right operand
    a = g.input("a", (3, 2, 50, 64), "bfloat16")
    b = g.input("b", (64, 48), "bfloat16")
    g.output("c", (a @ b) * 0.5)
    return g


def decoder_block(tokens: int = 200) -> ts.Graph:
    """The suite's Llama-style block at 256 wide (4 heads, FFN 384) and, by default, 200 tokens: sizes that divide no
    tile; its matmuls read normalised activations and heads permuted back into rows."""
    return llama_block(tokens, width=256, heads=4, ffn=384)


def deep_shared_chain(links: int = 1000) -> ts.Graph:
    """2 * links + 1 nodes, each used twice: as a tree it would have 2**links leaves; recursion would overflow."""
    g = ts.Graph("chain")
    t = g.input("x", (4,), "float32")
    for _ in range(links):
        t = (t + t).sin()
    g.output("y", t)
    return g


def residual_layers(depth: int, tokens: int = 64, width: int = 256) -> ts.Graph:
    """Pre-norm residual layers, each with weights of its own (norm, matmul, activation, residual add): the
    structure a model repeats, for the tests of compile time and kernels at depth."""
    g = ts.Graph("layers")
    x = g.input("x", (tokens, width), "float16")
    for layer in range(depth):
        h = nn.rms_norm(x, g.input(f"gain{layer}", (width,), "float16"))
        x = x + nn.silu(h @ g.input(f"w{layer}", (width, width), "float16"))
    g.output("y", x)
    return g


def _batch_of_one_norms() -> ts.Graph:
    """Norms of a (1, T, D) activation, as a model called on one sequence has them: each one row kernel, its
    statistics read back at the rows' unit batch index."""
    g = ts.Graph("batch_of_one_norms")
    x = g.input("x", (1, 45, 1000), "float16")
    g.output("rms", nn.rms_norm(x, g.input("w", (1000,), "float16")))
    g.output("layer", nn.layer_norm(x.cast("float32")))
    return g


def _reshaped_row_outputs() -> ts.Graph:
    """Row kernels whose outputs are reshapes of what their rows compute: a product of one row returned as
    (1, 1, N), as a decode step's last linear layer returns it, and softmax rows returned regrouped. Each kernel
    writes its reshaped output itself, with no copy kernel after it."""
    g = ts.Graph("reshaped_row_outputs")
    x = g.input("x", (1, 300), "float16")
    g.output("y", (x @ g.input("w", (520, 300), "float16").transpose(0, 1)).reshape((1, 1, 520)))
    rows = g.input("rows", (6, 100), "float32")
    g.output("p", nn.softmax(rows, -1).reshape((3, 2, 10, 10)))
    return g


CASES: dict[str, Callable[[], ts.Graph]] = {
    "pointwise_math": _pointwise_math, "views": _views, "broadcast_bf16": _broadcast_bf16,
    "integers": _integers, "lookups": _lookups, "column_sum": _column_sum, "full_sum": _full_sum, "norms": _norms,
    "many_short_rows": _many_short_rows, "rope": _rope, "matmul": _matmul, "shared_outputs": _shared_outputs,
    "attention": _attention, "tensor_core_mlp": _tensor_core_mlp, "tensor_core_batched": _tensor_core_batched,
    "decoder_block": decoder_block, "batch_of_one_norms": _batch_of_one_norms,
    "reshaped_row_outputs": _reshaped_row_outputs,
}
