"""Products of one activation with several of a module's weights, joined at import into one product.

A Llama layer multiplies its normed input by the q, k and v weights, then by the gate and up weights: five products
where two suffice. Each alone leaves the GPU under-filled at prefill sizes (k and v at 512 tokens are 512 x 512
outputs: 16 tiles of 128 x 128 for 132 SMs) and pays its own launch. Where torch.export's graph multiplies one value
(the same node, seen through views) by several parameters of one dtype and inner size, each transposed as
nn.Linear's weight is, the importer concatenates those weights (and biases) once, binds the result as one input,
computes one product over it, and gives each member its columns: exact, since the products are computed as they
were, side by side. The members' own weights are then read by nothing and dropped.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tensorsmith.ir.tensor import Tensor

from .imported import ImportedModel

VIEWS = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")
PRODUCTS = {"aten.mm.default": (None, 0, 1), "aten.addmm.default": (0, 1, 2)}   # (bias, lhs, rhs) positions


@dataclass
class JoinedProduct:
    """Products of one lhs with several weights: the first member computes them all, each takes its columns."""

    members: list[Any]                   # the mm / addmm FX nodes, in graph order
    weights: list[str]                   # each member's weight, as the module names it (its state_dict key)
    biases: list[str]                    # each member's bias (addmm), or none at all (mm)
    value: Tensor | None = field(default=None, repr=False)

    def member(self, node: Any, values: dict[str, Any], imported: ImportedModel,
               state: dict[str, Any]) -> Tensor | None:
        """`node`'s product: its columns of the joined product, which is lowered at the first member (None where
        the lhs is no graph value: PyTorch folds such a product at import)."""
        lhs = values[node.args[PRODUCTS[str(node.target)][1]].name]
        if not isinstance(lhs, Tensor):
            return None
        if self.value is None:
            import torch
            weight = torch.cat([state[name].detach() for name in self.weights])
            joined = lhs @ imported.bind(_joined_name(self.weights), weight, tuple(weight.shape),
                                         lhs.dtype).transpose(0, 1)
            if self.biases:
                bias = torch.cat([state[name].detach() for name in self.biases])
                joined = joined + imported.bind(_joined_name(self.biases), bias, tuple(bias.shape), lhs.dtype)
            self.value = joined
        start = sum(_columns(m) for m in self.members[:self.members.index(node)])
        return self.value[:, start:start + _columns(node)]


def joined_products(exported: Any) -> dict[str, JoinedProduct]:
    """The joinable products of an exported program, by member node name (each group of two or more)."""
    targets = {spec.arg.name: spec.target for spec in exported.graph_signature.input_specs
               if spec.kind.name == "PARAMETER"}
    groups: dict[tuple, list[tuple[Any, str, str | None]]] = {}
    for node in exported.graph.nodes:
        positions = PRODUCTS.get(str(node.target)) if node.op == "call_function" else None
        if positions is None or node.kwargs or not all(hasattr(a, "op") for a in node.args):   # alpha, beta: 1
            continue
        bias_at, lhs_at, rhs_at = positions
        weight = _linear_weight(node.args[rhs_at], targets)
        bias = targets.get(node.args[bias_at].name) if bias_at is not None else None
        if weight is None or (bias_at is not None and bias is None):
            continue
        lhs = node.args[lhs_at]
        key = (_root(lhs).name, tuple(lhs.meta["val"].shape), str(lhs.meta["val"].dtype), bias_at is not None)
        groups.setdefault(key, []).append((node, weight, bias))
    joined: dict[str, JoinedProduct] = {}
    for members in groups.values():
        weights = [weight for _, weight, _ in members]
        if len(members) < 2 or len(set(weights)) < len(weights):   # a weight used twice: nothing to join
            continue
        group = JoinedProduct([node for node, _, _ in members], weights,
                              [bias for _, _, bias in members if bias is not None])
        joined.update({node.name: group for node in group.members})
    return joined


def _linear_weight(rhs: Any, targets: dict[str, str]) -> str | None:
    """The parameter whose transpose `rhs` is (as nn.Linear multiplies by its weight), or None."""
    if (rhs.op == "call_function" and str(rhs.target) == "aten.permute.default" and list(rhs.args[1]) == [1, 0]
            and rhs.args[0].op == "placeholder"):
        return targets.get(rhs.args[0].name)
    return None


def _root(node: Any) -> Any:
    """The node under a chain of views."""
    while node.op == "call_function" and str(node.target) in VIEWS:
        node = node.args[0]
    return node


def _columns(node: Any) -> int:
    return int(node.meta["val"].shape[-1])


def _joined_name(names: list[str]) -> str:
    """q_proj.weight, k_proj.weight and v_proj.weight under one module: that module's q_proj_k_proj_v_proj.weight."""
    parts = [name.split(".") for name in names]
    head = 0
    while all(len(p) > head + 1 and p[head] == parts[0][head] for p in parts):
        head += 1
    tail = 0
    while all(len(p) > head + tail + 1 and p[-1 - tail] == parts[0][-1 - tail] for p in parts):
        tail += 1
    middle = "_".join(".".join(p[head:len(p) - tail]) for p in parts)
    return ".".join(parts[0][:head] + [middle] + (parts[0][len(parts[0]) - tail:] if tail else []))
