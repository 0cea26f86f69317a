"""Every archetype renders, and NVRTC compiles every rendered kernel to sm_90 cubin (no GPU needed)."""
from __future__ import annotations

import pytest

from graph_cases import CASES
from tensorsmith.codegen.nvrtc import compile_cubin
from tensorsmith.codegen.render import MEASURED_PLACEHOLDER, render_program
from tensorsmith.codegen.schedules import ARCHETYPES, default_schedule, is_valid
from tensorsmith.search.partition import partition

ELF_MAGIC = b"\x7fELF"


@pytest.mark.parametrize("case", sorted(CASES))
def test_case_renders_and_compiles_to_cubin(case: str) -> None:
    program = partition(CASES[case]())
    for kernel in render_program(program):
        assert kernel.archetype in ARCHETYPES
        assert f"void __launch_bounds__({kernel.block[0]}) {kernel.name}(" in kernel.source
        assert compile_cubin(kernel.source, kernel.name, arch="sm_90")[:4] == ELF_MAGIC


def test_header_names_graph_nodes_archetype_schedule_and_launch() -> None:
    program = partition(CASES["norms"]())
    kernel = render_program(program)[0]
    header = kernel.source.split("#include")[0]
    assert 'graph "norms"' in header
    assert "graph_cases.py" in header and "max" in header and "exp2" in header and "sum" in header
    assert f"archetype: {kernel.archetype}" in header
    assert "row_threads=" in header
    assert f"grid ({kernel.grid[0]}, 1, 1), block ({kernel.block[0]}, 1, 1)" in header
    assert MEASURED_PLACEHOLDER in header


def test_softmax_is_one_kernel_that_reads_its_row_three_times_and_writes_once() -> None:
    program = partition(CASES["norms"]())
    softmax = render_program(program)[0]
    assert softmax.name == "norms_soft"
    assert softmax.source.count("g_x[") == 3 and softmax.source.count("g_soft[") == 1
    assert "row_reduce(" in softmax.source


def test_views_fold_into_index_arithmetic_without_temporaries() -> None:
    program = partition(CASES["views"]())
    assert [k.archetype for k in program.kernels] == ["pointwise"]
    assert list(program.buffers) == ["x", "out"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_default_schedules_lie_in_the_declared_space(case: str) -> None:
    for kernel in partition(CASES[case]()).kernels:
        assert is_valid(kernel.archetype, default_schedule(kernel))
