"""torch.compile(model, backend="tensorsmith"): captured graphs compiled by tensorsmith, or run by PyTorch (said once)
where they hold an op with no lowering."""
from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the torch.compile backend needs it")

from tensorsmith import torch_backend  # noqa: E402


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_backend, "OPTIONS", {"budget_s": 3.0, "profile": False, "cache": False,
                                                   "progress": False})
    monkeypatch.setattr(torch_backend, "_SAID", set())
    torch._dynamo.reset()


def test_a_block_compiled_through_the_backend_name_matches_eager() -> None:
    from test_torch_import import Block
    torch.manual_seed(0)
    block, x = Block().eval(), torch.randn(2, 16, 64)
    compiled = torch.compile(block, backend="tensorsmith")     # found through the torch_dynamo_backends entry point
    with torch.no_grad():
        out, ref = compiled(x), block(x)
    assert float((out - ref).norm() / ref.norm()) < 1e-5


def test_a_graph_with_no_op_tensorsmith_lowers_runs_in_pytorch_and_says_so_once(caplog) -> None:
    class Ranked(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cummax(x.sort(dim=-1).values, dim=-1).values
    module, x = Ranked(), torch.randn(4, 8)
    compiled = torch.compile(module, backend=torch_backend.tensorsmith_backend)
    with caplog.at_level(logging.WARNING, logger="tensorsmith"):
        first, second = compiled(x), compiled(torch.randn(4, 8))
        torch._dynamo.reset()
        torch.compile(module, backend=torch_backend.tensorsmith_backend)(x)   # captured again: not said again
    assert torch.equal(first, module(x)) and second.shape == (4, 8)
    said = [r.getMessage() for r in caplog.records if "runs in PyTorch" in r.getMessage()]
    assert len(said) == 1 and "aten.sort" in said[0] and "aten.cummax" in said[0]


class SortedInTheMiddle(torch.nn.Module):
    """A linear, relu and scale before a sort, a residual add and softmax after it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.lin(x)) * 2
        return torch.softmax(h.sort(dim=-1).values + x, dim=-1)


def test_only_the_ops_tensorsmith_cannot_lower_are_left_to_pytorch(caplog, monkeypatch: pytest.MonkeyPatch) -> None:
    """The graph is split around its sort: the pieces before and after it are compiled by tensorsmith (counted by
    the compiles made), the sort runs in PyTorch, and the result matches eager on inputs other than the example."""
    compiles: list[str] = []
    real = torch_backend.ts_compile
    monkeypatch.setattr(torch_backend, "ts_compile", lambda graph, **options: compiles.append(graph.name)
                        or real(graph, **options))
    torch.manual_seed(0)
    module = SortedInTheMiddle().eval()
    compiled = torch.compile(module, backend=torch_backend.tensorsmith_backend)
    with caplog.at_level(logging.WARNING, logger="tensorsmith"), torch.no_grad():
        compiled(torch.randn(4, 8))
        for _ in range(2):
            x = torch.randn(4, 8)
            out, ref = compiled(x), module(x)
            assert float((out - ref).norm() / ref.norm()) < 1e-5
    assert len(compiles) == 2 and all(name.startswith(torch_backend.PIECE) for name in compiles), compiles
    said = [r.getMessage() for r in caplog.records if "in PyTorch" in r.getMessage()]
    assert len(said) == 1 and "2 tensorsmith programs" in said[0] and "aten.sort" in said[0], said
    assert "addmm" not in said[0] and "relu" not in said[0] and "softmax" not in said[0]


class MaskedAfterSort(torch.nn.Module):
    """Softmax over sorted scores with a -inf bias where they are small, the bias picked between two scalar tensors:
    the masks transformers builds for attention on the GPU are made so."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        order = x.sort(dim=-1).values
        bias = torch.where(order > -0.5, torch.scalar_tensor(0.0), torch.scalar_tensor(float("-inf")))
        return torch.softmax(order + bias, dim=-1)


def test_constants_made_in_the_captured_graph_are_folded_into_its_pieces(caplog) -> None:
    """`scalar_tensor(-inf)` depends on no input: left to PyTorch, it reached a piece as an input and `where`'s blend
    of its two branches made NaN (BERT through the backend on the GPU); folded at import, it is the largest finite
    value and the result matches eager, masked entries zero."""
    torch.manual_seed(0)
    module = MaskedAfterSort()
    compiled = torch.compile(module, backend=torch_backend.tensorsmith_backend)
    with caplog.at_level(logging.WARNING, logger="tensorsmith"), torch.no_grad():
        x = torch.randn(4, 8)
        out, ref = compiled(x), module(x)
    assert torch.isfinite(out).all() and float((out - ref).norm() / ref.norm()) < 1e-5
    assert bool((out[ref == 0] == 0).all()) and bool((ref == 0).any())
    said = [r.getMessage() for r in caplog.records if "in PyTorch" in r.getMessage()]
    assert len(said) == 1 and "aten.sort" in said[0] and "scalar_tensor" not in said[0], said


@pytest.mark.parametrize("family", ["llama", "falcon"])
def test_a_causal_lms_default_call_compiles_through_the_backend(family: str, caplog) -> None:
    """model(ids) with use_cache=True through torch.compile(backend="tensorsmith"): the cache that starts as empty
    tensors is concatenated as PyTorch concatenates it, and the logits match eager."""
    pytest.importorskip("transformers", reason="transformers is not installed")
    from test_torch_import import _causal_lm
    torch._dynamo.reset()
    model = _causal_lm(family)
    ids = torch.randint(0, 100, (1, 8))
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="tensorsmith"):
        ours, reference = torch.compile(model, backend="tensorsmith")(ids), model(ids)
    assert float((ours.logits - reference.logits).norm() / reference.logits.norm()) < 1e-5
    assert not [r for r in caplog.records if "PyTorch" in r.getMessage()]   # tensorsmith ran all of it
