"""Whole transformer blocks: a Llama-style decoder block (RMSNorm, QKV, RoPE, causal attention, output
projection, residuals, SwiGLU MLP; width 2048, 16 heads, FFN 5632) at 2048 tokens (prefill) and at 16 and 128
(decode-like), and a GPT-2 block (LayerNorm, fused QKV with bias, GELU MLP) over 4 sequences of 1024 tokens."""
import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.bench import Case, causal_attention_flops

try:
    import torch
    import torch.nn.functional as F
except ImportError:   # the graphs build without torch; only the references need it
    torch = F = None  # type: ignore[assignment]

WIDTH, HEADS, FFN = 2048, 16, 5632
HEAD_DIM = WIDTH // HEADS
ROPE_BASE = 10000.0
RMS_EPS, LAYER_NORM_EPS = 1e-6, 1e-5
BIAS_STD = 0.02                    # biases drawn N(0, 0.02^2), as GPT-2's initialiser draws its weights
GPT2_BATCH, GPT2_TOKENS, GPT2_WIDTH, GPT2_HEADS = 4, 1024, 768, 12


def llama_block(tokens: int, width: int = WIDTH, heads: int = HEADS, ffn: int = FFN) -> ts.Graph:
    """The block at `tokens` tokens; the tests build it smaller (other widths are named by them too)."""
    g = ts.Graph(f"llama_block_{tokens}" if (width, heads, ffn) == (WIDTH, HEADS, FFN) else
                 f"llama_block_{tokens}x{width}")
    x = g.input("x", (tokens, width), "float16")
    attn_norm, ffn_norm = g.input("attn_norm", (width,), "float16"), g.input("ffn_norm", (width,), "float16")
    wq, wk, wv, wo = (g.input(name, (width, width), "float16") for name in ("wq", "wk", "wv", "wo"))
    w_gate, w_up = g.input("w_gate", (ffn, width), "float16"), g.input("w_up", (ffn, width), "float16")
    w_down = g.input("w_down", (width, ffn), "float16")

    def split_heads(t: ts.Tensor) -> ts.Tensor:
        return t.reshape(tokens, heads, width // heads).permute(1, 0, 2)

    h = nn.rms_norm(x, attn_norm, eps=RMS_EPS)
    q, k, v = split_heads(nn.linear(h, wq)), split_heads(nn.linear(h, wk)), split_heads(nn.linear(h, wv))
    q, k = nn.rope(q, ROPE_BASE), nn.rope(k, ROPE_BASE)
    attended = nn.attention(q, k, v, causal=True).permute(1, 0, 2).reshape(tokens, width)
    x = x + nn.linear(attended, wo)
    h = nn.rms_norm(x, ffn_norm, eps=RMS_EPS)
    g.output("y", x + nn.linear(nn.silu(nn.linear(h, w_gate)) * nn.linear(h, w_up), w_down))
    return g


def torch_rope(t):
    """Rotary embedding in the rotate-half form of Hugging Face's Llama, computed in float32."""
    seq, dim = t.shape[-2], t.shape[-1]
    inv_freq = ROPE_BASE ** (-torch.arange(0, dim, 2, dtype=torch.float32, device=t.device) / dim)
    angle = torch.outer(torch.arange(seq, dtype=torch.float32, device=t.device), inv_freq)
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
    wide = t.float()
    x1, x2 = wide[..., :dim // 2], wide[..., dim // 2:]
    return (wide * cos + torch.cat([-x2, x1], -1) * sin).to(t.dtype)


def torch_llama_block(x, attn_norm, ffn_norm, wq, wk, wv, wo, w_gate, w_up, w_down):
    tokens = x.shape[0]
    h = F.rms_norm(x, (WIDTH,), attn_norm, eps=RMS_EPS)
    # (batch, heads, tokens, dim), as Hugging Face's Llama calls SDPA: given 3-D tensors SDPA takes its math path
    q, k, v = (F.linear(h, w).view(1, tokens, HEADS, HEAD_DIM).transpose(1, 2) for w in (wq, wk, wv))
    attended = F.scaled_dot_product_attention(torch_rope(q), torch_rope(k), v, is_causal=True)
    x = x + F.linear(attended.transpose(1, 2).reshape(tokens, WIDTH), wo)
    h = F.rms_norm(x, (WIDTH,), ffn_norm, eps=RMS_EPS)
    return x + F.linear(F.silu(F.linear(h, w_gate)) * F.linear(h, w_up), w_down)


def gpt2_block(tokens: int = GPT2_TOKENS) -> ts.Graph:
    g = ts.Graph("gpt2_block" if tokens == GPT2_TOKENS else f"gpt2_block_{tokens}")
    batch, width, heads = GPT2_BATCH, GPT2_WIDTH, GPT2_HEADS
    x = g.input("x", (batch * tokens, width), "float16")
    ln1_w, ln1_b, ln2_w, ln2_b = (g.input(name, (width,), "float16") for name in ("ln1_w", "ln1_b", "ln2_w", "ln2_b"))
    w_qkv, b_qkv = g.input("w_qkv", (3 * width, width), "float16"), g.input("b_qkv", (3 * width,), "float16")
    w_o, b_o = g.input("w_o", (width, width), "float16"), g.input("b_o", (width,), "float16")
    w_fc, b_fc = g.input("w_fc", (4 * width, width), "float16"), g.input("b_fc", (4 * width,), "float16")
    w_proj, b_proj = g.input("w_proj", (width, 4 * width), "float16"), g.input("b_proj", (width,), "float16")

    def split_heads(t: ts.Tensor) -> ts.Tensor:
        return t.reshape(batch, tokens, heads, width // heads).permute(0, 2, 1, 3)

    qkv = nn.linear(nn.layer_norm(x, ln1_w, ln1_b, eps=LAYER_NORM_EPS), w_qkv, b_qkv)
    q, k, v = (split_heads(qkv[:, i * width:(i + 1) * width]) for i in range(3))
    attended = nn.attention(q, k, v, causal=True).permute(0, 2, 1, 3).reshape(batch * tokens, width)
    x = x + nn.linear(attended, w_o, b_o)
    h = nn.gelu(nn.linear(nn.layer_norm(x, ln2_w, ln2_b, eps=LAYER_NORM_EPS), w_fc, b_fc))
    g.output("y", x + nn.linear(h, w_proj, b_proj))
    return g


def torch_gpt2_block(x, ln1_w, ln1_b, ln2_w, ln2_b, w_qkv, b_qkv, w_o, b_o, w_fc, b_fc, w_proj, b_proj):
    batch, width, heads = GPT2_BATCH, GPT2_WIDTH, GPT2_HEADS
    tokens = x.shape[0] // batch
    qkv = F.linear(F.layer_norm(x, (width,), ln1_w, ln1_b, eps=LAYER_NORM_EPS), w_qkv, b_qkv)
    q, k, v = (t.view(batch, tokens, heads, width // heads).transpose(1, 2) for t in qkv.split(width, dim=-1))
    attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + F.linear(attended.transpose(1, 2).reshape(batch * tokens, width), w_o, b_o)
    h = F.gelu(F.linear(F.layer_norm(x, (width,), ln2_w, ln2_b, eps=LAYER_NORM_EPS), w_fc, b_fc), approximate="tanh")
    return x + F.linear(h, w_proj, b_proj)


def _llama_flops(tokens: int) -> float:
    projections = 2.0 * tokens * WIDTH * (4 * WIDTH + 3 * FFN)
    return projections + causal_attention_flops(1, HEADS, tokens, HEAD_DIM)


GPT2_FLOPS = (2.0 * GPT2_BATCH * GPT2_TOKENS * GPT2_WIDTH * 12 * GPT2_WIDTH
              + causal_attention_flops(GPT2_BATCH, GPT2_HEADS, GPT2_TOKENS, GPT2_WIDTH // GPT2_HEADS))

CASES = [
    *(Case(llama_block(tokens), torch_llama_block, "block", flops=_llama_flops(tokens),
           note="FLOPs: attention counted over the unmasked half") for tokens in (2048, 128, 16)),
    Case(gpt2_block(), torch_gpt2_block, "block", std={b: BIAS_STD for b in ("b_qkv", "b_o", "b_fc", "b_proj")},
         flops=GPT2_FLOPS,
         note="FLOPs: attention counted over the unmasked half"),
]
