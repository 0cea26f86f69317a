"""Causal self-attention, written out: o = softmax(q @ k^T / sqrt(D) + mask) @ v.

q, k, v are (batch 1, heads 8, tokens 128, head dim 64) float16. Query i sees keys 0..i: the
mask adds -1e9 where key j > i. Scores and softmax run in float32.
"""
import math

import tensorsmith as ts
from tensorsmith import nn

BATCH, HEADS, TOKENS, HEAD_DIM = 1, 8, 128, 64
SCALE = 1.0 / math.sqrt(HEAD_DIM)
MASKED = -1e9  # a finite "minus infinity": exp of it is 0 and it never makes 0 * inf


def build() -> ts.Graph:
    """The attention graph: inputs q, k, v (BATCH, HEADS, TOKENS, HEAD_DIM), output o of the same shape."""
    g = ts.Graph("attention")
    shape = (BATCH, HEADS, TOKENS, HEAD_DIM)
    q, k, v = (g.input(name, shape, "float16") for name in ("q", "k", "v"))
    s = (q @ k.transpose(-1, -2)) * SCALE
    row, col = ts.iota((TOKENS, TOKENS), axis=0), ts.iota((TOKENS, TOKENS), axis=1)
    s = s.cast("float32") + (row < col).cast("float32") * MASKED
    g.output("o", nn.softmax(s, axis=-1) @ v)
    return g
