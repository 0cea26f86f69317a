"""Structural patterns that several stages recognise: today, a matrix product written as sum(a * b)."""
from __future__ import annotations

from dataclasses import dataclass

from .node import Node
from .ops import Op


@dataclass(frozen=True)
class MatmulMatch:
    """A sum that is a matrix product over an (..., M, K, N) space: `lhs` is constant along N, `rhs` along M."""

    reduce: Node
    lhs: Node
    rhs: Node

    @property
    def dims(self) -> tuple[int, int, int]:
        shape = self.reduce.srcs[0].shape
        return shape[-3], shape[-1], shape[-2]        # M, N, K

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return self.reduce.shape[:-2]


def _constant_along(node: Node, axis: int) -> bool:
    return node.op == Op.EXPAND and node.srcs[0].shape[axis] == 1 and node.shape[axis] > 1


def match_matmul(node: Node) -> MatmulMatch | None:
    """The operands of `node` if it is sum(a * b) over axis -2 of an (..., M, K, N) product, else None.

    `tensorsmith.nn.matmul` lowers a @ b to exactly this: SUM(MUL(EXPAND(a'), EXPAND(b')), axis=-2).
    """
    if node.op != Op.SUM or node.srcs[0].op != Op.MUL:
        return None
    product = node.srcs[0]
    rank = product.ndim
    if rank < 3 or node.arg != rank - 2:
        return None
    a, b = product.srcs
    for lhs, rhs in ((a, b), (b, a)):
        if _constant_along(lhs, rank - 1) and _constant_along(rhs, rank - 3):
            return MatmulMatch(node, lhs, rhs)
    return None
