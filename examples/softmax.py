"""Row softmax: y = softmax(x) along the last axis of a (1024, 4096) float16 matrix.

y[i, j] = exp(x[i, j] - max_j x[i, :]) / sum_j exp(x[i, j] - max_j x[i, :])
"""
import tensorsmith as ts
from tensorsmith import nn

ROWS, COLS = 1024, 4096


def build() -> ts.Graph:
    """The softmax graph: input x (ROWS, COLS) float16, output y of the same shape."""
    g = ts.Graph("softmax")
    x = g.input("x", (ROWS, COLS), "float16")
    g.output("y", nn.softmax(x, axis=-1))
    return g
