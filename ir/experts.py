"""A mixture of experts computed on the tokens routed to each expert only, with static shapes.

Each token picks k of E experts (`top_ids`, with `top_weights`). The T * k (token, expert) pairs are laid out as
rows grouped by expert, each expert's group padded to a whole number of `tile` rows, so that every tile of rows
belongs to one expert. The row layout is computed in the graph from one-hot counts (no sort):
- rank[p]: the number of earlier pairs routed to p's expert, a running sum;
- offset[e]: where expert e's group starts, a running sum of the padded group sizes;
- dest[p] = offset[expert of p] + rank[p], and each row's pair is the one whose dest it is (-1 for padding).
The rows hold the routed tokens' activations (a lookup), each tile is multiplied by its expert's weights (a
lookup along the experts, which the matmul copies from the selected expert's rows), and each token sums its k
rows, weighted. The work is the routed work plus at most E * (tile - 1) padding rows, against E / k times the
routed work when every expert runs on every token; the row count is the static bound T * k + E * (tile - 1).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .errors import ShapeError, user_location
from .nn import cumsum, silu, take
from .tensor import Tensor, equal, iota, where

TILE = 64   # rows a tile of routed tokens holds: the matmul's tile height


def grouped_rows(tokens: int, k: int, experts: int, tile: int = TILE) -> int:
    """The rows the grouped layout holds: every pair, and at most tile - 1 padding rows per expert, in whole tiles."""
    return -(-(tokens * k + experts * (tile - 1)) // tile) * tile


@dataclass(frozen=True)
class Routing:
    """Where each (token, expert) pair's row is, which token each row holds, and each tile's expert."""

    dest: Tensor          # (T * k,) int32: the row of each pair
    row_token: Tensor     # (rows,) int32: the token each row holds, -1 for padding
    tile_expert: Tensor   # (rows / tile,) int32: each tile's expert, -1 for a tile past the last group
    tile: int


def routing(top_ids: Tensor, experts: int, tile: int = TILE) -> Routing:
    """The row layout of the pairs `top_ids` (T, k) routes, grouped by expert and padded to whole tiles."""
    if top_ids.ndim != 2 or top_ids.dtype.value != "int32":
        raise ShapeError(f"routing: top_ids must be an int32 (tokens, k) tensor, got {top_ids.shape} "
                         f"{top_ids.dtype} at {user_location()}")
    tokens, k = top_ids.shape
    pairs = tokens * k
    rows = grouped_rows(tokens, k, experts, tile)
    onehot = equal(top_ids.reshape(pairs, 1).expand((pairs, experts)), iota((pairs, experts), 1)).cast("float32")
    rank = ((cumsum(onehot, 0) - onehot) * onehot).sum(1)                 # earlier pairs with the same expert
    counts = onehot.sum(0)
    padded = counts + float(tile - 1) - (counts + float(tile - 1)) % float(tile)
    offset = cumsum(padded, 0) - padded                                    # where each expert's rows start
    dest = (onehot * offset.reshape(1, experts).expand((pairs, experts))).sum(1) + rank
    at_row = equal(dest.reshape(1, pairs).expand((rows, pairs)), iota((rows, pairs), 0).cast("float32"))
    token = iota((tokens, k), 0).reshape(1, pairs).expand((rows, pairs)).cast("float32")
    row_token = where(at_row, token + 1.0, 0.0).sum(1) - 1.0
    starts = iota((rows // tile, experts), 0).cast("float32") * float(tile)
    low = offset.reshape(1, experts).expand(starts.shape)
    owns = ((low < starts + 1.0).cast("float32") * (starts < low + padded.reshape(1, experts).expand(starts.shape))
            .cast("float32"))
    tile_expert = (owns * (iota(starts.shape, 1).cast("float32") + 1.0)).sum(1) - 1.0
    return Routing(dest.cast("int32"), row_token.cast("int32"), tile_expert.cast("int32"), tile)


def grouped_experts(x: Tensor, top_ids: Tensor, top_weights: Tensor, gate: Tensor, up: Tensor, down: Tensor,
                    act: Callable[[Tensor], Tensor] = silu, tile: int = TILE) -> Tensor:
    """sum over each token's k experts e of weight * (act(x @ gate[e].T) * (x @ up[e].T)) @ down[e].T, for x (T, H),
    gate and up (E, F, H) and down (E, H, F), stored as nn.Linear stores its weight; computed on routed rows."""
    tokens, hidden = x.shape
    experts = gate.shape[0]
    k = top_ids.shape[1]
    layout = routing(top_ids, experts, tile)
    rows = layout.row_token.shape[0]
    routed = take(x, layout.row_token, 0).reshape(rows // tile, tile, hidden)   # padding rows: zeros

    def product(h: Tensor, weight: Tensor) -> Tensor:
        return h @ take(weight, layout.tile_expert, 0).transpose(1, 2)   # each tile times its expert's weight

    out = product(act(product(routed, gate)) * product(routed, up), down).reshape(rows, hidden)
    picked = take(out, layout.dest, 0).reshape(tokens, k, hidden)
    return (picked * top_weights.reshape(tokens, k, 1).cast(picked.dtype)).sum(1)
