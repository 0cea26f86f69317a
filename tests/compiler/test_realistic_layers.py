"""Realistic layers at the scales users run them: each compiles on the CPU, passes verification, and its program
matches a float64 numpy evaluation written here from the layer's meaning (issue 17), not the reference interpreter."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

import tensorsmith as ts
from tensorsmith import nn

DATA_SEED = 1717          # not verification's seeds (the compile's seed 0 and up, and 1000 for its large draw)
BUDGET_S = 2.0            # the compile's budget per layer: CI runs the whole suite on two cores
FLOAT16_TOLERANCE = 2e-2  # float16 keeps 11 bits (roundoff 4.9e-4): a layer's float16 roundings give ~1e-3, a bug O(1)
FLOAT32_TOLERANCE = 1e-4  # float32's roundoff is 6e-8: even a 32000-term float32 sum stays near 1e-6
ROPE_BASE = 10000.0
RMS_EPS, LAYER_NORM_EPS = 1e-6, 1e-5
BIAS_STD = 0.02           # biases as GPT-2's initialiser draws them
NORM_WEIGHT_STD = 0.1     # norm weights near 1, as trained ones are

Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class Layer:
    """A graph, how users' inputs to it are drawn, and what it means, in numpy."""

    build: Callable[[], ts.Graph]
    draw: Callable[[np.random.Generator], Arrays]
    meaning: Callable[[Arrays], np.ndarray]   # the output in float64, from the inputs in float64
    tolerance: float


def relative_l2(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref|| / ||ref||, in float64."""
    out64, ref64 = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm((out64 - ref64).ravel()) / np.linalg.norm(ref64.ravel()))


# numpy's float64 formulas --------------------------------------------------------------------------------------------

def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    centered = x - x.mean(-1, keepdims=True)
    return centered / np.sqrt((centered**2).mean(-1, keepdims=True) + LAYER_NORM_EPS) * weight + bias


def rms_norm(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + RMS_EPS) * weight


def rope(x: np.ndarray) -> np.ndarray:
    """Rotate-half rotary embedding of (..., tokens, dim): pair i and i + dim/2 turned by position * base**(-2i/dim)."""
    tokens, dim = x.shape[-2:]
    angle = np.outer(np.arange(tokens), ROPE_BASE ** (-np.arange(0, dim, 2) / dim))
    cos, sin = np.cos(angle), np.sin(angle)
    x1, x2 = x[..., :dim // 2], x[..., dim // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = False,
              bias: np.ndarray | None = None) -> np.ndarray:
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias
    if causal:
        queries, keys = scores.shape[-2:]
        scores = np.where(np.triu(np.ones((queries, keys), bool), keys - queries + 1), -np.inf, scores)
    return softmax(scores) @ v


# users' inputs -------------------------------------------------------------------------------------------------------

def activations(rng: np.random.Generator, shape: tuple[int, ...], dtype: str = "float16") -> np.ndarray:
    """N(0, 1), drawn in float32 (a 45M-element weight in float64 takes seconds) and rounded once."""
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


def weight(rng: np.random.Generator, shape: tuple[int, int], fan_in: int) -> np.ndarray:
    """N(0, 1/fan_in), as initialisers draw a weight matrix."""
    return (activations(rng, shape, "float32") * np.float32(1 / math.sqrt(fan_in))).astype(np.float16)


def norm_weight(rng: np.random.Generator, width: int) -> np.ndarray:
    """Near 1, as a trained norm's scale is (an N(0, 1) scale would flip signs no model has)."""
    return (1.0 + NORM_WEIGHT_STD * rng.standard_normal(width)).astype(np.float16)


def bias(rng: np.random.Generator, width: int) -> np.ndarray:
    """Small, as GPT-2's initialiser draws biases."""
    return (BIAS_STD * rng.standard_normal(width)).astype(np.float16)


# 1. Llama-7B's SwiGLU MLP --------------------------------------------------------------------------------------------

MLP_TOKENS, MLP_WIDTH, MLP_HIDDEN = 128, 4096, 11008


def swiglu_mlp() -> ts.Graph:
    """Llama-7B's MLP in the (in, out) weight layout: the size whose float16 products overflowed unscaled draws."""
    g = ts.Graph("swiglu_mlp_4096")
    x = g.input("x", (MLP_TOKENS, MLP_WIDTH), "float16")
    w1, w3 = (g.input(name, (MLP_WIDTH, MLP_HIDDEN), "float16") for name in ("w1", "w3"))
    w2 = g.input("w2", (MLP_HIDDEN, MLP_WIDTH), "float16")
    g.output("y", (nn.silu(x @ w1) * (x @ w3)) @ w2)
    return g


def swiglu_mlp_inputs(rng: np.random.Generator) -> Arrays:
    return {"x": activations(rng, (MLP_TOKENS, MLP_WIDTH)),
            "w1": weight(rng, (MLP_WIDTH, MLP_HIDDEN), MLP_WIDTH),
            "w3": weight(rng, (MLP_WIDTH, MLP_HIDDEN), MLP_WIDTH),
            "w2": weight(rng, (MLP_HIDDEN, MLP_WIDTH), MLP_HIDDEN)}


def swiglu_mlp_meaning(a: Arrays) -> np.ndarray:
    return (silu(a["x"] @ a["w1"]) * (a["x"] @ a["w3"])) @ a["w2"]


# 2. a GPT-2 block ----------------------------------------------------------------------------------------------------

GPT2_TOKENS, GPT2_WIDTH, GPT2_HEADS = 128, 768, 12
GPT2_HEAD_DIM = GPT2_WIDTH // GPT2_HEADS


def gpt2_block() -> ts.Graph:
    """LayerNorm, fused QKV with bias, causal attention over 12 heads, output projection, GELU MLP, residuals."""
    g = ts.Graph("gpt2_block_realistic")
    width, tokens = GPT2_WIDTH, GPT2_TOKENS
    x = g.input("x", (tokens, width), "float16")
    ln1_w, ln1_b, ln2_w, ln2_b = (g.input(name, (width,), "float16") for name in ("ln1_w", "ln1_b", "ln2_w", "ln2_b"))
    w_qkv, b_qkv = g.input("w_qkv", (3 * width, width), "float16"), g.input("b_qkv", (3 * width,), "float16")
    w_o, b_o = g.input("w_o", (width, width), "float16"), g.input("b_o", (width,), "float16")
    w_fc, b_fc = g.input("w_fc", (4 * width, width), "float16"), g.input("b_fc", (4 * width,), "float16")
    w_proj, b_proj = g.input("w_proj", (width, 4 * width), "float16"), g.input("b_proj", (width,), "float16")

    def split_heads(t: ts.Tensor) -> ts.Tensor:
        return t.reshape(tokens, GPT2_HEADS, GPT2_HEAD_DIM).permute(1, 0, 2)

    qkv = nn.linear(nn.layer_norm(x, ln1_w, ln1_b, eps=LAYER_NORM_EPS), w_qkv, b_qkv)
    q, k, v = (split_heads(qkv[:, i * width:(i + 1) * width]) for i in range(3))
    attended = nn.attention(q, k, v, causal=True).permute(1, 0, 2).reshape(tokens, width)
    h = x + nn.linear(attended, w_o, b_o)
    m = nn.gelu(nn.linear(nn.layer_norm(h, ln2_w, ln2_b, eps=LAYER_NORM_EPS), w_fc, b_fc))
    g.output("y", h + nn.linear(m, w_proj, b_proj))
    return g


def gpt2_block_inputs(rng: np.random.Generator) -> Arrays:
    width = GPT2_WIDTH
    return {"x": activations(rng, (GPT2_TOKENS, width)),
            "ln1_w": norm_weight(rng, width), "ln1_b": bias(rng, width),
            "ln2_w": norm_weight(rng, width), "ln2_b": bias(rng, width),
            "w_qkv": weight(rng, (3 * width, width), width), "b_qkv": bias(rng, 3 * width),
            "w_o": weight(rng, (width, width), width), "b_o": bias(rng, width),
            "w_fc": weight(rng, (4 * width, width), width), "b_fc": bias(rng, 4 * width),
            "w_proj": weight(rng, (width, 4 * width), 4 * width), "b_proj": bias(rng, width)}


def gpt2_block_meaning(a: Arrays) -> np.ndarray:
    x, width = a["x"], GPT2_WIDTH
    qkv = layer_norm(x, a["ln1_w"], a["ln1_b"]) @ a["w_qkv"].T + a["b_qkv"]
    q, k, v = (qkv[:, i * width:(i + 1) * width].reshape(GPT2_TOKENS, GPT2_HEADS, GPT2_HEAD_DIM).transpose(1, 0, 2)
               for i in range(3))
    attended = attention(q, k, v, causal=True).transpose(1, 0, 2).reshape(GPT2_TOKENS, width)
    h = x + attended @ a["w_o"].T + a["b_o"]
    m = gelu_tanh(layer_norm(h, a["ln2_w"], a["ln2_b"]) @ a["w_fc"].T + a["b_fc"])
    return h + m @ a["w_proj"].T + a["b_proj"]


# 3. a Llama block ----------------------------------------------------------------------------------------------------

LLAMA_TOKENS, LLAMA_WIDTH, LLAMA_HEADS, LLAMA_FFN = 128, 512, 8, 1408   # FFN: 2/3 of 4 x 512, rounded up to 64
LLAMA_HEAD_DIM = LLAMA_WIDTH // LLAMA_HEADS
LLAMA_WEIGHTS = ("wq", "wk", "wv", "wo")


def llama_block() -> ts.Graph:
    """RMSNorm, Q/K/V projections, RoPE on q and k, causal attention, output projection, SwiGLU MLP, residuals."""
    g = ts.Graph("llama_block_realistic")
    tokens, width = LLAMA_TOKENS, LLAMA_WIDTH
    x = g.input("x", (tokens, width), "float16")
    attn_norm, ffn_norm = g.input("attn_norm", (width,), "float16"), g.input("ffn_norm", (width,), "float16")
    wq, wk, wv, wo = (g.input(name, (width, width), "float16") for name in LLAMA_WEIGHTS)
    w_gate, w_up = g.input("w_gate", (LLAMA_FFN, width), "float16"), g.input("w_up", (LLAMA_FFN, width), "float16")
    w_down = g.input("w_down", (width, LLAMA_FFN), "float16")

    def split_heads(t: ts.Tensor) -> ts.Tensor:
        return t.reshape(tokens, LLAMA_HEADS, LLAMA_HEAD_DIM).permute(1, 0, 2)

    a = nn.rms_norm(x, attn_norm, eps=RMS_EPS)
    q, k, v = (split_heads(nn.linear(a, w)) for w in (wq, wk, wv))
    attended = nn.attention(nn.rope(q, ROPE_BASE), nn.rope(k, ROPE_BASE), v, causal=True)
    h = x + nn.linear(attended.permute(1, 0, 2).reshape(tokens, width), wo)
    b = nn.rms_norm(h, ffn_norm, eps=RMS_EPS)
    g.output("y", h + nn.linear(nn.silu(nn.linear(b, w_gate)) * nn.linear(b, w_up), w_down))
    return g


def llama_block_inputs(rng: np.random.Generator) -> Arrays:
    width = LLAMA_WIDTH
    return {"x": activations(rng, (LLAMA_TOKENS, width)),
            "attn_norm": norm_weight(rng, width), "ffn_norm": norm_weight(rng, width),
            **{name: weight(rng, (width, width), width) for name in LLAMA_WEIGHTS},
            "w_gate": weight(rng, (LLAMA_FFN, width), width), "w_up": weight(rng, (LLAMA_FFN, width), width),
            "w_down": weight(rng, (width, LLAMA_FFN), LLAMA_FFN)}


def llama_block_meaning(a: Arrays) -> np.ndarray:
    x = a["x"]

    def split_heads(t: np.ndarray) -> np.ndarray:
        return t.reshape(LLAMA_TOKENS, LLAMA_HEADS, LLAMA_HEAD_DIM).transpose(1, 0, 2)

    n = rms_norm(x, a["attn_norm"])
    q, k, v = (split_heads(n @ a[name].T) for name in ("wq", "wk", "wv"))
    attended = attention(rope(q), rope(k), v, causal=True).transpose(1, 0, 2).reshape(LLAMA_TOKENS, LLAMA_WIDTH)
    h = x + attended @ a["wo"].T
    m = rms_norm(h, a["ffn_norm"])
    return h + (silu(m @ a["w_gate"].T) * (m @ a["w_up"].T)) @ a["w_down"].T


# 4. three float16 4096 x 4096 products in a chain --------------------------------------------------------------------

CHAIN_TOKENS, CHAIN_WIDTH = 128, 4096
CHAIN_WEIGHTS = ("w1", "w2", "w3")


def matmul_chain() -> ts.Graph:
    """x @ w1 @ w2 @ w3: the e-graph also holds (w1 @ w2) @ w3 forms, 4096**3 products that must not win."""
    g = ts.Graph("matmul_chain_4096")
    x = g.input("x", (CHAIN_TOKENS, CHAIN_WIDTH), "float16")
    w1, w2, w3 = (g.input(name, (CHAIN_WIDTH, CHAIN_WIDTH), "float16") for name in CHAIN_WEIGHTS)
    g.output("y", x @ w1 @ w2 @ w3)
    return g


def matmul_chain_inputs(rng: np.random.Generator) -> Arrays:
    return {"x": activations(rng, (CHAIN_TOKENS, CHAIN_WIDTH)),
            **{name: weight(rng, (CHAIN_WIDTH, CHAIN_WIDTH), CHAIN_WIDTH) for name in CHAIN_WEIGHTS}}


def matmul_chain_meaning(a: Arrays) -> np.ndarray:
    return a["x"] @ a["w1"] @ a["w2"] @ a["w3"]


# 5. grouped-query decode ---------------------------------------------------------------------------------------------

DECODE_HEADS, DECODE_KV_HEADS, DECODE_CACHED, DECODE_HEAD_DIM = 32, 8, 1024, 128
DECODE_GROUP = DECODE_HEADS // DECODE_KV_HEADS


def gqa_decode() -> ts.Graph:
    """One query token of 32 heads against a cache of 8 KV heads, each repeated 4 times as Llama's repeat_kv does."""
    g = ts.Graph("gqa_decode_realistic")
    q = g.input("q", (1, DECODE_HEADS, 1, DECODE_HEAD_DIM), "float16")
    shape = (1, DECODE_KV_HEADS, DECODE_CACHED, DECODE_HEAD_DIM)
    k, v = g.input("k", shape, "float16"), g.input("v", shape, "float16")

    def repeat_kv(t: ts.Tensor) -> ts.Tensor:
        return t.reshape(1, DECODE_KV_HEADS, 1, DECODE_CACHED, DECODE_HEAD_DIM) \
            .expand(1, DECODE_KV_HEADS, DECODE_GROUP, DECODE_CACHED, DECODE_HEAD_DIM) \
            .reshape(1, DECODE_HEADS, DECODE_CACHED, DECODE_HEAD_DIM)

    g.output("y", nn.attention(q, repeat_kv(k), repeat_kv(v)))
    return g


def gqa_decode_inputs(rng: np.random.Generator) -> Arrays:
    shape = (1, DECODE_KV_HEADS, DECODE_CACHED, DECODE_HEAD_DIM)
    return {"q": activations(rng, (1, DECODE_HEADS, 1, DECODE_HEAD_DIM)),
            "k": activations(rng, shape), "v": activations(rng, shape)}


def gqa_decode_meaning(a: Arrays) -> np.ndarray:
    return attention(a["q"], np.repeat(a["k"], DECODE_GROUP, axis=1), np.repeat(a["v"], DECODE_GROUP, axis=1))


# 6. attention with an additive bias ----------------------------------------------------------------------------------

BIASED_SHAPE = (2, 8, 128, 64)   # batch, heads, tokens, head dim


def biased_attention() -> ts.Graph:
    """float32 attention with a per-head (tokens x tokens) bias, as relative-position biases are added."""
    g = ts.Graph("biased_attention")
    q, k, v = (g.input(name, BIASED_SHAPE, "float32") for name in "qkv")
    _, heads, tokens, _ = BIASED_SHAPE
    g.output("y", nn.attention(q, k, v, bias=g.input("bias", (heads, tokens, tokens), "float32")))
    return g


def biased_attention_inputs(rng: np.random.Generator) -> Arrays:
    _, heads, tokens, _ = BIASED_SHAPE
    return {**{name: activations(rng, BIASED_SHAPE, "float32") for name in "qkv"},
            "bias": activations(rng, (heads, tokens, tokens), "float32")}


def biased_attention_meaning(a: Arrays) -> np.ndarray:
    return attention(a["q"], a["k"], a["v"], bias=a["bias"])


# 7. a cross-entropy loss ---------------------------------------------------------------------------------------------

LOSS_TOKENS, LOSS_VOCAB = 64, 32000   # the 256 tokens: the exact check's two draws alone took 16-20 s


def cross_entropy() -> ts.Graph:
    """mean over tokens of -log_softmax(logits)[target], the target picked by a one-hot of iota == target."""
    g = ts.Graph("cross_entropy")
    logits = g.input("logits", (LOSS_TOKENS, LOSS_VOCAB), "float32")
    targets = g.input("targets", (LOSS_TOKENS,), "int32")
    hot = ts.iota((LOSS_TOKENS, LOSS_VOCAB), axis=1) == targets.reshape(LOSS_TOKENS, 1).expand(LOSS_TOKENS, LOSS_VOCAB)
    picked = (nn.log_softmax(logits, -1) * hot.cast("float32")).sum(-1)
    g.output("loss", -picked.mean())
    return g


def cross_entropy_inputs(rng: np.random.Generator) -> Arrays:
    return {"logits": activations(rng, (LOSS_TOKENS, LOSS_VOCAB), "float32"),
            "targets": rng.integers(0, LOSS_VOCAB, LOSS_TOKENS, dtype=np.int32)}


def cross_entropy_meaning(a: Arrays) -> np.ndarray:
    targets = a["targets"].astype(np.int64)
    return np.asarray(-np.mean(log_softmax(a["logits"])[np.arange(LOSS_TOKENS), targets]))


LAYERS: dict[str, Layer] = {
    "swiglu_mlp_4096": Layer(swiglu_mlp, swiglu_mlp_inputs, swiglu_mlp_meaning, FLOAT16_TOLERANCE),
    "gpt2_block": Layer(gpt2_block, gpt2_block_inputs, gpt2_block_meaning, FLOAT16_TOLERANCE),
    "llama_block": Layer(llama_block, llama_block_inputs, llama_block_meaning, FLOAT16_TOLERANCE),
    "matmul_chain_4096": Layer(matmul_chain, matmul_chain_inputs, matmul_chain_meaning, FLOAT16_TOLERANCE),
    "gqa_decode": Layer(gqa_decode, gqa_decode_inputs, gqa_decode_meaning, FLOAT16_TOLERANCE),
    "biased_attention": Layer(biased_attention, biased_attention_inputs, biased_attention_meaning, FLOAT32_TOLERANCE),
    "cross_entropy": Layer(cross_entropy, cross_entropy_inputs, cross_entropy_meaning, FLOAT32_TOLERANCE),
}


@pytest.mark.parametrize("name", LAYERS)
def test_a_realistic_layer_compiles_and_matches_its_meaning(name: str) -> None:
    """Verification accepts it, and on users' inputs its program computes what the layer means."""
    layer = LAYERS[name]
    graph = layer.build()
    program = ts.compile(graph, profile=False, cache=False, budget_s=BUDGET_S, progress=False)
    assert program.report["checks"] and all(c["relative_l2"] <= c["tolerance"] for c in program.report["checks"])
    inputs = layer.draw(np.random.default_rng(DATA_SEED))
    [output] = graph.outputs
    got = program(device="cpu", **inputs)[output]
    want = layer.meaning({key: value.astype(np.float64) if value.dtype.kind == "f" else value
                          for key, value in inputs.items()})
    assert got.shape == want.shape and np.isfinite(got).all()
    assert relative_l2(got, want) <= layer.tolerance
