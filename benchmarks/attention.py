"""Benchmark: tensorsmith's attention archetype against torch's scaled_dot_product_attention in one run.

Rows: causal prefill (batch 4, 32 heads, 2048 tokens, head dim 128), the same without the mask, and decode
(1 query against 4096 keys, batch 4, 32 heads, head dim 128). Our output is checked against SDPA's (SDPA's
itself spot-checked against a float64 reference on two heads) before its timing counts; both are timed with
CUDA events, L2 flushed before each run, in turns (memory_bound.time_interleaved), median of 60.

    python benchmarks/attention.py [--dtype float16|bfloat16] [--sweep]   # the kernel, timed directly
    python benchmarks/attention.py --compile [--tokens 512] [--budget 60] # through ts.compile (profile=True)

By default the kernel is rendered at codegen's default schedule (`--sweep`: under each schedule of SWEEP too)
and run on torch's tensors in place. `--compile` goes through the whole compiler as a user would and reports
`program.report["total_ms"]`; its verification runs the float64 reference on the host, so keep --tokens
modest there.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable

import numpy as np
import torch

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.codegen import runtime
from tensorsmith.codegen.nvrtc import compile_cubin
from tensorsmith.codegen.render import render_kernel
from tensorsmith.codegen.tensor_map import launch_arguments
from tensorsmith.ir.kernel_program import Schedule
from tensorsmith.search.partition import partition
from tensorsmith.search.verify import relative_l2

from memory_bound import time_interleaved, time_torch

# (label, batch, heads, queries, keys, head dim, causal)
ROWS = [("causal prefill", 4, 32, 2048, 2048, 128, True),
        ("prefill", 4, 32, 2048, 2048, 128, False),
        ("decode", 4, 32, 1, 4096, 128, False)]
SWEEP = [None, dict(bq=128, bkv=128, wgmma=1), dict(bq=128, bkv=64, wgmma=1), dict(bq=128, bkv=64, wgmma=0),
         dict(bq=128, bkv=128, wgmma=0), dict(bq=64, bkv=64, wgmma=0), dict(bq=16, bkv=32, wgmma=0)]
# None: codegen's default for the shape


def attention_graph(batch: int, heads: int, queries: int, keys: int, dim: int, dtype: str, causal: bool) -> ts.Graph:
    g = ts.Graph(f"attention_{queries}x{keys}")
    q = g.input("q", (batch, heads, queries, dim), dtype)
    k = g.input("k", (batch, heads, keys, dim), dtype)
    v = g.input("v", (batch, heads, keys, dim), dtype)
    g.output("o", nn.attention(q, k, v, causal=causal))
    return g


def reference_head(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> np.ndarray:
    """softmax(q k^T / sqrt(d) + mask) v for one head in float64 (the mask as nn.attention's: bottom-right)."""
    q64, k64, v64 = (t.double().cpu().numpy() for t in (q, k, v))
    scores = q64 @ k64.T / math.sqrt(q64.shape[-1])
    if causal:
        rows, cols = np.indices(scores.shape)
        scores = np.where(cols > rows + (k64.shape[0] - q64.shape[0]), -np.inf, scores)
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v64


def _row(label: str, ours_ms: float, theirs_ms: float, flops: float, nbytes: float) -> str:
    rate = (lambda ms: f"{flops / ms / 1e9:8.1f} TF") if flops else (lambda ms: f"{nbytes / ms / 1e6:8.0f} GB/s")
    return (f"{label:40s} {ours_ms * 1000:9.1f} us {rate(ours_ms)} {theirs_ms * 1000:9.1f} us {rate(theirs_ms)} "
            f"{theirs_ms / ours_ms:6.2f}")


def kernel_run(graph: ts.Graph, schedule: dict[str, int] | None, tensors: dict[str, torch.Tensor],
               expected: torch.Tensor) -> tuple[Callable[[], None] | None, str]:
    """The graph's attention kernel under `schedule` on torch's tensors (zero copy), checked: a launch of it to
    time, or None where its output is wrong."""
    program = partition(graph)
    assert [k.archetype for k in program.kernels] == ["attention"], [k.archetype for k in program.kernels]
    kernel = program.kernels[0]
    if schedule is not None:
        kernel = dataclasses.replace(kernel, schedule=Schedule.of(**schedule))
    rendered = render_kernel(dataclasses.replace(program, kernels=[kernel]), 0)
    function = runtime.Module(compile_cubin(rendered.source, rendered.name, arch=rendered.arch or "sm_90")
                              ).function(rendered.entry)
    args = launch_arguments(rendered.params, rendered.tensor_maps, {name: t.data_ptr() for name, t in tensors.items()})

    def run() -> None:
        runtime.launch(function, rendered.grid, rendered.block, args, rendered.shared_bytes)
    label = ("default " if schedule is None else "") + str(rendered.schedule)
    tensors["o"].fill_(float("nan"))
    run()
    runtime.synchronize()
    error = relative_l2(tensors["o"].float().cpu().numpy(), expected.float().cpu().numpy())
    if not error < 1e-2:
        return None, f"{label}: WRONG, relative L2 {error:.3g} against SDPA"
    return run, label


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    parser.add_argument("--sweep", action="store_true", help="time the kernel under each schedule of SWEEP")
    parser.add_argument("--compile", action="store_true", help="through ts.compile(profile=True), as a user would")
    parser.add_argument("--tokens", type=int, default=2048, help="prefill tokens (decode keys: twice as many)")
    parser.add_argument("--budget", type=float, default=60.0, help="ts.compile's search budget in seconds")
    args = parser.parse_args()
    torch_dtype = getattr(torch, args.dtype)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    print(f"{args.dtype}: {'':40s} {'tensorsmith':>12s} {'':11s} {'SDPA':>12s} {'':11s} {'ratio':>6s}")
    for label, batch, heads, queries, keys, dim, causal in ROWS:
        queries = args.tokens if queries > 1 else queries
        keys = args.tokens if queries > 1 else 2 * args.tokens
        graph = attention_graph(batch, heads, queries, keys, dim, args.dtype, causal)
        generator = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn((batch, heads, queries, dim), generator=generator, device="cuda").to(torch_dtype)
        k, v = (torch.randn((batch, heads, keys, dim), generator=generator, device="cuda").to(torch_dtype)
                for _ in range(2))
        # SDPA's causal mask is top-left aligned; nn.attention's bottom-right one is the same for square scores
        expected = sdpa(q, k, v, is_causal=causal)
        for b, h in ((0, 0), (batch - 1, heads - 1)):
            spot = relative_l2(expected[b, h].double().cpu().numpy(), reference_head(q[b, h], k[b, h], v[b, h], causal))
            assert spot < 1e-2, f"SDPA itself is off by {spot:.3g} on head {b}, {h}"
        visible = queries * (queries + 1) / 2 if causal else queries * keys
        flops = 4.0 * batch * heads * visible * dim if queries > 1 else 0.0
        nbytes = (q.numel() + k.numel() + v.numel() + q.numel()) * q.element_size()
        title = f"{label} {batch}x{heads}x{queries}x{keys}x{dim}"
        if args.compile:
            theirs_ms = time_torch(lambda: sdpa(q, k, v, is_causal=causal), (), repeat=30)
            program = ts.compile(graph, profile=True, cache=False, budget_s=args.budget)
            out = program(q=q, k=k, v=v)["o"]
            error = relative_l2(out.float().cpu().numpy(), expected.float().cpu().numpy())
            kernels = ", ".join(f"{kern.archetype}[{kern.schedule}]" for kern in program.kernels)
            if not error < 1e-2:
                print(f"{title:40s} WRONG: relative L2 {error:.3g} against SDPA ({kernels})")
                continue
            print(_row(title, program.report["total_ms"], theirs_ms, flops, nbytes) + f"  {kernels}")
            continue
        tensors = {"q": q, "k": k, "v": v, "o": torch.empty_like(q)}
        print(title)
        for schedule in SWEEP if args.sweep else [None]:
            run, how = kernel_run(graph, schedule, tensors, expected)
            if run is None:
                print(f"  {how}")
                continue
            times = time_interleaved({"ours": run, "sdpa": lambda: sdpa(q, k, v, is_causal=causal)})
            print(_row(f"  {how}", times["ours"], times["sdpa"], flops, nbytes))


if __name__ == "__main__":
    main()
