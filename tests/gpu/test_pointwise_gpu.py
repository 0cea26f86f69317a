"""On the GPU: pointwise kernels under every vector width that divides the last axis, and the compiled programs of
the pointwise cases, match the reference on fresh random inputs."""
from __future__ import annotations

import dataclasses

import pytest

import tensorsmith as ts
from kernel_launch import assert_cpu_predicts, run_rendered
from pointwise_cases import POINTWISE_CASES
from tensorsmith.codegen.render import render_program
from tensorsmith.ir.kernel_program import Schedule
from tensorsmith.search.partition import partition
from tensorsmith.search.verify import compare, random_inputs

pytestmark = pytest.mark.gpu



@pytest.mark.parametrize("vec", [1, 2, 4, 8])
@pytest.mark.parametrize("case", sorted(POINTWISE_CASES))
def test_pointwise_kernels_match_the_reference_at_every_vector_width(case: str, vec: int) -> None:
    graph = POINTWISE_CASES[case]()
    program = partition(graph)
    kernels = [dataclasses.replace(k, schedule=Schedule.of(block=128, vec=vec)) for k in program.kernels
               if program.buffers[k.writes[0]].shape[-1] % vec == 0]
    if len(kernels) < len(program.kernels):
        pytest.skip(f"vec={vec} does not divide every output's last axis")
    program = dataclasses.replace(program, kernels=kernels)
    for draw in range(2):   # fresh inputs: the kernels compute the function, not one answer
        inputs = random_inputs(graph, seed=300 + draw)
        for check in compare(graph, run_rendered(program, render_program(program), inputs), ts.evaluate(graph, inputs)):
            assert check.ok, f"{graph.name}.{check.output} at vec={vec}: relative L2 {check.error:.3g}"


def _large_add() -> ts.Graph:
    g = ts.Graph("large_add")     # large enough that the cost model takes 16-byte accesses
    x, y = g.input("x", (2048, 4096), "float16"), g.input("y", (4096,), "float16")
    g.output("out", x * 0.5 + y)
    return g


@pytest.mark.parametrize("case", [*sorted(POINTWISE_CASES), "large_add"])
def test_compiled_pointwise_programs_match_the_reference_on_gpu(case: str) -> None:
    graph = _large_add() if case == "large_add" else POINTWISE_CASES[case]()
    program = ts.compile(graph, profile=False, seed=0)
    if case == "large_add":
        assert [k.schedule["vec"] > 1 for k in program.kernels] == [True]
    for draw in range(2):
        inputs = random_inputs(graph, seed=1234 + draw)
        outputs = program(device="cuda", **inputs)
        for check in compare(graph, outputs, ts.evaluate(graph, inputs)):
            assert check.ok, f"{graph.name}.{check.output}: relative L2 {check.error:.3g} > {check.tolerance:g}"
        assert_cpu_predicts(program.kernel_program, inputs, outputs, label=graph.name)
