"""The pointwise archetype with VEC elements per thread: 16-byte loads and stores where the last axis allows,
broadcast operands read once per thread, permuted and sliced ones element by element; every schedule compiles."""
from __future__ import annotations

import dataclasses

import pytest

import tensorsmith as ts
from pointwise_cases import POINTWISE_CASES
from tensorsmith.codegen.nvrtc import compile_many
from tensorsmith.codegen.render import render_kernel, render_program
from tensorsmith.ir.kernel_program import KernelProgram, Schedule, merged_pointwise
from tensorsmith.ir.targets import get_target
from tensorsmith.search.cost import kernel_cost
from tensorsmith.search.partition import partition
from tensorsmith.search.prune import feasible_schedules, kernel_facts
from tensorsmith.search.verify import compare, random_inputs

SM90 = get_target("sm90")
ELF_MAGIC = b"\x7fELF"


def with_vec(program: KernelProgram, vec: int, block: int = 256) -> KernelProgram:
    return dataclasses.replace(program, kernels=[dataclasses.replace(k, schedule=Schedule.of(block=block, vec=vec))
                                                 for k in program.kernels])


def body(source: str) -> str:
    return source[source.index("extern \"C\""):]


@pytest.mark.parametrize("case", sorted(POINTWISE_CASES))
def test_every_vector_width_that_divides_the_last_axis_renders_and_compiles(case: str) -> None:
    program = partition(POINTWISE_CASES[case]())
    assert {k.archetype for k in program.kernels} == {"pointwise"}
    rendered = []
    for vec in (1, 2, 4, 8):
        trial = with_vec(program, vec)
        for position, kernel in enumerate(trial.kernels):
            if program.buffers[kernel.writes[0]].shape[-1] % vec == 0:
                rendered.append(render_kernel(trial, position))
            else:
                with pytest.raises(ValueError, match=f"vec={vec} does not divide the last axis"):
                    render_kernel(trial, position)
    cubins = compile_many([(k.source, k.name) for k in rendered], arch="sm_90")
    assert all(cubin[:4] == ELF_MAGIC for cubin in cubins)


def test_an_fp16_add_is_two_16_byte_loads_and_a_16_byte_store_per_thread() -> None:
    (kernel,) = render_program(partition(POINTWISE_CASES["add_f16"]()))
    assert kernel.schedule == Schedule.of(block=256, vec=8)
    assert kernel.grid == (24 * 64 // 8 // 256 + 1, 1, 1)
    code = body(kernel.source)
    assert "load_vec<8>(g_x + (o0) * 64 + (o1), r_x0);" in code and "load_vec<8>(g_y + (o0) * 64 + (o1), r_y1);" in code
    assert "store_vec<8>(g_out + base, r_out_out);" in code
    assert "g_x[" not in code and "g_y[" not in code and "g_out[" not in code
    assert "one thread per 8 consecutive elements of the last axis" in kernel.source.split("#include")[0]


def test_broadcast_operands_are_read_once_per_thread_before_the_loop() -> None:
    (kernel,) = render_program(partition(POINTWISE_CASES["bias"]()))
    code = body(kernel.source)
    before, loop = code.split("for (int v = 0; v < 8; ++v)")
    assert "load_vec<8>(g_x + " in before and "load_vec<8>(g_row + (o1), r_row1);" in before
    assert "g_col[(o0)]" in before and "g_s[0]" in before        # the column vector and the scalar
    assert "g_" not in loop.split("store_vec")[0]               # the loop reads registers only
    header = kernel.source.split("#include")[0]
    assert "x, row read with vector loads; col, s read once per thread" in header


@pytest.mark.parametrize("case, scalar", [("permuted_f32", "g_x[(k) * 20 + (o0)]"),
                                          ("sliced_f16", "g_x[(o0) * 70 + ((k + 3))]")])
def test_permuted_and_sliced_operands_are_read_element_by_element(case: str, scalar: str) -> None:
    (kernel,) = render_program(partition(POINTWISE_CASES[case]()))
    code = body(kernel.source)
    assert kernel.schedule["vec"] > 1 and scalar in code.split("for (int v = 0;")[1]
    assert "store_vec<" in code
    if case == "sliced_f16":    # x[:, :64] of rows of 70: a slice at 0 whose rows are not 16-byte aligned
        assert "load_vec" not in code and "g_x[(o0) * 70 + (k)]" in code
    else:
        assert "load_vec<4>(g_y + (o0) * 48 + (o1), r_y" in code


def test_int32_and_bool_operands_and_outputs_move_as_vectors() -> None:
    kernels = {k.name: k for k in render_program(partition(POINTWISE_CASES["int_bool"]()))}
    count, positive, scaled = (body(kernels[f"pw_int_bool_{n}"].source) for n in ("count", "positive", "scaled"))
    assert kernels["pw_int_bool_count"].schedule["vec"] == 4          # no float buffer: 4 x 32 bits
    assert "int r_n0[4];" in count and "int r_count_out[4];" in count and "store_vec<4>(g_count + base" in count
    assert "bool r_positive_out[8];" in positive and "store_vec<8>(g_positive + base" in positive
    assert "int r_n1[8];" in scaled and "load_vec<8>(g_n + " in scaled     # fp16 beside it sets VEC = 8
    (bool_input,) = render_program(partition(POINTWISE_CASES["bool_input"]()))
    assert "bool r_m0[8];" in body(bool_input.source)


def test_last_axes_that_do_not_divide_by_8_take_the_largest_width_that_does() -> None:
    kernels = {k.name: k for k in render_program(partition(POINTWISE_CASES["odd_last_axis"]()))}
    assert kernels["pw_odd_f16_out"].schedule["vec"] == 4             # 36 columns
    assert kernels["pw_odd_f16_flat"].schedule["vec"] == 1            # 37 elements
    assert "NUMEL / VEC" not in kernels["pw_odd_f16_flat"].source and "if (i >= NUMEL) return;" in \
        kernels["pw_odd_f16_flat"].source


def test_z3_prunes_vector_widths_that_do_not_divide_the_last_axis() -> None:
    program = partition(POINTWISE_CASES["odd_last_axis"]())
    shapes = {name: buf.shape for name, buf in program.buffers.items()}
    verdicts = {tuple(v.schedule.as_dict().values()): v.violated
                for v in feasible_schedules(kernel_facts(program.kernels[0], shapes), SM90)}
    assert verdicts[(256, 4)] is None and verdicts[(256, 8)] == "vec divides the last axis"


def test_the_cost_model_prefers_16_byte_accesses_on_a_large_fp16_add() -> None:
    g = ts.Graph("add")
    x, y = g.input("x", (4096, 4096), "float16"), g.input("y", (4096, 4096), "float16")
    g.output("out", x + y)
    program = partition(g)
    scalar, vector = with_vec(program, 1), with_vec(program, 8)
    assert kernel_cost(vector.kernels[0], vector, SM90).seconds * 1.5 < kernel_cost(scalar.kernels[0], scalar, SM90).seconds


@pytest.mark.parametrize("case", sorted(POINTWISE_CASES))
def test_compiled_pointwise_program_on_cpu_matches_the_reference(case: str) -> None:
    graph = POINTWISE_CASES[case]()
    program = ts.compile(graph, profile=False)
    assert all("vec" in k.schedule for k in program.kernels)
    for draw in range(2):
        inputs = random_inputs(graph, seed=40 + draw)
        checks = compare(graph, program(device="cpu", **inputs), ts.evaluate(graph, inputs))
        assert all(c.ok for c in checks), checks


def test_max_is_rendered_to_keep_nan() -> None:
    """Every max the kernels compute is ts_fmax, which returns a NaN operand (fmaxf returns the other one)."""
    graph = ts.Graph("max_kinds")
    x = graph.input("x", (16, 300), "float32")
    graph.output("row_max", x.max(axis=1))
    graph.output("relu", ts.nn.relu(x))
    program = ts.compile(graph, profile=False, cache=False)
    sources = "".join(kernel.source for kernel in program.kernels)
    assert "ts_fmax(" in sources and "fmaxf(" not in sources.replace("ts_fmax", "")


def _cache_write(read_elsewhere: bool = False, masked: bool = False, length: int = 16) -> ts.Graph:
    """A KV cache written at one position (ts.nn.put, a decode step's write), or where a mask holds (`masked`), and
    a sum over the written cache."""
    g = ts.Graph("cache_write")
    cache = g.input("cache", (4, length, 64), "float16")
    at, values = g.input("at", (1,), "int32"), g.input("values", (4, 1, 64), "float16")
    if masked:
        mask = g.input("mask", (4, length, 64), "bool")
        written = ts.nn.where(mask, values.expand((4, length, 64)), cache)
    else:
        written = ts.nn.put(cache, at, values, axis=1)
    g.output("written", written)
    g.output("total", written.cast("float32").sum(1))
    if read_elsewhere:
        g.output("twice", cache * 2.0)
    return g


@pytest.mark.parametrize("vec", [1, 8])
def test_a_cache_written_where_a_mask_holds_returns_early_where_written_in_place(vec: int) -> None:
    """The kernel that writes where(mask, values, cache) returns before reading anything where its output is the
    cache's own memory and none of its elements is masked; the program says that output may be written over the
    cache."""
    program = partition(_cache_write(masked=True))
    assert program.written_in_place() == {"written": "cache"}
    trial = with_vec(program, vec)
    (position,) = [i for i, k in enumerate(trial.kernels) if k.writes == ("written",)]
    kernel = render_kernel(trial, position)
    code = body(kernel.source)
    guard = "(const void*)g_written == (const void*)g_cache"
    assert guard in code and code.index(guard) < code.index("g_cache[" if vec == 1 else "load_vec")
    assert "reads and writes nothing" in kernel.source.split("#include")[0]
    (cubin,) = compile_many([(kernel.source, kernel.name)], arch="sm_90")
    assert cubin[:4] == ELF_MAGIC


@pytest.mark.parametrize("vec", [1, 8])
def test_a_cache_written_at_one_position_launches_over_that_slice_in_place(vec: int) -> None:
    """A decode step's write at a position read at run time: in place, the kernel's threads cover the one slice
    along the cache's axis (its blocks one wave, not one per 256 elements of the cache), the position read once; out
    of place the same blocks stride over every element. The cost model prices the slice."""
    length = 2048
    program = partition(_cache_write(length=length))
    assert program.written_in_place() == {"written": "cache"}
    trial = with_vec(program, vec, block=128)
    (position,) = [i for i, k in enumerate(trial.kernels) if k.writes == ("written",)]
    kernel = render_kernel(trial, position)
    code = body(kernel.source)
    whole_blocks = 4 * length * 64 // vec // 128
    assert kernel.grid[0] == min(whole_blocks, 256) < whole_blocks
    guard = "if (!((const void*)g_written == (const void*)g_cache))"
    assert code.index(guard) < code.index(f"e < {4 * length * 64}") < code.index("const idx_t at = ")
    assert "one position along axis 1" in kernel.source.split("#include")[0]
    (cubin,) = compile_many([(kernel.source, kernel.name)], arch="sm_90")
    assert cubin[:4] == ELF_MAGIC
    target = get_target("sm90")
    point = kernel_cost(trial.kernels[position], trial, target)
    masked = partition(_cache_write(length=length, masked=True))
    (other,) = [k for k in with_vec(masked, vec, block=128).kernels if k.writes == ("written",)]
    assert point.dram_bytes < 4 * 64 * 2 * 3 + 64 < kernel_cost(other, with_vec(masked, vec, 128), target).dram_bytes


@pytest.mark.parametrize("vec", [1, 8])
def test_a_history_written_along_its_last_axis_is_a_point_write_at_any_vec(vec: int) -> None:
    """A tensor written at one position of its last axis (a token history, a cache laid out keys-last): the slice
    takes one element a thread whatever VEC the copy path takes (a regression raised for vec > 1), and stores the
    value alone, reading neither the condition nor the kept element there."""
    g = ts.Graph("history")
    history, at = g.input("history", (4, 64, 2048), "float16"), g.input("at", (1,), "int32")
    g.output("written", ts.nn.put(history, at, g.input("token", (4, 64, 1), "float16"), axis=2, wrap=True))
    program = with_vec(partition(g), vec, block=128)
    kernel = render_kernel(program, 0)
    code = body(kernel.source)
    assert kernel.grid[0] == 256
    in_place = code[code.index("const idx_t at = "):]
    assert "g_history" not in in_place and "g_at" not in in_place
    (cubin,) = compile_many([(kernel.source, kernel.name)], arch="sm_90")
    assert cubin[:4] == ELF_MAGIC


def test_a_key_and_a_value_cache_written_in_one_kernel_share_the_slice_launch() -> None:
    """A decode step's K and V writes joined into one kernel (merged_pointwise, as a stitched model joins them) each
    compute their position alike: one point write, its threads over the slice, the position read once (each output
    stores its value there: neither condition is evaluated again)."""
    g = ts.Graph("two_caches")
    at = g.input("at", (1,), "int32")
    for name in ("k", "v"):
        cache = g.input(f"{name}_cache", (8, 2048, 64), "float16")
        g.output(f"{name}_written", ts.nn.put(cache, at, g.input(name, (8, 1, 64), "float16"), axis=1, wrap=True))
    program = with_vec(partition(g), 1, block=128)
    joined = dataclasses.replace(program, kernels=merged_pointwise(list(program.kernels)))
    (kernel,) = joined.kernels
    assert set(kernel.writes) == {"k_written", "v_written"}
    rendered = render_kernel(joined, 0)
    code = body(rendered.source)
    in_place = code[code.index("const idx_t at = "):]
    assert rendered.grid[0] == 256 and code.count("const idx_t at = ") == 1 and "g_at" not in in_place
    (cubin,) = compile_many([(rendered.source, rendered.name)], arch="sm_90")
    assert cubin[:4] == ELF_MAGIC


def test_a_cache_read_by_another_kernel_or_through_a_view_is_not_written_in_place() -> None:
    assert partition(_cache_write(read_elsewhere=True)).written_in_place() == {}
    g = ts.Graph("transposed")
    x = g.input("x", (16, 16), "float16")
    mask = g.input("mask", (16, 16), "bool")
    g.output("y", ts.nn.where(mask, x, x.transpose(0, 1)))
    program = partition(g)
    assert program.written_in_place() == {}
    assert all("(const void*)" not in k.source for k in render_program(program))
