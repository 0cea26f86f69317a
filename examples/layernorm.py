"""LayerNorm over the last axis: y = (x - mean(x)) / sqrt(var(x) + eps) * w + b.

x is (1024, 4096) float16, w and b are (4096,) float16; var is the population variance.
"""
import tensorsmith as ts
from tensorsmith import nn

TOKENS, HIDDEN = 1024, 4096
EPS = 1e-5


def build() -> ts.Graph:
    """The LayerNorm graph: inputs x (TOKENS, HIDDEN), w and b (HIDDEN,), output y like x."""
    g = ts.Graph("layernorm")
    x = g.input("x", (TOKENS, HIDDEN), "float16")
    w = g.input("w", (HIDDEN,), "float16")
    b = g.input("b", (HIDDEN,), "float16")
    g.output("y", nn.layer_norm(x, w, b, eps=EPS))
    return g
