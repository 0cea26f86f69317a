"""Graphs with size-0 axes compile: what they compute from empty tensors as constants, empty outputs as buffers
that no kernel writes (the graphs of the issue that crashed with a bare ZeroDivisionError)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.cli import main
from tensorsmith.search.verify import compare, random_inputs


def _product_with_k_0() -> ts.Graph:
    g = ts.Graph("k_0")
    x = g.input("x", (4, 0), "float32")
    g.output("y", x @ x.transpose(0, 1))
    return g


def _reshape_of_empty() -> ts.Graph:
    g = ts.Graph("reshape_0")
    g.output("y", g.input("x", (0, 8), "float32").reshape(8, 0))
    return g


def _norm_of_no_rows() -> ts.Graph:
    g = ts.Graph("norm_0")
    g.output("y", nn.layer_norm(g.input("x", (0, 16), "float32")))
    return g


def _mixed() -> ts.Graph:
    g = ts.Graph("mixed_0")
    x, w = g.input("x", (0, 16), "float16"), g.input("w", (16, 8), "float16")
    g.output("rows", nn.rms_norm(x) @ w)     # empty
    g.output("total", x.sum(0) + 1.0)        # 1 everywhere
    g.output("mean", x.mean(0))              # NaN everywhere
    g.output("scaled", w * 3.0)              # an ordinary output beside them
    return g


GRAPHS = {"k_0": _product_with_k_0, "reshape_0": _reshape_of_empty, "norm_0": _norm_of_no_rows, "mixed_0": _mixed}


@pytest.mark.parametrize("case", sorted(GRAPHS))
def test_a_graph_with_size_0_axes_compiles_and_matches_the_interpreter(case: str) -> None:
    graph = GRAPHS[case]()
    program = ts.compile(graph, budget_s=10, profile=False, cache=False)
    assert program.outputs == tuple(graph.outputs)
    inputs = random_inputs(graph, seed=3)
    outputs = program(device="cpu", **inputs)
    want = ts.evaluate(graph, inputs)
    for name, node in graph.outputs.items():
        assert outputs[name].shape == node.shape == want[name].shape
    for check in compare(graph, outputs, want):
        assert check.ok, check
    for kernel in program.kernels:      # no kernel writes an empty buffer
        assert all(0 not in program.buffers[name].shape for name in kernel.writes), kernel.name


def test_only_outputs_with_elements_get_kernels() -> None:
    assert ts.compile(_reshape_of_empty(), budget_s=10, profile=False, cache=False).kernels == []
    program = ts.compile(_mixed(), budget_s=10, profile=False, cache=False)
    written = {name for kernel in program.kernels for name in kernel.writes}
    assert {"total", "mean", "scaled"} <= written and "rows" not in written
    assert program.buffers["rows"].shape == (0, 8) and program.buffers["rows"].role == "output"


def test_a_program_with_an_empty_output_saves_and_loads(tmp_path: Path) -> None:
    graph = _mixed()
    ts.compile(graph, budget_s=10, profile=False, cache=False).save(tmp_path / "out")
    loaded = ts.load(tmp_path / "out")
    inputs = random_inputs(graph, seed=4)
    outputs = loaded(device="cpu", **inputs)
    assert outputs["rows"].shape == (0, 8)
    assert all(check.ok for check in compare(graph, outputs, ts.evaluate(graph, inputs)))


def test_the_command_line_compiles_and_checks_an_empty_output(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "empty.py"
    model.write_text("import tensorsmith as ts\ng = ts.Graph('e')\nx = g.input('x', (0, 16))\n"
                     "g.output('y', x * 2)\ng.output('s', x.sum(0))\n")
    assert main(["compile", str(model), "-o", str(tmp_path / "out"), "--no-profile", "-q"]) == 0
    assert main(["run", str(tmp_path / "out"), "--check", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert "y: shape (0, 16) float32, no elements" in printed
    assert "check y: relative L2 error 0" in printed and "check s: relative L2 error 0" in printed


@pytest.mark.gpu
@pytest.mark.parametrize("arrays", ["numpy", "torch"])
def test_empty_outputs_on_the_gpu(arrays: str) -> None:
    graph = _mixed()
    program = ts.compile(graph, budget_s=10, profile=False, cache=False)
    inputs = random_inputs(graph, seed=5)
    if arrays == "torch":
        torch = pytest.importorskip("torch")
        given = {name: torch.from_numpy(value).cuda() for name, value in inputs.items()}
        outputs = {name: value.cpu().float().numpy() for name, value in program(**given).items()}
    else:
        outputs = program(device="cuda", **inputs)
    assert outputs["rows"].shape == (0, 8)
    for check in compare(graph, outputs, ts.evaluate(graph, inputs)):
        assert check.ok, check
