"""On the GPU: the attention archetype, for every case at its default schedule and for every schedule point, and
compiled whole (examples/attention.py, nn.attention), matches the reference interpreter on fresh random inputs."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tensorsmith as ts
from attention_cases import (ATTENTION_CASES, ATTENTION_SCHEDULES, BIASED_CASES, GQA_CASES, WGMMA_SCHEDULES,
                             attention_graph, attention_program, biased_graph, gqa_graph, position_graph, rows_graph)
from kernel_launch import assert_cpu_predicts, run_rendered
from tensorsmith.codegen import attention
from tensorsmith.model_loader import load_graph
from tensorsmith.search.verify import compare, random_inputs, relative_l2

pytestmark = pytest.mark.gpu
EXAMPLE = Path(__file__).parents[2] / "examples" / "attention.py"


def _run_attention_kernel(graph: ts.Graph, schedule: dict[str, int] | None,
                          inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The graph's one attention kernel launched by itself on poisoned (NaN) output memory."""
    program, kernel = attention_program(graph, schedule)
    assert [k.archetype for k in program.kernels] == ["attention"], "one kernel: the attention"
    return run_rendered(program, [kernel], inputs)["o"]


def _check_kernel(graph: ts.Graph, schedule: dict[str, int] | None) -> None:
    for draw in range(2):   # fresh inputs: the kernel computes the function, not one answer
        inputs = random_inputs(graph, seed=300 + draw)
        out = _run_attention_kernel(graph, schedule, inputs)
        reference = ts.evaluate(graph, inputs)["o"]
        assert not np.isnan(out).any(), "unwritten (poisoned) elements"
        error = relative_l2(out, reference)
        assert error < 1e-2, f"relative L2 error {error:.3g}"


@pytest.mark.parametrize("case", sorted(ATTENTION_CASES))
def test_attention_matches_reference(case: str) -> None:
    _check_kernel(attention_graph(case, ATTENTION_CASES[case]), None)


@pytest.mark.parametrize("schedule", ATTENTION_SCHEDULES, ids=lambda s: f"bq{s['bq']}_bkv{s['bkv']}_wgmma{s['wgmma']}")
@pytest.mark.parametrize("case", ["prefill_fp16_d128_100_causal", "prefill_bf16_d128_77",
                                  "decode_fp16_d128_1x300_causal", "decode_bf16_d64_5x1000_causal"])
def test_every_schedule_point_matches_reference(case: str, schedule: dict[str, int]) -> None:
    _check_kernel(attention_graph(case, ATTENTION_CASES[case]), schedule)


@pytest.mark.parametrize("schedule", WGMMA_SCHEDULES, ids=lambda s: f"bkv{s['bkv']}")
@pytest.mark.parametrize("case", sorted(name for name in ATTENTION_CASES if name.startswith("prefill")))
def test_wgmma_kernel_matches_reference(case: str, schedule: dict[str, int]) -> None:
    """Every prefill case (head dims 64 and 128, lengths that do and do not divide the tiles, fewer queries than
    keys) on attention_tma.cu.j2."""
    graph = attention_graph(case, ATTENTION_CASES[case])
    assert attention_program(graph, schedule)[1].source.count("wgmma_rs_m64n") > 1, "rendered on wgmma"
    _check_kernel(graph, schedule)


@pytest.mark.parametrize("schedule", WGMMA_SCHEDULES, ids=lambda s: f"bkv{s['bkv']}")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "no_mask"])
def test_persistent_blocks_walk_many_query_tiles(schedule: dict[str, int], causal: bool, monkeypatch) -> None:
    """Three blocks for the 15 query tiles of five heads (an odd count per head): each block walks five or so,
    its K and V rings and its Q buffer running on from one tile to the next."""
    monkeypatch.setattr(attention, "SM_COUNT", 3)
    graph = attention_graph("persistent", (1, 5, 300, 300, 64, "float16", causal))
    assert attention_program(graph, schedule)[1].grid == (3, 1, 1)
    _check_kernel(graph, schedule)


@pytest.mark.parametrize("schedule", [None, *ATTENTION_SCHEDULES[:2], WGMMA_SCHEDULES[0]],
                         ids=lambda s: "default" if s is None else f"bq{s['bq']}_bkv{s['bkv']}_wgmma{s['wgmma']}")
@pytest.mark.parametrize("case", sorted(GQA_CASES))
def test_grouped_query_attention_reads_each_shared_kv_head(case: str, schedule: dict[str, int] | None) -> None:
    """k and v with a third or a quarter of q's heads, read in place through repeat_kv's views."""
    _check_kernel(gqa_graph(case), schedule)


def test_head_dim_256_matches_reference() -> None:
    _check_kernel(attention_graph("d256", (1, 2, 100, 100, 256, "bfloat16", True)), None)


def test_scores_far_apart_stay_finite() -> None:
    """Inputs 8 times larger (scores spread over tens, nearly one-hot rows) exercise the running max."""
    graph = attention_graph("large", ATTENTION_CASES["prefill_fp16_d64_128_causal"])
    inputs = {name: (array * 8).astype(array.dtype) for name, array in random_inputs(graph, seed=7).items()}
    out = _run_attention_kernel(graph, None, inputs)
    assert relative_l2(out, ts.evaluate(graph, inputs)["o"]) < 1e-2


@pytest.mark.parametrize("graph", [lambda: load_graph(EXAMPLE),
                                   lambda: attention_graph("causal", ATTENTION_CASES["prefill_fp16_d128_100_causal"]),
                                   lambda: attention_graph("decode", ATTENTION_CASES["decode_bf16_d64_5x1000_causal"])],
                         ids=["example", "causal_prefill", "decode"])
def test_compiled_program_is_one_attention_kernel_and_matches_reference(graph) -> None:
    graph = graph()
    program = ts.compile(graph, profile=False, cache=False, budget_s=30)
    assert [k.archetype for k in program.kernels] == ["attention"]
    for draw in range(2):
        inputs = random_inputs(graph, seed=1234 + draw)
        outputs = program(device="cuda", **inputs)
        for check in compare(graph, outputs, ts.evaluate(graph, inputs)):
            assert check.ok, f"{graph.name}.{check.output}: relative L2 {check.error:.3g} > {check.tolerance:g}"
        assert_cpu_predicts(program.kernel_program, inputs, outputs, label=graph.name)


BIASED_RUNS = [(case, schedule) for case in BIASED_CASES for schedule in
               (None, ATTENTION_SCHEDULES[1], *(WGMMA_SCHEDULES[:1] if case.startswith("prefill") else []))]


@pytest.mark.parametrize("case,schedule", BIASED_RUNS,
                         ids=[f"{case}-{'default' if s is None else s}" for case, s in BIASED_RUNS])
def test_a_bias_in_the_score_is_read_at_each_scores_indices(case: str, schedule: dict[str, int] | None) -> None:
    """A (batch, 1, queries, keys) bias broadcast over the heads, at lengths that do and do not divide the tiles,
    on mma.sync and (prefill) wgmma."""
    _check_kernel(biased_graph(case, ATTENTION_CASES[case]), schedule)


@pytest.mark.parametrize("case,schedule", [
    ("prefill_fp16_d128_100_causal", None), ("prefill_fp16_d128_100_causal", ATTENTION_SCHEDULES[0]),
    ("prefill_bf16_d64_77_causal", WGMMA_SCHEDULES[0]), ("decode_fp16_d128_1x300", None)],
    ids=["default", "mma_sync", "wgmma", "decode"])
def test_attention_stored_as_the_rows_an_output_projection_reads_matches_reference(
        case: str, schedule: dict[str, int] | None) -> None:
    _check_kernel(rows_graph(case, ATTENTION_CASES[case]), schedule)


@pytest.mark.parametrize("schedule", [None, {"bq": 64, "bkv": 64, "wgmma": 0}, {"bq": 128, "bkv": 64, "wgmma": 1}],
                         ids=["default", "bq64_bkv64", "wgmma"])
@pytest.mark.parametrize("case", [(2, 4, 1, 300, 128, "float16", False), (1, 8, 1, 1000, 64, "bfloat16", False)],
                         ids=["fp16_d128_300", "bf16_d64_1000"])
def test_a_mask_read_at_run_time_skips_the_keys_past_the_position_and_matches_reference(
        case: tuple, schedule: dict[str, int] | None) -> None:
    """A decode step's attention, the keys past a position given at run time masked: the kernel reads the key
    tiles up to the position alone; at a negative position (every key masked) it reads all, as the reference."""
    graph = position_graph("position", case)
    keys = case[3]
    for position in (0, 7, 63, 64, keys // 2, keys - 1, keys + 5, -3):
        inputs = random_inputs(graph, seed=500 + position)
        inputs["pos"] = np.asarray(position, dtype=np.int32)
        out = _run_attention_kernel(graph, schedule, inputs)
        assert not np.isnan(out).any(), f"position {position}: unwritten (poisoned) elements"
        error = relative_l2(out, ts.evaluate(graph, inputs)["o"])
        assert error < 1e-2, f"position {position}: relative L2 error {error:.3g}"
