"""from_onnx: an ONNX model (a file or a ModelProto) as a tensorsmith Graph, with the onnx package.

Each ONNX node is lowered by `LOWERINGS` (an op type -> a function of its inputs and attributes, written with the
Tensor API and `nn`), for opsets 13 and newer (torch.onnx writes 17 to 23 for transformer models). Initializers become
graph inputs bound to their arrays (one repeated value becomes a constant); nodes whose inputs are all known at import
(shapes, `Constant`, `Range`, shape arithmetic) are evaluated by onnx's reference implementation then. Inputs must
have static shapes (or be given them). An op with no lowering is reported once, by type and node name, with all others.
"""
from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tensorsmith.ir import nn
from tensorsmith.ir.dtypes import LARGEST_FINITE, DType
from tensorsmith.ir.errors import located
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.tensor import Tensor, constant, equal, logical_and, logical_not, where

from .folded_batch_norms import folded_weight_and_bias
from .imported import ImportedModel, ImportedProgram, ModelImportError, finite, identifier
from .pipeline import compile as ts_compile


class OnnxImportError(ModelImportError):
    """An ONNX model that cannot be read, has dynamic shapes not given, or holds ops tensorsmith cannot lower."""


MIN_OPSET = 13
NORM_EPSILON = 1e-5   # the normalisations' epsilon where a node leaves it out (ONNX's default for each of them)
DTYPES = {1: DType.FLOAT32, 10: DType.FLOAT16, 16: DType.BFLOAT16, 6: DType.INT32, 7: DType.INT32, 9: DType.BOOL}
# ONNX elem types: 1 float, 10 float16, 16 bfloat16, 6 int32, 7 int64 (held as int32), 9 bool
NUMPY_DTYPES = {np.dtype(np.float32): DType.FLOAT32, np.dtype(np.float16): DType.FLOAT16,
                np.dtype(np.int32): DType.INT32, np.dtype(np.int64): DType.INT32, np.dtype(np.bool_): DType.BOOL}


def from_onnx(model: Any, shapes: Mapping[str, Sequence[int]] | None = None, **compile_options: Any) -> ImportedProgram:
    """`model` (a path or an onnx.ModelProto) imported and compiled (`compile_options` as ts.compile takes them)."""
    began = time.monotonic()   # the import is inside the budget
    imported = import_onnx(model, shapes)
    return ImportedProgram(imported, ts_compile(imported.graph, **{"began": began, **compile_options}))


def import_onnx(model: Any, shapes: Mapping[str, Sequence[int]] | None = None,
                name: str | None = None) -> ImportedModel:
    """The tensorsmith graph of an ONNX model; `shapes` gives inputs whose shapes the file leaves dynamic."""
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError:
        raise OnnxImportError("reading ONNX models needs the onnx package: pip install onnx") from None
    proto = _load(onnx, model)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        raise OnnxImportError(f"the model's opset is {opset}; tensorsmith reads opset {MIN_OPSET} or newer (where"
                              f" Split, Slice, Unsqueeze and the reductions take their axes as inputs): convert it"
                              f" with onnx.version_converter.convert_version(model, {MIN_OPSET})")
    stem = Path(model).stem if isinstance(model, (str, Path)) else proto.graph.name or "onnx_model"
    imported = ImportedModel(Graph(identifier(name or stem)))
    values: dict[str, Any] = {init.name: numpy_helper.to_array(init) for init in proto.graph.initializer}
    arguments = [value_info.name for value_info in proto.graph.input if value_info.name not in values]
    unknown = sorted(set(shapes or {}) - set(arguments))
    if unknown:
        raise OnnxImportError(f"shapes given for {unknown}, which the model has no input of; its inputs are"
                              f" {arguments}")
    for value_info in proto.graph.input:
        if value_info.name not in values:
            values[value_info.name] = _argument(imported, value_info, shapes or {})
    nodes = _with_batch_norms_folded(proto, values)
    known = _Known(imported, {id(values[name]): name for name in values if isinstance(values[name], np.ndarray)})
    unsupported: dict[str, str] = {}
    model_file = Path(model).name if isinstance(model, (str, Path)) else f"{stem}.onnx"
    for number, node in nodes:
        # kernels and errors name the ONNX node, in the model file: what a user can find in Netron or onnx.helper
        with located(f"{model_file}:{node.name or f'{node.op_type} node {number}'}", _snake(node.op_type)):
            outputs = _node_values(node, values, known, unsupported)
        values.update(zip(node.output, outputs))
    if unsupported:
        listed = "; ".join(f"{op} (node {where})" for op, where in unsupported.items())
        raise OnnxImportError(f"the ONNX model uses ops tensorsmith cannot lower yet: {listed}")
    for output in proto.graph.output:     # named as the model names them (as C identifiers)
        out = identifier(output.name)
        imported.graph.output(out, known.tensor(values[output.name], f"output {output.name}"))
        imported.outputs.append(out)
    return imported


def _with_batch_norms_folded(proto: Any, values: dict[str, Any]) -> list[tuple[int, Any]]:
    """The graph's nodes, numbered as in the file, with each Conv whose output only a BatchNormalization (inference
    form) reads made one Conv with the folded weight and bias (`folded_weight_and_bias`, added to `values` under new
    names) writing the norm's output; the norm left out. A pair whose weights are not all initializers stays."""
    import onnx
    readers: dict[str, int] = {}
    for node in proto.graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    for output in proto.graph.output:
        readers[output.name] = readers.get(output.name, 0) + 1
    nodes = list(proto.graph.node)
    producers = {output: number for number, node in enumerate(nodes) for output in node.output}
    initializers = {init.name for init in proto.graph.initializer}
    folded: dict[int, Any] = {}   # a conv's number -> its folded replacement
    norms: set[int] = set()       # the numbers of the norms folded
    for number, norm in enumerate(nodes):
        at = producers.get(norm.input[0]) if norm.op_type == "BatchNormalization" and norm.input else None
        conv = nodes[at] if at is not None else None
        if (conv is None or conv.op_type != "Conv" or readers.get(conv.output[0]) != 1
                or any(norm.output[1:]) or not set(norm.input[1:5]) <= initializers
                or not {name for name in conv.input[1:3] if name} <= initializers):
            continue
        weight = values[conv.input[1]]
        bias = values[conv.input[2]] if len(conv.input) > 2 and conv.input[2] else None
        gamma, beta, mean, var = (values[name] for name in norm.input[1:5])
        eps = next((a.f for a in norm.attribute if a.name == "epsilon"), NORM_EPSILON)
        new_weight, new_bias = folded_weight_and_bias(weight, bias, gamma, beta, mean, var, eps)
        names = [_unused(f"{conv.input[1]}_folded", values), _unused(f"{norm.input[2]}_folded", values)]
        values[names[0]], values[names[1]] = new_weight.astype(weight.dtype), new_bias.astype(weight.dtype)
        replacement = onnx.NodeProto()
        replacement.CopyFrom(conv)
        del replacement.input[1:]
        replacement.input.extend(names)
        replacement.output[0] = norm.output[0]
        folded[at] = replacement
        norms.add(number)
    return [(number, folded.get(number, node)) for number, node in enumerate(nodes) if number not in norms]


def _unused(name: str, values: dict[str, Any]) -> str:
    while name in values:
        name += "_"
    return name


def _snake(op_type: str) -> str:
    """What the kernels computing an ONNX op's nodes are named after: mat_mul for MatMul."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", op_type).lower()


def _load(onnx: Any, model: Any) -> Any:
    if isinstance(model, (str, Path)):
        try:
            return onnx.load(str(model))
        except Exception as err:   # a missing file, or protobuf's error on one that is not ONNX
            raise OnnxImportError(f"cannot read ONNX model {str(model)!r}: {err}") from None
    if not isinstance(model, onnx.ModelProto):
        raise OnnxImportError(f"from_onnx takes a path or an onnx.ModelProto, not {type(model).__name__}")
    return model


def _argument(imported: ImportedModel, value_info: Any, shapes: Mapping[str, Sequence[int]]) -> Tensor:
    tensor_type = value_info.type.tensor_type
    dtype = DTYPES.get(tensor_type.elem_type)
    if dtype is None:
        raise OnnxImportError(f"input {value_info.name!r} has ONNX element type {tensor_type.elem_type}, which"
                              f" tensorsmith does not hold")
    if value_info.name in shapes:
        shape = tuple(int(d) for d in shapes[value_info.name])
    else:
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
        if None in dims:
            raise OnnxImportError(f"input {value_info.name!r} has a dynamic shape; give it, e.g. shapes="
                                  f"{{{value_info.name!r}: (1, 16)}} (compile --shape {value_info.name}=1,16)")
        shape = tuple(dims)   # type: ignore[arg-type]
    return imported.argument(value_info.name, shape, dtype)


def _node_values(node: Any, values: dict[str, Any], known: _Known, unsupported: dict[str, str]) -> list[Any]:
    """The node's outputs: evaluated at import where every input is known, else lowered."""
    import onnx
    inputs = [values.get(name) if name else None for name in node.input]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if any(v is UNLOWERED for v in inputs):
        return [UNLOWERED] * len(node.output)
    if node.op_type == "Shape":     # static shapes: known at import even for a computed tensor
        source = inputs[0]
        if source is None:
            raise OnnxImportError(f"Shape node {node.name or node.output[0]!r} has no input")
        shape = np.array(source.shape, dtype=np.int64)
        return [shape[attrs.get("start", 0):attrs.get("end", None)]]
    if not any(isinstance(v, Tensor) for v in inputs):
        return _folded(node, inputs)
    lowering = LOWERINGS.get(node.op_type)
    if lowering is None:
        unsupported.setdefault(node.op_type, node.name or node.output[0])
        return [UNLOWERED] * len(node.output)
    context = _Context(known, node)
    result = lowering(context, inputs, attrs)
    return list(result) if isinstance(result, (list, tuple)) else [result]


UNLOWERED = object()   # the value of a node whose op (or an input's) has no lowering


def _gather_elements(data: np.ndarray, indices: np.ndarray, axis: int = 0) -> np.ndarray:
    """GatherElements as its definition says: onnx 1.23's reference fails on BERT's token types (1, 64) gathered
    by position ids (1, 16) ("cannot reshape array of size 1 into shape (1,16)"), as torch.onnx's optimizer saw."""
    axis = axis % data.ndim
    return np.take_along_axis(data, np.where(indices < 0, indices + data.shape[axis], indices), axis)


FOLDINGS: dict[str, Callable[..., np.ndarray]] = {"GatherElements": _gather_elements}   # where not the reference


def _folded(node: Any, inputs: list[Any]) -> list[Any]:
    """The node evaluated by onnx's reference implementation (or FOLDINGS), on inputs all known at import."""
    import onnx
    from onnx.reference import ReferenceEvaluator
    try:
        if node.op_type in FOLDINGS:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            return [FOLDINGS[node.op_type](*inputs, **attrs)]
        feeds = {name: value for name, value in zip(node.input, inputs) if name}
        return list(ReferenceEvaluator(node).run(None, feeds))
    except Exception as err:   # the reference implementation raises many kinds
        raise OnnxImportError(f"cannot evaluate {node.op_type} node {node.name or node.output[0]!r} at import:"
                              f" {err}") from None


class _Known:
    """Arrays known at import (initializers, folded values) as tensors: each array one constant or one bound input,
    an initializer's named after it."""

    def __init__(self, imported: ImportedModel, names: dict[int, str]):
        self.imported, self.names = imported, names
        self.tensors: dict[int, tuple[Any, Tensor]] = {}   # id(array) -> (the array, kept alive; its tensor)

    def tensor(self, value: Any, what: str) -> Tensor:
        """A lowered value as it is; a known array as a constant where it holds one finite value, else bound."""
        if isinstance(value, Tensor):
            return value
        if id(value) in self.tensors:
            return self.tensors[id(value)][1]
        array = np.asarray(value)
        dtype = DType.BFLOAT16 if array.dtype.name == "bfloat16" else NUMPY_DTYPES.get(array.dtype)
        if dtype is None:
            raise OnnxImportError(f"{what}: an array of dtype {array.dtype}, which tensorsmith does not hold")
        if dtype == DType.BFLOAT16:          # ml_dtypes' bfloat16, held as its float32 values
            array = array.astype(np.float32)
        flat = array.reshape(-1)
        if flat.size and (flat == flat[0]).all() and not (dtype.is_float and math.isnan(float(flat[0]))):
            tensor = constant(finite(flat[0].item(), dtype), array.shape, dtype)
        else:
            held = array.astype(np.int32) if array.dtype == np.int64 else array
            if dtype in LARGEST_FINITE:   # infinities as the largest finite values, as a constant's are (finite)
                held = np.clip(held, -LARGEST_FINITE[dtype], LARGEST_FINITE[dtype])
            tensor = self.imported.bind_folded(self.names.get(id(value), "folded"), held, array.shape, dtype,
                                               np.ascontiguousarray(held).tobytes())
        self.tensors[id(value)] = (value, tensor)
        return tensor


class _Context:
    """What a lowering needs besides its inputs: the node (for messages) and the known arrays as tensors."""

    def __init__(self, known: _Known, node: Any):
        self.known, self.node = known, node

    def tensor(self, value: Any) -> Tensor:
        return self.known.tensor(value, f"{self.node.op_type} node {self.node.name or self.node.output[0]!r}")


def _ints(value: Any) -> list[int]:
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _known(context: _Context, value: Any, what: str) -> np.ndarray:
    if isinstance(value, Tensor):
        raise OnnxImportError(f"{context.node.op_type} node {context.node.name!r}: its {what} must be known at import"
                              f" (a constant or a shape), not computed")
    return np.asarray(value)


# -- the lowerings: (context, inputs, attributes) -> output(s) --------------------------------------------------------

def _elementwise(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    def lower(context: _Context, inputs: list[Any], attrs: dict) -> Tensor:
        return fn(*[context.tensor(v) for v in inputs])
    return lower


def _reshape(context: _Context, inputs: list[Any], attrs: dict) -> Tensor:
    x = context.tensor(inputs[0])
    target = _ints(_known(context, inputs[1], "shape"))
    if not attrs.get("allowzero", 0):
        target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
    if -1 in target:
        known = math.prod(d for d in target if d != -1)
        target[target.index(-1)] = math.prod(x.shape) // known if known else 0
    return x.reshape(tuple(target))


def _axes_input(context: _Context, inputs: list[Any], attrs: dict, rank: int) -> list[int] | None:
    axes = attrs.get("axes")
    if axes is None and len(inputs) > 1 and inputs[1] is not None:
        axes = _ints(_known(context, inputs[1], "axes"))
    return [a % rank for a in axes] if axes else None   # none, or empty: the op's default (Reduce*: all axes)


def _unsqueeze(context: _Context, inputs: list[Any], attrs: dict) -> Tensor:
    x = context.tensor(inputs[0])
    axes = attrs.get("axes") or _ints(_known(context, inputs[1], "axes"))
    shape = list(x.shape)
    for axis in sorted(a % (x.ndim + len(axes)) for a in axes):
        shape.insert(axis, 1)
    return x.reshape(tuple(shape))


def _squeeze(context: _Context, inputs: list[Any], attrs: dict) -> Tensor:
    x = context.tensor(inputs[0])
    axes = _axes_input(context, inputs, attrs, x.ndim)
    axes = [i for i, d in enumerate(x.shape) if d == 1] if axes is None else axes
    return x.reshape(tuple(d for i, d in enumerate(x.shape) if i not in axes))


def _expand(context: _Context, inputs: list[Any], attrs: dict) -> Tensor:
    x = context.tensor(inputs[0])
    shape = _ints(_known(context, inputs[1], "shape"))
    rank = max(len(shape), x.ndim)
    padded_x = (1,) * (rank - x.ndim) + tuple(x.shape)
    padded_s = [1] * (rank - len(shape)) + shape
    target = tuple(max(a, b) if 1 in (a, b) else a for a, b in zip(padded_x, padded_s))
    return x.reshape(padded_x).expand(target)


def _slice(context: _Context, inputs: list[Any], attrs: dict) -> Tensor:
    x = context.tensor(inputs[0])
    starts, ends = _ints(_known(context, inputs[1], "starts")), _ints(_known(context, inputs[2], "ends"))
    given = [_ints(_known(context, v, what)) if v is not None else None
             for v, what in zip(inputs[3:5], ("axes", "steps"))] + [None, None]
    axes = given[0] if given[0] is not None else list(range(len(starts)))
    steps = given[1] if given[1] is not None else [1] * len(starts)
    if any(s != 1 for s in steps):
        raise OnnxImportError(f"Slice node {context.node.name!r}: only step 1 is supported, got steps {steps}")
    index = [slice(None)] * x.ndim
    for start, end, axis in zip(starts, ends, axes):
        size = x.shape[axis % x.ndim]
        index[axis % x.ndim] = slice(max(-size, min(start, size)), max(-size - 1, min(end, size)))
    return x[tuple(index)]


def _split(context: _Context, inputs: list[Any], attrs: dict) -> list[Tensor]:
    x = context.tensor(inputs[0])
    axis = attrs.get("axis", 0) % x.ndim
    if len(inputs) > 1 and inputs[1] is not None:
        sizes = _ints(_known(context, inputs[1], "split"))
    else:
        parts = attrs.get("num_outputs", len(context.node.output))
        step = -(-x.shape[axis] // parts)
        sizes = [min(step, x.shape[axis] - s) for s in range(0, x.shape[axis], step)]
    return nn.split(x, sizes, axis)


def _gather(context: _Context, inputs: list[Any], attrs: dict) -> Tensor:
    data, indices = inputs
    axis = attrs.get("axis", 0)
    if isinstance(indices, Tensor):     # computed (or input) indices: a lookup
        return nn.take(context.tensor(data), indices, axis, wrap=True)   # ONNX counts a negative id from the end
    x, picked = context.tensor(data), np.asarray(indices)
    axis %= x.ndim
    rows = []
    for i in picked.reshape(-1):
        index = [slice(None)] * x.ndim
        index[axis] = slice(int(i) % x.shape[axis], int(i) % x.shape[axis] + 1)
        rows.append(x[tuple(index)])
    joined = nn.concat(rows, axis) if len(rows) > 1 else rows[0]
    return joined.reshape(tuple(x.shape[:axis]) + picked.shape + tuple(x.shape[axis + 1:]))


def _gather_nd(context: _Context, inputs: list[Any], attrs: dict) -> Tensor:
    """data at the index tuples that the last axis of indices holds (batch_dims 0): `nn.index` over its leading axes."""
    data, indices = context.tensor(inputs[0]), context.tensor(inputs[1])
    if attrs.get("batch_dims", 0):
        raise OnnxImportError(f"GatherND node {context.node.name!r}: batch_dims {attrs['batch_dims']}; only 0 is"
                              f" supported")
    parts = [indices[..., k] for k in range(indices.shape[-1])]
    return nn.index(data, parts, 0, wrap=True)


def _reduce(reduce: Callable[[Tensor, int], Tensor]) -> Callable[..., Tensor]:
    def lower(context: _Context, inputs: list[Any], attrs: dict) -> Tensor:
        x = context.tensor(inputs[0])
        axes = _axes_input(context, inputs, attrs, x.ndim)
        if axes is None:
            axes = [] if attrs.get("noop_with_empty_axes", 0) else list(range(x.ndim))
        out = x
        for axis in sorted(axes, reverse=True):
            out = reduce(out, axis)
        if not attrs.get("keepdims", 1):
            out = out.reshape(tuple(d for i, d in enumerate(x.shape) if i not in axes))
        return out
    return lower


def _gemm(context: _Context, inputs: list[Any], attrs: dict) -> Tensor:
    a, b = context.tensor(inputs[0]), context.tensor(inputs[1])
    a = a.transpose(0, 1) if attrs.get("transA", 0) else a
    b = b.transpose(0, 1) if attrs.get("transB", 0) else b
    out = a @ b
    out = out * attrs["alpha"] if attrs.get("alpha", 1.0) != 1.0 else out
    if len(inputs) > 2 and inputs[2] is not None:
        c = context.tensor(inputs[2])
        out = out + (c * attrs["beta"] if attrs.get("beta", 1.0) != 1.0 else c)
    return out


def _layer_norm(context: _Context, inputs: list[Any], attrs: dict) -> Tensor:
    x = context.tensor(inputs[0])
    if attrs.get("axis", -1) % x.ndim != x.ndim - 1:
        raise OnnxImportError(f"LayerNormalization node {context.node.name!r}: only the last axis is supported")
    weight = context.tensor(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None
    bias = context.tensor(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else None
    return nn.layer_norm(x, weight, bias, attrs.get("epsilon", NORM_EPSILON))


def _pads(context: _Context, attrs: dict, dims: int) -> list[tuple[int, int]]:
    """A Conv's or pooling's (before, after) pads per axis (NOTSET and VALID auto_pad only)."""
    if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise OnnxImportError(f"{context.node.op_type} node {context.node.name!r}: auto_pad"
                              f" {attrs['auto_pad']!r} is not supported; export with explicit pads")
    pads = list(attrs.get("pads", [0] * 2 * dims))
    return list(zip(pads[:dims], pads[dims:]))


def _conv(context: _Context, inputs: list[Any], attrs: dict) -> Tensor:
    x, weight = context.tensor(inputs[0]), context.tensor(inputs[1])
    bias = context.tensor(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else None
    pads = _pads(context, attrs, weight.ndim - 2)
    if any(before != after for before, after in pads):   # zeros either way: padded first, then none
        x, pads = x.pad([(0, 0), (0, 0)] + pads), [(0, 0)] * len(pads)
    return nn.conv(x, weight, bias, attrs.get("strides", 1), [before for before, _ in pads],
                   attrs.get("dilations", 1), attrs.get("group", 1))


def _conv_transpose(context: _Context, inputs: list[Any], attrs: dict) -> Tensor:
    """ConvTranspose with explicit pads; pads unequal on two sides crop the output computed without them."""
    x, weight = context.tensor(inputs[0]), context.tensor(inputs[1])
    bias = context.tensor(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else None
    if "output_shape" in attrs:
        raise OnnxImportError(f"ConvTranspose node {context.node.name!r}: output_shape is not supported; export with"
                              f" explicit pads and output_padding")
    dims = weight.ndim - 2
    pads = _pads(context, attrs, dims)
    even = all(before == after for before, after in pads)
    y = nn.conv_transpose(x, weight, bias, attrs.get("strides", 1), [before for before, _ in pads] if even else 0,
                          attrs.get("output_padding", 0), attrs.get("group", 1), attrs.get("dilations", 1))
    if even:
        return y
    return y[(slice(None), slice(None)) + tuple(slice(before, size - after)
                                                for (before, after), size in zip(pads, y.shape[2:]))]


def _max_pool(context: _Context, inputs: list[Any], attrs: dict) -> Tensor:
    kernel = list(attrs["kernel_shape"])
    return nn.max_pool(context.tensor(inputs[0]), kernel, attrs.get("strides", 1),
                       _pads(context, attrs, len(kernel)), attrs.get("dilations", 1), bool(attrs.get("ceil_mode", 0)))


def _average_pool(context: _Context, inputs: list[Any], attrs: dict) -> Tensor:
    kernel = list(attrs["kernel_shape"])
    return nn.avg_pool(context.tensor(inputs[0]), kernel, attrs.get("strides", 1),
                       _pads(context, attrs, len(kernel)), bool(attrs.get("ceil_mode", 0)),
                       bool(attrs.get("count_include_pad", 0)), dilation=attrs.get("dilations", 1))


def _batch_norm(context: _Context, inputs: list[Any], attrs: dict) -> Tensor:
    x, weight, bias, mean, var = (context.tensor(value) for value in inputs[:5])
    return nn.batch_norm(x, mean, var, weight, bias, attrs.get("epsilon", NORM_EPSILON))


def _rms_norm(context: _Context, inputs: list[Any], attrs: dict) -> Tensor:
    x = context.tensor(inputs[0])
    weight = context.tensor(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None
    return nn.rms_norm(x, weight, attrs.get("epsilon", NORM_EPSILON))


def _pow(context: _Context, inputs: list[Any], attrs: dict) -> Tensor:
    exponent = _known(context, inputs[1], "exponent").reshape(-1)
    if exponent.size != 1:
        raise OnnxImportError(f"Pow node {context.node.name!r}: the exponent must be one constant")
    return nn.power(context.tensor(inputs[0]), float(exponent[0]))


def _cast(context: _Context, inputs: list[Any], attrs: dict) -> Tensor:
    dtype = DTYPES.get(attrs["to"])
    if dtype is None:
        raise OnnxImportError(f"Cast node {context.node.name!r}: to ONNX element type {attrs['to']}, which"
                              f" tensorsmith does not hold")
    return context.tensor(inputs[0]).cast(dtype)


def _arg(pick: Callable[..., Tensor]) -> Callable[..., Tensor]:
    def lower(context: _Context, inputs: list[Any], attrs: dict) -> Tensor:
        if attrs.get("select_last_index", 0):
            raise OnnxImportError(f"{context.node.op_type} node {context.node.name!r}: select_last_index is not"
                                  f" supported")
        return pick(context.tensor(inputs[0]), attrs.get("axis", 0), bool(attrs.get("keepdims", 1)))
    return lower


def _cumsum(context: _Context, inputs: list[Any], attrs: dict) -> Tensor:
    if attrs.get("exclusive", 0) or attrs.get("reverse", 0):
        raise OnnxImportError(f"CumSum node {context.node.name!r}: exclusive and reverse sums are not supported")
    return nn.cumsum(context.tensor(inputs[0]), int(_known(context, inputs[1], "axis").reshape(-1)[0]))


def _where(context: _Context, inputs: list[Any], attrs: dict) -> Tensor:
    return where(context.tensor(inputs[0]), context.tensor(inputs[1]), context.tensor(inputs[2]))


LOWERINGS: dict[str, Callable[..., Any]] = {
    "Identity": _elementwise(lambda x: x),
    "Add": _elementwise(lambda a, b: a + b), "Sub": _elementwise(lambda a, b: a - b),
    "Mul": _elementwise(lambda a, b: a * b), "Div": _elementwise(lambda a, b: a / b),
    "Neg": _elementwise(lambda x: -x), "Abs": _elementwise(lambda x: x.abs()),
    "Sqrt": _elementwise(lambda x: x.sqrt()), "Reciprocal": _elementwise(lambda x: x.recip()),
    "Exp": _elementwise(lambda x: x.exp()), "Log": _elementwise(lambda x: x.log()),
    "Sin": _elementwise(lambda x: x.sin()), "Cos": _elementwise(lambda x: x.cos()),
    "Tanh": _elementwise(nn.tanh), "Sigmoid": _elementwise(nn.sigmoid), "Relu": _elementwise(nn.relu),
    "Erf": _elementwise(nn.erf),
    "Gelu": lambda context, inputs, attrs: (nn.gelu if attrs.get("approximate", "none") == "tanh"
                                            else nn.gelu_exact)(context.tensor(inputs[0])),
    "Max": _elementwise(lambda *xs: _fold(nn.maximum, xs)), "Min": _elementwise(lambda *xs: _fold(nn.minimum, xs)),
    "Pow": _pow,
    "MatMul": _elementwise(lambda a, b: a @ b), "Gemm": _gemm,
    "Softmax": lambda context, inputs, attrs: nn.softmax(context.tensor(inputs[0]), attrs.get("axis", -1)),
    "LogSoftmax": lambda context, inputs, attrs: nn.log_softmax(context.tensor(inputs[0]), attrs.get("axis", -1)),
    "LayerNormalization": _layer_norm, "RMSNormalization": _rms_norm,
    "Conv": _conv, "ConvTranspose": _conv_transpose, "MaxPool": _max_pool, "AveragePool": _average_pool, "BatchNormalization": _batch_norm,
    "GlobalAveragePool": lambda context, inputs, attrs: nn.adaptive_avg_pool(
        context.tensor(inputs[0]), [1] * (context.tensor(inputs[0]).ndim - 2)),
    "ReduceMean": _reduce(lambda x, axis: x.mean(axis, keepdim=True)),
    "ReduceSum": _reduce(lambda x, axis: x.sum(axis, keepdim=True)),
    "ReduceMax": _reduce(lambda x, axis: x.max(axis, keepdim=True)),
    "Reshape": _reshape, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Expand": _expand,
    "Transpose": lambda context, inputs, attrs: context.tensor(inputs[0]).permute(
        *(attrs.get("perm") or list(reversed(range(context.tensor(inputs[0]).ndim))))),
    "Slice": _slice, "Split": _split, "Gather": _gather, "GatherND": _gather_nd,
    "Concat": lambda context, inputs, attrs: nn.concat([context.tensor(v) for v in inputs], attrs["axis"]),
    "Cast": _cast, "Where": _where, "ArgMax": _arg(nn.argmax), "ArgMin": _arg(nn.argmin), "CumSum": _cumsum,
    "IsNaN": _elementwise(lambda x: logical_not(equal(x, x))),
    "Equal": _elementwise(equal), "Less": _elementwise(lambda a, b: a < b), "Greater": _elementwise(lambda a, b: a > b),
    "LessOrEqual": _elementwise(lambda a, b: a <= b), "GreaterOrEqual": _elementwise(lambda a, b: a >= b),
    "Not": _elementwise(logical_not), "And": _elementwise(logical_and),
}


def _fold(fn: Callable[[Tensor, Tensor], Tensor], xs: Sequence[Tensor]) -> Tensor:
    out = xs[0]
    for x in xs[1:]:
        out = fn(out, x)
    return out
