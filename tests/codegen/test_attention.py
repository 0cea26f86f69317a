"""The attention archetype: the pattern, the kernel boundaries, rendering and NVRTC compilation for every case and
schedule point, and a numpy model of one warp of the template (fragment layouts and its index arithmetic)."""
from __future__ import annotations

import dataclasses

import itertools
import math
import re
from pathlib import Path

import numpy as np
import pytest

import tensorsmith as ts
from attention_cases import (ATTENTION_CASES, ATTENTION_SCHEDULES, BIASED_CASES, GQA_CASES, WGMMA_SCHEDULES,
                             attention_graph, attention_program, biased_graph, gqa_graph, position_graph, rows_graph)
from tensorsmith import nn, rewrites, search
from tensorsmith.codegen import attention
from tensorsmith.codegen.matmul import SM_COUNT
from tensorsmith.codegen.nvrtc import compile_cubin, is_cubin
from tensorsmith.codegen.render import render_kernel
from tensorsmith.codegen.spaces import ARCHETYPES, ATTENTION_PAD, is_valid
from tensorsmith.ir.kernel_program import Schedule
from tensorsmith.ir.ops import Op
from tensorsmith.ir.patterns import match_attention
from tensorsmith.ir.targets import get_target
from tensorsmith.model_loader import load_graph
from tensorsmith.ir.tensor import iota
from tensorsmith.search.cost import _attention_key_tiles
from tensorsmith.search.partition import partition
from tensorsmith.search.prune import feasible_schedules, kernel_facts

EXAMPLE = Path(__file__).parents[2] / "examples" / "attention.py"
LOG2_E = 1.0 / math.log(2.0)


# ---- the pattern and the kernel boundaries -------------------------------------------------------------------

def _matches(graph: ts.Graph) -> list:
    return [m for node in graph.nodes() if node.op == Op.SUM and (m := match_attention(node)) is not None]


@pytest.mark.parametrize("extracted", [False, True], ids=["as_built", "after_rewrites"])
def test_example_and_causal_attention_match_with_their_mask(extracted: bool) -> None:
    for graph in (load_graph(EXAMPLE), attention_graph("causal", ATTENTION_CASES["prefill_fp16_d128_300_causal"])):
        if extracted:   # what the pipeline hands to search: saturated, then extracted
            graph = search.extract(rewrites.saturate(graph))
        (match,) = _matches(graph)
        assert match.output is next(iter(graph.outputs.values())) or match.norm is None
        assert match.causal_offset == 0 and match.mask_value == -1e9
        assert math.isclose(match.exp_scale, LOG2_E)
        assert match.dims[2] == match.dims[3] == graph.inputs["q"].shape[-1]


def test_offset_mask_and_decode_match() -> None:
    fewer = _matches(attention_graph("fewer", ATTENTION_CASES["prefill_bf16_d64_fewer_queries_causal"]))
    assert [m.causal_offset for m in fewer] == [130]           # key j hidden from query i where j > i + 130
    (decode,) = _matches(attention_graph("decode", ATTENTION_CASES["decode_fp16_d128_1x300"]))
    assert decode.dims == (1, 300, 128, 128) and decode.mask is None


@pytest.mark.parametrize("case", BIASED_CASES)
def test_a_score_that_reads_a_bias_is_one_attention_kernel_loading_it(case: str) -> None:
    """A bias input in the score (Hugging Face's masks) is loaded at each score's indices, broadcast over the heads;
    the score reading it keeps the causal mask's tile skipping where there is one, and its heads are not stacked."""
    graph = biased_graph(case, ATTENTION_CASES[case])
    (match,) = _matches(graph)
    assert (match.mask is not None) == ATTENTION_CASES[case][6] and attention.stacked_heads(match) is None
    program, kernel = attention_program(graph, None)
    assert [k.archetype for k in program.kernels] == ["attention"]
    assert set(program.kernels[0].reads) == {"q", "k", "v", "bias"} and "g_bias[" in kernel.source
    assert is_cubin(compile_cubin(kernel.source, kernel.name, arch=kernel.arch or "sm_90"))


def test_grouped_query_heads_are_stacked_only_where_the_score_reads_no_bias() -> None:
    """A bias row belongs to one query, so a block of stacked heads' rows would read it at the wrong query."""
    (plain,) = _matches(gqa_graph("gqa_decode_fp16_d128_1x300"))
    (biased,) = _matches(gqa_graph("gqa_decode_fp16_d128_1x300", biased=True))
    assert attention.stacked_heads(plain) is not None and attention.stacked_heads(biased) is None
    _, kernel = attention_program(gqa_graph("gqa_decode_fp16_d128_1x300", biased=True), None)
    assert "stacked" not in kernel.source and is_cubin(compile_cubin(kernel.source, kernel.name, arch="sm_90"))


def test_a_score_that_reduces_a_buffer_is_not_attention() -> None:
    g = ts.Graph("reduced")
    q, k, v = (g.input(name, (1, 2, 64, 64), "float16") for name in "qkv")
    bias = g.input("bias", (64, 64, 8), "float32")
    scores = (q @ k.transpose(-1, -2)).cast("float32") + bias.sum(-1)
    g.output("o", nn.softmax(scores, axis=-1).cast("float16") @ v)
    assert _matches(g) == []


@pytest.mark.parametrize("causal", [False, True])
def test_attention_is_one_kernel(causal: bool) -> None:
    for graph in (load_graph(EXAMPLE), attention_graph("a", (2, 4, 100, 100, 64, "float16", causal))):
        for form in (graph, search.extract(rewrites.saturate(graph))):
            program = partition(form)
            assert [k.archetype for k in program.kernels] == ["attention"]
            assert set(program.kernels[0].reads) == {"q", "k", "v"}


def test_an_operand_that_is_computed_gets_a_kernel_of_its_own() -> None:
    g = ts.Graph("cast_q")
    q = g.input("q", (1, 2, 64, 64), "float32")
    k, v = (g.input(name, (1, 2, 64, 64), "float16") for name in "kv")
    g.output("o", nn.attention(q.cast("float16"), k, v, causal=True))
    program = partition(g)
    assert [k.archetype for k in program.kernels] == ["pointwise", "attention"]
    g = ts.Graph("cast_q_and_o")             # the same with an epilogue: it stays in the attention kernel
    q = g.input("q", (1, 2, 64, 64), "float32")
    k, v = (g.input(name, (1, 2, 64, 64), "float16") for name in "kv")
    g.output("o", nn.attention(q.cast("float16"), k, v, causal=True).cast("float32") * 2.0)
    program = partition(g)
    assert [k.archetype for k in program.kernels] == ["pointwise", "attention"]


def test_keys_stored_transposed_fall_back_to_a_score_kernel() -> None:
    g = ts.Graph("k_t")
    q, v = (g.input(name, (1, 2, 64, 64), "float16") for name in "qv")
    k_t = g.input("k_t", (1, 2, 64, 64), "float16")     # (batch, heads, d, keys): not contiguous along d
    scores = ((q @ k_t) * 0.125).cast("float32")
    g.output("o", nn.softmax(scores, axis=-1).cast("float16") @ v)
    program = partition(g)
    assert "attention" not in [k.archetype for k in program.kernels] and program.kernels[0].archetype == "matmul"


def test_transformer_block_gets_an_attention_kernel_reading_strided_heads() -> None:
    program = partition(load_graph(EXAMPLE.parent / "transformer_block.py"))
    (kernel,) = [k for k in program.kernels if k.archetype == "attention"]
    assert all(program.buffers[name].shape == (128, 256) for name in kernel.reads)   # the q, k, v projections
    rendered = render_kernel(program, program.kernels.index(kernel))   # Hopper's default: wgmma fed by TMA
    # each projection seen as (head dim 64, head: 64 elements on, token: 256 on), copied 128 tokens of a head at once
    assert [(m.dims, m.strides, m.box) for m in rendered.tensor_maps] == [((64, 4, 128), (128, 512), (64, 1, 128))] * 3
    mma_sync = dataclasses.replace(kernel, schedule=Schedule.of(bq=128, bkv=128, wgmma=0))
    program = dataclasses.replace(program, kernels=[mma_sync if k is kernel else k for k in program.kernels])
    source = render_kernel(program, program.kernels.index(mma_sync)).source
    assert "(b0) * 64 + (qi) * 256" in source        # head b0's columns of token qi's row


@pytest.mark.parametrize("shape, axes, new", [((4, 6, 8), (0, 1, 2), (24, 8)), ((4, 6, 8), (1, 0, 2), (6, 32)),
                                              ((4, 6, 8), (1, 0, 2), (6, 4, 2, 4)), ((4, 6, 8), (2, 1, 0), (8, 24)),
                                              ((2, 1, 8), (0, 1, 2), (2, 8, 1)), ((3, 128), (0, 1), (3, 2, 64)),
                                              ((4, 6, 8), (1, 0, 2), (2, 3, 4, 8))])
def test_reshape_strides_agree_with_numpy_views(shape, axes, new) -> None:
    base = np.zeros(shape, np.int8).transpose(axes)
    try:
        view = base.view()
        view.shape = new                  # numpy refuses (AttributeError) exactly where no strides exist
        expected = tuple(stride for stride in view.strides)
    except AttributeError:
        expected = None
    strides = tuple(stride for stride in base.strides)
    got = attention._reshape_strides(base.shape, strides, new)
    if expected is None:
        assert got is None
    else:
        assert got is not None and all(g == e for g, e, d in zip(got, expected, new) if d != 1)


@pytest.mark.parametrize("views", [
    lambda t: t.reshape(2, 3, 1, 5, 8).expand(2, 3, 4, 5, 8).reshape(2, 12, 5, 8),            # repeat_kv
    lambda t: t.reshape(2, 3, 1, 5, 8).expand(2, 3, 4, 5, 8).reshape(2, 12, 1, 5, 8),         # as extraction tidies it
    lambda t: t.permute(0, 1, 3, 2).reshape(2, 3, 1, 8, 5).expand(2, 3, 4, 8, 5).reshape(2, 12, 8, 5),   # keys^T
    lambda t: t.reshape(2, 3, 1, 5, 8).expand(2, 3, 4, 5, 8).reshape(2, 12, 5, 8).permute(1, 0, 3, 2),
], ids=["repeat_kv", "tidied", "transposed", "permuted_after"])
def test_a_broadcast_axis_merged_into_heads_reads_each_shared_head_by_division(views) -> None:
    """Grouped-query attention's repeat_kv merges (kv heads, repeats) into heads: the address that `_strided` gives
    each element (offset + sum((i // group) * stride)) holds the value the views compute, for every element."""
    g = ts.Graph("views")
    g.output("y", views(g.input("x", (2, 3, 5, 8), "float32")))
    base = np.arange(2 * 3 * 5 * 8, dtype=np.float32).reshape(2, 3, 5, 8)
    expected = ts.evaluate(g, {"x": base})["y"]
    layout = attention._strided(g.outputs["y"])
    assert layout is not None and layout.grouped and layout.base.op == Op.INPUT
    index = np.indices(expected.shape)
    address = layout.offset + sum((i // group) * stride
                                  for i, stride, group in zip(index, layout.strides, layout.groups))
    assert np.array_equal(base.reshape(-1)[address], expected)


def test_a_merge_no_stride_or_group_describes_has_no_layout() -> None:
    """Two axes merged where the inner one is neither contiguous with the outer nor broadcast: no address form."""
    g = ts.Graph("views")
    g.output("y", g.input("x", (3, 4, 5), "float32").permute(1, 0, 2).reshape(12, 5))
    assert attention._strided(g.outputs["y"]) is None


@pytest.mark.parametrize("case", sorted(GQA_CASES))
def test_grouped_query_attention_is_one_kernel_reading_the_shared_kv_heads(case: str) -> None:
    """q has 3 or 4 times the heads of k and v: one attention kernel reads k and v as given (no repeated copy),
    query head h reading kv head h / repeats: on mma.sync without a mask, the query heads of a kv head as one block's
    rows; with one, by address; on wgmma by a TMA coordinate."""
    graph = gqa_graph(case)
    batch, heads, kv_heads, queries, keys, dim, _, _ = GQA_CASES[case]
    repeats = heads // kv_heads
    program, rendered = attention_program(graph, ATTENTION_SCHEDULES[0])
    assert [k.archetype for k in program.kernels] == ["attention"]
    assert sorted(program.kernels[0].reads) == ["k", "q", "v"]
    match = attention.kernel_attention(program.kernels[0].outputs[0][1])
    if match.mask is None:   # each block's rows: the queries of the query heads of one kv head, stacked
        assert attention.stacked_heads(match) == (1, repeats)
        assert f"stacked as its {repeats * queries} query rows" in rendered.source
        assert rendered.grid == (-(-repeats * queries // 16) * batch * kv_heads, 1, 1)
        assert f"(b1) * {repeats} + (qi) / {queries}" in rendered.source
    else:                    # the causal mask depends on the query: each query head its own block, dividing
        assert attention.stacked_heads(match) is None
        assert rendered.source.count(f") / {repeats}) * ") == 2
    _, rendered = attention_program(graph, WGMMA_SCHEDULES[0])
    if case.startswith("gqa_prefill"):
        assert [m.dims for m in rendered.tensor_maps[1:]] == [(dim, keys, kv_heads)] * 2
        assert rendered.source.count(f"(int)b1 / {repeats});") == 2 * (dim // 64)


def test_a_product_of_an_attention_of_its_shape_is_not_its_epilogue() -> None:
    """attention(q, k, v) @ w with w square: the product has the attention's shape but is no function of it elementwise,
    so the attention kernel could not compute it, and partition failed ("codegen refused ... again"). Found by the
    fuzzer as attention(attention(q, k1, v1), k2, v2) with 7 keys first, whose second scores extraction reassociated
    to P1 @ (v1 @ k2^T)."""
    g = ts.Graph("attention_then_matmul")
    q, k, v, w = (g.input(name, (16, 16), "float16") for name in "qkvw")
    g.output("y", nn.attention(q, k, v) @ w)
    program = partition(g)
    assert [k.archetype for k in program.kernels] == ["attention", "matmul"]
    inputs = {name: np.random.default_rng(0).standard_normal((16, 16)).astype(np.float16) for name in "qkvw"}
    want = ts.evaluate(g, inputs)["y"]
    np.testing.assert_allclose(program.execute(inputs)["y"], want, rtol=1e-2, atol=1e-2)


def test_head_dims_that_are_not_multiples_of_16_are_not_attention() -> None:
    program = partition(attention_graph("d40", (1, 2, 64, 64, 40, "float16", False)))
    assert "attention" not in [k.archetype for k in program.kernels]


# ---- rendering and compilation -------------------------------------------------------------------------------

@pytest.mark.parametrize("case", sorted(ATTENTION_CASES))
def test_every_case_compiles_at_the_default_schedule(case: str) -> None:
    program, kernel = attention_program(attention_graph(case, ATTENTION_CASES[case]), None)
    assert [k.archetype for k in program.kernels] == ["attention"]
    assert is_cubin(compile_cubin(kernel.source, kernel.name, arch=kernel.arch or "sm_90"))
    queries, dim = ATTENTION_CASES[case][2], ATTENTION_CASES[case][4]
    assert kernel.schedule["wgmma"] == (queries >= 128)      # Hopper's wgmma on TMA where the queries fill a block
    if kernel.schedule["wgmma"]:
        assert "wgmma_rs_m64n" in kernel.source and kernel.arch == "sm_90a" and len(kernel.tensor_maps) == 3
        assert kernel.shared_bytes == attention.wgmma_shared_bytes(128, 128, dim, dim)
    else:
        assert "mma.sync.aligned.m16n8k16" in kernel.source and "ldmatrix" in kernel.source
        assert kernel.shared_bytes == attention.shared_bytes(kernel.schedule["bq"], kernel.schedule["bkv"], dim, dim)
    assert ("SPLIT = 4;" in kernel.source) == (queries <= 16)      # decode where the queries are few
    causal = ATTENTION_CASES[case][6]
    assert ("past the causal diagonal skipped" in kernel.source) == causal   # one query's too: its one row, 0
    assert bool(re.search(r"const bool v\d+ =", kernel.source)) == causal     # the mask's comparison


@pytest.mark.parametrize("schedule", ATTENTION_SCHEDULES, ids=lambda s: f"bq{s['bq']}_bkv{s['bkv']}_wgmma{s['wgmma']}")
def test_every_schedule_point_compiles(schedule: dict[str, int]) -> None:
    assert is_valid("attention", Schedule.of(**schedule))
    graph = attention_graph("sched", ATTENTION_CASES["prefill_fp16_d128_100_causal"])
    _, kernel = attention_program(graph, schedule)
    assert is_cubin(compile_cubin(kernel.source, kernel.name, arch="sm_90"))
    warps = 4 if schedule["bq"] == 16 else schedule["bq"] // 16
    assert kernel.block == (32 * warps, 1, 1)
    assert kernel.grid == (-(-100 // schedule["bq"]) * 4, 1, 1)
    assert kernel.shared_bytes == attention.shared_bytes(schedule["bq"], schedule["bkv"], 128, 128)


def test_head_dim_256_compiles_with_key_tiles_of_32() -> None:
    _, kernel = attention_program(attention_graph("d256", (1, 2, 100, 100, 256, "bfloat16", True)), None)
    assert kernel.schedule.as_dict() == {"bq": 64, "bkv": 32, "wgmma": 0}
    assert is_cubin(compile_cubin(kernel.source, kernel.name, arch="sm_90"))


def test_z3_schedule_constraints_agree_with_codegen() -> None:
    target = get_target("sm90")
    for dims in ((64, 64), (128, 128), (256, 256), (128, 64)):
        program = partition(attention_graph("z3", (1, 2, 100, 100, dims[0], "float16", True)))
        kernel = program.kernels[0]
        facts = kernel_facts(kernel, {n: b.shape for n, b in program.buffers.items()})
        facts = type(facts)(**{**facts.__dict__, "head_dims": dims})
        verdicts = {v.schedule: v.violated for v in feasible_schedules(facts, target)}
        assert len(verdicts) == ARCHETYPES["attention"].size
        for schedule, violated in verdicts.items():   # the first constraint broken, in the order prune checks
            expected = None
            if attention.shared_bytes(schedule["bq"], schedule["bkv"], *dims) > target.shared_bytes_per_block:
                expected = "dynamic shared memory"
            elif attention.registers_per_thread(schedule["bkv"], *dims) > target.max_registers_per_thread:
                expected = "registers per thread"
            elif schedule["wgmma"] and not attention.takes_wgmma(schedule["bq"], schedule["bkv"], 64, 64):
                expected = "wgmma attention: 128 queries per block, key tiles of 64 or 128"
            elif schedule["wgmma"] and attention.wgmma_shared_bytes(128, schedule["bkv"], *dims) > 227 * 1024:
                expected = "wgmma attention: Q and two K and V tiles in shared memory"
            assert violated == expected, schedule


def test_default_schedules_are_feasible() -> None:
    target = get_target("sm90")
    for case in ATTENTION_CASES.values():
        for dim in (64, 128, 256):
            _, kernel = attention_program(attention_graph("default", case[:4] + (dim,) + case[5:]), None)
            bq, bkv = kernel.schedule["bq"], kernel.schedule["bkv"]
            assert kernel.shared_bytes <= target.shared_bytes_per_block
            assert attention.registers_per_thread(bkv, dim, dim) <= target.max_registers_per_thread
            assert (bq == 16) == (case[2] <= 16 and dim <= 128)


# ---- a numpy model of one warp -------------------------------------------------------------------------------
# The fragment layouts below are those of the PTX ISA as tensor_core.cu.j2 documents them; the addresses and
# index formulas are copied from attention.cu.j2. The model runs one warp (rows 0..15 of a block) through the
# key tiles the way the template does and compares with numpy's softmax(Q K^T) V.

def _ldmatrix_x4(smem: np.ndarray, address, trans: bool = False) -> np.ndarray:
    """(32 lanes, 4 registers, 2 halves): lanes 8i..8i+7 address the rows of matrix i."""
    regs = np.zeros((32, 4, 2))
    for i in range(4):
        matrix = np.array([smem[row, col:col + 8] for row, col in (address(lane) for lane in range(8 * i, 8 * i + 8))])
        for lane in range(32):
            g, t = lane // 4, lane % 4
            regs[lane, i] = matrix[2 * t:2 * t + 2, g] if trans else matrix[g, 2 * t:2 * t + 2]
    return regs


def _mma_16816(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """c (32, 4) += a (32, 4, 2) @ b (32, 2, 2) in the m16n8k16 layouts."""
    big_a, big_b, big_c = np.zeros((16, 16)), np.zeros((16, 8)), np.zeros((16, 8))
    for lane in range(32):
        g, t = lane // 4, lane % 4
        big_a[g, 2 * t:2 * t + 2], big_a[g + 8, 2 * t:2 * t + 2] = a[lane, 0], a[lane, 1]
        big_a[g, 8 + 2 * t:10 + 2 * t], big_a[g + 8, 8 + 2 * t:10 + 2 * t] = a[lane, 2], a[lane, 3]
        big_b[2 * t:2 * t + 2, g], big_b[8 + 2 * t:10 + 2 * t, g] = b[lane, 0], b[lane, 1]
        big_c[g, 2 * t:2 * t + 2], big_c[g + 8, 2 * t:2 * t + 2] = c[lane, 0:2], c[lane, 2:4]
    d = big_a @ big_b + big_c
    out = np.zeros((32, 4))
    for lane in range(32):
        g, t = lane // 4, lane % 4
        out[lane, 0:2], out[lane, 2:4] = d[g, 2 * t:2 * t + 2], d[g + 8, 2 * t:2 * t + 2]
    return out


def _quad(values: np.ndarray, combine) -> np.ndarray:
    """__shfl_xor_sync with 1, then 2: each lane combines the values of its quad."""
    lanes = np.arange(32)
    values = combine(values, values[lanes ^ 1])
    return combine(values, values[lanes ^ 2])


def _warp_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, bkv: int, tk: int, scale: float) -> np.ndarray:
    """One warp of the template on 16 query rows: O (16, DV) before the epilogue, i.e. acc / l_row."""
    dqk, dv = q.shape[1], v.shape[1]
    pad = ATTENTION_PAD
    s_q = np.zeros((16, dqk + pad))
    s_q[:, :dqk] = q
    ns, no, kq_steps = bkv // 8, dv // 8, dqk // 16
    row0 = 0
    r_q = [_ldmatrix_x4(s_q, lambda lane: (row0 + lane % 16, kq * 16 + lane // 16 * 8)) for kq in range(kq_steps)]
    r_o = np.zeros((no, 32, 4))
    r_m, r_l = np.full((2, 32), -np.inf), np.zeros((2, 32))
    lanes = np.arange(32)
    for tile in range(-(-tk // bkv)):
        k0 = tile * bkv
        s_k, s_v = np.zeros((bkv, dqk + pad)), np.zeros((bkv, dv + pad))
        rows = min(bkv, tk - k0)                   # rows past the last key stay zero (cp.async zero-fill)
        s_k[:rows, :dqk], s_v[:rows, :dv] = k[k0:k0 + rows], v[k0:k0 + rows]
        r_s = np.zeros((ns, 32, 4))
        for kq in range(kq_steps):
            for n in range(0, ns, 2):
                b = _ldmatrix_x4(s_k, lambda lane: (n * 8 + lane % 8 + lane // 16 * 8, kq * 16 + lane // 8 % 2 * 8))
                r_s[n] = _mma_16816(r_s[n], r_q[kq], b[:, 0:2])
                r_s[n + 1] = _mma_16816(r_s[n + 1], r_q[kq], b[:, 2:4])
        for n in range(ns):          # the score function is the identity here; keys past the last one: -inf
            for e in range(4):
                kj = k0 + n * 8 + lanes % 4 * 2 + e % 2
                r_s[n, :, e] = np.where(kj < tk, r_s[n, :, e], -np.inf)
        for h in range(2):
            tile_max = _quad(np.max(r_s[:, :, 2 * h:2 * h + 2], axis=(0, 2)), np.maximum)
            m_new = np.maximum(r_m[h], tile_max)
            m_use = np.where(m_new == -np.inf, 0.0, m_new)
            rescale = np.exp2((r_m[h] - m_use) * scale)
            r_m[h], r_l[h] = m_new, r_l[h] * rescale
            r_o[:, :, 2 * h:2 * h + 2] *= rescale[None, :, None]
            r_s[:, :, 2 * h:2 * h + 2] = np.exp2((r_s[:, :, 2 * h:2 * h + 2] - m_use[None, :, None]) * scale)
            r_l[h] += r_s[:, :, 2 * h:2 * h + 2].sum(axis=(0, 2))
        for j in range(ns // 2):
            a = np.stack([r_s[2 * j][:, 0:2], r_s[2 * j][:, 2:4], r_s[2 * j + 1][:, 0:2], r_s[2 * j + 1][:, 2:4]], axis=1)
            for d in range(0, no, 2):
                b = _ldmatrix_x4(s_v, lambda lane: (j * 16 + lane % 16, d * 8 + lane // 16 * 8), trans=True)
                r_o[d] = _mma_16816(r_o[d], a, b[:, 0:2])
                r_o[d + 1] = _mma_16816(r_o[d + 1], a, b[:, 2:4])
    s_o, s_sum = np.zeros((16, dv + 8)), np.zeros(16)     # staging, as the template writes it
    for h in range(2):
        r_l[h] = _quad(r_l[h], np.add)
        row = row0 + lanes // 4 + h * 8
        for d in range(no):
            s_o[row, d * 8 + lanes % 4 * 2] = r_o[d, :, 2 * h]
            s_o[row, d * 8 + lanes % 4 * 2 + 1] = r_o[d, :, 2 * h + 1]
        s_sum[row[lanes % 4 == 0]] = r_l[h][lanes % 4 == 0]
    return s_o[:, :dv] / s_sum[:, None]


@pytest.mark.parametrize("dims", [(32, 32, 32, 64), (64, 32, 16, 40), (16, 48, 64, 77)],
                         ids=["one_tile", "three_tiles_ragged", "ragged_dv"])
def test_fragment_model_of_one_warp_computes_softmax_qk_v(dims: tuple[int, int, int, int]) -> None:
    dqk, dv, bkv, tk = dims
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((16, dqk)), rng.standard_normal((tk, dqk)), rng.standard_normal((tk, dv))
    scale = LOG2_E / math.sqrt(dqk)
    scores = (q @ k.T) * scale
    p = np.exp2(scores - scores.max(axis=1, keepdims=True))
    expected = (p / p.sum(axis=1, keepdims=True)) @ v
    np.testing.assert_allclose(_warp_attention(q, k, v, bkv, tk, scale), expected, rtol=1e-9, atol=1e-12)


def test_fragment_model_score_indices_are_the_lanes_accumulators() -> None:
    """The (qi, kj) the template gives accumulator e of score tile n of a lane hold exactly that dot product."""
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((16, 32)), rng.standard_normal((32, 32))
    s_q, s_k = np.zeros((16, 40)), np.zeros((32, 40))
    s_q[:, :32], s_k[:, :32] = q, k
    r_s = np.zeros((4, 32, 4))
    for kq in range(2):
        a = _ldmatrix_x4(s_q, lambda lane: (lane % 16, kq * 16 + lane // 16 * 8))
        for n in (0, 2):
            b = _ldmatrix_x4(s_k, lambda lane: (n * 8 + lane % 8 + lane // 16 * 8, kq * 16 + lane // 8 % 2 * 8))
            r_s[n], r_s[n + 1] = _mma_16816(r_s[n], a, b[:, 0:2]), _mma_16816(r_s[n + 1], a, b[:, 2:4])
    for n, lane, e in itertools.product(range(4), range(32), range(4)):
        qi, kj = lane // 4 + e // 2 * 8, n * 8 + lane % 4 * 2 + e % 2
        assert math.isclose(r_s[n, lane, e], q[qi] @ k[kj], rel_tol=1e-12, abs_tol=1e-12)


@pytest.mark.parametrize("schedule", WGMMA_SCHEDULES, ids=lambda s: f"bkv{s['bkv']}")
@pytest.mark.parametrize("case", sorted(name for name in ATTENTION_CASES if name.startswith("prefill")))
def test_wgmma_kernel_renders_and_compiles(case: str, schedule: dict[str, int]) -> None:
    """attention_tma.cu.j2 for every prefill case: a producer and two consumer warpgroups, a block per pair of
    query tiles (at most one per SM), a tensor map per operand (head dim, tokens, heads, batch: the box 64 x the
    tile's rows), and a cubin for sm_90a."""
    _, kernel = attention_program(attention_graph(case, ATTENTION_CASES[case]), schedule)
    batch, heads, queries, keys, dim = ATTENTION_CASES[case][:5]
    assert kernel.arch == "sm_90a" and kernel.block == (384, 1, 1)
    assert kernel.grid == (min(SM_COUNT, -(-(-(-queries // 128) * batch * heads) // 2)), 1, 1)
    outer = (heads,) if batch == 1 else (heads, batch)        # an axis of size 1 has no dimension in the map
    assert [(m.buffer, m.dims, m.box) for m in kernel.tensor_maps] == [
        ("q", (dim, queries, *outer), (64, 128, *[1] * len(outer))),
        ("k", (dim, keys, *outer), (64, schedule["bkv"], *[1] * len(outer))),
        ("v", (dim, keys, *outer), (64, schedule["bkv"], *[1] * len(outer)))]
    assert kernel.shared_bytes == attention.wgmma_shared_bytes(128, schedule["bkv"], dim, dim) <= 227 * 1024
    assert is_cubin(compile_cubin(kernel.source, kernel.name, arch=kernel.arch))


def test_wgmma_schedule_falls_back_to_mma_sync_where_tma_cannot_copy_an_operand() -> None:
    """Keys and values shared by two heads (a broadcast: stride 0) have no tensor map: the same schedule renders the
    mma.sync kernel, which reads them through index arithmetic."""
    g = ts.Graph("shared_kv")
    q = g.input("q", (1, 2, 128, 64), "float16")
    k, v = (g.input(name, (1, 1, 128, 64), "float16").expand(1, 2, 128, 64) for name in "kv")
    g.output("o", nn.attention(q, k, v, causal=True))
    _, kernel = attention_program(g, {"bq": 128, "bkv": 128, "wgmma": 1})
    assert kernel.arch is None and not kernel.tensor_maps and "mma.sync.aligned.m16n8k16" in kernel.source
    assert is_cubin(compile_cubin(kernel.source, kernel.name, arch="sm_90"))


@pytest.mark.parametrize("case", ["prefill_fp16_d64_128", "prefill_fp16_d64_128_causal"])
def test_wgmma_score_function_takes_the_mask_branch_once_per_tile(case: str) -> None:
    """Tiles every row of a warp sees whole run a loop without the mask's arithmetic; the branch is outside the
    element loops (inside, the compiler would evaluate both sides for every score)."""
    _, kernel = attention_program(attention_graph(case, ATTENTION_CASES[case]), WGMMA_SCHEDULES[-1])
    assert ("      if (unmasked) {\n        #pragma unroll" in kernel.source) == ATTENTION_CASES[case][6]
    assert kernel.source.count("const float dot = r_s[4 * j + e];") == (2 if ATTENTION_CASES[case][6] else 1)


@pytest.mark.parametrize("schedule", [None, WGMMA_SCHEDULES[0]], ids=["default", "wgmma"])
def test_attention_stores_the_rows_an_output_projection_reads(schedule: dict[str, int] | None) -> None:
    """attention(q, k, v).transpose(1, 2).reshape(b, t, h * d), the rows a model's o projection reads, is one
    attention kernel storing (b, h, t, d) at (b, t, h, d)'s offsets: no copy kernel after it."""
    graph = rows_graph("rows", ATTENTION_CASES["prefill_fp16_d128_100_causal"])   # (2, 2, 100, 100, 128)
    program, kernel = attention_program(graph, schedule)
    assert [k.archetype for k in program.kernels] == ["attention"]
    assert "g_o[(b0) * 25600 + (qi) * 256 + (b1) * 128 + (hd)]" in kernel.source
    assert is_cubin(compile_cubin(kernel.source, kernel.name, arch=kernel.arch or "sm_90"))


def test_a_mask_read_at_run_time_is_matched_with_its_position_and_skips_by_it() -> None:
    """transformers' decode-step mask, position < key with the position an input: matched with the position as
    the offset's base; the kernel reads it once and stops at its key tile (where it is not negative), on mma.sync
    even where a wgmma schedule is asked for; the cost model, not knowing the position, counts every tile."""
    graph = position_graph("position", (2, 4, 1, 300, 128, "float16", False))
    (match,) = _matches(graph)
    assert match.offset_base is graph.inputs["pos"] and match.causal_offset == 0
    assert attention.skips_masked_tiles(match)
    for schedule in (None, {"bq": 128, "bkv": 64, "wgmma": 1}):
        _, kernel = attention_program(graph, schedule)
        assert "g_pos[0]" in kernel.source and "const idx_t MASK_OFFSET = (idx_t)(" in kernel.source
        assert re.search(r"if \(MASK_OFFSET >= 0\)\s+kv_tiles = min\(", kernel.source)
        assert "constexpr idx_t MASK_OFFSET" not in kernel.source
        assert kernel.arch is None and not kernel.tensor_maps and "mma.sync.aligned.m16n8k16" in kernel.source
        assert is_cubin(compile_cubin(kernel.build_source, kernel.entry, arch="sm_90"))
    assert _attention_key_tiles(match, 16, 32) == [-(-300 // 32)]


def test_a_position_per_sequence_is_no_mask_of_the_kernel() -> None:
    """A position that differs by batch entry is read at each score, not as one offset: no mask is matched."""
    g = ts.Graph("positions")
    q, k, v = (g.input(n, (2, 4, t, 64), "float16") for n, t in (("q", 1), ("k", 300), ("v", 300)))
    later = g.input("pos", (2, 1, 1, 1), "int32").expand((2, 1, 1, 300)) < iota((2, 1, 1, 300), 3)
    g.output("o", nn.attention(q, k, v, bias=later.cast("float16") * -65504.0))
    (match,) = _matches(g)
    assert match.mask is None and match.offset_base is None


def test_a_position_compared_in_a_16_bit_float_is_no_mask_of_the_kernel() -> None:
    """Compared in bfloat16, position 319 and key 320 both round to 320, so the graph keeps key 320: no integer
    offset says which keys it hides, and the kernel must not skip a tile by one."""
    g = ts.Graph("rounded")
    q, k, v = (g.input(n, (1, 4, t, 64), "float16") for n, t in (("q", 1), ("k", 400), ("v", 400)))
    position = g.input("pos", (), "int32").reshape((1, 1, 1, 1)).expand((1, 1, 1, 400))
    later = position.cast("bfloat16") < iota((1, 1, 1, 400), 3).cast("bfloat16")
    g.output("o", nn.attention(q, k, v, bias=later.cast("float16") * -65504.0))
    (match,) = _matches(g)
    assert match.mask is None and match.offset_base is None
