"""Graphs larger than this machine can verify: refused at once, in one line."""
from __future__ import annotations

import time

import pytest

import tensorsmith as ts
from tensorsmith.search.verify import TooLargeToVerify, available_memory, verification_bytes


def test_a_graph_too_large_to_verify_is_refused_in_one_line_before_the_compile() -> None:
    """A (2^16, 2^16) float32 input: drawing it and its float64 reference would take about 96 GiB. The compile
    says so at once instead of raising MemoryError after its search."""
    graph = ts.Graph("huge")
    graph.output("y", graph.input("x", (1 << 16, 1 << 16), "float32") * 2.0)
    free = available_memory()
    if free is None or verification_bytes(graph) <= free:
        pytest.skip("this machine has the memory to verify it")
    start = time.perf_counter()
    with pytest.raises(TooLargeToVerify, match=r"too large to verify on this machine: .* GiB .* GiB are free"):
        ts.compile(graph, profile=False, cache=False)
    assert time.perf_counter() - start < 5
