"""`torch.compile(model, backend="tensorsmith")`: each graph TorchDynamo captures is imported (torch_import) and
compiled by tensorsmith. A graph holding an op with no lowering runs in PyTorch instead, whole, and the ops that
sent it there are said once per op (a finer split, only the unsupported pieces left to PyTorch, is not built yet).
The backend is registered with TorchDynamo by the `torch_dynamo_backends` entry point in pyproject.toml."""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .imported import ImportedProgram, ModelImportError
from .pipeline import compile as ts_compile
from .torch_import import import_torch

log = logging.getLogger("tensorsmith")
_SAID: set[str] = set()   # fall-back reasons already logged in this process
OPTIONS: dict[str, Any] = {"budget_s": 30.0}   # ts.compile's options for each captured graph; change them here


def tensorsmith_backend(graph_module: Any, example_inputs: list[Any]) -> Callable[..., Any]:
    """TorchDynamo's backend: the captured graph compiled by tensorsmith, or the graph itself where it cannot be."""
    try:
        imported = import_torch(graph_module, example_inputs, name="dynamo_graph")
    except ModelImportError as err:
        reason = str(err)
        if reason not in _SAID:
            _SAID.add(reason)
            log.warning("tensorsmith: a captured graph runs in PyTorch: %s", reason)
        return graph_module.forward
    program = ImportedProgram(imported, ts_compile(imported.graph, **OPTIONS))
    returns_sequence = _returns_sequence(graph_module)

    def run(*args: Any) -> Any:
        results = program(*args)
        if not returns_sequence:
            return results
        return list(results) if isinstance(results, tuple) else [results]
    return run


def _returns_sequence(graph_module: Any) -> bool:
    output = next(node for node in graph_module.graph.nodes if node.op == "output")
    return isinstance(output.args[0], (tuple, list))
