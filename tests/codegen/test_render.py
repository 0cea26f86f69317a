"""Every archetype renders, and NVRTC compiles every rendered kernel to sm_90 cubin (no GPU needed)."""
from __future__ import annotations

import pytest

import tensorsmith as ts

from graph_cases import CASES
from tensorsmith.codegen.nvrtc import compile_cubin
from tensorsmith.codegen.render import MEASURED_PLACEHOLDER, render_program
from tensorsmith.codegen.schedules import default_schedule
from tensorsmith.codegen.spaces import ARCHETYPES, is_valid
from tensorsmith.search.partition import partition

ELF_MAGIC = b"\x7fELF"


@pytest.mark.parametrize("case", sorted(CASES))
def test_case_renders_and_compiles_to_cubin(case: str) -> None:
    program = partition(CASES[case]())
    for kernel in render_program(program):
        assert kernel.archetype in ARCHETYPES
        assert kernel.source.startswith(f"// {kernel.name} --")
        assert f"void __launch_bounds__({kernel.block[0]}) {kernel.entry}(" in kernel.source
        assert f"{kernel.entry}(" in kernel.build_source and kernel.name not in kernel.build_source
        cubin = compile_cubin(kernel.build_source, kernel.entry, arch=kernel.arch or "sm_90")   # sm_90a: wgmma
        assert cubin[:4] == ELF_MAGIC and kernel.entry.encode() in cubin


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


def test_softmax_is_one_kernel_that_reads_its_row_once_into_registers() -> None:
    program = partition(CASES["norms"]())
    softmax = render_program(program)[0]
    assert softmax.name == "norms_soft" and softmax.schedule["vec"] == 8
    assert softmax.source.count("load_vec<8>(g_x + ") == 1 and "g_x[" not in softmax.source
    assert softmax.source.count("store_vec<8>(g_soft + ") == 1 and "g_soft[" not in softmax.source
    assert softmax.source.count("row_reduce(acc") == 2          # max, then sum, before the epilogue


def test_a_norm_of_a_batch_of_one_is_one_row_kernel() -> None:
    """The row's statistic is read at index 0 of the batch's unit axis, the row kernel's own row there: a
    (1, T, D) norm is one kernel, not a reduction and a pointwise kernel after it (twice the traffic)."""
    program = partition(CASES["batch_of_one_norms"]())
    assert [(kernel.archetype, kernel.writes) for kernel in program.kernels] == [
        ("row_reduce", ("rms",)), ("row_reduce", ("layer",))]


def test_rows_that_do_not_divide_a_vector_use_strided_loops() -> None:
    program = partition(CASES["many_short_rows"]())        # 45 columns: no vector width divides them
    (kernel,) = render_program(program)
    assert kernel.schedule["vec"] == 1 and "load_vec<" not in kernel.source.split("extern")[1]
    assert kernel.source.count("g_x[") == 4      # two maxes (softmax's and the explicit one), a sum, the epilogue


def test_views_fold_into_index_arithmetic_without_temporaries() -> None:
    program = partition(CASES["views"]())
    assert [k.archetype for k in program.kernels] == ["pointwise"]
    assert list(program.buffers) == ["x", "out"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_default_schedules_lie_in_the_declared_space(case: str) -> None:
    program = partition(CASES[case]())
    shapes = {name: buf.shape for name, buf in program.buffers.items()}
    for kernel in program.kernels:
        assert is_valid(kernel.archetype, default_schedule(kernel, shapes))


def test_layernorm_caches_only_x_and_computes_its_row_statistics_once() -> None:
    program = partition(CASES["norms"]())
    (ln,) = [k for k in render_program(program) if k.name == "norms_ln"]
    code = ln.source[ln.source.index("extern"):]
    assert ln.schedule["vec"] == 8 and code.count("load_vec<8>(g_x + ") == 1 and "float r_x0[2][8];" in code
    epilogue = code.split("// the epilogue")[1]
    # w and b are read by the epilogue alone: loaded there, 16 bytes at a time, not held for the whole row
    assert "load_vec<8>(g_w + (base), r_w1);" in epilogue and "load_vec<8>(g_b + (base), r_b2);" in epilogue
    before_loop, loop = epilogue.split("#pragma unroll", 1)
    assert "sqrtf(" in before_loop and "sqrtf(" not in loop     # 1/std once per row, not once per element
    # two reductions in a row, one barrier each: they alternate scratch arrays
    assert "row_reduce(acc1, Sum(), s_scratch_f[0])" in code and "s_scratch_f[1])" in code
    assert code.count("__syncthreads") == 0 and ln.source.count("__syncthreads();") == 1


def test_a_matrix_vector_product_loads_each_weight_row_a_vector_at_a_time() -> None:
    """A decode step's products have one row: one value per output row, summed along K. Its weight rows are read
    eight halves at a time (a 16-byte load), as a softmax's rows are; element by element they ran at about half
    the bandwidth the cost model predicts for Llama-3.2-1B's vocabulary projection."""
    graph = ts.Graph("gemv")
    x = graph.input("x", (1, 2048), "float16")
    w = graph.input("w", (4096, 2048), "float16")
    graph.output("y", x @ w.T)
    (kernel,) = render_program(partition(graph))
    assert kernel.archetype == "row_reduce" and kernel.schedule["vec"] == 8
    body = kernel.source.split("extern")[1]
    assert body.count("load_vec<8>(g_w + ") == 1 and body.count("load_vec<8>(g_x + ") == 1 and "g_w[" not in body
    trips = 2048 // (kernel.schedule["row_threads"] * 8)
    assert f"it < {trips};" in body
    assert compile_cubin(kernel.build_source, kernel.entry)[:4] == ELF_MAGIC


def test_a_matrix_vector_product_over_a_transposed_weight_reads_it_element_by_element() -> None:
    """Stored (K, N), a weight's K is not its last axis: only the vector is loaded eight at a time."""
    graph = ts.Graph("gemv_kn")
    x = graph.input("x", (1, 2048), "float16")
    w = graph.input("w", (2048, 4096), "float16")
    graph.output("y", x @ w)
    (kernel,) = render_program(partition(graph))
    body = kernel.source.split("extern")[1]
    assert kernel.schedule["vec"] == 8 and "load_vec<8>(g_x + " in body and "load_vec<8>(g_w" not in body
    assert "g_w[" in body


def test_a_row_kernel_writes_an_output_that_reshapes_its_rows_itself() -> None:
    """A product of one row returned as (1, 1, N) and softmax rows returned regrouped: each is one row kernel that
    stores the reshaped output at its rows' row-major offsets, not a row kernel and a copy kernel after it."""
    program = partition(CASES["reshaped_row_outputs"]())
    assert [(kernel.archetype, [name for name, _ in kernel.outputs]) for kernel in program.kernels] == [
        ("row_reduce", ["y"]), ("row_reduce", ["p"])]
    sources = "\n".join(kernel.source for kernel in render_program(program))
    assert "g_y[(r1)] = " in sources and "g_p + (r0) * 100 + (base)" in sources
