"""The call's bookkeeping that needs no GPU: the workspace's layout, `out=` on the host."""
from __future__ import annotations

import numpy as np
import pytest

import tensorsmith as ts
from graph_cases import CASES
from tensorsmith.device_call import WORKSPACE_ALIGNMENT, workspace_layout
from tensorsmith.search.verify import random_inputs


def test_workspace_holds_each_temporary_aligned_and_apart() -> None:
    program = ts.compile(CASES["tensor_core_mlp"](), profile=False, seed=0)
    offsets, size = workspace_layout(program)
    temps = {name: buf for name, buf in program.buffers.items() if buf.role == "temp"}
    assert set(offsets) == set(temps) and temps
    spans = sorted((offsets[name], offsets[name] + buf.nbytes) for name, buf in temps.items())
    assert all(start % WORKSPACE_ALIGNMENT == 0 for start, _ in spans)
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:])) and spans[-1][1] <= size


def test_out_on_the_host_is_written_in_place_and_checked() -> None:
    program = ts.compile(CASES["pointwise_math"](), profile=False, seed=0)
    inputs = random_inputs(program.graph, seed=3)
    expected = program(device="cpu", **inputs)["out"]
    target = np.full_like(expected, np.nan)
    outputs = program(device="cpu", out={"out": target}, **inputs)
    assert outputs["out"] is target and np.array_equal(target, expected)
    with pytest.raises(ts.InputError, match="not outputs of program"):
        program(device="cpu", out={"nope": target}, **inputs)
    with pytest.raises(ts.InputError, match=r"out\['out'\]: expected a numpy array of shape"):
        program(device="cpu", out={"out": target[:1]}, **inputs)
