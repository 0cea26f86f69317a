"""A program called inside the caller's own CUDA graph, as a torch user captures a model: for the GPU tests."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def replayed_in_a_captured_graph(call: Callable[..., Any], static: dict[str, Any], later: Mapping[str, Any]) -> Any:
    """`call(**static)` captured in a torch CUDA graph (warmed up on a side stream first, as torch asks), `static`'s
    tensors then refilled with `later`'s and the graph replayed: the captured outputs, which hold `later`'s result."""
    import torch

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        call(**static)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call(**static)
    for name, value in later.items():
        static[name].copy_(value)
    graph.replay()
    torch.cuda.synchronize()
    return captured
