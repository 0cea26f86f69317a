"""Matrix products as a linear layer computes them, y = x @ W.T with W of shape (out, in): M = 16 and 128
(decode), 4096 (prefill) against the (N, K) of a 7B model's projections, in float16 and bfloat16."""
import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.bench import Case

try:
    import torch.nn.functional as F
except ImportError:   # the graphs build without torch; only the references need it
    F = None  # type: ignore[assignment]

ROWS = (16, 128, 4096)
OUT_IN = ((4096, 4096), (11008, 4096), (4096, 11008))
DTYPES = {"float16": "fp16", "bfloat16": "bf16"}


def linear(m: int, n: int, k: int, dtype: str) -> ts.Graph:
    g = ts.Graph(f"matmul_{m}x{n}x{k}_{DTYPES[dtype]}")
    x, w = g.input("x", (m, k), dtype), g.input("w", (n, k), dtype)
    g.output("y", nn.linear(x, w))
    return g


CASES = [Case(linear(m, n, k, dtype), lambda x, w: F.linear(x, w), "matmul")
         for dtype in DTYPES for m in ROWS for n, k in OUT_IN]
