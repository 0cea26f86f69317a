"""A transformer MLP block: y = linear(gelu(linear(x, w1, b1)), w2, b2), GELU in its tanh form.

x is (64, 256) float16 (tokens by model width); the hidden width is 4x the model width.
Weights are (out_features, in_features) as in PyTorch, so linear(x, w, b) = x @ w.T + b.
"""
import tensorsmith as ts
from tensorsmith import nn

TOKENS, WIDTH, HIDDEN = 64, 256, 1024


def build() -> ts.Graph:
    """The MLP graph: inputs x, w1, b1, w2, b2 (float16), output y (TOKENS, WIDTH)."""
    g = ts.Graph("gelu_mlp")
    x = g.input("x", (TOKENS, WIDTH), "float16")
    w1 = g.input("w1", (HIDDEN, WIDTH), "float16")
    b1 = g.input("b1", (HIDDEN,), "float16")
    w2 = g.input("w2", (WIDTH, HIDDEN), "float16")
    b2 = g.input("b2", (WIDTH,), "float16")
    g.output("y", nn.linear(nn.gelu(nn.linear(x, w1, b1)), w2, b2))
    return g
