"""Memory-bound layers over 8192 x 8192 float16 activations: softmax, RMSNorm, LayerNorm and SwiGLU's gate."""
import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.bench import Case

try:
    import torch.nn.functional as F
except ImportError:   # the graphs build without torch; only the references need it
    F = None  # type: ignore[assignment]

ROWS, COLS = 8192, 8192
RMS_EPS, LAYER_NORM_EPS = 1e-6, 1e-5


def softmax() -> ts.Graph:
    g = ts.Graph("softmax")
    g.output("y", nn.softmax(g.input("x", (ROWS, COLS), "float16"), axis=-1))
    return g


def rmsnorm() -> ts.Graph:
    g = ts.Graph("rmsnorm")
    x, w = g.input("x", (ROWS, COLS), "float16"), g.input("w", (COLS,), "float16")
    g.output("y", nn.rms_norm(x, w, eps=RMS_EPS))
    return g


def layernorm() -> ts.Graph:
    g = ts.Graph("layernorm")
    x = g.input("x", (ROWS, COLS), "float16")
    w, b = g.input("w", (COLS,), "float16"), g.input("b", (COLS,), "float16")
    g.output("y", nn.layer_norm(x, w, b, eps=LAYER_NORM_EPS))
    return g


def swiglu_gate() -> ts.Graph:
    g = ts.Graph("swiglu_gate")
    a, b = g.input("a", (ROWS, COLS), "float16"), g.input("b", (ROWS, COLS), "float16")
    g.output("y", nn.silu(a) * b)
    return g


CASES = [
    Case(softmax(), lambda x: F.softmax(x, dim=-1), "memory-bound"),
    Case(rmsnorm(), lambda x, w: F.rms_norm(x, (COLS,), w, eps=RMS_EPS), "memory-bound"),
    Case(layernorm(), lambda x, w, b: F.layer_norm(x, (COLS,), w, b, eps=LAYER_NORM_EPS), "memory-bound"),
    Case(swiglu_gate(), lambda a, b: F.silu(a) * b, "memory-bound"),
]
