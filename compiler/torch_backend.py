"""`torch.compile(model, backend="tensorsmith")`: each graph TorchDynamo captures is imported (torch_import) and
compiled by tensorsmith. Where a graph holds ATen ops with no lowering, only those ops run in PyTorch: the graph's
core ATen form is split into the runs of ops tensorsmith lowers (each compiled by it) and the ops between them
(run by PyTorch), and the ops left to PyTorch are said once. A graph that cannot be split runs in PyTorch, whole.
The backend is registered with TorchDynamo by the `torch_dynamo_backends` entry point in pyproject.toml."""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .imported import ImportedProgram, ModelImportError
from .pipeline import compile as ts_compile
from .torch_import import IGNORED, LOWERINGS, exported_aten, import_torch, op_name, where_of

log = logging.getLogger("tensorsmith")
_SAID: set[str] = set()   # fall-back reasons already logged in this process
OPTIONS: dict[str, Any] = {"budget_s": 30.0}   # ts.compile's options for each captured graph; change them here
PIECE = "tensorsmith_"    # the name of each piece of a split graph that tensorsmith compiles


def tensorsmith_backend(graph_module: Any, example_inputs: list[Any]) -> Callable[..., Any]:
    """TorchDynamo's backend: the captured graph compiled by tensorsmith, split around the ops it cannot lower, or
    the graph itself where it cannot be."""
    try:
        imported = import_torch(graph_module, example_inputs, name="dynamo_graph")
    except ModelImportError as err:
        reason = str(err)
        try:
            split = _split(graph_module, example_inputs)
        except Exception as failure:   # torch.fx's partitioner, a piece's import or compile: PyTorch runs it all
            split, reason = None, f"{reason}; splitting it around those ops failed: {failure}"
        if split is not None:
            return split
        _say_once(f"tensorsmith: a captured graph runs in PyTorch: {reason}")
        return graph_module.forward
    program = ImportedProgram(imported, ts_compile(imported.graph, **OPTIONS))
    returns_sequence = _returns_sequence(graph_module)

    def run(*args: Any) -> Any:
        results = program(*args)
        if not returns_sequence:
            return results
        return list(results) if isinstance(results, tuple) else [results]
    return run


def _split(graph_module: Any, example_inputs: list[Any]) -> Callable[..., Any] | None:
    """The graph's core ATen form with each run of lowered ops replaced by its tensorsmith program (every piece
    imported before any is compiled); None where there is nothing to compile (no lowered op). Raises what fails."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

    aten = exported_aten(graph_module, example_inputs).module()
    support = _Lowered(aten.graph)
    left = {op_name(n.target): where_of(n) for n in aten.graph.nodes
            if n.op == "call_function" and not support.is_node_supported({}, n)}
    partitioner = CapabilityBasedPartitioner(aten, support, allows_single_node_partition=True)  # type: ignore[arg-type]
    pieces = [p for p in partitioner.propose_partitions() if any(op_name(n.target) in LOWERINGS for n in p.nodes)]
    if not pieces:
        return None
    split = partitioner.fuse_partitions(pieces, prefix=PIECE)
    names = [str(n.target) for n in split.graph.nodes if n.op == "call_module" and str(n.target).startswith(PIECE)]
    arguments = _piece_arguments(split, names, example_inputs)
    imported = {name: import_torch(getattr(split, name), arguments[name], name=name) for name in names}  # all, first
    programs = {name: _piece(ImportedProgram(model, ts_compile(model.graph, **OPTIONS)),
                             _returns_sequence(getattr(split, name))) for name, model in imported.items()}
    for name, run in programs.items():
        delattr(split, name)       # a submodule's name may then hold any callable, which the graph's code calls
        setattr(split, name, run)
    listed = "; ".join(f"{op} (at {line})" for op, line in left.items())
    _say_once(f"tensorsmith: a captured graph runs as {len(names)} tensorsmith programs and these ATen ops in"
              f" PyTorch: {listed}")
    return split.forward


class _Lowered:
    """Which nodes of a core ATen graph tensorsmith takes, as torch.fx's partitioner asks: those it lowers, and
    those that depend on no input of the graph, which its import folds. Left to PyTorch, a constant such as
    `scalar_tensor(-inf)` would reach a piece as an input, where no import sees that it is infinite."""

    def __init__(self, graph: Any) -> None:
        self.variable: set[Any] = set()     # the nodes that depend on some placeholder
        for node in graph.nodes:
            if node.op == "placeholder" or any(arg in self.variable for arg in node.all_input_nodes):
                self.variable.add(node)

    def is_node_supported(self, submodules: Any, node: Any) -> bool:
        return node.op == "call_function" and (op_name(node.target) in LOWERINGS or op_name(node.target) in IGNORED
                                               or node not in self.variable)


def _piece_arguments(split: Any, names: list[str], example_inputs: list[Any]) -> dict[str, tuple[Any, ...]]:
    """The arguments the split graph passes to each piece, recorded by running it once on the example inputs."""
    import torch

    seen: dict[str, tuple[Any, ...]] = {}

    class Recorder(torch.fx.Interpreter):
        def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
            seen.setdefault(str(target), tuple(args))
            return super().call_module(target, args, kwargs)

    with torch.no_grad():
        Recorder(split).run(*example_inputs)
    return {name: seen[name] for name in names}


def _piece(program: ImportedProgram, returns_sequence: bool) -> Callable[..., Any]:
    """A piece of a split graph, run by its tensorsmith program and returning what the piece returned."""
    def run(*args: Any) -> Any:
        results = program(*args)
        if not returns_sequence:
            return results
        return tuple(results) if isinstance(results, (tuple, list)) else (results,)
    return run


def _say_once(message: str) -> None:
    if message not in _SAID:
        _SAID.add(message)
        log.warning("%s", message)


def _returns_sequence(graph_module: Any) -> bool:
    output = next(node for node in graph_module.graph.nodes if node.op == "output")
    return isinstance(output.args[0], (tuple, list))
