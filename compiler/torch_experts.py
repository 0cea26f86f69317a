"""transformers' mixture-of-experts layers in forms with static shapes, for the export.

Their default groups the tokens by expert (a sort, a histogram, products of sizes known only at run time), which
no static-shape graph holds; their `batched_mm` form gathers each routed (token, expert) pair's weights, tokens
times experts' size, which fits small configurations only. Here, by size:
- many tokens (prefill): the experts' products on the routed tokens only, grouped by expert in whole tiles
  (`ir/experts.py`), through the op `tensorsmith::grouped_experts`, which the import lowers to that graph;
- a few tokens: each expert on every token as one batched product over the experts (x read once, each expert's
  weights read once), and each token's output its experts' outputs weighted by their routing weights, zero for
  the experts it was not routed to (added zeros change nothing): experts / k times the routed work;
- fewer pairs routed than there are experts (decoding): each pair's product over its own expert's weights.
The grouped form holds the standard gated layer (gate and up concatenated, no bias, nn.Linear's layout, SiLU, no
norm after the experts, Mixtral's and Qwen-MoE's); any other layer takes the dense form.
"""
from __future__ import annotations

from typing import Any

from tensorsmith.ir.experts import grouped_rows

NAME = "tensorsmith_static"      # the experts implementation's name in transformers' ExpertsInterface
GROUPED_OP = "tensorsmith::grouped_experts"
GROUPED_ACTIVATIONS = ("SiLU", "SiLUActivation")   # the act_fn classes the grouped op computes (as silu)


def experts_forward(experts: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """The experts' output for (tokens, hidden) states routed to `top_k_index` with `top_k_weights`, as
    transformers' experts forward functions take them (`experts` is the layer holding the stacked weights), in the
    form of least work for these sizes."""
    import torch
    from transformers.integrations.moe import batched_mm_experts_forward
    tokens, k = top_k_index.shape
    if tokens * k < experts.num_experts:
        return batched_mm_experts_forward(experts, hidden_states, top_k_index, top_k_weights)
    if grouped_rows(tokens, k, experts.num_experts) < tokens * experts.num_experts and _grouped_layout(experts):
        return torch.ops.tensorsmith.grouped_experts(hidden_states, top_k_index, top_k_weights,
                                                     experts.gate_up_proj, experts.down_proj)
    return _dense(experts, hidden_states, top_k_index, top_k_weights)


def _dense(experts: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """Every expert on every token, each token's output weighted by its routing weights."""
    gated = _flag(experts, "has_gate", True)
    up = experts.gate_up_proj if gated else experts.up_proj
    out = _products(hidden_states.unsqueeze(0), up, experts, "gate_up_proj_bias" if gated else
                    "up_proj_bias")                                                        # (experts, tokens, *)
    out = _gated(experts, out) if gated else experts.act_fn(out)
    out = _products(out, experts.down_proj, experts, "down_proj_bias")                    # (experts, tokens, hidden)
    if _flag(experts, "has_post_expert_norm", False):
        out = experts.post_expert_norm(out)
    return _combined(out, top_k_index, top_k_weights, hidden_states.dtype)


def _combined(out: Any, top_k_index: Any, top_k_weights: Any, dtype: Any) -> Any:
    """Each token's sum of the experts' outputs `out` (experts, tokens, hidden), weighted by its routing weights
    (zero for the experts it was not routed to)."""
    import torch
    routed = torch.arange(out.shape[0], device=top_k_index.device)
    picked = (top_k_index.unsqueeze(-1) == routed).to(top_k_weights.dtype)              # (tokens, k, experts)
    weights = (picked * top_k_weights.unsqueeze(-1)).sum(dim=1)                         # (tokens, experts)
    return (out * weights.transpose(0, 1).unsqueeze(-1).to(out.dtype)).sum(dim=0).to(dtype)


def _grouped_reference(hidden: Any, top_k_index: Any, top_k_weights: Any, gate_up: Any, down: Any) -> Any:
    """What `tensorsmith::grouped_experts` computes, in PyTorch (outside the export): the routed experts' SiLU-gated
    products, weighted."""
    import torch
    gate, up = (hidden.unsqueeze(0) @ gate_up.transpose(1, 2)).chunk(2, dim=-1)
    out = (torch.nn.functional.silu(gate) * up) @ down.transpose(1, 2)
    return _combined(out, top_k_index, top_k_weights, hidden.dtype)


def _grouped_layout(experts: Any) -> bool:
    """Whether the layer is the standard gated one the grouped op computes."""
    from transformers.integrations import moe
    own_gate = getattr(type(experts), "_apply_gate", moe._default_apply_gate)
    return (_flag(experts, "has_gate", True) and _flag(experts, "is_concatenated", True)
            and not _flag(experts, "has_bias", False) and not _flag(experts, "is_transposed", False)
            and not _flag(experts, "has_post_expert_norm", False) and own_gate is moe._default_apply_gate
            and type(experts.act_fn).__name__ in GROUPED_ACTIVATIONS)


def _products(x: Any, weight: Any, experts: Any, bias_name: str) -> Any:
    """x @ each expert's weight (stored (experts, out, in), or (experts, in, out) where transposed), with its
    bias where the layer has biases."""
    product = x @ (weight if _flag(experts, "is_transposed", False) else weight.transpose(1, 2))
    return product + getattr(experts, bias_name).unsqueeze(1) if _flag(experts, "has_bias", False) else product


def _gated(experts: Any, gate_up: Any) -> Any:
    """The layer's own gating of its gate and up halves where it has one, else act(gate) * up."""
    if hasattr(experts, "_apply_gate"):
        return experts._apply_gate(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return experts.act_fn(gate) * up


def _flag(experts: Any, name: str, default: bool) -> bool:
    """A layout flag of the experts layer; older transformers (5.17) set fewer of them, and mean the default."""
    return bool(getattr(experts, name, default))


def _define_grouped_op() -> None:
    """The op `tensorsmith::grouped_experts(hidden, top_k_index, top_k_weights, gate_up, down)`, once."""
    import torch
    if hasattr(torch.ops.tensorsmith, "grouped_experts"):
        return
    op = torch.library.custom_op(GROUPED_OP, _grouped_reference, mutates_args=(), schema=(
        "(Tensor hidden, Tensor top_k_index, Tensor top_k_weights, Tensor gate_up, Tensor down) -> Tensor"))
    op.register_fake(lambda hidden, *_: torch.empty_like(hidden))


def register() -> bool:
    """Make the forms known to transformers' ExpertsInterface (where this transformers has one): whether it is."""
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError:
        return False
    _define_grouped_op()
    ExpertsInterface.register(NAME, experts_forward)
    return True
