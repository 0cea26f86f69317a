"""Saturation time and e-graph size for every example and for stacks of 1, 2, 4, 8 transformer blocks.

    python benchmarks/saturation.py            # the table (about a minute on a 2-core machine)
    python benchmarks/saturation.py --quick    # examples and one block only

Issue 3's targets: one block (attention + gated MLP + two RMSNorms, seq 2048, d 4096) saturates in under 10 s
and under 200k e-nodes on a 2-core machine, and the stack grows no worse than linearly in its depth.
Not part of the default pytest run; tests/rewrites/test_saturation.py runs the one-block case with a time limit.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import NamedTuple

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.model_loader import load_graph as load_example
from tensorsmith.rewrites import saturate

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SEQ, DIM, HEADS, FFN = 2048, 4096, 32, 11008


def block(g: ts.Graph, x: ts.Tensor, k: int, seq: int = SEQ, dim: int = DIM, heads: int = HEADS,
          ffn: int = FFN) -> ts.Tensor:
    """One pre-norm transformer block: x + attention(rms_norm(x)), then + gated-SiLU MLP(rms_norm(.))."""
    def weight(name: str, shape: tuple[int, ...]) -> ts.Tensor:
        return g.input(f"{name}{k}", shape, "float16")

    head_dim = dim // heads
    normed = nn.rms_norm(x, weight("attn_norm", (dim,)))

    def split(t: ts.Tensor) -> ts.Tensor:
        return t.reshape(1, seq, heads, head_dim).permute(0, 2, 1, 3)

    q, kk, v = (split(nn.linear(normed, weight(n, (dim, dim)))) for n in ("wq", "wk", "wv"))
    attended = nn.attention(q, kk, v, causal=True).permute(0, 2, 1, 3).reshape(seq, dim)
    h = x + nn.linear(attended, weight("wo", (dim, dim)))
    normed2 = nn.rms_norm(h, weight("mlp_norm", (dim,)))
    gate = nn.silu(nn.linear(normed2, weight("w_gate", (ffn, dim))))
    up = nn.linear(normed2, weight("w_up", (ffn, dim)))
    return h + nn.linear(gate * up, weight("w_down", (dim, ffn)))


def transformer(layers: int, **sizes: int) -> ts.Graph:
    """A stack of `layers` identical blocks (each with its own weights)."""
    g = ts.Graph(f"transformer_{layers}")
    x = g.input("x", (sizes.get("seq", SEQ), sizes.get("dim", DIM)), "float16")
    for k in range(layers):
        x = block(g, x, k, **sizes)
    g.output("y", x)
    return g


class Row(NamedTuple):
    """One saturated graph: its size, the e-graph's, the time, and why saturation and each stage stopped."""

    name: str
    nodes: int
    enodes: int
    eclasses: int
    seconds: float
    stopped: str
    stages: str       # "stage:e-nodes(why it stopped)" for every stage
    layers: int = 0   # the depth of a transformer stack; 0 for an example


def measure(name: str, graph: ts.Graph, layers: int = 0) -> Row:
    start = time.perf_counter()
    report = saturate(graph).report
    seconds = time.perf_counter() - start
    stops = dict(report.stage_stops)
    stages = " ".join(f"{stage}:{enodes}" + (f"({stops[stage]})" if stage in stops else "")
                      for stage, _, enodes, _ in report.per_stage())
    return Row(name, len(graph.nodes()), report.enodes, report.eclasses, seconds, report.stopped, stages, layers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="examples and one block only")
    args = parser.parse_args(argv)
    rows = [measure(path.stem, load_example(path)) for path in sorted(EXAMPLES.glob("*.py"))]
    for layers in (1,) if args.quick else (1, 2, 4, 8):
        rows.append(measure(f"{layers} block{'s' if layers > 1 else ''}", transformer(layers), layers))
    print(f"{'graph':<17} {'nodes':>6} {'e-nodes':>8} {'e-classes':>9} {'seconds':>8}  {'stopped':<10} "
          "e-nodes per stage (why the stage stopped)")
    for row in rows:
        print(f"{row.name:<17} {row.nodes:>6} {row.enodes:>8} {row.eclasses:>9} {row.seconds:>8.2f}  "
              f"{row.stopped:<10} {row.stages}")
    print(per_block_line([row for row in rows if row.layers]))
    return 0


def per_block_line(stacks: list[Row]) -> str:
    """E-nodes and seconds per block of each stack, relative to the one-block stack (1.00x: linear growth)."""
    one = next((row for row in stacks if row.layers == 1), None)
    if one is None or len(stacks) < 2:
        return ""
    return "per block, relative to one: " + ", ".join(
        f"{row.name}: {row.enodes / one.enodes / row.layers:.2f}x e-nodes, "
        f"{row.seconds / one.seconds / row.layers:.2f}x time" for row in stacks if row is not one)


if __name__ == "__main__":
    sys.exit(main())
