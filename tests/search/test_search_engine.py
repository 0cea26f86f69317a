"""search_program: verified, no slower than greedy or unfused, deterministic, within budget, GPU-rewardable."""
from __future__ import annotations

import math
import time

import pytest
from graph_cases import CASES

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.codegen.schedules import default_schedule
from tensorsmith.codegen.spaces import is_valid
from tensorsmith.ir.kernel_program import KernelProgram, program_structure
from tensorsmith.ir.targets import get_target
from tensorsmith.search.beam import BeamConfig
from tensorsmith.search.cost import program_seconds
from tensorsmith.search.engine import SearchConfig, SearchProgress, search_program
from tensorsmith.search.mcts import MCTSConfig
from tensorsmith.search.partition import partition
from tensorsmith.search.space import CandidateSpace, SpaceStats
from tensorsmith.search.verify import verify_program

SM90 = get_target("sm90")
QUICK = SearchConfig(BeamConfig(width=3, rounds=2), MCTSConfig(iterations=16))


@pytest.mark.parametrize("case", ["many_short_rows", "matmul", "integers", "shared_outputs", "views"])
def test_search_returns_a_verified_scheduled_program_no_slower_than_greedy(case: str) -> None:
    graph = CASES[case]()
    result = search_program(graph, "sm90", budget_s=30, config=QUICK)
    verify_program(graph, result.program, seed=11)
    assert all(kernel.schedule.params and is_valid(kernel.archetype, kernel.schedule)
               for kernel in result.program.kernels)
    predicted = program_seconds(result.program, SM90) * 1e6
    assert predicted == pytest.approx(result.predicted_us)
    assert predicted <= result.greedy_us * (1 + 1e-9) and predicted <= result.unfused_us
    stats = result.stats
    assert stats.enumerated >= 1 and stats.verified >= 1 and stats.boundary_sets >= 1
    assert [e["verdict"] for e in result.history].count("winner") == 1
    assert all(set(e) >= {"name", "description", "predicted_us", "measured_us", "verdict"} for e in result.history)


def test_search_finds_better_schedules_than_the_defaults() -> None:
    graph = CASES["norms"]()
    result = search_program(graph, "sm90", budget_s=30, config=QUICK)
    assert result.predicted_us < result.greedy_us


def test_same_seed_same_program() -> None:
    graph = CASES["attention"]()
    first = search_program(graph, "sm90", budget_s=30, seed=3, config=QUICK)
    again = search_program(CASES["attention"](), "sm90", budget_s=30, seed=3, config=QUICK)
    assert not first.stats.budget_hit and not again.stats.budget_hit
    assert program_structure(first.program) == program_structure(again.program)
    assert [e["description"] for e in first.history] == [e["description"] for e in again.history]


def test_a_spent_budget_still_returns_a_verified_program() -> None:
    graph = CASES["norms"]()
    result = search_program(graph, "sm90", budget_s=0.0)
    assert result.stats.budget_hit and result.stats.seconds < 20
    verify_program(graph, result.program, seed=1)


def test_measured_time_is_the_reward_and_picks_the_winner() -> None:
    graph = CASES["many_short_rows"]()
    measured: list[KernelProgram] = []

    def measure(program: KernelProgram) -> float:   # a "GPU" that disagrees with the model: it likes 64 threads
        verify_program(graph, program, seed=7)         # only verified candidates are ever measured
        measured.append(program)
        return sum(1e-6 * (1 if k.schedule.as_dict().get("row_threads") == 64 else 5) for k in program.kernels)

    progress: list[SearchProgress] = []
    result = search_program(graph, "sm90", budget_s=30, measure=measure, progress=progress.append,
                            config=SearchConfig(BeamConfig(width=2, rounds=1), MCTSConfig(iterations=24,
                                                                                         schedules_per_kernel=6)))
    assert measured and result.stats.measured == len(measured)
    assert result.measured_us == min(e["measured_us"] for e in result.history if e["measured_us"] is not None)
    times = [1e6 * sum(1e-6 * (1 if k.schedule.as_dict().get("row_threads") == 64 else 5) for k in p.kernels)
             for p in list(measured)]
    assert math.isclose(result.measured_us, min(times))
    assert progress and progress[-1].tried == result.stats.enumerated and progress[-1].best_us is not None


def test_winner_is_never_predicted_slower_than_greedy_partition_with_its_defaults() -> None:
    graph = CASES["rope"]()
    result = search_program(graph, "sm90", budget_s=30, config=QUICK)
    assert result.predicted_us <= program_seconds(partition(graph), SM90) * 1e6 * (1 + 1e-9)


def test_candidates_that_fault_hang_or_are_wrong_on_the_gpu_are_reported_and_skipped(caplog) -> None:
    from tensorsmith.ir.errors import KernelFault
    from tensorsmith.search.verify import VerificationError

    graph = CASES["many_short_rows"]()
    calls: list[KernelProgram] = []

    def measure(program: KernelProgram) -> float:   # the first three candidates measured fail, each in its own way
        calls.append(program)
        if len(calls) == 1:
            raise KernelFault("cuCtxSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS", "faulted")
        if len(calls) == 2:
            raise KernelFault("did not finish in 20.0 s; their worker was killed", "timed out")
        if len(calls) == 3:
            raise VerificationError("the GPU program disagrees with the reference")
        return 1e-6 * len(calls)        # later ones are slower: a failed candidate would win if it were kept

    progress: list[SearchProgress] = []
    result = search_program(graph, "sm90", budget_s=30, measure=measure, progress=progress.append,
                            config=SearchConfig(BeamConfig(width=2, rounds=1), MCTSConfig(iterations=24,
                                                                                         schedules_per_kernel=6)))
    stats = result.stats
    assert (stats.faulted, stats.timed_out, stats.wrong_on_gpu) == (1, 1, 1)
    assert stats.measured == len(calls) - 3 >= 1
    verdicts = [e["verdict"] for e in result.history]
    assert verdicts.count("faulted") == verdicts.count("timed out") == verdicts.count("wrong on GPU") == 1
    assert all(e["measured_us"] is None for e in result.history if e["verdict"] in ("faulted", "timed out"))
    assert result.measured_us == pytest.approx(4.0)      # the fastest candidate that measured well
    assert progress[-1].rejected == 3
    assert "is skipped (faulted): cuCtxSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS" in caplog.text
    assert "is skipped (timed out)" in caplog.text


def test_verification_of_the_winner_is_reserved_from_the_budget(monkeypatch) -> None:
    """The first draw's reference is timed before the search starts; the search's deadline keeps the time the
    remaining draws and the program's executions will take, but never more than 75% of the budget."""
    from tensorsmith.search import engine
    graph = CASES["many_short_rows"]()
    slow = engine.reference_draw

    def reference_taking_a_second(*args, **kwargs):
        began = time.monotonic()
        found = slow(*args, **kwargs)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - began)))
        return found
    monkeypatch.setattr(engine, "reference_draw", reference_taking_a_second)
    run = engine._Run(None, graph, 0, QUICK, 0.0, 0.0, None, None)
    reserve = engine._verification_reserve(run, budget_s=60.0)
    assert 0 in run.draws and run.draws[0] is not None          # the verification will read it from the memo
    assert 0.9 <= run.stats.reference_s <= 1.5                   # and the pipeline sizes the exact check by it
    draws = 2 + engine.softmax_like(graph)     # the large draw too where the graph is softmax-like
    assert 2 * draws - 1.1 <= reserve <= 2 * draws - 0.5   # the other references and every execution: 1 s each
    assert engine._verification_reserve(run, budget_s=2.0) == pytest.approx(1.5)   # capped at 75%


def test_codegens_default_schedule_is_always_among_a_kernels_options() -> None:
    """The cost model ranks six other schedules of this softmax cheaper than the default (picked from H200
    measurements); the options that search times still include it, so search never loses it."""
    g = ts.Graph("default_kept")
    g.output("y", nn.softmax(g.input("x", (8192, 8192), "float16"), -1))
    space = CandidateSpace(g, get_target("sm90"))
    boundaries = space.greedy()
    program = space.program(boundaries)
    shapes = {name: buffer.shape for name, buffer in program.buffers.items()}
    options = space.options(boundaries, 0)
    assert default_schedule(program.kernels[0], shapes) in options.schedules
    assert list(options.seconds) == sorted(options.seconds)


def test_the_forms_of_one_search_schedule_each_kernel_structure_once() -> None:
    """Two forms whose greedy programs have the same kernels (here two builds of one graph): the second form's
    options come from the first's scheduling (search shares `scheduled` between its forms' spaces), not again."""
    shared, stats = {}, SpaceStats()
    first, second = (CandidateSpace(CASES["decoder_block"](), get_target("sm90"), stats=stats, form=form,
                                    scheduled=shared) for form in (0, 1))
    options = [first.options(first.greedy(), p) for p in range(len(first.program(first.greedy()).kernels))]
    scheduled = stats.kernels_scheduled
    assert scheduled == len(shared) > 1
    again = [second.options(second.greedy(), p) for p in range(len(second.program(second.greedy()).kernels))]
    assert stats.kernels_scheduled == scheduled and again == options


def _at_defaults(program: KernelProgram) -> bool:
    shapes = {name: buffer.shape for name, buffer in program.buffers.items()}
    return all(kernel.schedule == default_schedule(kernel, shapes) for kernel in program.kernels)


@pytest.mark.parametrize("defaults_faster", [True, False])
def test_the_search_returns_nothing_slower_than_its_kernels_at_codegens_defaults(defaults_faster: bool) -> None:
    """A "GPU" on which codegen's default schedules are three times faster than any other: the norms' search
    (whose model prefers other row schedules) measures its winner's kernels at the defaults too and returns them;
    where the defaults are the slower ones, the winner stays."""
    graph = CASES["norms"]()

    def measure(program: KernelProgram) -> float:
        fast = _at_defaults(program) == defaults_faster
        return (1e-6 if fast else 3e-6) * len(program.kernels)

    result = search_program(graph, "sm90", budget_s=3, measure=measure)
    assert _at_defaults(result.program) == defaults_faster
    assert result.stats.defaults_kept == (1 if defaults_faster else 0)
