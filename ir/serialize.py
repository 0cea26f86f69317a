"""Graphs and kernel bodies as JSON-ready data, so a saved program can be checked and run on a CPU later."""
from __future__ import annotations

import math
from typing import Any, Iterable

from .dtypes import DType
from .graph import Graph
from .kernel_program import Buffer, Kernel, KernelProgram, Schedule
from .node import Node, toposort
from .ops import Op

FORMAT = 1
_TUPLE_ARGS = {Op.RESHAPE, Op.EXPAND, Op.PERMUTE}
_PAIR_ARGS = {Op.SLICE, Op.PAD}


def nodes_to_data(roots: Iterable[Node]) -> tuple[list[dict[str, Any]], dict[int, int]]:
    """Every node under `roots` as a list of records (sources by position), and each node's position."""
    order = toposort(roots)
    index = {id(node): i for i, node in enumerate(order)}
    records = [{"op": n.op.value, "srcs": [index[id(s)] for s in n.srcs], "shape": list(n.shape),
                "dtype": n.dtype.value, "arg": _arg_to_data(n), "where": n.where, "api": n.api} for n in order]
    return records, index


def nodes_from_data(records: list[dict[str, Any]]) -> list[Node]:
    """The nodes of `nodes_to_data`, rebuilt in the same order (no checks re-run: they passed when built)."""
    nodes: list[Node] = []
    for r in records:
        op = Op(r["op"])
        nodes.append(Node(op, tuple(nodes[i] for i in r["srcs"]), tuple(r["shape"]), DType(r["dtype"]),
                          _arg_from_data(op, r["arg"]), r.get("where", ""), r.get("api", "")))
    return nodes


def graph_to_data(graph: Graph) -> dict[str, Any]:
    records, index = nodes_to_data(graph.nodes())
    return {"format": FORMAT, "name": graph.name, "nodes": records,
            "inputs": {name: index[id(n)] for name, n in graph.inputs.items()},
            "outputs": {name: index[id(n)] for name, n in graph.outputs.items()}}


def graph_from_data(data: dict[str, Any]) -> Graph:
    nodes = nodes_from_data(data["nodes"])
    graph = Graph(data["name"])
    graph.inputs = {name: nodes[i] for name, i in data["inputs"].items()}
    graph.outputs = {name: nodes[i] for name, i in data["outputs"].items()}
    return graph


def _arg_to_data(node: Node) -> Any:
    arg = node.arg
    if node.op == Op.CONSTANT and isinstance(arg, float) and not math.isfinite(arg):
        return {"float": repr(arg)}          # JSON has no inf or nan
    if node.op in _TUPLE_ARGS:
        return list(arg)
    if node.op in _PAIR_ARGS:
        return [list(pair) for pair in arg]
    return arg


def _arg_from_data(op: Op, data: Any) -> Any:
    if isinstance(data, dict) and "float" in data:
        return float(data["float"])
    if op in _TUPLE_ARGS:
        return tuple(data)
    if op in _PAIR_ARGS:
        return tuple(tuple(pair) for pair in data)
    return data


def kernel_program_to_data(program: KernelProgram) -> dict[str, Any]:
    roots = [node for kernel in program.kernels for _, node in kernel.outputs]
    records, index = nodes_to_data(roots)
    return {
        "format": FORMAT, "name": program.name, "nodes": records,
        "buffers": [{"name": b.name, "shape": list(b.shape), "dtype": b.dtype.value, "role": b.role}
                    for b in program.buffers.values()],
        "kernels": [{"name": k.name, "archetype": k.archetype, "schedule": k.schedule.as_dict(),
                     "outputs": [[buf, index[id(node)]] for buf, node in k.outputs]} for k in program.kernels],
        "inputs": list(program.inputs), "outputs": program.outputs,
    }


def kernel_program_from_data(data: dict[str, Any]) -> KernelProgram:
    nodes = nodes_from_data(data["nodes"])
    buffers = {b["name"]: Buffer(b["name"], tuple(b["shape"]), DType(b["dtype"]), b["role"]) for b in data["buffers"]}
    kernels = [Kernel(k["name"], k["archetype"], tuple((buf, nodes[i]) for buf, i in k["outputs"]),
                      Schedule.of(**k["schedule"])) for k in data["kernels"]]
    return KernelProgram(data["name"], buffers, kernels, tuple(data["inputs"]), dict(data["outputs"]))
