"""transformers' mixture-of-experts layers in a form with static shapes, for the export: every expert on every token.

Their default groups the tokens by expert (a sort, a histogram, products of sizes known only at run time), which
no static-shape graph holds; their `batched_mm` form gathers each routed (token, expert) pair's weights, tokens
times experts' size, which fits small configurations only. Here each expert runs on every token as one batched
product over the experts (x read once, each expert's weights read once), and a token's output sums its experts'
outputs weighted by their routing weights, zero for the experts it was not routed to: the routed experts' sum,
exactly (added zeros change nothing). The work is experts / top-k times the routed work; the weights are read once
each, as any grouping reads them when every expert gets a token. Where fewer pairs are routed than there are
experts (decoding), each pair's product over its own expert's weights reads less, and is taken instead.
"""
from __future__ import annotations

from typing import Any

NAME = "tensorsmith_dense"      # the experts implementation's name in transformers' ExpertsInterface


def dense_experts_forward(experts: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """The experts' output for (tokens, hidden) states routed to `top_k_index` with `top_k_weights`, as
    transformers' experts forward functions take them (`experts` is the layer holding the stacked weights). Where
    fewer (token, expert) pairs are routed than there are experts (decoding a token), each pair's product over its
    expert's weights (transformers' batched_mm) reads fewer weights, and is taken."""
    import torch
    from transformers.integrations.moe import batched_mm_experts_forward
    if top_k_index.numel() < experts.num_experts:
        return batched_mm_experts_forward(experts, hidden_states, top_k_index, top_k_weights)
    routed = torch.arange(experts.num_experts, device=top_k_index.device)
    picked = (top_k_index.unsqueeze(-1) == routed).to(top_k_weights.dtype)              # (tokens, k, experts)
    weights = (picked * top_k_weights.unsqueeze(-1)).sum(dim=1)                         # (tokens, experts)
    gated = _flag(experts, "has_gate", True)
    up = experts.gate_up_proj if gated else experts.up_proj
    out = _products(hidden_states.unsqueeze(0), up, experts, "gate_up_proj_bias" if gated else
                    "up_proj_bias")                                                        # (experts, tokens, *)
    out = _gated(experts, out) if gated else experts.act_fn(out)
    out = _products(out, experts.down_proj, experts, "down_proj_bias")                    # (experts, tokens, hidden)
    if _flag(experts, "has_post_expert_norm", False):
        out = experts.post_expert_norm(out)
    combined = (out * weights.transpose(0, 1).unsqueeze(-1).to(out.dtype)).sum(dim=0)
    return combined.to(hidden_states.dtype)


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


def register() -> bool:
    """Make the form known to transformers' ExpertsInterface (where this transformers has one): whether it is."""
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError:
        return False
    ExpertsInterface.register(NAME, dense_experts_forward)
    return True
