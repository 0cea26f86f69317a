"""Mixture-of-experts routing with static shapes: the pairs' rows grouped by expert in whole tiles, and the experts
computed on those rows give what each token's own experts give."""
from __future__ import annotations

import numpy as np
import pytest

import tensorsmith as ts
from tensorsmith.ir.experts import grouped_experts, routing
from tensorsmith.search.verify import compare

TOKENS, K, EXPERTS, HIDDEN, FFN, TILE = 24, 2, 4, 32, 48, 8


def _routes(rng: np.random.Generator) -> np.ndarray:
    """Each token's k distinct experts; expert 3 gets none, expert 0 more than two tiles' worth."""
    ids = np.stack([rng.permutation(3)[:K] for _ in range(TOKENS)]).astype(np.int32)
    ids[:20, 0] = 0
    return ids


def test_each_pair_has_a_row_of_its_own_in_a_tile_of_its_expert() -> None:
    g = ts.Graph("routing")
    layout = routing(g.input("ids", (TOKENS, K), "int32"), EXPERTS, TILE)
    g.output("dest", layout.dest)
    g.output("row_token", layout.row_token)
    g.output("tile_expert", layout.tile_expert)
    ids = _routes(np.random.default_rng(0))
    out = ts.evaluate(g, {"ids": ids})
    dest, row_token, tile_expert = (out[name].astype(np.int64) for name in ("dest", "row_token", "tile_expert"))
    rows = TOKENS * K + EXPERTS * (TILE - 1)
    assert row_token.shape == (-(-rows // TILE) * TILE,) and len(set(dest)) == TOKENS * K
    pair_token = np.repeat(np.arange(TOKENS), K)
    assert (row_token[dest] == pair_token).all()                       # each row holds its pair's token
    assert (tile_expert[dest // TILE] == ids.reshape(-1)).all()         # in a tile of the pair's expert
    assert (np.delete(row_token, dest) == -1).all()                     # every other row is padding
    assert EXPERTS - 1 not in tile_expert and (tile_expert == -1).any()  # no tile for an expert with no pairs


def _moe_graph(dtype: str) -> ts.Graph:
    g = ts.Graph("moe")
    x, ids, weights = (g.input("x", (TOKENS, HIDDEN), dtype), g.input("ids", (TOKENS, K), "int32"),
                       g.input("weights", (TOKENS, K), dtype))
    gate, up = g.input("gate", (EXPERTS, FFN, HIDDEN), dtype), g.input("up", (EXPERTS, FFN, HIDDEN), dtype)
    down = g.input("down", (EXPERTS, HIDDEN, FFN), dtype)
    g.output("y", grouped_experts(x, ids, weights, gate, up, down, tile=TILE))
    return g


def _inputs(dtype: type) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    scaled = {"x": (1.0, (TOKENS, HIDDEN)), "weights": (0.5, (TOKENS, K)), "gate": (0.2, (EXPERTS, FFN, HIDDEN)),
              "up": (0.2, (EXPERTS, FFN, HIDDEN)), "down": (0.15, (EXPERTS, HIDDEN, FFN))}
    arrays = {name: (rng.standard_normal(shape) * scale).astype(dtype) for name, (scale, shape) in scaled.items()}
    return {**arrays, "ids": _routes(rng)}


def test_the_routed_experts_give_each_tokens_weighted_sum_of_its_experts() -> None:
    inputs = _inputs(np.float32)
    got = ts.evaluate(_moe_graph("float32"), inputs)["y"]
    want = np.zeros((TOKENS, HIDDEN))
    for token in range(TOKENS):
        x = inputs["x"][token].astype(np.float64)
        for slot in range(K):
            e = inputs["ids"][token, slot]
            gate, up = x @ inputs["gate"][e].T, x @ inputs["up"][e].T
            want[token] += inputs["weights"][token, slot] * ((gate / (1 + np.exp(-gate)) * up) @ inputs["down"][e].T)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_compiled_no_expert_weight_is_gathered_into_a_buffer(device: str) -> None:
    """The program matches the interpreter, and each tile reads its expert's weights where they are: no buffer of
    the gathered weights (tiles x FFN x HIDDEN) is written."""
    graph = _moe_graph("float16")
    program = ts.compile(graph, budget_s=10, profile=False, cache=False)
    tiles = -(-(TOKENS * K + EXPERTS * (TILE - 1)) // TILE)
    assert not [b for b in program.buffers.values() if b.shape in ((tiles, FFN, HIDDEN), (tiles, HIDDEN, FFN))]
    inputs = _inputs(np.float16)
    for check in compare(graph, program(device=device, **inputs), ts.evaluate(graph, inputs)):
        assert check.ok, check
