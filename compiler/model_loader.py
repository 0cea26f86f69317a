"""Loads a Graph from a user's model file: a model.py (a module-level Graph, or a function build() returning one) or
an ONNX model (model.onnx, through onnx_import)."""
from __future__ import annotations

import importlib.util
import sys
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tensorsmith.ir.errors import TensorsmithError
from tensorsmith.ir.graph import Graph

from .onnx_import import import_onnx


class ModelError(TensorsmithError):
    """A model file is missing, raises, or does not define exactly the graph asked for."""


def load_model(path: str | Path, name: str | None = None,
               shapes: Mapping[str, Sequence[int]] | None = None) -> tuple[Graph, dict[str, Any]]:
    """`load_graph`'s graph and the values its inputs are bound to: an ONNX model's initializers (none for a Python
    model, whose inputs are all the caller's)."""
    if Path(path).suffix == ".onnx":
        if not Path(path).is_file():
            raise ModelError(f"model file {path} not found")
        imported = import_onnx(path, shapes)
        return imported.graph, dict(imported.bound)
    return load_graph(path, name, shapes), {}


def load_graph(path: str | Path, name: str | None = None,
               shapes: Mapping[str, Sequence[int]] | None = None) -> Graph:
    """The graph defined by the model file at `path`; `name` picks one where it defines several; `shapes` gives an
    ONNX model's dynamic input shapes. An ONNX model's initializers are inputs of the graph, named after them."""
    if Path(path).suffix == ".onnx":
        if not Path(path).is_file():
            raise ModelError(f"model file {path} not found")
        return import_onnx(path, shapes).graph
    if shapes:
        raise ModelError(f"input shapes ({', '.join(shapes)}) are given for an ONNX model's dynamic inputs; {path}"
                         f" is a Python model, whose graph states its own shapes")
    graphs = _graphs_in(_run_module(Path(path)))
    if not graphs:
        raise ModelError(f"{path} defines no graph: add a module-level ts.Graph or a function build() returning one")
    if name is not None:
        if name not in graphs:
            raise ModelError(f"{path} has no graph named {name!r}; it has: {', '.join(graphs)}")
        return graphs[name]
    if len(graphs) > 1:
        raise ModelError(f"{path} defines several graphs ({', '.join(graphs)}); choose one with --graph NAME")
    return next(iter(graphs.values()))


def _run_module(path: Path) -> dict:
    if not path.is_file():
        raise ModelError(f"model file {path} not found")
    spec = importlib.util.spec_from_file_location(f"tensorsmith_model_{abs(hash(str(path.resolve())))}", path)
    if spec is None or spec.loader is None:
        raise ModelError(f"{path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.resolve().parent))
    try:
        spec.loader.exec_module(module)
        namespace = vars(module)
        if callable(namespace.get("build")):
            built = namespace["build"]()
            if not isinstance(built, Graph):
                raise ModelError(f"{path}: build() returned {type(built).__name__}, not a tensorsmith Graph")
            namespace = {**namespace, "__built__": built}
        return namespace
    except TensorsmithError:
        raise
    except BaseException as err:  # the user's code failed: say where, keep the traceback for --debug
        if isinstance(err, KeyboardInterrupt):
            raise
        frames = [f for f in traceback.extract_tb(err.__traceback__) if Path(f.filename).resolve() == path.resolve()]
        where = f" at {path}:{frames[-1].lineno}" if frames else ""
        raise ModelError(f"{path} raised {type(err).__name__}{where}: {err}") from err
    finally:
        sys.path.remove(str(path.resolve().parent))


def _graphs_in(namespace: dict) -> dict[str, Graph]:
    found: dict[str, Graph] = {}
    for value in namespace.values():
        if isinstance(value, Graph) and all(value is not g for g in found.values()):
            found[value.name] = value
    return found
