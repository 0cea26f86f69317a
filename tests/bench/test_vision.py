"""The vision rows (issue 42): listed with their parameter counts without being built; the ResNet block built on
the CPU computes what its PyTorch module computes."""
from __future__ import annotations

import numpy as np
import pytest

import tensorsmith as ts
from tensorsmith.bench.case import DeferredCase, built, load_suite, select


def test_the_vision_rows_are_listed_with_their_parameters_unbuilt() -> None:
    pytest.importorskip("torch", reason="PyTorch is not installed")
    pytest.importorskip("transformers", reason="transformers is not installed")
    rows = {c.name: c for c in select(load_suite(), ["vision"])}
    assert set(rows) == {"vit_b16", "resnet_block"}
    assert all(isinstance(c, DeferredCase) and "case" not in vars(c) for c in rows.values())
    assert 85e6 < rows["vit_b16"].parameters() < 87e6            # ViT-B/16: 86 M
    assert rows["resnet_block"].parameters() == 256 * 64 + 64 * 64 * 9 + 64 * 256 + 2 * (64 + 64 + 256)


def test_the_resnet_block_computes_what_its_module_computes() -> None:
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    case = built(next(c for c in load_suite() if c.name == "resnet_block"))
    tensors = case.values(torch, 0)
    assert set(tensors) == set(case.graph.inputs)
    ours = ts.evaluate(case.graph, {name: value.numpy() for name, value in tensors.items()})
    with torch.no_grad():
        widened = case.reference(**{k: v.float() if v.is_floating_point() else v for k, v in tensors.items()})
    (name,) = case.graph.outputs
    assert ours[name].shape == tuple(widened.shape) == (8, 256, 56, 56)
    error = np.linalg.norm(ours[name].astype(np.float64) - widened.double().numpy()) / widened.norm().item()
    assert error < 1e-2, f"the imported block and its module differ (relative L2 {error:.3g})"
