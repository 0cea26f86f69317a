"""What a program's call from PyTorch costs beyond its kernels, and what no call can avoid on this machine.

Compiles a small program (RMSNorm then a 1024x1024 product, `--layers` times; RMSNorm alone for 0), then times in turns, as
`tensorsmith bench` does (CUDA events, L2 flushed, medians): its launches queued behind a sleeping kernel (the
GPU's time), `prog(**tensors)` and `prog(..., out=...)` from an idle device, the program's CUDA graph replayed
bare from an idle device (the floor of any call through a graph), and `torch.add` on the same input, queued and
from idle (the floor of any PyTorch op). Also the CPU time of one call, from a loop of calls. Needs a GPU:

    python benchmarks/call_overhead.py [--layers 0 1 3]
"""
from __future__ import annotations

import argparse
import time

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.bench import timing

WIDTH, TOKENS = 1024, 16


def stacked(layers: int) -> ts.Graph:
    g = ts.Graph(f"norm_linear_x{layers}")
    x = g.input("x", (TOKENS, WIDTH), "float16")
    w = g.input("w", (WIDTH,), "float16")
    if not layers:
        x = nn.rms_norm(x, w, eps=1e-6)
    for _ in range(layers):
        x = nn.relu(nn.rms_norm(x, w, eps=1e-6) @ g.input(f"m{len(g.inputs) - 2}", (WIDTH, WIDTH), "float16"))
    g.output("y", x)
    return g


def main() -> None:
    import torch
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[0, 1, 3])
    parser.add_argument("--calls", type=int, default=5000, help="calls in the loop that gives the CPU time")
    args = parser.parse_args()
    for layers in args.layers:
        program = ts.compile(stacked(layers), budget_s=2, profile=False)
        tensors = {"x": torch.randn(TOKENS, WIDTH, device="cuda", dtype=torch.float16),
                   "w": torch.randn(WIDTH, device="cuda", dtype=torch.float16)}
        tensors.update({f"m{i}": torch.randn(WIDTH, WIDTH, device="cuda", dtype=torch.float16) / WIDTH**0.5
                        for i in range(layers)})
        out = {"y": torch.empty(TOKENS, WIDTH, device="cuda", dtype=torch.float16)}
        for _ in range(10):
            program(**tensors)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.calls):
            program(**tensors)
        cpu_us = (time.perf_counter() - start) / args.calls * 1e6
        torch.cuda.synchronize()
        graph = next(iter(next(iter(program.gpu_state["device_caller"].streams.values())).graphs.values()))
        x = tensors["x"]
        times = timing.time_runs(torch, {
            "kernels": lambda: graph.replay(0), "call": lambda: program(**tensors),
            "call out=": lambda: program(**tensors, out=out), "bare replay": lambda: graph.replay(0),
            "torch.add queued": lambda: torch.add(x, 1), "torch.add": lambda: torch.add(x, 1)},
            queued=frozenset({"kernels", "torch.add queued"}))
        cells = ", ".join(f"{name} {ms * 1e3:.1f} us" for name, ms in times.items())
        print(f"{len(program.kernels)} kernels: CPU per call {cpu_us:.1f} us; {cells}")


if __name__ == "__main__":
    main()
