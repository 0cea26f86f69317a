"""RMSNorm over the last axis, as in LLaMA: y = x / sqrt(mean(x**2) + eps) * w.

x is (1024, 4096) float16 (tokens by hidden size), w is the (4096,) float16 gain.
"""
import tensorsmith as ts
from tensorsmith import nn

TOKENS, HIDDEN = 1024, 4096
EPS = 1e-6


def build() -> ts.Graph:
    """The RMSNorm graph: inputs x (TOKENS, HIDDEN) and w (HIDDEN,), output y like x."""
    g = ts.Graph("rmsnorm")
    x = g.input("x", (TOKENS, HIDDEN), "float16")
    w = g.input("w", (HIDDEN,), "float16")
    g.output("y", nn.rms_norm(x, w, eps=EPS))
    return g
