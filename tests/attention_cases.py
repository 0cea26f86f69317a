"""Attention graphs for the attention archetype's tests: prefill and decode, fp16 and bf16, head dims 64 and 128,
causal or not, sequence lengths that divide the tiles (128) and that do not (100, 77, 300).

Each case is (batch, heads, queries, keys, head dim, dtype, causal); `attention_graph` builds it with
`nn.attention`, `attention_program` partitions it and renders its one kernel under a schedule.
"""
from __future__ import annotations

import dataclasses

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.ir.tensor import iota
from tensorsmith.codegen.render import RenderedKernel, render_kernel
from tensorsmith.ir.kernel_program import KernelProgram, Schedule
from tensorsmith.search.partition import partition

Case = tuple[int, int, int, int, int, str, bool]

ATTENTION_CASES: dict[str, Case] = {
    "prefill_fp16_d64_128": (1, 4, 128, 128, 64, "float16", False),
    "prefill_fp16_d64_128_causal": (1, 4, 128, 128, 64, "float16", True),
    "prefill_fp16_d128_100_causal": (2, 2, 100, 100, 128, "float16", True),
    "prefill_bf16_d128_77": (2, 2, 77, 77, 128, "bfloat16", False),
    "prefill_bf16_d64_77_causal": (1, 3, 77, 77, 64, "bfloat16", True),
    "prefill_fp16_d128_300_causal": (1, 2, 300, 300, 128, "float16", True),
    "prefill_bf16_d64_fewer_queries_causal": (1, 2, 70, 200, 64, "bfloat16", True),
    "decode_fp16_d128_1x300": (2, 4, 1, 300, 128, "float16", False),
    "decode_fp16_d128_1x300_causal": (2, 4, 1, 300, 128, "float16", True),
    "decode_bf16_d64_5x1000_causal": (1, 4, 5, 1000, 64, "bfloat16", True),
    "decode_bf16_d128_16x77": (1, 2, 16, 77, 128, "bfloat16", False),
}

# every point of the schedule space that fits an H200's shared memory at head dim 128
ATTENTION_SCHEDULES: list[dict[str, int]] = [
    {"bq": 16, "bkv": 32, "wgmma": 0}, {"bq": 64, "bkv": 32, "wgmma": 0}, {"bq": 64, "bkv": 64, "wgmma": 0},
    {"bq": 64, "bkv": 128, "wgmma": 0}, {"bq": 128, "bkv": 32, "wgmma": 0}, {"bq": 128, "bkv": 64, "wgmma": 0},
    {"bq": 128, "bkv": 128, "wgmma": 0},
]
# Hopper's wgmma fed by TMA (attention_tma.cu.j2): 128 queries per block, key tiles of 64 or 128
WGMMA_SCHEDULES: list[dict[str, int]] = [{"bq": 128, "bkv": 64, "wgmma": 1}, {"bq": 128, "bkv": 128, "wgmma": 1}]


def attention_graph(name: str, case: Case) -> ts.Graph:
    """o = nn.attention(q, k, v) with q (batch, heads, queries, d) and k, v (batch, heads, keys, d)."""
    batch, heads, queries, keys, dim, dtype, causal = case
    g = ts.Graph(name)
    q = g.input("q", (batch, heads, queries, dim), dtype)
    k = g.input("k", (batch, heads, keys, dim), dtype)
    v = g.input("v", (batch, heads, keys, dim), dtype)
    g.output("o", nn.attention(q, k, v, causal=causal))
    return g


def rows_graph(name: str, case: Case) -> ts.Graph:
    """o = nn.attention(q, k, v) as the (batch, queries, heads * d) rows an output projection reads (a model's
    transpose(1, 2).reshape): the attention kernel stores them so itself."""
    batch, heads, queries, keys, dim, dtype, causal = case
    g = ts.Graph(name)
    q = g.input("q", (batch, heads, queries, dim), dtype)
    k = g.input("k", (batch, heads, keys, dim), dtype)
    v = g.input("v", (batch, heads, keys, dim), dtype)
    g.output("o", nn.attention(q, k, v, causal=causal).transpose(1, 2).reshape((batch, queries, heads * dim)))
    return g


def biased_graph(name: str, case: Case) -> ts.Graph:
    """o = nn.attention(q, k, v, bias=bias), the bias (batch, 1, queries, keys) in q's dtype broadcast over the
    heads: the padding or causal mask Hugging Face's models pass to scaled_dot_product_attention."""
    batch, heads, queries, keys, dim, dtype, causal = case
    g = ts.Graph(name)
    q = g.input("q", (batch, heads, queries, dim), dtype)
    k = g.input("k", (batch, heads, keys, dim), dtype)
    v = g.input("v", (batch, heads, keys, dim), dtype)
    bias = g.input("bias", (batch, 1, queries, keys), dtype)
    g.output("o", nn.attention(q, k, v, causal=causal, bias=bias))
    return g


BIASED_CASES = ["prefill_fp16_d128_100_causal", "prefill_bf16_d64_77_causal", "prefill_fp16_d64_128",
                "decode_fp16_d128_1x300"]


# grouped-query attention: (batch, query heads, kv heads, queries, keys, head dim, dtype, causal)
GQA_CASES: dict[str, tuple[int, int, int, int, int, int, str, bool]] = {
    "gqa_decode_fp16_d128_1x300": (2, 8, 2, 1, 300, 128, "float16", False),
    "gqa_prefill_bf16_d64_100_causal": (1, 6, 2, 100, 100, 64, "bfloat16", True),
    "gqa_queries_bf16_d64_5x200": (1, 8, 2, 5, 200, 64, "bfloat16", False),
}


def repeat_kv(t: ts.Tensor, times: int) -> ts.Tensor:
    """(batch, kv heads, keys, d) -> (batch, kv heads * times, keys, d), each kv head repeated (Llama's repeat_kv)."""
    batch, heads, keys, dim = t.shape
    return t.reshape(batch, heads, 1, keys, dim).expand(batch, heads, times, keys, dim) \
        .reshape(batch, heads * times, keys, dim)


def gqa_graph(name: str, biased: bool = False) -> ts.Graph:
    """o = nn.attention(q, repeat_kv(k), repeat_kv(v)) for a GQA_CASES case: k and v have fewer heads than q;
    `biased`: with a (batch, 1, queries, keys) bias, as `biased_graph`."""
    batch, heads, kv_heads, queries, keys, dim, dtype, causal = GQA_CASES[name]
    g = ts.Graph(name)
    q = g.input("q", (batch, heads, queries, dim), dtype)
    k, v = (repeat_kv(g.input(n, (batch, kv_heads, keys, dim), dtype), heads // kv_heads) for n in "kv")
    bias = g.input("bias", (batch, 1, queries, keys), dtype) if biased else None
    g.output("o", nn.attention(q, k, v, causal=causal, bias=bias))
    return g


def attention_program(graph: ts.Graph, schedule: dict[str, int] | None) -> tuple[KernelProgram, RenderedKernel]:
    """The graph partitioned (one attention kernel expected last), that kernel rendered under `schedule`
    (codegen's default where None)."""
    program = partition(graph)
    position = len(program.kernels) - 1
    if schedule is not None:
        kernel = dataclasses.replace(program.kernels[position], schedule=Schedule.of(**schedule))
        program = dataclasses.replace(program, kernels=[*program.kernels[:position], kernel])
    return program, render_kernel(program, position)


def position_graph(name: str, case: Case) -> ts.Graph:
    """A decode step's attention over a static cache: nn.attention(q, k, v, bias=mask) with the mask hiding the
    keys past an int32 position given at run time (`pos`), as transformers builds it from `cache_position`."""
    batch, heads, queries, keys, dim, dtype, _ = case
    g = ts.Graph(name)
    q = g.input("q", (batch, heads, queries, dim), dtype)
    k = g.input("k", (batch, heads, keys, dim), dtype)
    v = g.input("v", (batch, heads, keys, dim), dtype)
    position = g.input("pos", (), "int32")
    later = position.reshape((1, 1, 1, 1)).expand((1, 1, 1, keys)) < iota((1, 1, 1, keys), 3)
    g.output("o", nn.attention(q, k, v, bias=later.cast(dtype) * -65504.0))
    return g
