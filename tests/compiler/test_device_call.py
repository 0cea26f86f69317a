"""The call's bookkeeping that needs no GPU: the workspace's layout, `out=` on the host."""
from __future__ import annotations

import numpy as np
import pytest

import tensorsmith as ts
from graph_cases import CASES
from tensorsmith import nn
from tensorsmith.device_call import STAGED_BYTES, WORKSPACE_ALIGNMENT, staging_layout, workspace_layout
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


def test_each_small_input_and_output_has_a_staging_slot_after_the_temporaries() -> None:
    g = ts.Graph("lookup")
    ids, table = g.input("ids", (1, 4), "int32"), g.input("table", (1000, 512), "float16")
    rows = nn.embedding(table, ids)
    g.output("y", nn.rms_norm(rows, g.input("gain", (512,), "float16")) * 2.0)
    g.output("total", rows.sum(-1))
    program = ts.compile(g, profile=False, seed=0)
    offsets, end = workspace_layout(program)
    slots, size = staging_layout(program, end)
    assert set(slots) == {"ids", "gain", "total"}   # 16, 1024 and 8 bytes; the table and y are never copied
    assert program.buffers["gain"].nbytes == STAGED_BYTES < program.buffers["y"].nbytes
    spans = sorted((slots[name], slots[name] + program.buffers[name].nbytes) for name in slots)
    assert spans[0][0] >= end and all(start % WORKSPACE_ALIGNMENT == 0 for start, _ in spans)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:])) and spans[-1][1] <= size
