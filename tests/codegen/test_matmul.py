"""The matmul archetype renders and compiles to sm_90 cubin for every layout, dtype, edge case and schedule."""
from __future__ import annotations

import pytest

from matmul_cases import MATMUL_CASES, MATMUL_SCHEDULES, matmul_program
from tensorsmith.codegen.matmul import shared_bytes
from tensorsmith.codegen.nvrtc import compile_cubin, is_cubin
from tensorsmith.codegen.schedules import is_valid
from tensorsmith.ir.kernel_program import Schedule


@pytest.mark.parametrize("case", sorted(MATMUL_CASES))
def test_every_case_compiles_at_the_default_schedule(case: str) -> None:
    _, kernel = matmul_program(MATMUL_CASES[case](), None)
    assert is_cubin(compile_cubin(kernel.source, kernel.name, arch="sm_90"))
    assert "mma.sync.aligned.m16n8k16" in kernel.source and kernel.shared_bytes > 0


@pytest.mark.parametrize("schedule", MATMUL_SCHEDULES[1:], ids=lambda s: "x".join(map(str, s.values())))
def test_every_schedule_point_compiles_and_sizes_its_pipeline(schedule: dict[str, int]) -> None:
    assert is_valid("matmul", Schedule.of(**schedule))
    _, kernel = matmul_program(MATMUL_CASES["ragged_bf16_both_transposed"](), schedule)
    assert is_cubin(compile_cubin(kernel.source, kernel.name, arch="sm_90"))
    assert kernel.block == (32 * schedule["warps_m"] * schedule["warps_n"], 1, 1)
    # A is stored (k, m) and B (n, k): the template keeps A as [k][m] and B as [n][k] tiles
    expected = shared_bytes(schedule["bm"], schedule["bn"], schedule["bk"], schedule["stages"], "m", "k")
    assert kernel.shared_bytes == expected
    assert f"constexpr int BM = {schedule['bm']}, BN = {schedule['bn']}, BK = {schedule['bk']}, " \
           f"STAGES = {schedule['stages']};" in kernel.source


def test_operands_that_are_not_plain_chunked_loads_take_the_prologue_path() -> None:
    _, fused = matmul_program(MATMUL_CASES["fused"](), None)
    assert fused.source.count("cp_async_16(") == 2           # the definition and B's copy; A is scaled first
    _, odd = matmul_program(MATMUL_CASES["k_not_multiple_of_8"](), None)
    assert odd.source.count("cp_async_16(") == 2             # the definition and B's copy (N = 40 is whole chunks)


def test_schedules_that_break_the_warp_tiling_are_invalid() -> None:
    assert not is_valid("matmul", Schedule.of(bm=32, bn=64, bk=32, stages=2, warps_m=4, warps_n=2))   # 8-row warp tiles
    assert not is_valid("matmul", Schedule.of(bm=128, bn=256, bk=32, stages=2, warps_m=2, warps_n=2))  # 256 accumulators
