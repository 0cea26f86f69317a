"""A pre-norm transformer block: x + attention(rms_norm(x)), then h + mlp(rms_norm(h)).

x is (tokens 128, model width 256) float16; 4 heads of 64, causal; a GELU MLP of width 1024. Weights
enter as standard-normal tensors and are scaled by 1/sqrt(fan-in) inside the graph, so activations
keep unit scale whatever values the weights are given.
"""
import math

import tensorsmith as ts
from tensorsmith import nn

TOKENS, WIDTH, HEADS, FFN = 128, 256, 4, 1024
HEAD_DIM = WIDTH // HEADS


def _heads(t: ts.Tensor) -> ts.Tensor:
    """(tokens, width) -> (heads, tokens, head dim)."""
    return t.reshape(TOKENS, HEADS, HEAD_DIM).permute(1, 0, 2)


def build() -> ts.Graph:
    """The block's graph: input x and its weights, output y of x's shape."""
    g = ts.Graph("transformer_block")
    x = g.input("x", (TOKENS, WIDTH), "float16")
    norm1, norm2 = g.input("norm1", (WIDTH,), "float16"), g.input("norm2", (WIDTH,), "float16")
    wq, wk, wv, wo = (g.input(name, (WIDTH, WIDTH), "float16") for name in ("wq", "wk", "wv", "wo"))
    w_up, w_down = g.input("w_up", (FFN, WIDTH), "float16"), g.input("w_down", (WIDTH, FFN), "float16")

    def scaled(w: ts.Tensor) -> ts.Tensor:
        return w * (1.0 / math.sqrt(w.shape[-1]))

    a = nn.rms_norm(x, norm1)
    q, k, v = (_heads(nn.linear(a, scaled(w))) for w in (wq, wk, wv))
    attended = nn.attention(q, k, v, causal=True).permute(1, 0, 2).reshape(TOKENS, WIDTH)
    h = x + nn.linear(attended, scaled(wo))
    m = nn.gelu(nn.linear(nn.rms_norm(h, norm2), scaled(w_up)))
    g.output("y", h + nn.linear(m, scaled(w_down)))
    return g
