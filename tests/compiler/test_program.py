"""ts.compile and Program: the CPU path, inputs checked at call time, and the saved folder."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

import tensorsmith as ts
from graph_cases import CASES
from tensorsmith.codegen.runtime import gpu_available
from tensorsmith.executor import launch_grid
from tensorsmith.codegen.tensor_map import TensorMapSpec
from tensorsmith.search.verify import compare, random_inputs


@pytest.mark.parametrize("case", ["norms", "views", "integers", "attention"])
def test_program_on_cpu_matches_the_reference(case: str) -> None:
    graph = CASES[case]()
    program = ts.compile(graph, profile=False)
    inputs = random_inputs(graph, seed=11)
    checks = compare(graph, program(device="cpu", **inputs), ts.evaluate(graph, inputs))
    assert all(c.ok for c in checks), checks


def test_save_writes_kernels_cubins_and_program_json(tmp_path: Path) -> None:
    program = ts.compile(CASES["norms"](), profile=False)
    folder = program.save(tmp_path / "out")
    doc = json.loads((folder / "program.json").read_text())
    assert [k["name"] for k in doc["kernels"]] == [k.name for k in program.kernels]
    assert [t["name"] for t in doc["inputs"]] == ["x", "w", "b"]
    assert {t["name"] for t in doc["outputs"]} == {"soft", "logsoft", "rms", "ln"}
    files = sorted(p.name for p in (folder / "kernels").iterdir())
    assert files[:2] == ["00_soft.cu", "00_soft.cubin"]
    for kernel in doc["kernels"]:
        assert len(kernel["grid"]) == 3 and len(kernel["block"]) == 3 and kernel["params"]
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".")] == []   # no staging folder left


def test_save_replaces_an_older_folder_whole(tmp_path: Path) -> None:
    older = ts.compile(CASES["norms"](), profile=False)
    older.save(tmp_path / "out")                        # a folder tensorsmith wrote (it has the manifest)
    program = ts.compile(CASES["views"](), profile=False)
    program.save(tmp_path / "out")
    kept = {str(file.relative_to(tmp_path / "out")) for file in (tmp_path / "out" / "kernels").iterdir()}
    assert kept == {f"kernels/{kernel.file_stem}{suffix}" for kernel in program.kernels for suffix in (".cu", ".cubin")}


def test_load_reads_back_what_save_wrote(tmp_path: Path) -> None:
    program = ts.compile(CASES["norms"](), profile=False)
    loaded = ts.load(program.save(tmp_path / "out"))
    assert [(k.name, k.grid, k.block, k.params, k.cubin) for k in loaded.kernels] == \
           [(k.name, k.grid, k.block, k.params, k.cubin) for k in program.kernels]
    assert loaded.buffers == program.buffers


def test_load_reads_back_the_tma_tensor_maps(tmp_path: Path) -> None:
    program = ts.compile(CASES["norms"](), profile=False)
    maps = (TensorMapSpec.of_buffer("x", (7, 1000), (64, 7)), TensorMapSpec.of_buffer("w", (1000,), (64,)))
    assert maps[0].dims == (1000, 7) and maps[0].strides == (2000,)   # innermost first, byte strides
    program.kernels[0] = dataclasses.replace(program.kernels[0], tensor_maps=maps)
    loaded = ts.load(program.save(tmp_path / "out"))
    assert [k.tensor_maps for k in loaded.kernels] == [k.tensor_maps for k in program.kernels]


def test_persistent_kernels_are_marked_saved_and_launched_at_most_one_block_per_sm(tmp_path: Path) -> None:
    """A persistent kernel (the TMA matmul, which walks its tiles by gridDim.x) is rendered for 132 SMs; on a GPU
    with fewer it is launched with one block per SM, and a kernel that is not persistent keeps its grid."""
    g = ts.Graph("wide")
    g.output("c", g.input("a", (4096, 256), "float16") @ g.input("b", (256, 4096), "float16"))
    program = ts.compile(g, profile=False, cache=False, budget_s=5)
    [kernel] = program.kernels
    assert kernel.persistent and kernel.grid == (132, 1, 1)   # 512 output tiles of 128 x 256
    assert launch_grid(kernel, 114) == (114, 1, 1) and launch_grid(kernel, 132) == (132, 1, 1)
    assert [k.persistent for k in ts.load(program.save(tmp_path / "out")).kernels] == [True]
    plain = ts.compile(CASES["norms"](), profile=False, cache=False, budget_s=5).kernels[0]
    assert not plain.persistent and launch_grid(plain, 2) == plain.grid


@pytest.mark.parametrize("bad, message", [
    ({"x": np.ones((7, 999), np.float16)}, "expected shape (7, 1000)"),
    ({}, "missing ['x', 'w', 'b']"),
])
def test_wrong_inputs_at_call_time_are_named(bad: dict, message: str) -> None:
    program = ts.compile(CASES["norms"](), profile=False)
    inputs = {**random_inputs(CASES["norms"](), seed=1), **bad} if bad else {}
    with pytest.raises(ts.InputError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        program(device="cpu", **inputs)


def test_int_input_where_float_expected_is_refused() -> None:
    graph = CASES["views"]()
    program = ts.compile(graph, profile=False)
    with pytest.raises(ts.InputError, match="expected float16"):
        program(device="cpu", x=np.ones((6, 10, 7), np.int32))


def test_unknown_target_lists_the_known_ones() -> None:
    with pytest.raises(ts.TargetError, match="known targets: sm90"):
        ts.compile(CASES["views"](), target="sm42")


@pytest.mark.skipif(gpu_available(), reason="checks the message seen on machines without a GPU")
def test_profiling_without_a_gpu_is_a_clear_error() -> None:
    with pytest.raises(ts.TensorsmithError, match="needs an NVIDIA GPU"):
        ts.compile(CASES["views"](), profile=True)



def test_a_float_array_of_another_width_is_refused_not_rounded() -> None:
    """A float32 or float64 array given to a float16 input: a DTypeError saying how to convert it (PyTorch refuses
    such a call too); float32 for a bfloat16 input is its host form, and is taken."""
    g = ts.Graph("halves")
    g.output("y", g.input("x", (4, 8), "float16") * 2 + g.input("b", (8,), "bfloat16").cast("float16"))
    program = ts.compile(g, profile=False)
    x, b = np.ones((4, 8), np.float16), np.ones(8, np.float32)
    assert program(device="cpu", x=x, b=b)["y"].dtype == np.float16
    for wrong in (np.float32, np.float64):
        with pytest.raises(ts.DTypeError, match=r"'x'.*float16.*astype\(np.float16\)"):
            program(device="cpu", x=x.astype(wrong), b=b)
