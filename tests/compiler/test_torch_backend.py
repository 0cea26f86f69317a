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


def test_a_graph_with_an_op_tensorsmith_cannot_lower_runs_in_pytorch_and_says_so_once(caplog) -> None:
    class Ranked(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.topk(x.sort(dim=-1).values, 2).values.exp()
    module, x = Ranked(), torch.randn(4, 8)
    compiled = torch.compile(module, backend=torch_backend.tensorsmith_backend)
    with caplog.at_level(logging.WARNING, logger="tensorsmith"):
        first, second = compiled(x), compiled(torch.randn(4, 8))
        torch._dynamo.reset()
        torch.compile(module, backend=torch_backend.tensorsmith_backend)(x)   # captured again: not said again
    assert torch.equal(first, module(x)) and second.shape == (4, 2)
    said = [r.getMessage() for r in caplog.records if "runs in PyTorch" in r.getMessage()]
    assert len(said) == 1 and "aten.sort" in said[0] and "aten.topk" in said[0]
