"""Benchmark: tensorsmith's memory-bound kernels against PyTorch on the same GPU, in one run.

For softmax, RMSNorm and LayerNorm over an 8192 x 8192 float16 tensor, and three pointwise kernels of the same
size (the sum of two tensors, GELU, and a bias row added to every row), it prints tensorsmith's time,
PyTorch's (eager, and torch.compile with --compile), the bandwidth each reaches counting each input
read once and each output written once, and the ratio to a device-to-device copy measured in the same
run. Every output is checked against a float64 reference before its timing is printed.

    python benchmarks/memory_bound.py [--rows 8192] [--cols 8192] [--compile] [--only add,gelu,bias_add]
"""
from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import numpy as np
import torch

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.bench.timing import L2_FLUSH_BYTES, SLEEP_CYCLES
from tensorsmith.search.verify import relative_l2


def graphs(rows: int, cols: int) -> dict[str, tuple[ts.Graph, callable]]:
    def softmax() -> ts.Graph:
        g = ts.Graph("softmax")
        g.output("y", nn.softmax(g.input("x", (rows, cols), "float16"), -1))
        return g

    def rmsnorm() -> ts.Graph:
        g = ts.Graph("rmsnorm")
        x, w = g.input("x", (rows, cols), "float16"), g.input("w", (cols,), "float16")
        g.output("y", nn.rms_norm(x, w, eps=1e-6))
        return g

    def layernorm() -> ts.Graph:
        g = ts.Graph("layernorm")
        x, w, b = g.input("x", (rows, cols), "float16"), g.input("w", (cols,), "float16"), g.input("b", (cols,), "float16")
        g.output("y", nn.layer_norm(x, w, b, eps=1e-5))
        return g

    def add() -> ts.Graph:
        g = ts.Graph("add")
        g.output("y", g.input("x", (rows, cols), "float16") + g.input("z", (rows, cols), "float16"))
        return g

    def gelu() -> ts.Graph:
        g = ts.Graph("gelu")
        g.output("y", nn.gelu(g.input("x", (rows, cols), "float16")))
        return g

    def bias_add() -> ts.Graph:
        g = ts.Graph("bias_add")
        g.output("y", g.input("x", (rows, cols), "float16") + g.input("b", (cols,), "float16"))
        return g

    return {
        "add": (add(), lambda x, z: x + z),
        "gelu": (gelu(), lambda x: torch.nn.functional.gelu(x, approximate="tanh")),
        "bias_add": (bias_add(), lambda x, b: x + b),
        "softmax": (softmax(), lambda x: torch.softmax(x, -1)),
        "rmsnorm": (rmsnorm(), lambda x, w: torch.nn.functional.rms_norm(x, (cols,), w, 1e-6)),
        "layernorm": (layernorm(), lambda x, w, b: torch.nn.functional.layer_norm(x, (cols,), w, b, 1e-5)),
    }


def time_torch(fn, args, repeat: int = 50) -> float:
    """Median ms of `fn(*args)` with CUDA events, L2 flushed before each run."""
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    for _ in range(5):
        fn(*args)
    times = []
    for _ in range(repeat):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def time_interleaved(runs: dict[str, Callable[[], object]], rounds: int = 6, repeat: int = 10) -> dict[str, float]:
    """Median ms of each of `runs`, timed in turns: `rounds` rounds in which each run goes `repeat` times, L2
    flushed before every run and a round's runs queued behind a sleeping kernel before one synchronize (so that
    the time between two events is the GPU's, not Python's launch), so that a drift of the GPU's clocks during
    a benchmark falls on each run alike (timed one after the other, cuBLAS and SDPA moved by up to 14% between
    runs of the same script). Every run must use torch's current stream, as the launches of
    tensorsmith.codegen.runtime (the legacy default stream) do."""
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    for run in runs.values():
        for _ in range(3):
            run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        events = []
        torch.cuda._sleep(SLEEP_CYCLES)   # the GPU waits while the round is queued: no launch gap is timed
        for name, run in runs.items():
            for _ in range(repeat):
                flush.zero_()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                run()
                end.record()
                events.append((name, start, end))
        torch.cuda.synchronize()
        for name, start, end in events:
            times[name].append(start.elapsed_time(end))
    return {name: statistics.median(values) for name, values in times.items()}


def copy_bandwidth() -> float:
    """Device-to-device copy in bytes/s (bytes read plus bytes written), the ceiling for these kernels."""
    src = torch.randn(2**29 // 2, device="cuda", dtype=torch.float16)
    dst = torch.empty_like(src)
    ms = time_torch(lambda: dst.copy_(src), ())
    return 2 * src.numel() * 2 / (ms * 1e-3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--cols", type=int, default=8192)
    parser.add_argument("--compile", action="store_true", help="also time torch.compile")
    parser.add_argument("--only", default="", help="comma-separated kernel names (default: all)")
    parser.add_argument("--budget", type=float, default=20.0, help="search seconds per kernel (ts.compile budget_s)")
    args = parser.parse_args()
    ceiling = copy_bandwidth()
    print(f"device copy: {ceiling / 1e12:.2f} TB/s on {torch.cuda.get_device_name()}")
    print(f"\n{'kernel':10s} {'tensorsmith':>12s} {'TB/s':>6s} {'of copy':>8s} {'torch eager':>12s} "
          f"{'torch.compile':>14s} {'vs eager':>9s}  schedule")
    for name, (graph, torch_fn) in graphs(args.rows, args.cols).items():
        if args.only and name not in args.only.split(","):
            continue
        program = ts.compile(graph, profile=True, cache=False, budget_s=args.budget)
        rng = np.random.default_rng(0)
        inputs = {k: rng.standard_normal(n.shape).astype(np.float16) for k, n in graph.inputs.items()}
        reference = ts.evaluate(graph, inputs)["y"]
        error = relative_l2(program(**inputs)["y"], reference)
        assert error < 1e-2, f"{name}: tensorsmith output is wrong (relative L2 {error:.3g})"
        tensors = [torch.from_numpy(v).cuda() for v in inputs.values()]
        assert relative_l2(torch_fn(*tensors).float().cpu().numpy(), reference) < 1e-2, f"{name}: torch is wrong"
        nbytes = sum(v.nbytes for v in inputs.values()) + args.rows * args.cols * 2
        ours, eager = program.report["total_ms"], time_torch(torch_fn, tensors)
        compiled = f"{time_torch(torch.compile(torch_fn), tensors) * 1000:11.1f} us" if args.compile else f"{'-':>14s}"
        tbs = nbytes / (ours * 1e-3) / 1e12
        schedules = "; ".join(f"{k.archetype}: {', '.join(f'{p}={v}' for p, v in k.schedule.items())}"
                              for k in program.kernels)
        print(f"{name:10s} {ours * 1000:9.1f} us {tbs:6.2f} {tbs * 1e12 / ceiling:8.1%} {eager * 1000:9.1f} us "
              f"{compiled} {eager / ours:8.2f}x  {schedules}", flush=True)

if __name__ == "__main__":
    main()
