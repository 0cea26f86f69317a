"""Benchmark: tensorsmith's tensor-core matmul archetype against torch.matmul (cuBLAS) in one run.

Shapes are issue 5's: 4096^3, and LLM shapes with M = 16, 128, 4096 and N, K from {4096, 11008}. Each
output is checked against a float64 reference before its timing is printed.

    python benchmarks/matmul.py [--dtype float16|bfloat16] [--quick]
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

import tensorsmith as ts
from tensorsmith.search.verify import random_inputs, relative_l2

from memory_bound import time_torch

SHAPES = [(4096, 4096, 4096), (16, 4096, 4096), (128, 4096, 4096), (16, 11008, 4096), (128, 4096, 11008),
          (4096, 11008, 4096)]


def matmul_graph(m: int, n: int, k: int, dtype: str) -> ts.Graph:
    g = ts.Graph(f"matmul_{m}x{n}x{k}")
    g.output("c", g.input("a", (m, k), dtype) @ g.input("b", (k, n), dtype))
    return g


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    parser.add_argument("--quick", action="store_true", help="only the first three shapes")
    args = parser.parse_args()
    torch_dtype = getattr(torch, args.dtype)
    print(f"{'M x N x K':22s} {'tensorsmith':>12s} {'TFLOP/s':>8s} {'cuBLAS':>10s} {'TFLOP/s':>8s} {'ratio':>6s}")
    for m, n, k in SHAPES[:3] if args.quick else SHAPES:
        graph = matmul_graph(m, n, k, args.dtype)
        program = ts.compile(graph, profile=True, cache=False)
        inputs = random_inputs(graph, seed=1)
        tensors = [torch.from_numpy(inputs[name]).to(torch_dtype).cuda() for name in ("a", "b")]
        reference = np.matmul(inputs["a"].astype(np.float64), inputs["b"].astype(np.float64))
        assert relative_l2(torch.matmul(*tensors).float().cpu().numpy(), reference) < 1e-2
        ours_ms, theirs_ms = program.report["total_ms"], time_torch(torch.matmul, tensors)
        flops = 2.0 * m * n * k
        print(f"{m:5d} x {n:5d} x {k:5d}  {ours_ms * 1000:9.1f} us {flops / ours_ms / 1e9:8.1f} "
              f"{theirs_ms * 1000:7.1f} us {flops / theirs_ms / 1e9:8.1f} {theirs_ms / ours_ms:6.2f}")


if __name__ == "__main__":
    main()
