"""The cost model orders known pairs the way the GPU does: fusion, SM fill, register caching, ragged waves."""
from __future__ import annotations

import dataclasses

from graph_cases import decoder_block

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.ir.kernel_program import KernelProgram, Schedule
from tensorsmith.ir.targets import get_target
from tensorsmith.search.cost import KernelPricing, kernel_cost, kernel_work, program_seconds
from tensorsmith.search.partition import partition, unfused
from tensorsmith.search.prune import feasible_schedules, kernel_facts

SM90 = get_target("sm90")


def softmax_graph(rows: int = 1024, cols: int = 4096) -> ts.Graph:
    g = ts.Graph("softmax")
    x = g.input("x", (rows, cols), "float16")
    g.output("y", nn.softmax(x, axis=-1))
    return g


def scheduled(program: KernelProgram, **params: int) -> KernelProgram:
    kernels = [dataclasses.replace(program.kernels[0], schedule=Schedule.of(**params)), *program.kernels[1:]]
    return dataclasses.replace(program, kernels=kernels)


def test_fused_softmax_is_predicted_faster_than_unfused() -> None:
    g = softmax_graph()
    fused, separate = partition(g), unfused(g)
    assert len(fused.kernels) == 1 and len(separate.kernels) > 4
    assert program_seconds(fused, SM90) * 3 < program_seconds(separate, SM90)


def test_row_threads_that_leave_most_sms_idle_cost_more_than_ones_that_fill_them() -> None:
    program = partition(softmax_graph())
    idle = scheduled(program, row_threads=32, block=1024, vec=1)      # 32 rows a block: 32 blocks for 132 SMs
    full = scheduled(program, row_threads=256, block=256, vec=1)      # a row a block: 1024 blocks
    idle_cost, full_cost = kernel_cost(idle.kernels[0], idle, SM90), kernel_cost(full.kernels[0], full, SM90)
    assert idle_cost.blocks == 32 < SM90.sm_count <= full_cost.blocks
    assert idle_cost.seconds > 2 * full_cost.seconds


def test_vector_caching_beats_strided_rereads() -> None:
    program = partition(softmax_graph())
    strided = scheduled(program, row_threads=256, block=256, vec=1)
    cached = scheduled(program, row_threads=256, block=256, vec=8)
    strided_cost = kernel_cost(strided.kernels[0], strided, SM90)
    cached_cost = kernel_cost(cached.kernels[0], cached, SM90)
    # softmax walks its row three times (max, sum, epilogue): vec == 1 reads it from memory each time
    assert dict(kernel_work(program.kernels[0], 1).loads)["x"] == 3 * 1024 * 4096
    assert dict(kernel_work(program.kernels[0], 8).loads)["x"] == 1024 * 4096
    assert strided_cost.cache_bytes == 2 * 1024 * 4096 * 2 and cached_cost.cache_bytes == 0
    assert cached_cost.seconds < strided_cost.seconds


def pointwise_program(numel: int) -> KernelProgram:
    g = ts.Graph("scale")
    x = g.input("x", (numel,), "float32")
    g.output("y", x * 2 + 1)
    return scheduled(partition(g), block=256)


def test_a_ragged_last_wave_costs_a_wave() -> None:
    slots = SM90.sm_count * (SM90.max_threads_per_sm // 256)       # blocks of 256 threads resident at once
    exact, ragged = pointwise_program(64 * slots * 256), pointwise_program((64 * slots + 1) * 256)
    exact_cost, ragged_cost = kernel_cost(exact.kernels[0], exact, SM90), kernel_cost(ragged.kernels[0], ragged, SM90)
    assert (exact_cost.waves, ragged_cost.waves) == (64, 65)
    # one block more than 64 full waves costs far more than 1/(64 * slots) more
    assert ragged_cost.seconds - exact_cost.seconds > 0.2 * exact_cost.seconds / 64


def test_schedules_that_do_not_fit_a_sm_are_infinitely_slow() -> None:
    program = partition(softmax_graph())
    # 32 threads per row caching 4096 halves in registers: 168 registers x 1024 threads exceed the register file
    spilled = scheduled(program, row_threads=32, block=1024, vec=8)
    assert kernel_cost(spilled.kernels[0], spilled, SM90).seconds == float("inf")


def test_recomputation_under_fusion_is_counted() -> None:
    g = ts.Graph("expand")
    x = g.input("x", (64, 128), "float32")
    g.output("y", (x.exp().reshape(64, 1, 128).expand(64, 32, 128)).sum(-1))   # exp evaluated 32 times per element
    program = partition(g)
    assert kernel_work(program.kernels[0], 1).flops >= 32 * 64 * 128 * 8


def test_a_persistent_matmul_is_priced_as_its_tiles_walked_by_its_blocks() -> None:
    """4096^3 on 128 x 256 TMA tiles: 512 output tiles, 132 blocks that walk them, so 4 waves of tiles (the last
    one ragged); the same tiles with K split across a cluster are ordinary blocks, one per (tile, split)."""
    g = ts.Graph("mm")
    g.output("c", g.input("a", (4096, 4096), "float16") @ g.input("b", (4096, 4096), "float16"))
    tile = dict(bm=128, bn=256, bk=64, stages=4, warps_m=2, warps_n=4, wgmma=1)
    persistent = scheduled(partition(g), split_k=1, **tile)
    cost = kernel_cost(persistent.kernels[0], persistent, SM90)
    assert (cost.blocks, cost.waves) == (512, 4)
    split = scheduled(partition(g), split_k=2, **tile)
    assert kernel_cost(split.kernels[0], split, SM90).blocks == 1024


def test_wgmma_attention_is_priced_on_its_own_launch_and_faster_than_mma_sync() -> None:
    g = ts.Graph("attention")
    q, k, v = (g.input(name, (4, 32, 2048, 128), "float16") for name in "qkv")
    g.output("o", nn.attention(q, k, v, causal=True))
    wgmma, mma_sync = (scheduled(partition(g), bq=128, bkv=128, wgmma=w) for w in (1, 0))
    fast, slow = kernel_cost(wgmma.kernels[0], wgmma, SM90), kernel_cost(mma_sync.kernels[0], mma_sync, SM90)
    assert fast.blocks == slow.blocks == 16 * 4 * 32 and fast.blocks_per_sm == 1   # 225 KB of shared memory
    assert fast.seconds < 0.7 * slow.seconds      # measured on the H200: 372 against 672 us


def test_pricing_a_kernel_once_for_many_schedules_gives_each_schedules_own_cost() -> None:
    """One KernelPricing reused across every feasible schedule of a decoder block's kernels (the search's way: what
    the schedule does not change, its work per vector width included, worked out once and cached) against
    kernel_cost of the kernel carrying each schedule, which prices it afresh: a cache that leaked one schedule's
    work into another's would differ. Matmuls with prologues, attention, row reductions and pointwise kernels."""
    program = partition(decoder_block())
    shapes = {name: buffer.shape for name, buffer in program.buffers.items()}
    compared = set()
    for position, kernel in enumerate(program.kernels):
        pricing = KernelPricing(kernel, program, SM90)
        for verdict in feasible_schedules(kernel_facts(kernel, shapes), SM90):
            if verdict.violated is None:
                trial = scheduled_at(program, position, verdict.schedule)
                assert pricing.cost(verdict.schedule) == kernel_cost(trial.kernels[position], trial, SM90)
                compared.add(kernel.archetype)
    assert compared == {"matmul", "attention", "row_reduce", "pointwise"}


def scheduled_at(program: KernelProgram, position: int, schedule: Schedule) -> KernelProgram:
    kernel = dataclasses.replace(program.kernels[position], schedule=schedule)
    return dataclasses.replace(program, kernels=[*program.kernels[:position], kernel, *program.kernels[position + 1:]])
