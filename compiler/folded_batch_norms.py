"""Batch normalisation in eval mode folded into the convolution before it, at import (torch.export's graphs here, ONNX
graphs by `onnx_import`, both with `folded_weight_and_bias`).

A CNN's convolution is followed by a batch norm whose running statistics and affine parameters are constants of the
module: y = (conv(x, W) + b - mean) * gamma / sqrt(var + eps) + beta is conv(x, W * s) + (b - mean) * s + beta with
s = gamma / sqrt(var + eps) per output channel. Where torch.export's graph feeds a convolution's output to nothing
but such a batch norm, and every one of those tensors is a parameter or buffer of the module, the importer computes
the folded weight and bias once (in float64, stored in the weight's dtype), binds them, and lowers the pair as one
convolution: the per-channel scale and shift no longer run, and the norm's four tensors are not read.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensorsmith.ir import nn
from tensorsmith.ir.tensor import Tensor

from .imported import ImportedModel

CONVOLUTION = "aten.convolution.default"
BATCH_NORM = "aten._native_batch_norm_legit_no_training.default"


@dataclass
class FoldedBatchNorm:
    """A convolution and the batch norm that alone reads it: the convolution lowered with the folded weight and
    bias, the norm as that convolution's output."""

    convolution: Any                      # the FX nodes
    norm: Any
    names: dict[str, str | None]          # weight, bias, gamma, beta, mean, var -> state_dict keys (bias, gamma,
    value: Tensor | None = field(default=None, repr=False)   # beta may be None: absent)

    def member(self, node: Any, values: dict[str, Any], imported: ImportedModel,
               state: dict[str, Any]) -> Any:
        """The folded convolution for the convolution node, (it, None, None) for the norm's node, or None where the
        input is no graph value (PyTorch folds such a convolution at import)."""
        if node is self.norm:
            return (self.value, None, None) if self.value is not None else None
        x = values[node.args[0].name]
        if not isinstance(x, Tensor):
            return None
        given = {key: state[name].detach().double().cpu().numpy() if name else None
                 for key, name in self.names.items()}
        like = state[self.names["weight"]]   # the folded pair made torch tensors of the weight's dtype
        weight, bias = (like.new_tensor(array, dtype=like.dtype, device="cpu")
                        for array in folded_weight_and_bias(**given, eps=float(self.norm.args[6])))
        stride, padding, dilation, _, _, groups = node.args[3:9]
        base = self.names["weight"].removesuffix(".weight")
        self.value = nn.conv(x, imported.bind(f"{base}.folded_weight", weight, tuple(weight.shape), x.dtype),
                             imported.bind(f"{base}.folded_bias", bias, tuple(bias.shape), x.dtype),
                             list(stride), list(padding), list(dilation), int(groups))
        return self.value


def folded_batch_norms(exported: Any) -> dict[str, FoldedBatchNorm]:
    """The convolution and batch norm pairs of an exported program that fold, by both nodes' names."""
    constants = {spec.arg.name: spec.target for spec in exported.graph_signature.input_specs
                 if spec.kind.name in ("PARAMETER", "BUFFER")}
    folded: dict[str, FoldedBatchNorm] = {}
    for norm in exported.graph.nodes:
        if norm.op != "call_function" or str(norm.target) != BATCH_NORM:
            continue
        conv = norm.args[0]
        if (conv.op != "call_function" or str(conv.target) != CONVOLUTION or len(conv.users) != 1
                or conv.args[6]):   # transposed
            continue
        names = {"weight": _constant(conv.args[1], constants), "bias": _constant(conv.args[2], constants),
                 "gamma": _constant(norm.args[1], constants), "beta": _constant(norm.args[2], constants),
                 "mean": _constant(norm.args[3], constants), "var": _constant(norm.args[4], constants)}
        given = {"weight": conv.args[1], "bias": conv.args[2], "gamma": norm.args[1], "beta": norm.args[2],
                 "mean": norm.args[3], "var": norm.args[4]}
        if any(names[key] is None and (given[key] is not None or key in ("weight", "mean", "var")) for key in names):
            continue   # some tensor is computed, or given as an input: nothing to fold at import
        pair = FoldedBatchNorm(conv, norm, names)
        folded.update({conv.name: pair, norm.name: pair})
    return folded


def _constant(arg: Any, constants: dict[str, str]) -> str | None:
    return constants.get(arg.name) if arg is not None and getattr(arg, "op", None) == "placeholder" else None


def folded_weight_and_bias(weight: np.ndarray, bias: np.ndarray | None, gamma: np.ndarray | None,
                           beta: np.ndarray | None, mean: np.ndarray, var: np.ndarray,
                           eps: float) -> tuple[np.ndarray, np.ndarray]:
    """W * s and (b - mean) * s + beta, s = gamma / sqrt(var + eps) per output channel (W's first axis), in float64:
    each route rounds them to the weight's dtype once."""
    scale = 1.0 / np.sqrt(np.asarray(var, np.float64) + eps)
    if gamma is not None:
        scale = scale * np.asarray(gamma, np.float64)
    shift = -np.asarray(mean, np.float64) * scale
    if bias is not None:
        shift = shift + np.asarray(bias, np.float64) * scale
    if beta is not None:
        shift = shift + np.asarray(beta, np.float64)
    return np.asarray(weight, np.float64) * scale.reshape((-1,) + (1,) * (np.ndim(weight) - 1)), shift

