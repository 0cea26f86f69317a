"""A matmul operand computed in its tile loads (a normalised activation) or a view of another kernel's output (heads
permuted back into rows) is slow to load; search may give it a buffer of its own, so that the matmul copies plain
buffers by TMA, and the cost model prices the two forms so that it does where that is faster."""
from __future__ import annotations

import dataclasses

import pytest

from graph_cases import decoder_block

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.codegen.matmul import takes_wgmma
from tensorsmith.codegen.schedules import default_schedule
from tensorsmith.ir.kernel_program import KernelProgram, Schedule, program_structure
from tensorsmith.ir.ops import Op, VIEWS
from tensorsmith.ir.targets import get_target
from tensorsmith.search.beam import BeamConfig, beam
from tensorsmith.search.cost import launch_geometry, kernel_seconds
from tensorsmith.search.engine import SearchConfig, search_program
from tensorsmith.search.mcts import MCTSConfig
from tensorsmith.search.partition import computed_operands, vector_operands
from tensorsmith.search.prune import AbstractChecker
from tensorsmith.search.space import DEFAULT_MARGIN, CandidateSpace
from tensorsmith.search.verify import verify_program

SM90 = get_target("sm90")
MMA_SYNC = Schedule.of(bm=128, bn=128, bk=64, stages=3, warps_m=2, warps_n=4, split_k=1, wgmma=0)


def _matmuls(program: KernelProgram) -> list:
    return [kernel for kernel in program.kernels if kernel.archetype == "matmul"]


def _shapes(program: KernelProgram) -> dict:
    return {name: buffer.shape for name, buffer in program.buffers.items()}


def _rms_norm_linear(tokens: int, width: int = 2048) -> ts.Graph:
    g = ts.Graph(f"rms_norm_linear_{tokens}")
    x, norm = g.input("x", (tokens, width), "float16"), g.input("norm", (width,), "float16")
    g.output("y", nn.linear(nn.rms_norm(x, norm), g.input("w", (width, width), "float16")))
    return g


def test_the_block_operands_are_its_norms_its_gate_and_its_attention_view() -> None:
    operands = computed_operands(decoder_block())
    ops = sorted(node.op.value for node in operands)
    assert ops == ["mul", "mul", "mul", "reshape"]       # two RMSNorms, silu(gate) * up, the attention's rows
    (view,) = [node for node in operands if node.op in VIEWS]
    assert [size for size in view.shape if size != 1] == [200, 256] and view.srcs[0].op == Op.PERMUTE


def test_with_its_operands_materialised_every_matmul_of_the_block_copies_both_operands_and_computes_the_same() -> None:
    graph = decoder_block()
    space = CandidateSpace(graph, SM90, AbstractChecker())
    greedy, materialised = space.program(space.greedy()), space.program(space.operands_materialised())
    assert not all(takes_wgmma(k, _shapes(greedy)) for k in _matmuls(greedy))   # the greedy fuses the prologues
    assert len(_matmuls(materialised)) == 7
    assert all(takes_wgmma(k, _shapes(materialised)) for k in _matmuls(materialised))
    assert space.expression_ok(space.operands_materialised())
    verify_program(graph, materialised, seed=3)   # raises if the materialised program computes anything else


def test_a_computed_operand_costs_its_loads_latency_every_k_step() -> None:
    graph = _rms_norm_linear(2048)
    space = CandidateSpace(graph, SM90, AbstractChecker())
    fused = space.program(space.greedy())
    (matmul,) = _matmuls(fused)
    fused = dataclasses.replace(fused, kernels=[dataclasses.replace(k, schedule=MMA_SYNC) if k is matmul else k
                                                for k in fused.kernels])
    geometry = launch_geometry(fused.kernels[-1], _shapes(fused), MMA_SYNC)
    assert geometry.computed_per_step == 128 * 64 // 256    # A's tile, element by element; B is copied
    materialised = space.program(space.operands_materialised())
    (plain,) = _matmuls(materialised)
    plain = dataclasses.replace(plain, schedule=MMA_SYNC)
    assert launch_geometry(plain, _shapes(materialised), MMA_SYNC).computed_per_step == 0
    assert kernel_seconds(fused.kernels[-1], fused, SM90) > 3 * kernel_seconds(plain, materialised, SM90)


def test_search_gives_a_prefill_norm_its_own_kernel_and_the_matmul_tma() -> None:
    graph = _rms_norm_linear(2048)
    result = search_program(graph, "sm90", budget_s=60, config=SearchConfig(BeamConfig(width=3, rounds=2),
                                                                             MCTSConfig(iterations=8)))
    (matmul,) = _matmuls(result.program)
    assert matmul.schedule["wgmma"] == 1 and takes_wgmma(matmul, _shapes(result.program))
    assert len(result.program.kernels) > 1 and result.predicted_us < result.greedy_us


def test_a_matmul_default_schedule_is_kept_unless_another_is_predicted_well_faster() -> None:
    graph = _rms_norm_linear(2048)
    space = CandidateSpace(graph, SM90, AbstractChecker())
    boundaries = space.operands_materialised()
    program = space.program(boundaries)
    position = next(i for i, k in enumerate(program.kernels) if k.archetype == "matmul")
    options = space.options(boundaries, position)
    default = default_schedule(program.kernels[position], _shapes(program), SM90.arch)
    assert options.schedules[0] == default
    assert min(options.seconds) < options.seconds[0]   # the model alone would have chosen another
    for schedule, seconds, rank in zip(options.schedules[1:], options.seconds[1:], options.ranks[1:]):
        assert rank == seconds * DEFAULT_MARGIN and rank >= options.ranks[0]


def test_with_a_gpu_the_models_choice_is_measured_first_and_wins_unless_another_measures_faster() -> None:
    graph = decoder_block()
    config = SearchConfig(BeamConfig(width=2, rounds=1), MCTSConfig(iterations=6))
    space = CandidateSpace(graph, SM90, AbstractChecker())
    _, first = beam(space, config.beam)[0]
    expected = _signature(space.build(first))
    measured: list[tuple] = []

    def measure(program: KernelProgram) -> float:   # a GPU on which the model's choice is the fastest
        measured.append(_signature(program))
        return 1e-3 if measured[-1] == expected else 2e-3

    result = search_program(graph, "sm90", budget_s=60, measure=measure, config=config)
    assert measured[0] == expected and len(measured) > 1   # the beam's first candidate, then MCTS's
    assert result.measured_us == 1e3 and _signature(result.program) == expected


def _signature(program: KernelProgram) -> tuple:
    return program_structure(program), tuple(str(kernel.schedule) for kernel in program.kernels)


def test_a_materialised_norm_is_one_row_kernel_and_an_activation_the_epilogue_of_its_matmul() -> None:
    space = CandidateSpace(decoder_block(), SM90, AbstractChecker())
    program = space.program(space.operands_materialised())
    rows = [kernel for kernel in program.kernels if kernel.archetype == "row_reduce"]
    assert len(rows) == 2 and all(program.buffers[k.writes[0]].shape == (200, 256) for k in rows)   # the two norms

    g = ts.Graph("gelu_mlp")   # gelu(x @ w1 + b1) @ w2: the activation, once materialised, is w1's epilogue
    x, w1, b1, w2 = (g.input("x", (512, 256), "float16"), g.input("w1", (1024, 256), "float16"),
                     g.input("b1", (1024,), "float16"), g.input("w2", (256, 1024), "float16"))
    g.output("y", nn.linear(nn.gelu(nn.linear(x, w1, b1)), w2))
    space = CandidateSpace(g, SM90, AbstractChecker())
    program = space.program(space.operands_materialised())
    assert [kernel.archetype for kernel in program.kernels] == ["matmul", "matmul"]
    assert all(takes_wgmma(kernel, _shapes(program)) for kernel in program.kernels)


def test_the_compile_keeps_the_searchs_random_tests_of_its_winner_instead_of_repeating_them(monkeypatch) -> None:
    """The search tests candidates against the user's graph on the verify stage's draws, so that stage does not
    execute the chosen program again (a large model's verification took 16 s of its 56 s compile)."""
    executions: list[str] = []
    execute = KernelProgram.execute

    def counted(program: KernelProgram, inputs: dict, memo=None) -> dict:
        executions.append(stage[-1])
        return execute(program, inputs, memo)

    stage = ["before"]
    monkeypatch.setattr(KernelProgram, "execute", counted)
    program = ts.compile(decoder_block(), cache=False, profile=False, budget_s=30,
                         progress=lambda event: stage.append(event) if isinstance(event, str) else None)
    assert "search" in executions and "verify" not in executions
    checks = program.report["checks"]
    assert checks and all(check["relative_l2"] < check["tolerance"] for check in checks)


@pytest.mark.parametrize("faster", ["greedy", "operands_materialised"])
def test_with_a_gpu_the_search_takes_the_operand_form_that_measures_faster(faster: str) -> None:
    """Whichever the model prefers, the search measures both the block with its operands' computations fused into
    the matmuls' loads (the greedy partition) and with them in kernels of their own, several moves apart, and
    returns the one the GPU (here a fake one) says is faster."""
    graph = decoder_block()
    space = CandidateSpace(graph, SM90, AbstractChecker())
    fast = program_structure(space.program(getattr(space, faster)()))

    def measure(program: KernelProgram) -> float:
        return 1e-3 if program_structure(program) == fast else 2e-3

    result = search_program(graph, "sm90", budget_s=60, measure=measure,
                            config=SearchConfig(BeamConfig(width=1, rounds=1), MCTSConfig(iterations=4)))
    assert result.measured_us == 1e3 and program_structure(result.program) == fast


def _norm_then_logits() -> ts.Graph:
    """A model's last norm and its (T, V) logits returned as (1, T, V), as a causal LM returns them."""
    g = ts.Graph("logits")
    x = g.input("x", (1, 64, 256), "float16")
    normed = nn.rms_norm(x, g.input("norm", (256,), "float16"))
    g.output("y", (normed.reshape((64, 256)) @ g.input("w", (320, 256), "float16").transpose(0, 1))
             .reshape((1, 64, 320)))
    return g


def _copies_through_views(program: KernelProgram) -> list:
    return [kernel for kernel in program.kernels
            if all(node.op in VIEWS or node.op == Op.INPUT for node in kernel.body)]


@pytest.mark.parametrize("graph", [_norm_then_logits, decoder_block], ids=["logits", "decoder_block"])
def test_no_start_of_the_search_copies_a_temporary_through_views(graph) -> None:
    """A refusal that gives the logits' product a buffer of its own, or the operands' start that gives the
    attention's rows one, would leave a kernel that only copies a temporary into another layout (a pass over the
    logits: 64 us of a 2-layer Llama at 512 tokens); the kernel writing the temporary stores through the views
    instead, and every start still computes the graph."""
    graph = graph()
    space = CandidateSpace(graph, SM90, AbstractChecker())
    for start in (space.greedy, space.operands_materialised, space.computed_once):
        program = space.program(start())
        assert not _copies_through_views(program), start.__name__
        verify_program(graph, program, seed=0)
    logits = space.program(space.greedy())
    if graph.name == "logits":
        assert [(k.archetype, k.writes) for k in logits.kernels][-1] == ("matmul", ("y",))


def test_a_decode_steps_computed_vectors_are_listed_and_materialised_in_its_start() -> None:
    """At one token the block's products run on the row kernel, which would compute a computed vector (a norm, the
    gated activation) again for each of its output rows; the start with its operands materialised gives each a
    buffer (the attention's query, which its own kernel reads once, excepted)."""
    graph = decoder_block(tokens=1)
    assert computed_operands(graph) == []            # no product takes the tensor cores at one row
    vectors = vector_operands(graph)
    assert sorted(node.op.value for node in vectors) == ["mul", "mul", "mul"]   # two norms, silu(gate) * up
    space = CandidateSpace(graph, SM90, AbstractChecker())
    program = space.program(space.operands_materialised())
    written = {program.buffers[name].shape for kernel in program.kernels for name in kernel.writes}
    assert {vector.shape for vector in vectors} <= written
    verify_program(graph, program, seed=3)


def test_a_vocabulary_projection_reads_its_normalised_vector_from_a_buffer() -> None:
    """Llama-3.2-1B's residual stream, last norm and vocabulary projection at one token, its vocabulary narrowed:
    inline, the adds and the norm are computed again for each of the 32000 vocabulary rows; materialised, once,
    and the projection reads the weight at its bandwidth."""
    g = ts.Graph("lm_head")
    x = g.input("x", (1, 1, 2048), "float16")
    for layer in range(2):
        x = x + g.input(f"h{layer}", (1, 1, 2048), "float16")
    normed = nn.rms_norm(x, g.input("norm", (2048,), "float16"))
    g.output("y", nn.linear(normed, g.input("w", (32000, 2048), "float16")))
    (vector,) = vector_operands(g)
    space = CandidateSpace(g, SM90, AbstractChecker())
    greedy, materialised = space.program(space.greedy()), space.program(space.operands_materialised())
    norm, projection = materialised.kernels
    assert materialised.buffers[norm.writes[0]].shape == vector.shape and projection.writes == ("y",)
    assert [greedy.buffers[k.writes[0]].shape for k in greedy.kernels] == [(1, 1), (1, 1, 32000)]   # a statistic
    greedy_s = sum(kernel_seconds(k, greedy, SM90) for k in greedy.kernels)
    assert sum(kernel_seconds(k, materialised, SM90) for k in materialised.kernels) < 0.7 * greedy_s
    verify_program(g, materialised, seed=3)


def test_an_experts_weight_selected_per_tile_is_not_given_a_buffer() -> None:
    """Each tile of routed tokens times its expert's weight, read transposed as nn.Linear stores it: the lookup is
    copied by the matmul from the selected expert's rows, so the transposed view of it is not listed as an operand
    to materialise (its buffer would be a copy of a whole expert weight per tile); a lookup of a table computed
    elementwise still is."""
    g = ts.Graph("expert_tiles")
    x, picks = g.input("x", (24, 64, 256), "float16"), g.input("picks", (24,), "int32")
    w = g.input("w", (8, 512, 256), "float16")
    g.output("y", x @ nn.take(w, picks, 0).transpose(1, 2))
    g.output("z", x @ nn.take(w * 2.0, picks, 0).transpose(1, 2))
    (listed,) = computed_operands(g)                                   # z's, not y's
    assert listed.op in VIEWS and any(node.op == Op.MUL for node in ts.ir.node.toposort([listed]))
