"""Attention as models call it: causal prefill (every head its own keys, and grouped-query), grouped-query decode
over a cache (with repeat_kv, as Llama's code does), and single-query multi-head decode."""
import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.bench import Case, causal_attention_flops

try:
    import torch.nn.functional as F
except ImportError:   # the graphs build without torch; only the references need it
    F = None  # type: ignore[assignment]

HEAD_DIM = 128
PREFILL = (4, 32, 2048)                 # batch, heads, tokens
DECODE_BATCH, DECODE_HEADS, DECODE_KV_HEADS, CACHED = 8, 32, 8, 4096


def repeat_kv(t: ts.Tensor, times: int) -> ts.Tensor:
    """(batch, kv heads, keys, dim) -> (batch, kv heads * times, keys, dim), each head repeated `times` times."""
    batch, heads, keys, dim = t.shape
    return t.reshape(batch, heads, 1, keys, dim).expand(batch, heads, times, keys, dim) \
        .reshape(batch, heads * times, keys, dim)


def torch_repeat_kv(t, times: int):
    batch, heads, keys, dim = t.shape
    return t[:, :, None, :, :].expand(batch, heads, times, keys, dim).reshape(batch, heads * times, keys, dim)


def prefill_causal(shape: tuple[int, int, int] = PREFILL) -> ts.Graph:
    g = ts.Graph("attention_prefill_causal" if shape == PREFILL else "attention_prefill_causal_small")
    q, k, v = (g.input(name, (*shape, HEAD_DIM), "float16") for name in "qkv")
    g.output("y", nn.attention(q, k, v, causal=True))
    return g


def prefill_gqa(shape: tuple[int, int, int] = PREFILL, repeats: int = DECODE_HEADS // DECODE_KV_HEADS) -> ts.Graph:
    """Causal prefill with grouped-query heads (Llama 3's 32 query heads over 8 kv heads): repeat_kv, then attention."""
    batch, heads, tokens = shape
    g = ts.Graph("attention_prefill_gqa" if shape == PREFILL else "attention_prefill_gqa_small")
    q = g.input("q", (batch, heads, tokens, HEAD_DIM), "float16")
    k, v = (repeat_kv(g.input(name, (batch, heads // repeats, tokens, HEAD_DIM), "float16"), repeats) for name in "kv")
    g.output("y", nn.attention(q, k, v, causal=True))
    return g


def torch_prefill_gqa(q, k, v):
    times = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, torch_repeat_kv(k, times), torch_repeat_kv(v, times), is_causal=True)


def decode(kv_heads: int) -> ts.Graph:
    g = ts.Graph(f"attention_decode_{'gqa' if kv_heads < DECODE_HEADS else 'mha'}")
    q = g.input("q", (DECODE_BATCH, DECODE_HEADS, 1, HEAD_DIM), "float16")
    k, v = (g.input(name, (DECODE_BATCH, kv_heads, CACHED, HEAD_DIM), "float16") for name in "kv")
    if kv_heads < DECODE_HEADS:
        k, v = repeat_kv(k, DECODE_HEADS // kv_heads), repeat_kv(v, DECODE_HEADS // kv_heads)
    g.output("y", nn.attention(q, k, v))
    return g


def torch_decode_gqa(q, k, v):
    times = DECODE_HEADS // DECODE_KV_HEADS
    return F.scaled_dot_product_attention(q, torch_repeat_kv(k, times), torch_repeat_kv(v, times))


batch, heads, tokens = PREFILL
CASES = [
    Case(prefill_causal(), lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), "attention",
         flops=causal_attention_flops(batch, heads, tokens, HEAD_DIM), note="FLOPs of the unmasked half"),
    Case(prefill_gqa(), torch_prefill_gqa, "attention", flops=causal_attention_flops(batch, heads, tokens, HEAD_DIM),
         note="FLOPs of the unmasked half"),
    Case(decode(DECODE_KV_HEADS), torch_decode_gqa, "attention"),
    Case(decode(DECODE_HEADS), lambda q, k, v: F.scaled_dot_product_attention(q, k, v), "attention"),
]
