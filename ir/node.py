"""Graph nodes: one frozen record per op application, compared by identity."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import AbstractSet, Any, Callable, Iterable

from .dtypes import DType
from .ops import Op


@dataclass(frozen=True, eq=False)
class Node:
    """One op applied to `srcs`, with its inferred shape and dtype; `where` is the user's file:line, `api` the
    tensorsmith function that line called (`rms_norm`, `softmax`, `__mul__`), which names the kernel computing it."""

    op: Op
    srcs: tuple["Node", ...]
    shape: tuple[int, ...]
    dtype: DType
    arg: Any = None
    where: str = ""
    api: str = ""

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __repr__(self) -> str:
        arg = f", {self.arg!r}" if self.arg is not None else ""
        return f"Node({self.op}{arg}, shape={self.shape}, dtype={self.dtype})"


def squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    """`shape` without its unit axes: two shapes alike so hold the same elements in the same order."""
    return tuple(size for size in shape if size != 1)


def toposort(roots: Iterable[Node], stops: AbstractSet[int] = frozenset(),
             first: Callable[[Node], int] | None = None) -> list[Node]:
    """Every node reachable from `roots`, each after its sources (iterative: graphs can be deep).

    The walk does not look past nodes whose id is in `stops` (they are listed, their sources are not). A node's
    sources are walked in their order, or by `first` (smallest first) where it is given.
    """
    order: list[Node] = []
    seen: set[int] = set()
    for root in roots:
        stack: list[tuple[Node, bool]] = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.append(node)
                continue
            if id(node) in seen:
                continue
            seen.add(id(node))
            stack.append((node, True))
            if id(node) not in stops:
                srcs = sorted(node.srcs, key=first) if first is not None else node.srcs
                stack.extend((src, False) for src in reversed(srcs) if id(src) not in seen)
    return order


def consumers(order: list[Node]) -> dict[int, list[Node]]:
    """Map from a node's id to the nodes that use it, for nodes in `order`."""
    users: dict[int, list[Node]] = {id(node): [] for node in order}
    for node in order:
        for src in node.srcs:
            users[id(src)].append(node)
    return users


def structure_rows(order: list[Node] | tuple[Node, ...], arg_of: Callable[[Node], Any] = lambda node: node.arg,
                   ) -> tuple[list[tuple], dict[int, int]]:
    """One row per node of `order` (topological): op, repr of its arg (as `arg_of` gives it), shape, dtype and its
    sources' positions; equal rows for nodes computed the same way. Also each node's position, by id."""
    index: dict[int, int] = {}
    rows = []
    for i, node in enumerate(order):
        index[id(node)] = i
        rows.append((node.op.value, repr(arg_of(node)), node.shape, node.dtype.value,
                     tuple(index[id(src)] for src in node.srcs)))
    return rows, index
