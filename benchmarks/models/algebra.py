"""Layers whose written form is not their fastest: the e-graph's rewrites of matrix products choose another
(issue 19). Each is written the way a model writes it; the search compares the written form with the others."""
import tensorsmith as ts
from tensorsmith.bench import Case

try:
    import torch
except ImportError:   # the graphs build without torch; only the references need it
    torch = None  # type: ignore[assignment]

WIDTH, FFN = 4096, 11008           # Llama-7B
HEAD, KEYS = 64, 4096              # linear attention: one head of 64, 4096 positions
LORA_RANK = 16


def row_scaled_linear(tokens: int) -> ts.Graph:
    """Activations scaled per token (a dequantisation or a norm's 1/rms) and then projected: (x * s) @ W."""
    g = ts.Graph(f"row_scaled_linear_{tokens}")
    x, s = g.input("x", (tokens, WIDTH), "float16"), g.input("s", (tokens, 1), "float16")
    w = g.input("w", (WIDTH, FFN), "float16")
    g.output("y", (x * s) @ w)
    return g


def torch_row_scaled_linear(x, s, w):
    return (x * s) @ w


def linear_attention() -> ts.Graph:
    """Attention without its softmax, written as (Q K^T) V: the (n, n) scores need not exist, Q (K^T V) is 64 times
    fewer FLOPs."""
    g = ts.Graph("linear_attention")
    q, k, v = (g.input(name, (KEYS, HEAD), "float16") for name in ("q", "k", "v"))
    g.output("y", (q @ k.T) @ v)
    return g


def torch_linear_attention(q, k, v):
    return (q @ k.T) @ v


def two_branches(tokens: int) -> ts.Graph:
    """Two projections of the same input added (parallel branches, or an adapter beside its frozen weight merged):
    x @ W1 + x @ W2."""
    g = ts.Graph(f"two_branches_{tokens}")
    x = g.input("x", (tokens, WIDTH // 2), "float16")
    w1, w2 = g.input("w1", (WIDTH // 2, WIDTH // 2), "float16"), g.input("w2", (WIDTH // 2, WIDTH // 2), "float16")
    g.output("y", x @ w1 + x @ w2)
    return g


def torch_two_branches(x, w1, w2):
    return x @ w1 + x @ w2


def lora_delta(tokens: int) -> ts.Graph:
    """A LoRA adapter's update with its factors merged first, as a merged-weight implementation writes it:
    x @ (A^T @ B^T), a (4096 x 4096) product of rank 16, where (x @ A^T) @ B^T is two thin products."""
    g = ts.Graph(f"lora_delta_{tokens}")
    x = g.input("x", (tokens, WIDTH), "float16")
    a, b = g.input("lora_a", (LORA_RANK, WIDTH), "float16"), g.input("lora_b", (WIDTH, LORA_RANK), "float16")
    g.output("y", x @ (a.T @ b.T))
    return g


def torch_lora_delta(x, lora_a, lora_b):
    return x @ (lora_a.T @ lora_b.T)


WRITTEN_FLOOR = "floor of the graph as written: another form can do less work"
CASES = [
    Case(row_scaled_linear(128), torch_row_scaled_linear, "algebra", note=WRITTEN_FLOOR),
    Case(linear_attention(), torch_linear_attention, "algebra", note=WRITTEN_FLOOR),
    Case(two_branches(4096), torch_two_branches, "algebra", note=WRITTEN_FLOOR),
    Case(lora_delta(128), torch_lora_delta, "algebra", note=WRITTEN_FLOOR),
]
