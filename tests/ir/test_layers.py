"""A model's identical layers found by structure (issue 41): cut where one value carries everything forward, each
distinct piece a graph of its own, and a program stitched from one program per distinct piece."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from graph_cases import decoder_block, residual_layers

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.ir.kernel_program import merged_pointwise
from tensorsmith.ir.layers import find_layers, inline, stitched
from tensorsmith.ir.interpreter import evaluate
from tensorsmith.search.partition import unfused
from tensorsmith.search.verify import random_inputs


@pytest.mark.parametrize("depth", [2, 3, 8])
def test_identical_layers_are_found_each_reading_its_own_weights(depth: int) -> None:
    graph = residual_layers(depth)
    layers = find_layers(graph)
    assert layers is not None and layers.repeats == depth
    assert [piece.tag for piece in layers.pieces] == [f"layer{i}" for i in range(depth)]
    assert len(layers.distinct()) == 1
    for i, piece in enumerate(layers.pieces):   # the first layer reads the model's input, the others the carried value
        assert graph.inputs[f"w{i}"] in piece.reads and graph.inputs[f"gain{i}"] in piece.reads
        assert not any(graph.inputs[f"w{j}"] in piece.reads for j in range(depth) if j != i)


def test_a_model_of_one_layer_or_of_no_repeated_layer_has_none() -> None:
    assert find_layers(residual_layers(1)) is None
    assert find_layers(decoder_block()) is None


def _model_with_ends(depth: int) -> ts.Graph:
    """A projection in, `depth` identical layers, a last layer unlike them (GELU, not SiLU), a norm out."""
    g = ts.Graph("ends")
    x = g.input("x", (32, 64), "float32") @ g.input("w_in", (64, 128), "float32")
    for layer in range(depth + 1):
        h = nn.rms_norm(x, g.input(f"gain{layer}", (128,), "float32"))
        act = nn.silu if layer < depth else nn.gelu
        x = x + act(h @ g.input(f"w{layer}", (128, 128), "float32"))
    g.output("y", nn.rms_norm(x, g.input("gain_out", (128,), "float32")))
    return g


def test_layers_unlike_the_run_are_pieces_of_their_own() -> None:
    layers = find_layers(_model_with_ends(4))
    assert layers is not None and layers.repeats == 4
    tags = [piece.tag for piece in layers.pieces]
    assert tags == ["prefix", "layer0", "layer1", "layer2", "layer3", "suffix"]
    assert len(layers.distinct()) == 3     # the prefix, one layer, and the suffix with the GELU layer in it
    assert len({piece.structure for piece in layers.pieces[1:5]}) == 1


def test_a_stitched_program_computes_what_the_model_computes() -> None:
    """Each piece's program bound to its own weights: the same values, to the bit, as the model's own program with
    the same kernel boundaries, and the model's reference within rounding."""
    graph = _model_with_ends(3)
    layers = find_layers(graph)
    assert layers is not None
    program = stitched(graph, layers, {piece.structure: unfused(piece.graph) for piece in layers.distinct()})
    inputs = random_inputs(graph, seed=3)
    ours = program.execute(inputs)["y"]
    assert np.array_equal(ours, unfused(graph).execute(inputs)["y"])
    reference = evaluate(graph, inputs)["y"]
    assert np.linalg.norm(ours - reference) <= 1e-5 * np.linalg.norm(reference)
    names = [kernel.name for kernel in program.kernels]
    assert len(set(names)) == len(names) and any(name.startswith("ends_layer2_") for name in names)


def test_pieces_inlined_on_the_model_inputs_are_the_model() -> None:
    graph = _model_with_ends(2)
    layers = find_layers(graph)
    assert layers is not None
    values = {id(node): node for node in graph.inputs.values()}
    for piece in layers.pieces:
        made = inline(piece.graph, {name: values[id(node)] for name, node in piece.binding.items()})
        values.update({id(node): made[name] for name, node in piece.results.items()})
    again = ts.Graph("ends")
    again.inputs, again.outputs = dict(graph.inputs), {"y": values[id(graph.outputs["y"])]}
    inputs = random_inputs(graph, seed=5)
    assert np.array_equal(evaluate(again, inputs)["y"], evaluate(graph, inputs)["y"])



def test_pointwise_kernels_that_depend_on_nothing_between_them_are_joined() -> None:
    """A stitched program joins each pointwise kernel into the first one of its shape, dtype and schedule that runs
    after what it reads (a decode step's per-layer cache counters, read from inputs alone, become one kernel);
    a kernel reading another's output is not joined to it, and the values are the same."""
    g = ts.Graph("joined")
    x, y = g.input("x", (4, 64), "float32"), g.input("y", (4, 64), "float32")
    doubled = x * 2.0
    g.output("after", doubled + 1.0)              # reads `doubled`: runs after it, alone
    g.output("tripled", y * 3.0)                  # reads an input: joined to `doubled`'s kernel
    for layer in range(3):
        g.output(f"length{layer}", g.input(f"count{layer}", (), "int32") + 4)
    program = unfused(g)
    joined = merged_pointwise(list(program.kernels))
    writes = [set(kernel.writes) for kernel in joined]
    assert {"tripled"} < next(w for w in writes if any(name.startswith("mul") for name in w))
    assert {"after"} in writes and {"length0", "length1", "length2"} in writes
    assert len(joined) == len(program.kernels) - 3
    inputs = random_inputs(g, seed=5)
    expected = program.execute(inputs)
    for name, value in dataclasses.replace(program, kernels=joined).execute(inputs).items():
        assert np.array_equal(value, expected[name]), name
