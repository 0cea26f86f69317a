"""Benchmark: tensorsmith's tensor-core matmul archetype against torch.matmul (cuBLAS) in one run.

Shapes are issue 5's: 4096^3, and LLM shapes with M = 16, 128, 4096 and N, K from {4096, 11008}. Each
output is checked against torch's (itself checked against a float64 reference) before its timing counts.

    python benchmarks/matmul.py [--dtype float16|bfloat16|float32] [--quick]   # ts.compile, as a user would
    python benchmarks/matmul.py --sweep [--quick] [--wgmma | --defaults] [--m 128]   # under fixed schedules
    python benchmarks/matmul.py --shapes llama1b --linear [--sweep]   # a model's own products, weights as nn.Linear's

`--sweep` times the one matmul kernel directly under each schedule of SWEEP (what the search would
choose between), so that a default can be picked from measurements; `--wgmma` keeps only its wgmma (TMA)
schedules and the default, about a third of the time; `--defaults` only codegen's default for each shape.
A schedule that fails to render, compile or run is reported on its row and the sweep goes on. In float32 the
kernel is 3xTF32 and the sweep takes SWEEP_F32; cuBLAS runs at PyTorch's default float32 precision ("highest":
no TF32), as a float32 user's matmul does.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools

import numpy as np
import torch

import tensorsmith as ts
from tensorsmith.codegen import runtime
from tensorsmith.codegen.nvrtc import compile_cubin
from tensorsmith.codegen.render import render_kernel
from tensorsmith.codegen.tensor_map import launch_arguments
from tensorsmith.ir.kernel_program import KernelProgram, Schedule
from tensorsmith.search.partition import partition
from tensorsmith.search.verify import random_inputs, relative_l2

from memory_bound import time_interleaved, time_torch

SHAPES = [(4096, 4096, 4096), (16, 4096, 4096), (128, 4096, 4096), (16, 11008, 4096), (128, 4096, 11008),
          (4096, 11008, 4096), (4096, 4096, 11008)]
SWEEP = [dict(bm=128, bn=128, bk=32, stages=4, warps_m=2, warps_n=4, split_k=1, wgmma=0),
         dict(bm=128, bn=128, bk=64, stages=3, warps_m=2, warps_n=4, split_k=1, wgmma=0),
         dict(bm=128, bn=256, bk=64, stages=2, warps_m=2, warps_n=4, split_k=1, wgmma=0),
         dict(bm=128, bn=128, bk=64, stages=4, warps_m=4, warps_n=2, split_k=1, wgmma=0),
         dict(bm=32, bn=64, bk=64, stages=4, warps_m=1, warps_n=4, split_k=4, wgmma=0),
         dict(bm=32, bn=128, bk=64, stages=4, warps_m=1, warps_n=4, split_k=4, wgmma=0),
         dict(bm=32, bn=64, bk=64, stages=4, warps_m=1, warps_n=4, split_k=8, wgmma=0),
         dict(bm=64, bn=128, bk=64, stages=4, warps_m=2, warps_n=2, split_k=2, wgmma=0),
         dict(bm=64, bn=64, bk=64, stages=4, warps_m=2, warps_n=2, split_k=4, wgmma=0),
         dict(bm=128, bn=256, bk=64, stages=4, warps_m=2, warps_n=4, split_k=1, wgmma=1),
         dict(bm=128, bn=256, bk=64, stages=3, warps_m=2, warps_n=4, split_k=1, wgmma=1),
         dict(bm=128, bn=128, bk=64, stages=4, warps_m=2, warps_n=4, split_k=1, wgmma=1),
         dict(bm=64, bn=256, bk=64, stages=4, warps_m=1, warps_n=4, split_k=1, wgmma=1),
         dict(bm=128, bn=128, bk=64, stages=4, warps_m=2, warps_n=4, split_k=4, wgmma=1),
         dict(bm=64, bn=128, bk=64, stages=4, warps_m=1, warps_n=4, split_k=4, wgmma=1),
         dict(bm=64, bn=256, bk=64, stages=4, warps_m=1, warps_n=4, split_k=4, wgmma=1),
         dict(bm=128, bn=256, bk=64, stages=3, warps_m=2, warps_n=4, split_k=8, wgmma=1),
         dict(bm=128, bn=128, bk=64, stages=4, warps_m=2, warps_n=4, split_k=2, wgmma=1),
         dict(bm=64, bn=128, bk=64, stages=4, warps_m=1, warps_n=4, split_k=2, wgmma=1),
         dict(bm=64, bn=256, bk=64, stages=4, warps_m=1, warps_n=4, split_k=2, wgmma=1),
         dict(bm=128, bn=256, bk=64, stages=4, warps_m=2, warps_n=4, split_k=4, wgmma=1),   # M = 128: B read once
         # M <= 128: rings as deep as fit (a one-wave grid), 128 x 192 tiles in 22 clusters of four
         dict(bm=64, bn=128, bk=64, stages=8, warps_m=1, warps_n=4, split_k=2, wgmma=1),
         dict(bm=64, bn=128, bk=64, stages=8, warps_m=1, warps_n=4, split_k=4, wgmma=1),
         dict(bm=128, bn=128, bk=64, stages=6, warps_m=2, warps_n=4, split_k=2, wgmma=1),
         dict(bm=128, bn=192, bk=64, stages=5, warps_m=2, warps_n=4, split_k=4, wgmma=1),
         dict(bm=64, bn=64, bk=64, stages=12, warps_m=1, warps_n=4, split_k=1, wgmma=1),
         None]   # None: codegen's default for the shape
# float32 (3xTF32, mma.sync only): K tiles of 32 floats, 128 bytes a row as the 16-bit schedules' 64
SWEEP_F32 = [dict(bm=128, bn=128, bk=32, stages=3, warps_m=2, warps_n=4, split_k=1, wgmma=0),
             dict(bm=128, bn=128, bk=32, stages=4, warps_m=2, warps_n=4, split_k=1, wgmma=0),
             dict(bm=128, bn=256, bk=32, stages=3, warps_m=2, warps_n=4, split_k=1, wgmma=0),
             dict(bm=128, bn=128, bk=32, stages=4, warps_m=4, warps_n=2, split_k=1, wgmma=0),
             dict(bm=64, bn=128, bk=32, stages=4, warps_m=2, warps_n=2, split_k=1, wgmma=0),
             dict(bm=64, bn=128, bk=32, stages=4, warps_m=1, warps_n=4, split_k=2, wgmma=0),
             dict(bm=64, bn=64, bk=32, stages=4, warps_m=2, warps_n=2, split_k=4, wgmma=0),
             dict(bm=32, bn=64, bk=32, stages=4, warps_m=1, warps_n=4, split_k=4, wgmma=0),
             dict(bm=128, bn=128, bk=64, stages=2, warps_m=2, warps_n=4, split_k=1, wgmma=0),
             None]


# the products of one Llama-3.2-1B layer at 512 tokens (q and o, k and v, gate and up, down) and its LM head
MODEL_SHAPES = {"llama1b": [(512, 2048, 2048), (512, 512, 2048), (512, 8192, 2048), (512, 2048, 8192),
                            (512, 128256, 2048)]}


def matmul_graph(m: int, n: int, k: int, dtype: str, linear: bool = False) -> ts.Graph:
    """a @ b; with `linear`, b is stored (n, k) as nn.Linear stores its weight, and the product reads it transposed."""
    g = ts.Graph(f"matmul_{m}x{n}x{k}")
    b = g.input("b", (n, k), dtype).transpose(0, 1) if linear else g.input("b", (k, n), dtype)
    g.output("c", g.input("a", (m, k), dtype) @ b)
    return g


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """A model's name in MODEL_SHAPES, or shapes written MxNxK, comma-separated."""
    if text in MODEL_SHAPES:
        return MODEL_SHAPES[text]
    try:
        return [tuple(int(v) for v in shape.split("x", 2)) for shape in text.split(",")]   # type: ignore[misc]
    except ValueError:
        raise SystemExit(f"--shapes: expected MxNxK[,MxNxK...] or one of {sorted(MODEL_SHAPES)}, got {text!r}")


def _row(label: str, ours_ms: float, theirs_ms: float, flops: float) -> str:
    return (f"{label:34s} {ours_ms * 1000:9.1f} us {flops / ours_ms / 1e9:7.1f} {theirs_ms * 1000:8.1f} us "
            f"{flops / theirs_ms / 1e9:7.1f} {theirs_ms / ours_ms:6.2f}")


def sweep(m: int, n: int, k: int, dtype: str, a: torch.Tensor, b: torch.Tensor, expected: torch.Tensor,
          wgmma_only: bool = False, defaults_only: bool = False, linear: bool = False) -> None:
    """Each SWEEP schedule's kernel on torch's tensors (zero copy), checked, then timed in turns with cuBLAS."""
    program = partition(matmul_graph(m, n, k, dtype, linear))
    out = torch.empty((m, n), dtype=a.dtype, device="cuda")
    pointers = {"a": a.data_ptr(), "b": b.data_ptr(), "c": out.data_ptr()}
    for params in SWEEP_F32 if dtype == "float32" else SWEEP:
        if params is not None and (defaults_only or wgmma_only and not params["wgmma"]):
            continue
        try:
            _time_schedule(program, params, pointers, out, expected, a, b, m * n * k, linear)
        except (ValueError, RuntimeError) as error:   # a schedule the kernel rejects, or NVRTC's error
            print(f"  {params}: FAILED: {str(error).splitlines()[0]}")


def _time_schedule(program: KernelProgram, params: dict[str, int] | None, pointers: dict[str, int],
                   out: torch.Tensor, expected: torch.Tensor, a: torch.Tensor, b: torch.Tensor, mnk: int,
                   linear: bool = False) -> None:
    """The kernel under `params` (None: codegen's default), checked, then timed in turns with cuBLAS."""
    kernel = program.kernels[0]
    if params is not None:
        kernel = dataclasses.replace(kernel, schedule=Schedule.of(**params))
    rendered = render_kernel(dataclasses.replace(program, kernels=[kernel]), 0)
    cubin = compile_cubin(rendered.source, rendered.name, arch=rendered.arch or "sm_90")   # sm_90a for wgmma
    function = runtime.Module(cubin).function(rendered.entry)
    args = launch_arguments(rendered.params, rendered.tensor_maps, pointers)

    def run() -> None:
        runtime.launch(function, rendered.grid, rendered.block, args, rendered.shared_bytes)
    out.fill_(float("nan"))
    run()
    runtime.synchronize()
    error = relative_l2(out.float().cpu().numpy(), expected.float().cpu().numpy())
    label = "  " + ("default " if params is None else "") + "/".join(
        str(v) for v in rendered.schedule.as_dict().values())
    if not error < 1e-2:
        print(f"{label:34s} WRONG: relative L2 {error:.3g}")
        return
    times = time_interleaved({"ours": run, "cublas": lambda: cublas(a, b, linear)})
    print(_row(label, times["ours"], times["cublas"], 2.0 * mnk))


def cublas(a: torch.Tensor, b: torch.Tensor, linear: bool) -> torch.Tensor:
    """PyTorch's product as a user calls it: F.linear for a weight stored as nn.Linear stores it."""
    return torch.nn.functional.linear(a, b) if linear else torch.matmul(a, b)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    parser.add_argument("--quick", action="store_true", help="only the first three shapes")
    parser.add_argument("--sweep", action="store_true", help="time the kernel under each schedule of SWEEP")
    parser.add_argument("--wgmma", action="store_true", help="sweep only SWEEP's wgmma schedules (and the default)")
    parser.add_argument("--defaults", action="store_true", help="sweep only codegen's default schedule")
    parser.add_argument("--m", type=int, default=None, help="only the shapes with this M")
    parser.add_argument("--shapes", default=None, help=f"MxNxK[,MxNxK...] or one of {sorted(MODEL_SHAPES)}")
    parser.add_argument("--linear", action="store_true", help="b stored (N, K), as nn.Linear's weight")
    args = parser.parse_args()
    torch_dtype = getattr(torch, args.dtype)
    torch.backends.cuda.matmul.allow_tf32 = False   # float32's cuBLAS as PyTorch runs it by default
    print(f"{args.dtype}: {'M x N x K':25s} {'tensorsmith':>12s} {'TFLOP/s':>7s} {'cuBLAS':>11s} {'TFLOP/s':>7s} "
          f"{'ratio':>6s}")
    shapes = parse_shapes(args.shapes) if args.shapes else SHAPES[:3] if args.quick else SHAPES
    for m, n, k in shapes:
        if args.m is not None and m != args.m:
            continue
        graph = matmul_graph(m, n, k, args.dtype, args.linear)
        inputs = random_inputs(graph, seed=1)
        a, b = (torch.from_numpy(inputs[name]).to(torch_dtype).cuda() for name in ("a", "b"))
        expected = cublas(a, b, args.linear)
        rows = np.random.default_rng(0).choice(m, size=min(m, 64), replace=False)   # a float64 spot check
        b64 = inputs["b"].astype(np.float64)
        reference = inputs["a"][rows].astype(np.float64) @ (b64.T if args.linear else b64)
        assert relative_l2(expected[torch.from_numpy(rows).cuda()].float().cpu().numpy(), reference) < 1e-2
        label = f"{m:5d} x {n:5d} x {k:5d}"
        if args.sweep:
            print(label)
            sweep(m, n, k, args.dtype, a, b, expected, args.wgmma, args.defaults, args.linear)
            continue
        theirs_ms = time_torch(functools.partial(cublas, linear=args.linear), (a, b))
        program = ts.compile(graph, profile=True, cache=False)
        out = program(a=a, b=b)["c"]
        error = relative_l2(out.float().cpu().numpy(), expected.float().cpu().numpy())
        if not error < 1e-2:
            print(f"{label:34s} WRONG: relative L2 {error:.3g}")
            continue
        print(_row(label, program.report["total_ms"], theirs_ms, 2.0 * m * n * k) + f"  {program.kernels[0].schedule}")


if __name__ == "__main__":
    main()
