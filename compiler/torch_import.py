"""from_torch: a PyTorch module, through torch.export and its core ATen decomposition, as a tensorsmith Graph.

Each ATen op of the exported graph is lowered by `LOWERINGS` (an op's name -> a function of its arguments, written
with tensorsmith's Tensor API and `nn`); parameters and buffers become graph inputs bound to the module's tensors.
Nodes that depend on no input (masks, position ids, `arange`, `full`) are evaluated by PyTorch at import and enter
the graph as constants (one value) or bound inputs (any other). Each node carries the line of the module's code it
came from (torch.export's stack trace). An op with no lowering is reported once, by name and line, with all others.
"""
from __future__ import annotations

import contextlib
import math
import operator
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tensorsmith.ir import nn
from tensorsmith.ir.dtypes import LARGEST_FINITE, DType
from tensorsmith.ir.errors import TensorsmithError, located
from tensorsmith.ir.experts import grouped_experts
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.node import Node
from tensorsmith.ir.ops import Op
from tensorsmith.ir.sliced import slices_sunk
from tensorsmith.ir.tensor import Tensor, constant, equal, iota, logical_and, logical_not, where

from . import torch_experts
from .imported import ImportedModel, ImportedProgram, ModelImportError, finite, identifier
from .folded_batch_norms import folded_batch_norms
from .joined_products import joined_products
from .pipeline import compile as ts_compile


class TorchImportError(ModelImportError):
    """A module torch.export cannot export, or whose exported graph holds ops tensorsmith cannot lower."""


DTYPES = {"torch.float32": DType.FLOAT32, "torch.float16": DType.FLOAT16, "torch.bfloat16": DType.BFLOAT16,
          "torch.int32": DType.INT32, "torch.int64": DType.INT32, "torch.bool": DType.BOOL}
# int64 (PyTorch's index dtype) is held as int32: token ids and positions fit; the call converts


UNLOWERED = object()   # the value of a node whose op (or an argument's) has no lowering


@dataclass
class Folded:
    """A value PyTorch computed at import: it depends on no input of the module."""

    value: Any     # a torch tensor


def from_torch(module: Any, example_inputs: Sequence[Any], keep_cache: bool = False,
               **compile_options: Any) -> ImportedProgram:
    """`module` exported with `example_inputs`, lowered, and compiled (`compile_options` as ts.compile takes them).
    A model that returns a KV cache (transformers' default call, use_cache=True) gives it back with `keep_cache`;
    else its cache is not computed and comes back as None.

    >>> prog = ts.from_torch(model, (x,), budget_s=30); y = prog(x)
    """
    began = time.monotonic()   # the import is inside the budget
    imported = import_torch(module, example_inputs, keep_cache=keep_cache)
    return ImportedProgram(imported, ts_compile(imported.graph, **{"began": began, **compile_options}))


def import_torch(module: Any, example_inputs: Sequence[Any], name: str | None = None,
                 keep_cache: bool = False) -> ImportedModel:
    """The tensorsmith graph of `module` (an nn.Module) as torch.export traces it on `example_inputs`; the cache
    tensors of a model's output are outputs only with `keep_cache`."""
    exported = exported_aten(module, example_inputs)
    returned = ReturnedStructure.of(exported, keep_cache)
    graph = Graph(identifier(name or type(module).__name__))
    imported = ImportedModel(graph)
    state = {**exported.state_dict, **exported.constants}
    sources = {spec.arg.name: spec for spec in exported.graph_signature.input_specs}
    values: dict[str, Any] = {}
    unsupported: dict[str, str] = {}
    joined = {**joined_products(exported), **folded_batch_norms(exported)}   # lowered otherwise than op by op
    for node in exported.graph.nodes:
        if node.op == "placeholder":
            values[node.name] = _placeholder(imported, node, sources[node.name], state)
        elif node.op == "call_function":
            where = where_of(node)
            with located(where, _api(node.target)):
                group = joined.get(node.name)
                value = group.member(node, values, imported, state) if group is not None else None
                values[node.name] = value if value is not None else _lower(node, values, imported, unsupported,
                                                                           where)
        elif node.op == "output":
            results = node.args[0] if isinstance(node.args[0], (tuple, list)) else [node.args[0]]
            if unsupported:
                listed = "; ".join(f"{op} (at {line})" for op, line in unsupported.items())
                raise TorchImportError(f"{type(module).__name__} uses ATen ops tensorsmith cannot lower yet: {listed}")
            _outputs(module, exported, returned, results, values, imported)
    imported.graph = slices_sunk(imported.graph)   # logits[:, -1]: the last position's alone computed
    imported.drop_unread()
    imported.structure = returned.rebuild if returned.structured else None
    imported.in_spec = exported.call_spec.in_spec
    return imported


def _outputs(module: Any, exported: Any, returned: "ReturnedStructure", results: Sequence[Any],
             values: dict[str, Any], imported: ImportedModel) -> None:
    """The graph's outputs: what the module returns (but a cache not asked for), and the new value of each argument
    it changes in place (a static KV cache), which the call writes back into the caller's tensor."""
    user = iter(returned.names)
    for spec, result in zip(exported.graph_signature.output_specs, results, strict=True):
        kind = spec.kind.name
        if kind == "USER_OUTPUT":
            out = next(user)
        elif kind == "USER_INPUT_MUTATION":
            argument = values[spec.target].node.arg
            out = f"{argument}_updated"
            imported.updates[out] = argument
        else:
            raise TorchImportError(f"{type(module).__name__} changes {spec.target!r} in place ({kind}): only its "
                                   f"arguments may be changed in place yet")
        if out is not None:
            imported.graph.output(out, _tensor(values[result.name], imported, f"output {out}"))
            if kind == "USER_OUTPUT":
                imported.outputs.append(out)


@dataclass(frozen=True)
class ReturnedStructure:
    """What the module returns, as torch.export flattened it: each leaf's output name (None: a cache leaf not
    computed), and the means to build the module's own return value (a transformers ModelOutput) from them."""

    spec: Any                            # torch.export's output TreeSpec
    names: tuple[str | None, ...]
    structured: bool                     # a mapping (ModelOutput), not a tensor or a tuple of them

    @classmethod
    def of(cls, exported: Any, keep_cache: bool) -> "ReturnedStructure":
        import torch
        import torch.utils._pytree as pytree
        spec = exported.call_spec.out_spec
        marks = [torch.empty(0) for _ in range(spec.num_leaves)]   # a tensor each: caches flatten only tensors
        position = {id(mark): i for i, mark in enumerate(marks)}
        returned = pytree.tree_unflatten(marks, spec)
        if not isinstance(returned, Mapping):
            names = ["y"] if len(marks) == 1 else [f"y{i}" for i in range(len(marks))]
            return cls(spec, tuple(names), False)
        names: list[str | None] = [None] * len(marks)
        for key, value in returned.items():
            leaves = [position[id(leaf)] for leaf in pytree.tree_leaves(value) if id(leaf) in position]
            for j, leaf in enumerate(leaves):
                kept = keep_cache or not _is_cache(value)
                names[leaf] = identifier(key if len(leaves) == 1 else f"{key}_{j}") if kept else None
        return cls(spec, tuple(names), True)

    def rebuild(self, results: Sequence[Any]) -> Any:
        """The module's return value from the program's outputs (in the order of the kept names); a cache not
        computed is None."""
        import torch.utils._pytree as pytree
        kept = iter(results)
        leaves = [next(kept) if name is not None else None for name in self.names]
        if None not in leaves:
            return pytree.tree_unflatten(leaves, self.spec)
        marks = pytree.tree_unflatten(leaves, self.spec)   # caches of None, emptied below
        for key, value in list(marks.items()):
            if _is_cache(value):
                marks[key] = None
        return marks


def _is_cache(value: Any) -> bool:
    """transformers' rule for a cache object: a class named *Cache (DynamicCache, StaticCache, ...)."""
    return type(value).__name__.endswith("Cache")


def exported_aten(module: Any, example_inputs: Sequence[Any]) -> Any:
    """`module` through torch.export and the core ATen decomposition (an ExportedProgram), or one clear error."""
    try:
        import torch
    except ImportError:
        raise TorchImportError("importing a PyTorch module needs PyTorch: pip install torch") from None
    _register_transformers_caches(module)
    _check_caches_initialized(example_inputs)
    try:
        with _exportable_experts(module):
            return torch.export.export(module, tuple(example_inputs)).run_decompositions(_decompositions(torch))
    except Exception as err:   # torch raises many kinds; the user needs its message, in one line
        raise TorchImportError(f"torch.export could not export {type(module).__name__}: "
                               f"{str(err).strip().splitlines()[0]}") from None


def _decompositions(torch: Any) -> dict:
    """The core ATen decomposition but for scaled-dot-product attention, kept whole: decomposed, it becomes the
    device's fused kernel on a GPU but, on a CPU, a math form whose 'safe' softmax (a row masked whole gives 0)
    no attention kernel matches, so a model imported on a CPU would compile its attention as a dozen kernels."""
    table = torch.export.default_decompositions()
    table.pop(torch.ops.aten.scaled_dot_product_attention.default, None)
    return table


def _register_transformers_caches(module: Any) -> None:
    """transformers' own pytree registration of its cache classes, where it has one (5.x), so that a model called
    as it is by default (use_cache=True), whose output holds a DynamicCache, exports."""
    if "transformers" not in sys.modules:   # no transformers model, and its import is slow
        return
    try:
        from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model
    except ImportError:
        return
    register_cache_pytrees_for_model(module)


def _check_caches_initialized(example_inputs: Sequence[Any]) -> None:
    """A transformers cache given as an argument must hold its tensors already: one that allocates them on its first
    update would allocate them inside the export, and the program would have none to write."""
    for position, value in enumerate(example_inputs):
        layers = getattr(value, "layers", None) if _is_cache(value) else None
        if layers and not all(getattr(layer, "is_initialized", True) for layer in layers):
            raise TorchImportError(f"argument {position} is a {type(value).__name__} whose tensors are not allocated "
                                   f"yet: call its early_initialization(batch_size, num_kv_heads, head_dim, dtype, "
                                   f"device) before importing, as torch.export needs")


@contextlib.contextmanager
def _exportable_experts(module: Any) -> Iterator[None]:
    """transformers' mixture-of-experts layers switched, for the export, to a form of static shapes: every expert
    on every token, or grouped by expert on the routed tokens only (`torch_experts`). Their default groups tokens
    by expert with a sort and sizes known only at run time, which no static-shape graph holds. The module is given
    back as it was."""
    configs = {id(c): c for m in module.modules() if (c := getattr(m, "config", None)) is not None
               and getattr(c, "_experts_implementation", None) is not None} if hasattr(module, "modules") else {}
    saved = {key: config._experts_implementation for key, config in configs.items()}
    try:
        if configs and torch_experts.register():
            for config in configs.values():
                config._experts_implementation = torch_experts.NAME
        yield
    finally:
        for key, config in configs.items():
            config._experts_implementation = saved[key]


def _placeholder(imported: ImportedModel, node: Any, spec: Any, state: dict[str, Any]) -> Tensor | Folded:
    """A graph input for a parameter (bound to its tensor) or a tensor argument of forward; a buffer or constant is
    known at import (Folded), as the bound tensors are (they are read once), so what is computed from buffers alone
    (BERT's token types gathered by position ids) is computed then."""
    if spec.kind.name in ("BUFFER", "CONSTANT_TENSOR"):
        return Folded(state[spec.target])
    value = node.meta["val"]
    dtype = DTYPES.get(str(value.dtype))
    if dtype is None:
        raise TorchImportError(f"input {node.name!r} has dtype {value.dtype}, which tensorsmith does not hold")
    if spec.kind.name == "USER_INPUT":
        return imported.argument(node.name, tuple(value.shape), dtype)
    return imported.bind(spec.target, state[spec.target], tuple(value.shape), dtype)


def _lower(node: Any, values: dict[str, Any], imported: ImportedModel, unsupported: dict[str, str],
           where: str) -> Any:
    """The value of one ATen node: folded by PyTorch where no argument depends on an input, else lowered."""
    args = _resolve(node.args, values)
    kwargs = _resolve(node.kwargs, values)
    op = op_name(node.target)
    if op in IGNORED:
        return None
    if not _depends_on_input([*args, *kwargs.values()]):
        return Folded(node.target(*_unfold(args), **_unfold(kwargs)))
    lowering = LOWERINGS.get(op)
    if lowering is None:
        unsupported.setdefault(op, where)
        return UNLOWERED
    if any(v is UNLOWERED for v in _flatten([*args, *kwargs.values()])):
        return UNLOWERED   # an argument that could not be lowered: its op is reported already
    args = [_tensors(a, imported, op) for a in args]
    kwargs = {k: _tensors(v, imported, op) for k, v in kwargs.items()}
    result = lowering(node, *args, **kwargs)
    return _as_exported(result, node.meta.get("val"))


def _as_exported(result: Any, val: Any) -> Any:
    """`result` cast to the dtype PyTorch gives the node (type promotion differs in corners); its shape checked."""
    if not isinstance(result, Tensor) or val is None or not hasattr(val, "dtype"):
        return result
    if tuple(result.shape) != tuple(val.shape):
        raise TensorsmithError(f"lowering gave shape {result.shape} where PyTorch has {tuple(val.shape)}"
                               f" (a tensorsmith bug)")
    dtype = DTYPES.get(str(val.dtype))
    return result.cast(dtype) if dtype is not None and dtype != result.dtype else result


def _tensor(value: Any, imported: ImportedModel, what: str) -> Tensor:
    """A Tensor for a lowered or folded value: one repeated value as a constant, any other as a bound input."""
    if isinstance(value, Tensor):
        return value
    if not isinstance(value, Folded):
        raise TorchImportError(f"{what}: expected a tensor, got {type(value).__name__}")
    tensor = value.value
    dtype = DTYPES.get(str(tensor.dtype))
    if dtype is None:
        raise TorchImportError(f"{what}: a constant of dtype {tensor.dtype}, which tensorsmith does not hold")
    flat = tensor.detach().reshape(-1)
    if flat.numel() > 0 and bool((flat == flat[0]).all()) and not math.isnan(float(flat[0])):
        return constant(finite(flat[0].item(), dtype), tuple(tensor.shape), dtype)
    offset = _causal_pattern(tensor.detach())
    if offset is not None:   # computed from indices, so that an attention reads it as causal
        return _causal(offset, tuple(tensor.shape))
    counted = _arange_pattern(tensor.detach())
    if counted is not None:  # likewise: a decode step's mask, position < key, reads as keys past the position
        axis, start = counted
        positions = iota(tuple(tensor.shape), axis) + start if start else iota(tuple(tensor.shape), axis)
        return positions if dtype == DType.INT32 else positions.cast(dtype)
    held = tensor.detach()
    if dtype in LARGEST_FINITE:   # infinities as the largest finite values, as a constant's are (imported.finite)
        held = held.clamp(-LARGEST_FINITE[dtype], LARGEST_FINITE[dtype])
    content = held.double().cpu().numpy().tobytes()   # exact for every dtype held (numpy has no bfloat16)
    return imported.bind_folded("folded", held, tuple(tensor.shape), dtype, content)


def _tensors(value: Any, imported: ImportedModel, what: str) -> Any:
    """`value` with every folded tensor in it (a list's too, as cat's) made a Tensor."""
    if isinstance(value, Folded):
        return _tensor(value, imported, what)
    if isinstance(value, (list, tuple)):
        return type(value)(_tensors(v, imported, what) for v in value)
    return value


def _resolve(value: Any, values: dict[str, Any]) -> Any:
    if hasattr(value, "op") and hasattr(value, "name") and value.name in values:
        return values[value.name]
    if isinstance(value, (list, tuple)):
        return type(value)(_resolve(v, values) for v in value)
    if isinstance(value, dict):
        return {k: _resolve(v, values) for k, v in value.items()}
    return value


def _flatten(values: Sequence[Any]) -> list[Any]:
    flat: list[Any] = []
    for v in values:
        flat += _flatten(v) if isinstance(v, (list, tuple)) else [v]
    return flat


def _depends_on_input(values: Sequence[Any]) -> bool:
    return any(isinstance(v, Tensor) or v is UNLOWERED or isinstance(v, (list, tuple)) and _depends_on_input(v)
               for v in values)


def _unfold(value: Any) -> Any:
    if isinstance(value, Folded):
        return value.value
    if isinstance(value, (list, tuple)):
        return type(value)(_unfold(v) for v in value)
    if isinstance(value, dict):
        return {k: _unfold(v) for k, v in value.items()}
    return value


def op_name(target: Any) -> str:
    """'aten.add.Tensor' for an ATen overload, 'getitem' for operator.getitem."""
    return "getitem" if target is operator.getitem else str(target)


def _api(target: Any) -> str:
    """What the kernels computing an ATen op's nodes are named after: 'softmax' for aten._softmax.default (the
    overload's packet, in any namespace: 'convert_element_type' for prims.convert_element_type.default)."""
    parts = op_name(target).split(".")
    return (parts[-2] if len(parts) >= 3 else parts[-1]).strip("_")


def where_of(node: Any) -> str:
    """The module's `file:line` that made this node: the innermost frame of torch.export's stack trace outside torch
    itself (the user's `forward`, or a library model's file, not `torch/nn/modules/linear.py`)."""
    frames = re.findall(r'File "([^"]+)", line (\d+)', node.meta.get("stack_trace") or "")
    if not frames:
        return f"<exported node {node.name}>"
    torch_file = getattr(sys.modules.get("torch"), "__file__", None)
    torch_dir = str(Path(torch_file).parent) + os.sep if torch_file else None
    own = [frame for frame in frames if torch_dir is None or not frame[0].startswith(torch_dir)]
    file, line = (own or frames)[-1]
    return f"{file}:{line}"


# -- the lowerings: each takes the ATen node (for its shapes) and the node's arguments ------------------------------

def _shape(node: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in node.meta["val"].shape)


def _axes(x: Tensor, dims: Any) -> list[int]:
    dims = [dims] if isinstance(dims, int) else list(dims) if dims else list(range(x.ndim))
    return [d % max(x.ndim, 1) for d in dims]


def _reduced(reduce: Callable[[Tensor, int], Tensor]) -> Callable[..., Tensor]:
    def lower(node: Any, x: Tensor, dims: Any = None, keepdim: bool = False, **_: Any) -> Tensor:
        out = x
        for axis in sorted(_axes(x, dims), reverse=True):
            out = reduce(out, axis)
        return out.reshape(_shape(node))
    return lower


def _scalar(value: Any) -> Any:
    return value.item() if hasattr(value, "item") and not isinstance(value, Tensor) else value


def _binary(fn: Callable[[Any, Any], Tensor]) -> Callable[..., Tensor]:
    def lower(node: Any, a: Any, b: Any, alpha: Any = 1, **_: Any) -> Tensor:
        a, b = _scalar(a), _scalar(b)
        return fn(a, b if alpha == 1 else b * alpha)
    return lower


def _expand(node: Any, x: Tensor, sizes: Any, **_: Any) -> Tensor:
    shape = _shape(node)
    return x.reshape((1,) * (len(shape) - x.ndim) + tuple(x.shape)).expand(shape)


def _slice(node: Any, x: Tensor, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Tensor:
    if step != 1:
        raise TorchImportError(f"slice with step {step}: only step 1 is supported")
    index = [slice(None)] * x.ndim
    index[dim % x.ndim] = slice(start, end)
    return x[tuple(index)]


def _select(node: Any, x: Tensor, dim: int, index: int) -> Tensor:
    """x[..., index, ...] at a fixed index (`x[:, 0]`, BERT's pooler): a slice with the axis dropped."""
    return x[(slice(None),) * (dim % x.ndim) + (index,)]


def _index(node: Any, x: Tensor, indices: Sequence[Any]) -> Tensor:
    """x[..., i, j, ...] with integer tensors of ids on consecutive axes (the others taken whole), as PyTorch's
    advanced indexing does it (`nn.index`; negative ids count from the end)."""
    given = [(axis, ids) for axis, ids in enumerate(indices) if ids is not None]
    axes = [axis for axis, _ in given]
    if any(ids.dtype != DType.INT32 for _, ids in given) or axes != list(range(axes[0], axes[0] + len(axes))):
        kinds = ", ".join(f"{ids.dtype} ids on axis {axis}" for axis, ids in given)
        raise TorchImportError(f"aten.index.Tensor with {kinds}: only integer ids on consecutive axes are supported;"
                               f" boolean masks and ids on axes apart are not yet")
    return nn.index(x, [ids for _, ids in given], axes[0], wrap=True)   # x[-1] is the last row, as in PyTorch


def _index_put(node: Any, x: Tensor, indices: Sequence[Any], values: Tensor, accumulate: bool = False) -> Tensor:
    """x[..., ids, ...] = values for one 1-D tensor of ids (a static KV cache written at its positions)."""
    given = [(axis, ids) for axis, ids in enumerate(indices) if ids is not None]
    if accumulate or len(given) != 1 or given[0][1].ndim != 1 or given[0][1].dtype != DType.INT32:
        raise TorchImportError("aten.index_put with ids on several axes, ids of more than one axis of their own, or "
                               "accumulate=True: only one 1-D integer id tensor, written over, is supported yet")
    axis, ids = given[0]
    return nn.put(x, ids, values, axis, wrap=True)


def _split(node: Any, x: Tensor, sizes: Sequence[int], dim: int = 0) -> list[Tensor]:
    return nn.split(x, sizes, dim)


def _gelu(node: Any, x: Tensor, approximate: str = "none") -> Tensor:
    return nn.gelu(x) if approximate == "tanh" else nn.gelu_exact(x)


def _layer_norm(node: Any, x: Tensor, shape: Sequence[int], weight: Any = None, bias: Any = None,
                eps: float = 1e-5) -> tuple[Tensor, Tensor, Tensor]:
    if len(shape) != 1:
        raise TorchImportError(f"layer_norm over {len(shape)} axes: only the last axis is supported")
    mean = x.mean(-1, keepdim=True)
    centered = x - mean
    rstd = ((centered * centered).mean(-1, keepdim=True) + eps).rsqrt()
    return nn.layer_norm(x, weight, bias, eps), mean, rstd


def _convolution(node: Any, x: Tensor, weight: Tensor, bias: Any, stride: Sequence[int], padding: Sequence[int],
                 dilation: Sequence[int], transposed: bool, output_padding: Sequence[int], groups: int) -> Tensor:
    if transposed:
        return nn.conv_transpose(x, weight, bias if isinstance(bias, Tensor) else None, stride, padding,
                                 output_padding, groups, dilation)
    return _conv(node, x, weight, bias, stride, padding, dilation, groups)


def _conv(node: Any, x: Tensor, weight: Tensor, bias: Any = None, stride: Any = 1, padding: Any = 0,
          dilation: Any = 1, groups: int = 1) -> Tensor:
    return nn.conv(x, weight, bias if isinstance(bias, Tensor) else None, stride, padding, dilation, groups)


def _pooled(node: Any, value: Any) -> Any:
    """A pooling's size argument for each pooled axis: PyTorch lets one number (or a list of one) stand for all."""
    axes = int(re.search(r"pool(\d)d", op_name(node.target)).group(1))
    values = [value] if isinstance(value, int) else list(value)
    return values * axes if len(values) == 1 else values


def _max_pool(node: Any, x: Tensor, kernel: Sequence[int], stride: Sequence[int] = (), padding: Any = 0,
              dilation: Any = 1, ceil_mode: bool = False) -> tuple[Tensor, None]:
    """Its values; the indices it also returns have no lowering (None: an error where something reads them)."""
    return nn.max_pool(x, _pooled(node, kernel), _pooled(node, stride) or None, _pooled(node, padding),
                       _pooled(node, dilation), ceil_mode), None


def _avg_pool(node: Any, x: Tensor, kernel: Sequence[int], stride: Sequence[int] = (), padding: Any = 0,
              ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: Any = None) -> Tensor:
    return nn.avg_pool(x, _pooled(node, kernel), _pooled(node, stride) or None, _pooled(node, padding), ceil_mode,
                       count_include_pad, divisor_override)


def _adaptive_avg_pool(node: Any, x: Tensor, size: Sequence[int]) -> Tensor:
    return nn.adaptive_avg_pool(x, list(size))


def _batch_norm(node: Any, x: Tensor, weight: Any, bias: Any, mean: Tensor, var: Tensor, momentum: float,
                eps: float) -> tuple[Tensor, None, None]:
    """Batch normalisation in eval mode (its running statistics); the statistics it also returns are not lowered."""
    out = nn.batch_norm(x, mean, var, weight if isinstance(weight, Tensor) else None,
                        bias if isinstance(bias, Tensor) else None, eps)
    return out, None, None


def _where_lowering(node: Any, cond: Tensor, a: Any, b: Any) -> Tensor:
    dtype = _dtype(node.meta["val"].dtype)
    return where(cond, *(finite(_scalar(v), dtype) if not isinstance(v, Tensor) else v for v in (a, b)))


def _multiply(a: Any, b: Any) -> Tensor:
    """a * b; of two bool tensors, their and (PyTorch multiplies masks so)."""
    if all(isinstance(v, Tensor) and v.dtype == DType.BOOL for v in (a, b)):
        return logical_and(a, b)
    return a * b


def _remainder(node: Any, a: Tensor, b: Any) -> Tensor:
    """PyTorch's (and Python's) a % b, which takes the sign of b: the truncated remainder, plus b where it is not
    zero and its sign is not b's."""
    b = _scalar(b)
    r = a % b
    if isinstance(b, Tensor):
        wrong_sign = logical_not(equal(r < 0, b < 0))
        return where(logical_and(logical_not(equal(r, 0)), wrong_sign), r + b, r)
    return where(r < 0 if b > 0 else r > 0, r + b, r)


def _compare(fn: Callable[[Any, Any], Tensor]) -> Callable[..., Tensor]:
    return lambda node, a, b: fn(_scalar(a), _scalar(b))


def _dtype(value: Any) -> DType:
    """tensorsmith's dtype for a torch dtype, or one clear error (float64, complex, int8 and the like are not held)."""
    if str(value) not in DTYPES:
        raise TorchImportError(f"dtype {value} is not one tensorsmith holds (float32, float16, bfloat16, int32 or"
                               f" int64 as int32, bool)")
    return DTYPES[str(value)]


def _cast(node: Any, x: Tensor, *_: Any, dtype: Any = None, **__: Any) -> Tensor:
    return x if dtype is None else x.cast(_dtype(dtype))


def _addmm(node: Any, bias: Tensor, a: Tensor, b: Tensor, beta: Any = 1, alpha: Any = 1) -> Tensor:
    product = a @ b
    return (product if alpha == 1 else product * alpha) + (bias if beta == 1 else bias * beta)


def _fused_rms_norm(node: Any, x: Tensor, shape: Sequence[int], weight: Any = None, eps: Any = None
                    ) -> tuple[Tensor, Tensor]:
    """CUDA's fused RMSNorm (left whole by the decomposition): its output, and 1 / rms as its second result."""
    if len(shape) != 1:
        raise TorchImportError(f"rms_norm over {len(shape)} axes: only the last axis is supported")
    eps = float(eps) if eps is not None else TORCH_EPS[x.dtype]
    rstd = ((x * x).mean(-1, keepdim=True) + eps).rsqrt()
    return nn.rms_norm(x, weight, eps), rstd


TORCH_EPS = {DType.FLOAT32: 2.0 ** -23, DType.FLOAT16: 2.0 ** -10, DType.BFLOAT16: 2.0 ** -7}   # finfo(dtype).eps,
                                                                                                 # rms_norm's default


def _attention(node: Any, q: Tensor, k: Tensor, v: Tensor, *args: Any, **kwargs: Any) -> tuple:
    """A fused scaled-dot-product attention kernel of the device (flash, cuDNN, memory-efficient): nn.attention, and
    no further results (log-sum-exp, seeds) a forward pass reads. Its flags are read by name from the op's schema
    (torch leaves trailing defaults out of the recorded call, so positions differ between calls)."""
    named = _named_arguments(node, (q, k, v, *args), kwargs)
    bias = named.get("attn_bias")        # a mask known at import arrives as a constant or a bound input
    out = nn.attention(q, k, v, causal=bool(named.get("is_causal", False)), scale=named.get("scale"),
                       bias=bias if isinstance(bias, Tensor) else None)
    return (out,) + (None,) * (len(node.target._schema.returns) - 1)


def _scaled_dot_product(node: Any, q: Tensor, k: Tensor, v: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """F.scaled_dot_product_attention as called: nn.attention with a boolean mask (True: attend) as a bias of 0 or
    the most negative value, a float mask as the bias itself, is_causal's mask aligned top-left as PyTorch's is,
    and enable_gqa's key and value heads repeated for the query heads that share them."""
    named = _named_arguments(node, (q, k, v, *args), kwargs)
    if named.get("dropout_p"):
        raise TorchImportError(f"scaled_dot_product_attention with dropout_p={named['dropout_p']}: dropout is random"
                               f" and tensorsmith compiles inference; call model.eval() before exporting")
    mask = named.get("attn_mask")
    bias = None
    if isinstance(mask, Tensor):
        bias = _masked(mask, q.dtype) if mask.dtype == DType.BOOL else mask
    causal = bool(named.get("is_causal", False))
    if causal and q.shape[-2] != k.shape[-2]:   # nn.attention's mask is aligned bottom-right, PyTorch's top-left
        seen = iota((q.shape[-2], k.shape[-2]), 1) <= iota((q.shape[-2], k.shape[-2]), 0)
        hidden = _masked(seen, q.dtype)
        bias, causal = (hidden if bias is None else bias + hidden), False
    if named.get("enable_gqa") and k.shape[-3] != q.shape[-3]:
        k, v = (_repeated_heads(t, q.shape[-3]) for t in (k, v))
    return nn.attention(q, k, v, causal=causal, scale=named.get("scale"), bias=bias)


def _masked(attend: Tensor, dtype: DType) -> Tensor:
    """A boolean mask (True: attend) as the float32 bias that adds it: 0, or `dtype`'s most negative value, as
    (not attend) times that value, the form in which the attention kernel reads a causal mask from its indices
    (ir.patterns._causal_mask: it skips the tiles past the diagonal and loads no mask)."""
    node = attend.node
    negated = node.op == Op.LESS_THAN and _constant_true(node.srcs[1])   # logical_not(x) is x < True
    hidden = Tensor(node.srcs[0]) if negated else logical_not(attend)   # not (not x) is x
    return hidden.cast(DType.FLOAT32) * finite(-math.inf, dtype)


def _constant_true(node: Node) -> bool:
    while node.op in (Op.EXPAND, Op.RESHAPE):
        node = node.srcs[0]
    return node.op == Op.CONSTANT and node.dtype == DType.BOOL and bool(node.arg)


def _causal_pattern(mask: Any) -> int | None:
    """d where a folded boolean mask (..., Tq, Tk) is True exactly where key <= query + d in every leading index
    (a causal mask folded at import, as transformers makes it), else None."""
    if str(mask.dtype) != "torch.bool" or mask.ndim < 2 or mask.numel() == 0:
        return None
    held = mask.cpu().numpy().reshape(-1, *mask.shape[-2:])
    queries, keys = held.shape[-2:]
    offset = int(held[0, 0].sum()) - 1
    causal = np.arange(keys)[None, :] <= np.arange(queries)[:, None] + offset
    return offset if bool((held == causal).all()) else None


def _arange_pattern(values: Any) -> tuple[int, int] | None:
    """(axis, start) where a folded integer tensor counts up by one from `start` along its one axis longer than 1
    (the key positions transformers folds into a decode step's mask), else None."""
    axes = [axis for axis, size in enumerate(values.shape) if size > 1]
    if values.dtype.is_floating_point or str(values.dtype) == "torch.bool" or len(axes) != 1:
        return None
    flat = values.reshape(-1).cpu().numpy().astype(np.int64)
    start = int(flat[0])
    if start + flat.size > np.iinfo(np.int32).max or start < np.iinfo(np.int32).min:
        return None
    return (axes[0], start) if bool((flat == np.arange(start, start + flat.size)).all()) else None


def _causal(offset: int, shape: tuple[int, ...]) -> Tensor:
    """The boolean mask of `_causal_pattern` built from indices: not (query + d < key)."""
    queries, keys = shape[-2:]
    later = iota((queries, keys), 0) + offset < iota((queries, keys), 1)
    return logical_not(later.reshape((1,) * (len(shape) - 2) + (queries, keys)).expand(shape))   # the not last
                                                                                          # (_masked takes it off)


def _repeated_heads(x: Tensor, heads: int) -> Tensor:
    """(..., H, T, D) as (..., heads, T, D), each of its heads repeated for heads // H consecutive ones."""
    *lead, h, t, d = x.shape
    return x.reshape((*lead, h, 1, t, d)).expand((*lead, h, heads // h, t, d)).reshape((*lead, heads, t, d))


def _named_arguments(node: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by the names of the op's schema, defaults filled in."""
    named = {}
    for position, argument in enumerate(node.target._schema.arguments):
        if position < len(args):
            named[argument.name] = args[position]
        elif argument.name in kwargs:
            named[argument.name] = kwargs[argument.name]
        elif argument.has_default_value():
            named[argument.name] = argument.default_value
    return named


def _one_axis(node: Any, x: Tensor, dims: Any) -> int:
    dims = [dims] if isinstance(dims, int) else list(dims or [])
    if len(dims) != 1:
        raise TorchImportError(f"{op_name(node.target)} over {len(dims) or 'all'} axes: only one axis is supported")
    return dims[0] % x.ndim


def _variance(root: bool) -> Callable[..., Tensor]:
    def lower(node: Any, x: Tensor, dims: Any = None, *, correction: Any = 1, keepdim: bool = False) -> Tensor:
        out = nn.var(x, _one_axis(node, x, dims), 1 if correction is None else int(correction), keepdim)
        return out.sqrt() if root else out
    return lower


def _arg(pick: Callable[..., Tensor]) -> Callable[..., Tensor]:
    def lower(node: Any, x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
        if dim is None:
            return pick(x.reshape(-1), 0).reshape(_shape(node))
        return pick(x, dim % x.ndim, keepdim)
    return lower


def _any(x: Tensor, axis: int) -> Tensor:
    """Whether any element along `axis` is nonzero (true)."""
    nonzero = x if x.dtype == DType.BOOL else logical_not(equal(x, 0))
    return nonzero.cast(DType.FLOAT32).max(axis, keepdim=True) > 0


def _full_like(node: Any, x: Tensor, value: Any, **_: Any) -> Tensor:
    dtype = _dtype(node.meta["val"].dtype)
    return constant(finite(_scalar(value), dtype), x.shape, dtype)


def _identity(node: Any, x: Tensor, *_: Any, **__: Any) -> Tensor:
    return x


def _reshape(node: Any, x: Tensor, *_: Any, **__: Any) -> Tensor:
    return x.reshape(_shape(node))


def _cat(node: Any, tensors: list[Tensor], dim: int = 0) -> Tensor:
    """torch.cat, which skips 1-D operands of size 0 (a cache that starts empty, as transformers' DynamicCache
    does) whatever the others' rank."""
    joined = [t for t in tensors if t.shape != (0,)]
    return nn.concat(joined or tensors[:1], dim)


def _grouped_experts(node: Any, hidden: Tensor, ids: Tensor, weights: Tensor, gate_up: Tensor, down: Tensor
                     ) -> Tensor:
    """`tensorsmith::grouped_experts` (torch_experts' form of a Mixtral-style layer): the routed pairs' products
    grouped by expert, gate and up the halves of the concatenated weight."""
    half = gate_up.shape[1] // 2
    return grouped_experts(hidden, ids.cast("int32"), weights, gate_up[:, :half], gate_up[:, half:], down)


LOWERINGS: dict[str, Callable[..., Any]] = {
    "aten.view.default": _reshape, "aten._unsafe_view.default": _reshape, "aten.reshape.default": _reshape,
    "aten.unsqueeze.default": _reshape, "aten.squeeze.dim": _reshape, "aten.squeeze.dims": _reshape,
    "aten.squeeze.default": _reshape,
    "aten.permute.default": lambda node, x, dims: x.permute(*[d % x.ndim for d in dims]),
    "aten.t.default": lambda node, x: x.transpose(0, 1) if x.ndim == 2 else x,
    "aten.transpose.int": lambda node, x, a, b: x.transpose(a, b),
    "aten.expand.default": _expand,
    "aten.slice.Tensor": _slice,
    "aten.cat.default": _cat,
    "aten.split_with_sizes.default": _split,
    "aten.topk.default": lambda node, x, k, dim=-1, largest=True, sorted=True: nn.topk(x, k, dim, largest),
    "aten.split.Tensor": lambda node, x, size, dim=0: _split(node, x, [min(size, x.shape[dim] - s) for s in
                                                                     range(0, x.shape[dim], size)], dim),
    "getitem": lambda node, values, index: values[index],
    "aten.clone.default": _identity, "aten.alias.default": _identity, "aten.contiguous.default": _identity,
    "aten.detach.default": _identity, "aten.lift_fresh_copy.default": _identity,
    "aten._to_copy.default": _cast,
    "aten.add.Tensor": _binary(lambda a, b: a + b), "aten.add.Scalar": _binary(lambda a, b: a + b),
    "aten.sub.Tensor": _binary(lambda a, b: a - b), "aten.sub.Scalar": _binary(lambda a, b: a - b),
    "aten.rsub.Scalar": lambda node, a, b, alpha=1: _scalar(b) - (a if alpha == 1 else a * alpha),
    "aten.mul.Tensor": _binary(_multiply), "aten.mul.Scalar": _binary(_multiply),
    "aten.div.Tensor": _binary(lambda a, b: a / b), "aten.div.Scalar": _binary(lambda a, b: a / b),
    "aten.neg.default": lambda node, x: -x,
    "aten.pow.Tensor_Scalar": lambda node, x, exponent: nn.power(x, exponent),
    "aten.rsqrt.default": lambda node, x: x.rsqrt(), "aten.sqrt.default": lambda node, x: x.sqrt(),
    "aten.exp.default": lambda node, x: x.exp(), "aten.log.default": lambda node, x: x.log(),
    "aten.sin.default": lambda node, x: x.sin(), "aten.cos.default": lambda node, x: x.cos(),
    "aten.abs.default": lambda node, x: x.abs(), "aten.reciprocal.default": lambda node, x: x.recip(),
    "aten.tanh.default": lambda node, x: nn.tanh(x), "aten.sigmoid.default": lambda node, x: nn.sigmoid(x),
    "aten.silu.default": lambda node, x: nn.silu(x), "aten.relu.default": lambda node, x: nn.relu(x),
    "aten.gelu.default": _gelu, "aten.erf.default": lambda node, x: nn.erf(x),
    "aten.maximum.default": lambda node, a, b: nn.maximum(a, b),
    "aten.minimum.default": lambda node, a, b: nn.minimum(a, b),
    "aten.clamp.default": lambda node, x, lo=None, hi=None: nn.clamp(x, _scalar(lo), _scalar(hi)),
    "aten.mean.dim": _reduced(lambda x, axis: x.mean(axis, keepdim=True)),
    "aten.sum.dim_IntList": _reduced(lambda x, axis: x.sum(axis, keepdim=True)),
    "aten.amax.default": _reduced(lambda x, axis: x.max(axis, keepdim=True)),
    "aten.any.dim": _reduced(_any), "aten.any.dims": _reduced(_any), "aten.any.default": _reduced(_any),
    "aten.mm.default": lambda node, a, b: a @ b, "aten.bmm.default": lambda node, a, b: a @ b,
    "aten.addmm.default": _addmm,
    "aten.native_layer_norm.default": _layer_norm, "aten._fused_rms_norm.default": _fused_rms_norm,
    "aten.scaled_dot_product_attention.default": _scaled_dot_product,
    "aten._scaled_dot_product_cudnn_attention.default": _attention,
    "aten._scaled_dot_product_flash_attention.default": _attention,
    "aten._scaled_dot_product_efficient_attention.default": _attention,
    "aten._softmax.default": lambda node, x, dim, half_to_float=False: nn.softmax(x, axis=dim),
    "aten._safe_softmax.default": lambda node, x, dim, dtype=None: nn.softmax(x, axis=dim),
    "aten._log_softmax.default": lambda node, x, dim, half_to_float=False: nn.log_softmax(x, axis=dim),
    "aten.where.self": _where_lowering,
    "aten.logical_not.default": lambda node, x: logical_not(x),
    "aten.bitwise_and.Tensor": lambda node, a, b: logical_and(a, b),
    "aten.logical_and.default": lambda node, a, b: logical_and(a, b),
    "aten.eq.Tensor": _compare(lambda a, b: equal(a, b)), "aten.eq.Scalar": _compare(lambda a, b: equal(a, b)),
    "aten.ne.Tensor": _compare(lambda a, b: logical_not(equal(a, b))),
    "aten.ne.Scalar": _compare(lambda a, b: logical_not(equal(a, b))),
    "aten.lt.Tensor": _compare(lambda a, b: a < b), "aten.lt.Scalar": _compare(lambda a, b: a < b),
    "aten.gt.Tensor": _compare(lambda a, b: a > b), "aten.gt.Scalar": _compare(lambda a, b: a > b),
    "aten.le.Tensor": _compare(lambda a, b: a <= b), "aten.le.Scalar": _compare(lambda a, b: a <= b),
    "aten.ge.Tensor": _compare(lambda a, b: a >= b), "aten.ge.Scalar": _compare(lambda a, b: a >= b),
    "aten.embedding.default": lambda node, weight, ids, *_: nn.embedding(weight, ids),
    "aten.index_select.default": lambda node, x, dim, index: nn.take(x, index, dim),
    "aten.index.Tensor": _index, "aten.select.int": _select,
    "aten.index_put.default": _index_put,
    "aten.index_copy.default": lambda node, x, dim, ids, values: nn.put(x, ids, values, dim, wrap=True),
    "aten.remainder.Scalar": _remainder, "aten.remainder.Tensor": _remainder,
    "aten.fmod.Scalar": lambda node, a, b: a % _scalar(b), "aten.fmod.Tensor": lambda node, a, b: a % _scalar(b),
    "aten.var.correction": _variance(root=False), "aten.std.correction": _variance(root=True),
    "aten.argmax.default": _arg(nn.argmax), "aten.argmin.default": _arg(nn.argmin),
    "aten.cumsum.default": lambda node, x, dim, dtype=None: nn.cumsum(x, dim),
    torch_experts.GROUPED_OP.replace("::", ".") + ".default": _grouped_experts,
    "aten.full_like.default": _full_like,
    "aten.convolution.default": _convolution, "aten.conv2d.default": _conv, "aten.conv1d.default": _conv,
    "aten.max_pool2d_with_indices.default": _max_pool, "aten.max_pool3d_with_indices.default": _max_pool,
    "aten.max_pool1d_with_indices.default": _max_pool,
    "aten.max_pool2d.default": lambda node, *args: _max_pool(node, *args)[0],
    "aten.avg_pool2d.default": _avg_pool, "aten.avg_pool3d.default": _avg_pool, "aten.avg_pool1d.default": _avg_pool,
    "aten._adaptive_avg_pool2d.default": _adaptive_avg_pool, "aten.adaptive_avg_pool2d.default": _adaptive_avg_pool,
    "aten._native_batch_norm_legit_no_training.default": _batch_norm,
}
IGNORED = {"aten._assert_tensor_metadata.default", "aten._assert_scalar.default", "aten.sym_constrain_range.default"}
