"""Graphs whose faster algebraic form the e-graph holds (issue 19's table and more): the forms tests search them, the
derivation tests show the rewrites each chosen form depends on."""
from __future__ import annotations

from typing import Callable

from tensorsmith import nn
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.tensor import Tensor


def _graph(name: str, shapes: list[tuple[str, tuple[int, ...]]], out: Callable[..., Tensor]) -> Graph:
    g = Graph(name)
    g.output("y", out(*(g.input(n, shape, "float16") for n, shape in shapes)))
    return g


def row_scaled_linear() -> Graph:
    """(x * s) @ W, s a per-row scale as RMSNorm makes: the written form runs the scale in the matmul's prologue."""
    return _graph("row_scaled_linear", [("x", (128, 4096)), ("s", (128, 1)), ("w", (4096, 11008))],
                  lambda x, s, w: (x * s) @ w)


def chain_left_first() -> Graph:
    """(a @ b) @ c with a 4096x64, b 64x4096, c 4096x64: right first is 64 times fewer FLOPs."""
    return _graph("chain_left_first", [("a", (4096, 64)), ("b", (64, 4096)), ("c", (4096, 64))],
                  lambda a, b, c: (a @ b) @ c)


def chain_right_first() -> Graph:
    """a @ (b @ c) with a 64x4096, b 4096x64, c 64x4096: left first is 64 times fewer FLOPs."""
    return _graph("chain_right_first", [("a", (64, 4096)), ("b", (4096, 64)), ("c", (64, 4096))],
                  lambda a, b, c: a @ (b @ c))


def shared_operand() -> Graph:
    """x @ W1 + x @ W2 at a compute-bound size: one product of the summed weights does half the FLOPs."""
    return _graph("shared_operand", [("x", (2048, 1024)), ("w1", (1024, 1024)), ("w2", (1024, 1024))],
                  lambda x, w1, w2: x @ w1 + x @ w2)


def shared_weight() -> Graph:
    """a @ W + b @ W: one product of the summed activations does half the FLOPs."""
    return _graph("shared_weight", [("a", (2048, 2048)), ("b", (2048, 2048)), ("w", (2048, 2048))],
                  lambda a, b, w: a @ w + b @ w)


def rms_norm_linear() -> Graph:
    """nn.rms_norm(x, g) @ W: the per-row 1/rms can leave the matmul's prologue for its epilogue (g cannot)."""
    return _graph("rms_norm_linear", [("x", (128, 4096)), ("g", (4096,)), ("w", (4096, 11008))],
                  lambda x, g, w: nn.rms_norm(x, g) @ w)


def chain_of_four() -> Graph:
    """((a @ b) @ c) @ d with a thin middle: the cheapest order multiplies the thin pair first."""
    return _graph("chain_of_four", [("a", (4096, 64)), ("b", (64, 4096)), ("c", (4096, 64)), ("d", (64, 4096))],
                  lambda a, b, c, d: ((a @ b) @ c) @ d)
