"""Registers per thread and resident warps per SM of the memory-bound kernels, from NVRTC alone (no GPU needed).

For softmax, RMSNorm and LayerNorm over an 8192 x 8192 float16 tensor, every row_reduce schedule with one row
per block and 128 or more threads per row is rendered and compiled for sm_90 with `--ptxas-options=-v`; the
table shows what ptxas reports (registers, spill stores) and the warps per SM that the register file and the
thread limit allow, beside the cost model's prediction.

    python benchmarks/registers.py [--kernels layernorm,rmsnorm,softmax]
"""
from __future__ import annotations

import argparse
import dataclasses
import re

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.codegen.nvrtc import build_options, run_nvrtc
from tensorsmith.codegen.render import render_kernel
from tensorsmith.codegen.spaces import is_valid
from tensorsmith.ir.targets import get_target
from tensorsmith.search.cost import kernel_cost
from tensorsmith.search.partition import partition
from tensorsmith.search.prune import feasible_schedules, kernel_facts

SIZE = 8192
REGISTER_GRANULE = 8      # registers are allocated per thread in multiples of 8


def graph(kind: str) -> ts.Graph:
    g = ts.Graph(kind)
    x = g.input("x", (SIZE, SIZE), "float16")
    if kind == "softmax":
        g.output("y", nn.softmax(x, -1))
    elif kind == "rmsnorm":
        g.output("y", nn.rms_norm(x, g.input("w", (SIZE,), "float16"), eps=1e-6))
    else:
        w, b = g.input("w", (SIZE,), "float16"), g.input("b", (SIZE,), "float16")
        g.output("y", nn.layer_norm(x, w, b, eps=1e-5))
    return g


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernels", default="layernorm,rmsnorm,softmax")
    args = parser.parse_args()
    target = get_target("sm90")
    print(f"{'kernel':10s} {'schedule':38s} {'regs':>4s} {'spill':>5s} {'warps/SM':>8s} {'predicted':>10s}")
    for kind in args.kernels.split(","):
        program = partition(graph(kind))
        shapes = {name: buf.shape for name, buf in program.buffers.items()}
        kernel = program.kernels[0]
        for verdict in feasible_schedules(kernel_facts(kernel, shapes), target):
            schedule = verdict.schedule
            if verdict.violated or not is_valid(kernel.archetype, schedule) or schedule["row_threads"] < 128:
                continue
            trial = dataclasses.replace(program, kernels=[dataclasses.replace(kernel, schedule=schedule)])
            rendered = render_kernel(trial, 0)
            log = run_nvrtc(rendered.source, rendered.name, build_options("sm_90", ["--ptxas-options=-v"])).log
            registers = int(re.search(r"Used (\d+) registers", log).group(1))
            spill = int(re.search(r"(\d+) bytes spill stores", log).group(1))
            block = schedule["block"]
            granted = -(-registers // REGISTER_GRANULE) * REGISTER_GRANULE
            blocks = min(target.max_blocks_per_sm, target.max_threads_per_sm // block,
                         target.registers_per_sm // (granted * block))
            seconds = kernel_cost(trial.kernels[0], trial, target).seconds
            print(f"{kind:10s} {str(schedule):38s} {registers:4d} {spill:5d} {blocks * block // 32:8d} "
                  f"{seconds * 1e6:7.1f} us")


if __name__ == "__main__":
    main()
