"""Layers whose operations a compiler should fuse: RMSNorm into the next linear, a SwiGLU MLP (Llama-7B widths), the
same MLP with its weights scaled in its forward (as muP's multipliers or an initialisation's 1/sqrt(width) are
applied), a LoRA adapter beside its frozen weight, and GPT-2's MLP with its biases and GELU."""
import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.bench import Case
from tensorsmith.suite.blocks import BIAS_STD, GPT2_BATCH, GPT2_TOKENS, GPT2_WIDTH, RMS_EPS

try:
    import torch.nn.functional as F
except ImportError:   # the graphs build without torch; only the references need it
    F = None  # type: ignore[assignment]

WIDTH, FFN = 4096, 11008           # Llama-7B
WEIGHT_SCALE = WIDTH ** -0.5       # the scaled MLP's multiplier on each weight
LORA_RANK, LORA_SCALE = 16, 2.0    # alpha / rank with alpha = 32


def rmsnorm_linear(tokens: int) -> ts.Graph:
    g = ts.Graph(f"rmsnorm_linear_{tokens}")
    x, norm = g.input("x", (tokens, WIDTH), "float16"), g.input("norm", (WIDTH,), "float16")
    w = g.input("w", (WIDTH, WIDTH), "float16")
    g.output("y", nn.linear(nn.rms_norm(x, norm, eps=RMS_EPS), w))
    return g


def torch_rmsnorm_linear(x, norm, w):
    return F.linear(F.rms_norm(x, (WIDTH,), norm, eps=RMS_EPS), w)


def gated_mlp(tokens: int) -> ts.Graph:
    g = ts.Graph(f"gated_mlp_{tokens}")
    x = g.input("x", (tokens, WIDTH), "float16")
    w_gate, w_up = g.input("w_gate", (FFN, WIDTH), "float16"), g.input("w_up", (FFN, WIDTH), "float16")
    w_down = g.input("w_down", (WIDTH, FFN), "float16")
    g.output("y", nn.linear(nn.silu(nn.linear(x, w_gate)) * nn.linear(x, w_up), w_down))
    return g


def torch_gated_mlp(x, w_gate, w_up, w_down):
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def scaled_gated_mlp(tokens: int) -> ts.Graph:
    g = ts.Graph(f"scaled_gated_mlp_{tokens}")
    x = g.input("x", (tokens, WIDTH), "float16")
    w_gate, w_up = g.input("w_gate", (FFN, WIDTH), "float16"), g.input("w_up", (FFN, WIDTH), "float16")
    w_down = g.input("w_down", (WIDTH, FFN), "float16")
    gate, up, down = (w * WEIGHT_SCALE for w in (w_gate, w_up, w_down))
    g.output("y", nn.linear(nn.silu(nn.linear(x, gate)) * nn.linear(x, up), down))
    return g


def torch_scaled_gated_mlp(x, w_gate, w_up, w_down):
    gate, up, down = (w * WEIGHT_SCALE for w in (w_gate, w_up, w_down))
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


def lora(tokens: int) -> ts.Graph:
    g = ts.Graph(f"lora_{tokens}")
    x, w = g.input("x", (tokens, WIDTH), "float16"), g.input("w", (WIDTH, WIDTH), "float16")
    a, b = g.input("lora_a", (LORA_RANK, WIDTH), "float16"), g.input("lora_b", (WIDTH, LORA_RANK), "float16")
    g.output("y", nn.linear(x, w) + nn.linear(nn.linear(x, a), b) * LORA_SCALE)
    return g


def torch_lora(x, w, lora_a, lora_b):
    return F.linear(x, w) + F.linear(F.linear(x, lora_a), lora_b) * LORA_SCALE


def gpt2_mlp(tokens: int) -> ts.Graph:
    g = ts.Graph(f"gpt2_mlp_{tokens}")
    x = g.input("x", (tokens, GPT2_WIDTH), "float16")
    w1, b1 = g.input("w_fc", (4 * GPT2_WIDTH, GPT2_WIDTH), "float16"), g.input("b_fc", (4 * GPT2_WIDTH,), "float16")
    w2, b2 = g.input("w_proj", (GPT2_WIDTH, 4 * GPT2_WIDTH), "float16"), g.input("b_proj", (GPT2_WIDTH,), "float16")
    g.output("y", nn.linear(nn.gelu(nn.linear(x, w1, b1)), w2, b2))
    return g


def torch_gpt2_mlp(x, w_fc, b_fc, w_proj, b_proj):
    return F.linear(F.gelu(F.linear(x, w_fc, b_fc), approximate="tanh"), w_proj, b_proj)


CASES = [
    Case(rmsnorm_linear(16), torch_rmsnorm_linear, "fused"),
    Case(gated_mlp(128), torch_gated_mlp, "fused"),
    Case(gated_mlp(2048), torch_gated_mlp, "fused"),
    Case(scaled_gated_mlp(128), torch_scaled_gated_mlp, "fused"),
    Case(lora(128), torch_lora, "fused"),
    Case(gpt2_mlp(GPT2_BATCH * GPT2_TOKENS), torch_gpt2_mlp, "fused", std={"b_fc": BIAS_STD, "b_proj": BIAS_STD}),
]
