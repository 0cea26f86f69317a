"""What this machine's host does per element, for the verification of a real-size model: float16 widening (one
thread and every core), a float32 and a float64 product of a layer's size, drawing 16-bit normals, and the float64
reference of a model of Llama-3.2-1B's shape alone, with nothing else running.

    python benchmarks/host_throughput.py [--layers 2]
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from tensorsmith.ir.host_arrays import cast_into
from tensorsmith.search.verify import random_inputs, reference_draw


def seconds(work, repeat: int = 3) -> float:
    work()
    began = time.perf_counter()
    for _ in range(repeat):
        work()
    return (time.perf_counter() - began) / repeat


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    print(f"numpy {np.__version__}, {len(os.sched_getaffinity(0))} cores")
    n = 1 << 24
    half = np.random.default_rng(0).standard_normal(n, dtype=np.float32).astype(np.float16).reshape(4096, 4096)
    for width in (np.float32, np.float64):
        out = np.empty_like(half, dtype=width)
        one = seconds(lambda: np.copyto(out, half))
        every = seconds(lambda: cast_into(out, half))
        print(f"float16 -> {np.dtype(width).name}: {one / n * 1e9:.2f} ns an element on one core,"
              f" {every / n * 1e9:.2f} on every core")
    for width, name in ((np.float32, "float32"), (np.float64, "float64")):
        a, b = np.ones((512, 2048), width), np.ones((2048, 8192), width)
        took = seconds(lambda: a @ b)
        print(f"{name} 512 x 2048 x 8192 product: {took * 1e3:.1f} ms, {2 * 512 * 2048 * 8192 / took / 1e9:.0f} GFLOP/s")
    from tensorsmith.bench.case import built, load_suite, select
    case = built(select(load_suite(), [f"llama1b_{args.layers}layers"])[0])
    began = time.perf_counter()
    inputs = random_inputs(case.graph, 0)
    drew = time.perf_counter() - began
    elements = sum(a.size for a in inputs.values())
    began = time.perf_counter()
    reference_draw(case.graph, 0, 0)
    print(f"llama1b_{args.layers}layers alone: drew {elements / 1e6:.0f} M elements in {drew:.2f} s;"
          f" draw and float64 reference {time.perf_counter() - began:.2f} s")


if __name__ == "__main__":
    main()
