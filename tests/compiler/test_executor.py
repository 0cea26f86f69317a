"""The executor's bookkeeping that needs no GPU: a Program's loaded kernels are kept between calls."""
from __future__ import annotations

import dataclasses
import gc

import pytest

import tensorsmith as ts
from graph_cases import CASES
from tensorsmith import executor
from tensorsmith.codegen import runtime


class FakeModule:
    """Stands in for runtime.Module: records each load instead of loading into a CUDA context."""

    loads: list[str] = []

    def __init__(self, cubin: bytes):
        self.cubin = cubin

    def function(self, name: str) -> tuple[str, bytes]:
        FakeModule.loads.append(name)
        return (name, self.cubin)


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    FakeModule.loads = []
    monkeypatch.setattr(runtime, "Module", FakeModule)
    return FakeModule.loads


def test_a_program_loads_its_kernels_once(loads) -> None:
    program = ts.compile(CASES["norms"](), profile=False)
    names = [kernel.symbol for kernel in program.kernels]
    first = executor.loaded_functions(program)
    assert executor.loaded_functions(program) == first and loads == names


def test_a_swapped_kernel_is_loaded_and_the_one_it_replaced_let_go(loads) -> None:
    program = ts.compile(CASES["norms"](), profile=False)
    executor.loaded_functions(program)
    old = program.kernels[0]
    program.kernels[0] = dataclasses.replace(old, grid=(1, 1, 1))           # the same cubin: nothing to load
    executor.loaded_functions(program)
    program.kernels[0] = dataclasses.replace(old, cubin=old.cubin + b"\0")   # another cubin: loaded
    executor.loaded_functions(program)
    assert loads == [k.symbol for k in program.kernels] + [old.symbol]
    assert (old.symbol, old.cubin) not in executor._loaded[id(program)]


def test_the_loaded_kernels_go_with_the_program(loads) -> None:
    program = ts.compile(CASES["norms"](), profile=False)
    executor.loaded_functions(program)
    key = id(program)
    assert key in executor._loaded
    del program
    gc.collect()
    assert key not in executor._loaded


def test_a_launch_plan_is_loaded_each_time(loads) -> None:
    program = ts.compile(CASES["norms"](), profile=False)
    plan = executor.LaunchPlan.of(program)
    executor.loaded_functions(plan)
    executor.loaded_functions(plan)
    assert loads == [kernel.symbol for kernel in program.kernels] * 2
