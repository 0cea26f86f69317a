"""What the importers (torch_import, onnx_import) make of a model: its Graph, the graph inputs bound to the model's
own tensors (weights, buffers, folded constants), and a program called as the model is, its arguments in order."""
from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensorsmith.ir.dtypes import LARGEST_FINITE, DType
from tensorsmith.ir.errors import TensorsmithError
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.node import toposort
from tensorsmith.ir.ops import Op
from tensorsmith.ir.tensor import Tensor

from .program import Program


class ModelImportError(TensorsmithError):
    """A model that cannot be imported: its exporter refused it, or it holds ops tensorsmith cannot lower yet."""


@dataclass
class ImportedModel:
    """The graph of an imported model and what its inputs are bound to."""

    graph: Graph
    arguments: list[str] = field(default_factory=list)      # graph inputs the model's caller gives, in order
    bound: dict[str, Any] = field(default_factory=dict)     # graph inputs bound to the model's tensors
    outputs: list[str] = field(default_factory=list)        # graph outputs in the order the model returns them
    folded: dict[tuple, Tensor] = field(default_factory=dict)   # bind_folded's inputs, by shape, dtype and content
    # the model's own return value from the outputs in order (a transformers ModelOutput); None: one output
    # alone, several as a tuple
    structure: Callable[[list[Any]], Any] | None = None
    updates: dict[str, str] = field(default_factory=dict)   # output -> the argument it changes in place
    in_spec: Any = None                  # torch.export's spec of the arguments: a cache object given whole

    def bind(self, hint: str, value: Any, shape: tuple[int, ...], dtype: DType) -> Tensor:
        """A new graph input named after `hint` (made unique), bound to `value`."""
        name = self._unique(hint)
        self.bound[name] = value
        return self.graph.input(name, shape, dtype)

    def bind_folded(self, hint: str, value: Any, shape: tuple[int, ...], dtype: DType, content: bytes) -> Tensor:
        """A graph input bound to a value the importer folded (it depends on no input), one per distinct value:
        each layer of a model folds the same RoPE tables and causal mask again, which are then one buffer."""
        key = (shape, dtype, hashlib.sha256(content).hexdigest())
        if key not in self.folded:
            self.folded[key] = self.bind(hint, value, shape, dtype)
        return self.folded[key]

    def drop_unread(self) -> None:
        """Forget the bound inputs no output reads (an operand torch.cat skips, a weight of a branch not taken):
        they would be copied to the GPU for nothing, and an empty one could not be compiled."""
        read = {node.arg for node in toposort(self.graph.outputs.values()) if node.op == Op.INPUT}
        for name in [name for name in self.bound if name not in read]:
            del self.bound[name], self.graph.inputs[name]
        self.folded = {key: tensor for key, tensor in self.folded.items() if tensor.node.arg in read}

    def argument(self, hint: str, shape: tuple[int, ...], dtype: DType) -> Tensor:
        """A new graph input for one of the model's arguments (named after `hint`, made unique)."""
        name = self._unique(hint)
        self.arguments.append(name)
        return self.graph.input(name, shape, dtype)

    def _unique(self, hint: str) -> str:
        base = identifier(hint)
        name, count = base, 1
        while name in self.graph.inputs:
            name, count = f"{base}_{count}", count + 1
        return name


def finite(value: Any, dtype: DType) -> Any:
    """An infinite constant as the dtype's largest finite value of its sign: `where` blends both branches, so an
    infinite one (a mask filled with -inf) would make NaN where it is not chosen; the largest value masks alike."""
    if isinstance(value, float) and value in (math.inf, -math.inf) and dtype in LARGEST_FINITE:
        return math.copysign(LARGEST_FINITE[dtype], value)
    return value


def identifier(name: str) -> str:
    """`name` as a graph input or output name: word characters only, not starting with a digit."""
    cleaned = re.sub(r"\W", "_", name)
    return cleaned if re.match(r"[A-Za-z_]", cleaned) else f"t_{cleaned}"


class ImportedProgram:
    """A compiled model, called as the model is: its arguments in order (numpy arrays or torch tensors), its outputs
    back in the same kind (one, or a tuple)."""

    def __init__(self, imported: ImportedModel, program: Program):
        self.imported, self.program = imported, program
        self._bound: dict[bool, dict[str, Any]] = {}   # the bound inputs as the program takes them, on GPU or not

    @property
    def graph(self) -> Graph:
        return self.imported.graph

    def __call__(self, *args: Any, device: str | None = None, **named: Any) -> Any:
        """The model's outputs for its arguments, given in order or by the names its `forward` (or the ONNX graph)
        gives them; `device` as `Program.__call__` takes it ("cpu" runs the kernels' program in numpy)."""
        args = self._arguments(*self._flattened(args, named))
        torch = _torch_if_used(args)
        on_gpu = torch is not None and any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
        if on_gpu and device == "cpu":
            raise ModelImportError("device='cpu' with arguments on the GPU: move them to the CPU first")
        if on_gpu not in self._bound:   # weights moved to the device (or to numpy) once, not on every call
            self._bound[on_gpu] = {name: _as_input(value, self.imported.graph.inputs[name].dtype, on_gpu)
                                   for name, value in self.imported.bound.items()}
        inputs = {name: _as_input(value, self.imported.graph.inputs[name].dtype, on_gpu)
                  for name, value in zip(self.imported.arguments, args)}
        in_place = self._in_place(args, inputs) if on_gpu and device != "cpu" else {}
        outputs = self.program(**inputs, **self._bound[on_gpu], device=device, out=in_place or None)
        for out, argument in self.imported.updates.items():   # the caller's tensor changed in place, as the model's
            if out not in in_place:
                _write_back(args[self.imported.arguments.index(argument)], outputs[out])
        results = [outputs[name] for name in self.imported.outputs]
        if torch is not None:   # in the model's dtypes (bfloat16 comes back from numpy as float32)
            device = next(a.device for a in args if isinstance(a, torch.Tensor))
            dtypes = [getattr(torch, self.imported.graph.outputs[name].dtype.value) for name in self.imported.outputs]
            results = [(r if isinstance(r, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(r)))
                       .to(device=device, dtype=dtype) for r, dtype in zip(results, dtypes)]
        if self.imported.structure is not None:
            return self.imported.structure(results)
        return results[0] if len(results) == 1 else tuple(results)


    def _in_place(self, args: tuple[Any, ...], inputs: dict[str, Any]) -> dict[str, Any]:
        """The outputs the kernels write straight into the caller's tensor that the model changes in place (a static
        KV cache on the GPU): those the program may write over their input (`written_in_place`), where the input
        the kernels read is the caller's tensor itself (not a copy made for the program's dtype or layout)."""
        in_place = {}
        for out, argument in self.imported.updates.items():
            given = args[self.imported.arguments.index(argument)]
            if (self.program.written_in_place.get(out) == argument
                    and inputs[argument].data_ptr() == given.data_ptr() and inputs[argument].shape == given.shape):
                in_place[out] = inputs[argument]
        return in_place

    def save(self, path: Any, force: bool = False) -> Any:
        """`Program.save`, with the model's bound tensors (its weights) kept in the folder: `ts.load(path)` gives a
        Program called with the model's own arguments, by name."""
        bound = {name: _as_input(value, self.imported.graph.inputs[name].dtype, False)
                 for name, value in self.imported.bound.items()}
        return dataclasses.replace(self.program, bound=bound).save(path, force)

    def _flattened(self, args: tuple[Any, ...], named: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The arguments as tensors, where they were given as the module takes them (a transformers cache object
        whole, as torch.export flattened it); else as given."""
        if self.imported.in_spec is None or len(args) + len(named) == len(self.imported.arguments):
            return args, named
        import torch.utils._pytree as pytree
        leaves, spec = pytree.tree_flatten((args, named))
        return (tuple(leaves), {}) if spec == self.imported.in_spec else (args, named)

    def _arguments(self, args: tuple[Any, ...], named: dict[str, Any]) -> tuple[Any, ...]:
        """The arguments in the model's order, from those given in order and by name; or one error naming them."""
        names = self.imported.arguments
        unknown = [name for name in named if name not in names]
        given = dict(zip(names, args))
        twice = [name for name in named if name in given]
        missing = [name for name in names[len(args):] if name not in named]
        if len(args) > len(names) or unknown or twice or missing:
            problems = [f"{len(args)} given in order" if len(args) > len(names) else "",
                        f"unknown {unknown}" if unknown else "", f"given twice {twice}" if twice else "",
                        f"missing {missing}" if missing else ""]
            raise ModelImportError(f"this program takes the arguments ({', '.join(names)}), as the model was imported"
                                   f" with: {'; '.join(p for p in problems if p)}")
        return tuple({**given, **named}[name] for name in names)


def _write_back(argument: Any, value: Any) -> None:
    """An argument the model changes in place given its new value: a torch tensor or numpy array, written over."""
    torch = _torch_if_used((argument,))
    if torch is not None:
        value = value if isinstance(value, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(value))
        argument.copy_(value.reshape(argument.shape))
    elif isinstance(argument, np.ndarray):
        np.copyto(argument, np.reshape(value, argument.shape), casting="unsafe")
    else:
        raise ModelImportError(f"an argument the model changes in place must be a tensor or array that the call "
                               f"can write into, got {type(argument).__name__}")


def _torch_if_used(args: tuple[Any, ...]) -> Any:
    """The torch module where some argument is a torch tensor, else None (torch is not a dependency)."""
    if not any(type(a).__module__.startswith("torch") for a in args):
        return None
    import torch
    return torch


def _as_input(value: Any, dtype: DType, on_gpu: bool) -> Any:
    """A value as the program takes it: int64 as int32; torch tensors on the GPU where the call is, else numpy."""
    if type(value).__module__.startswith("torch"):
        if dtype == DType.INT32 and str(value.dtype) != "torch.int32":
            value = value.int()
        if on_gpu:
            return value.detach().cuda().contiguous()
        value = value.detach().cpu()
        return (value.float() if str(value.dtype) == "torch.bfloat16" else value).numpy()
    if on_gpu:
        import torch
        return _as_input(torch.as_tensor(np.asarray(value)), dtype, on_gpu)
    array = np.asarray(value)
    return array.astype(np.int32) if dtype == DType.INT32 and array.dtype != np.int32 else array
