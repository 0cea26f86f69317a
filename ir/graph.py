"""Graph: named inputs and outputs over a DAG of Nodes."""
from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import Callable, Sequence

from . import primitives as P
from .dtypes import DType
from .errors import GraphError, user_location
from .node import Node, structure_rows, toposort
from .ops import Op
from .tensor import Tensor

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Graph:
    """A model: inputs declared with `input`, results registered with `output`.

    >>> g = Graph("scale"); x = g.input("x", (4,), "float32"); g.output("y", x * 2)
    """

    def __init__(self, name: str):
        if not isinstance(name, str) or not _NAME.match(name):
            raise GraphError(f"graph name {name!r} must be an identifier (it names files and kernels)")
        self.name = name
        self.inputs: dict[str, Node] = {}
        self.outputs: dict[str, Node] = {}

    def input(self, name: str, shape: Sequence[int], dtype: DType | str = "float32") -> Tensor:
        """Declare an input tensor of a static shape and dtype."""
        self._check_new_name(name, "input")
        node = P.input_(name, shape, dtype)
        self.inputs[name] = node
        return Tensor(node)

    def output(self, name: str, value: Tensor) -> None:
        """Register `value` as the output called `name`."""
        self._check_new_name(name, "output")
        if not isinstance(value, Tensor):
            raise GraphError(f"output {name!r}: expected a Tensor, got {type(value).__name__} at {user_location()}")
        foreign = [n.arg for n in toposort([value.node])
                   if n.op == Op.INPUT and self.inputs.get(n.arg) is not n]
        if foreign:
            raise GraphError(f"output {name!r} of graph {self.name!r} uses input {foreign[0]!r} of another graph"
                             f" at {user_location()}")
        self.outputs[name] = value.node

    def _check_new_name(self, name: str, kind: str) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise GraphError(f"{kind} name {name!r} must be an identifier at {user_location()}")
        if name in self.inputs or name in self.outputs:
            raise GraphError(f"{kind} name {name!r} is already used in graph {self.name!r} at {user_location()}")

    def nodes(self) -> list[Node]:
        """Every node the outputs depend on, in topological order (unused inputs included last)."""
        order = toposort(self.outputs.values())
        seen = {id(n) for n in order}
        return order + [n for n in self.inputs.values() if id(n) not in seen]

    def structural_hash(self) -> str:
        """A hash of the graph's structure: equal for graphs that compute the same thing the same way."""
        digest = hashlib.sha256(self.name.encode())
        rows, index = structure_rows(self.nodes())
        for row in rows:
            digest.update(repr(row).encode())
        for name, node in self.outputs.items():
            digest.update(repr((name, index[id(node)])).encode())
        return digest.hexdigest()

    def summary(self) -> str:
        """One line per node, for debugging and error reports."""
        order = self.nodes()
        index = {id(n): i for i, n in enumerate(order)}
        lines = [f"graph {self.name}"]
        for i, n in enumerate(order):
            srcs = ", ".join(f"%{index[id(s)]}" for s in n.srcs)
            arg = f" {n.arg!r}" if n.arg is not None else ""
            lines.append(f"  %{i} = {n.op}{arg}({srcs}) : {n.dtype}{list(n.shape)}")
        for name, n in self.outputs.items():
            lines.append(f"  output {name} = %{index[id(n)]}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        ins = ", ".join(f"{k}{list(v.shape)}:{v.dtype}" for k, v in self.inputs.items())
        outs = ", ".join(f"{k}{list(v.shape)}:{v.dtype}" for k, v in self.outputs.items())
        return f"Graph({self.name!r}, inputs=[{ins}], outputs=[{outs}])"


def rebuilt(graph: Graph, replacement: Callable[[Node, dict[int, Node]], Node | None]) -> Graph:
    """`graph` with each node for which `replacement(node, new)` gives a node replaced by it (`new` holds the rebuilt
    nodes below, by id of the original), and every node above a replaced one rebuilt over its new sources; the same
    graph where nothing changes."""
    new: dict[int, Node] = {}
    for node in toposort(graph.outputs.values()):
        changed = replacement(node, new)
        if changed is not None:
            new[id(node)] = changed
        elif any(new[id(src)] is not src for src in node.srcs):
            new[id(node)] = dataclasses.replace(node, srcs=tuple(new[id(src)] for src in node.srcs))
        else:
            new[id(node)] = node
    if all(new[id(node)] is node for node in graph.outputs.values()):
        return graph
    result = Graph(graph.name)
    result.inputs.update(graph.inputs)
    result.outputs.update((name, new[id(node)]) for name, node in graph.outputs.items())
    return result
