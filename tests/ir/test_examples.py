"""Every model in examples/ builds, evaluates to finite outputs of the declared shapes, and computes its formula."""
import functools
import importlib.util
import math
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import tensorsmith as ts

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.py"))
REQUIRED = ["attention", "gelu_mlp", "layernorm", "rmsnorm", "softmax"]


def load(name: str) -> ModuleType:
    """Import examples/<name>.py from its path, as the CLI's loader does."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def evaluated(name: str) -> tuple[ts.Graph, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(graph, inputs, outputs) for one example on fresh random inputs; cached: the reference takes a while."""
    graph = load(name).build()
    rng = np.random.default_rng(sum(name.encode()))
    inputs = {}
    for input_name, node in graph.inputs.items():
        assert node.dtype.is_float, f"{name}: random inputs here are floats only"
        values = rng.standard_normal(node.shape)
        values = np.where(values == 0, 0.5, values)
        inputs[input_name] = values.astype("float32" if node.dtype == ts.DType.BFLOAT16 else str(node.dtype))
    return graph, inputs, ts.evaluate(graph, inputs)


def test_the_required_examples_exist():
    assert set(REQUIRED) <= {path.stem for path in EXAMPLE_FILES}


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=[p.stem for p in EXAMPLE_FILES])
def test_example_module_shape(path):
    module = load(path.stem)
    assert module.__doc__ and module.__doc__.strip(), "an example says what it computes"
    assert callable(getattr(module, "build", None)), "the loader calls build()"
    assert not any(isinstance(value, ts.Graph) for value in vars(module).values()), \
        "no module-level Graph: the loader calls build()"
    graph = module.build()
    assert isinstance(graph, ts.Graph) and graph.outputs and graph.inputs
    assert module.build().structural_hash() == graph.structural_hash(), "build() is deterministic"
    for node in graph.inputs.values():
        assert node.size <= 4 * 2 ** 20, "inputs stay small enough for the float64 reference"


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=[p.stem for p in EXAMPLE_FILES])
def test_example_evaluates_to_finite_outputs_of_the_declared_shapes(path):
    graph, _, outputs = evaluated(path.stem)
    assert set(outputs) == set(graph.outputs)
    for name, node in graph.outputs.items():
        assert outputs[name].shape == node.shape
        assert np.isfinite(outputs[name]).all()
        assert np.abs(outputs[name]).max() > 0


# independent numpy formulas, one per example ------------------------------------------------------

def softmax_rows(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def ref_softmax(x):
    return {"y": softmax_rows(x)}


def ref_rmsnorm(x, w):
    return {"y": x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-6) * w}


def ref_layernorm(x, w, b):
    mu = x.mean(-1, keepdims=True)
    return {"y": (x - mu) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * w + b}


def ref_gelu_mlp(x, w1, b1, w2, b2):
    h = x @ w1.T + b1
    h = 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))
    return {"y": h @ w2.T + b2}


def ref_attention(q, k, v):
    t = q.shape[-2]
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    s = np.where(np.triu(np.ones((t, t), bool), k=1), -np.inf, s)  # key j > query i is hidden
    return {"o": softmax_rows(s) @ v}


REFERENCES = {"softmax": ref_softmax, "rmsnorm": ref_rmsnorm, "layernorm": ref_layernorm,
              "gelu_mlp": ref_gelu_mlp, "attention": ref_attention}


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_example_matches_its_numpy_formula(name):
    graph, inputs, outputs = evaluated(name)
    expected = REFERENCES[name](**{k: v.astype(np.float64) for k, v in inputs.items()})
    assert set(expected) == set(outputs)
    for key in expected:
        np.testing.assert_allclose(outputs[key], expected[key], rtol=1e-9, atol=1e-12)


def test_softmax_rows_sum_to_one():
    _, _, outputs = evaluated("softmax")
    np.testing.assert_allclose(outputs["y"].sum(-1), 1.0, rtol=1e-12)
    assert (outputs["y"] > 0).all()


def test_normalised_rows_have_unit_statistics():
    _, inputs, outputs = evaluated("layernorm")
    normalised = (outputs["y"] - inputs["b"].astype(np.float64)) / inputs["w"].astype(np.float64)
    np.testing.assert_allclose(normalised.mean(-1), 0.0, atol=1e-9)
    np.testing.assert_allclose(normalised.var(-1), 1.0, rtol=1e-3)  # eps shifts it a little
    _, inputs, outputs = evaluated("rmsnorm")
    normalised = outputs["y"] / inputs["w"].astype(np.float64)
    np.testing.assert_allclose(np.sqrt(np.mean(normalised ** 2, -1)), 1.0, rtol=1e-3)


def test_attention_is_causal():
    _, inputs, outputs = evaluated("attention")
    # the first query sees only the first key, so its output is the first value row
    np.testing.assert_allclose(outputs["o"][..., 0, :], inputs["v"][..., 0, :].astype(np.float64), rtol=1e-12)
