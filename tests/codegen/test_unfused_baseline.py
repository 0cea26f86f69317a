"""The unfused baseline (one kernel per op), which profiling measures against, renders and compiles for every
graph (on the CPU, where profiling never runs, nothing else renders it)."""
from __future__ import annotations

from pathlib import Path

import pytest

from graph_cases import CASES
from tensorsmith.codegen.nvrtc import compile_many, is_cubin
from tensorsmith.codegen.render import render_program
from tensorsmith.model_loader import load_graph
from tensorsmith.search.partition import unfused

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.py"))


@pytest.mark.parametrize("graph", [*(CASES[name] for name in sorted(CASES)), *(lambda p=p: load_graph(p) for p in EXAMPLES)],
                         ids=[*sorted(CASES), *(p.stem for p in EXAMPLES)])
def test_every_kernel_of_the_unfused_baseline_renders(graph) -> None:
    program = unfused(graph())
    rendered = render_program(program)
    assert [k.name for k in rendered] == [k.name for k in program.kernels]
    cubins = compile_many([(k.source, k.name, k.arch or "sm_90") for k in rendered])
    assert all(is_cubin(cubin) for cubin in cubins)
