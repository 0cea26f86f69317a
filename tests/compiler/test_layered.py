"""A model of identical layers compiles each distinct piece once (issue 41): one layer is searched, verified and
measured, the others run its kernels on their own weights, and the stitched program is tested end to end."""
from __future__ import annotations

import sys

import numpy as np

import tensorsmith as ts
from graph_cases import residual_layers
from stitching import cross_the_stitching
from tensorsmith import pipeline
from tensorsmith.ir.interpreter import evaluate
from tensorsmith.ir.kernel_program import kernel_structure
from tensorsmith.search.verify import random_inputs


def test_an_8_layer_model_searches_one_layer_and_binds_its_kernels_to_every_layer(monkeypatch) -> None:
    searched: list[str] = []
    real = pipeline.search.search_program

    def counting(graph, *args, **kwargs):
        searched.append(graph.name)
        return real(graph, *args, **kwargs)
    monkeypatch.setattr(pipeline.search, "search_program", counting)
    switching = sys.getswitchinterval()
    program = ts.compile(residual_layers(8), budget_s=4.0, profile=False, cache=False, progress=False)
    assert sys.getswitchinterval() == switching   # shortened while the draw's thread ran beside the search, restored
    assert searched == ["layers_layer0"]
    layers = program.report["layers"]
    assert layers["identical"] == 8 and [piece["piece"] for piece in layers["pieces"]] == ["layer (x8)"]
    assert set(layers["whole_model_seconds"]) == {"reference", "waited for it", "random test"}   # no GPU check
    assert layers["end_to_end"] == "numpy"                                                       # without a GPU
    plan = program.kernel_program
    per_layer = [[k for k in plan.kernels if k.name.startswith(f"layers_layer{i}_")] for i in range(8)]
    assert all(len(kernels) == len(per_layer[0]) > 0 for kernels in per_layer)
    assert all([(kernel_structure(k), k.schedule) for k in kernels] == [(kernel_structure(k), k.schedule)
                                                                       for k in per_layer[0]] for kernels in per_layer)
    inputs = random_inputs(program.graph, seed=9)
    reference = evaluate(program.graph, inputs)["y"]
    ours = program(device="cpu", **inputs)["y"].astype(np.float64)
    assert np.linalg.norm(ours - reference) <= 2e-2 * np.linalg.norm(reference)
    assert program.report["checks"]   # the stitched program was random-tested end to end


def test_a_wrongly_stitched_program_is_caught_end_to_end_and_the_model_searched_whole(monkeypatch) -> None:
    """Were the stitching wrong (here, each layer bound to the next layer's weights), the end-to-end random test
    rejects it: the model is then searched whole, and the report says why."""
    cross_the_stitching(monkeypatch)
    program = ts.compile(residual_layers(3), budget_s=4.0, profile=False, cache=False, progress=False)
    assert "searched whole" in program.report["left_out"]["layers"] and not program.report["layers"]
    inputs = random_inputs(program.graph, seed=4)
    reference = evaluate(program.graph, inputs)["y"]
    ours = program(device="cpu", **inputs)["y"].astype(np.float64)
    assert np.linalg.norm(ours - reference) <= 2e-2 * np.linalg.norm(reference)


def test_layers_off_searches_the_model_whole_and_is_cached_apart(tmp_path) -> None:
    whole = ts.compile(residual_layers(3), budget_s=3.0, profile=False, cache_dir=tmp_path, progress=False,
                       layers=False)
    assert not whole.report["layers"] and not any("_layer" in kernel.name for kernel in whole.kernels)
    layered = ts.compile(residual_layers(3), budget_s=3.0, profile=False, cache_dir=tmp_path, progress=False)
    assert layered.report["layers"]["identical"] == 3 and not layered.report.get("from_cache")
