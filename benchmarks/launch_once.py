"""Launch one matmul kernel once, at codegen's default schedule, for a profiler to read (Nsight Compute):

    cd benchmarks && ncu --clock-control none --section SpeedOfLight python launch_once.py 4096 4096 4096

Inputs are random float16 on the GPU; the output is checked against torch.matmul after the launch.
"""
from __future__ import annotations

import argparse
import sys

import torch

from tensorsmith.codegen import runtime
from tensorsmith.codegen.nvrtc import compile_cubin
from tensorsmith.codegen.render import render_kernel
from tensorsmith.codegen.tensor_map import launch_arguments
from tensorsmith.search.partition import partition
from tensorsmith.search.verify import relative_l2

from matmul import matmul_graph


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shape", type=int, nargs=3, metavar=("M", "N", "K"))
    m, n, k = parser.parse_args().shape
    program = partition(matmul_graph(m, n, k, "float16"))
    rendered = render_kernel(program, 0)
    function = runtime.Module(compile_cubin(rendered.source, rendered.name, arch=rendered.arch or "sm_90")
                              ).function(rendered.entry)
    a, b = (torch.randn(shape, device="cuda", dtype=torch.float16) for shape in ((m, k), (k, n)))
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    pointers = {"a": a.data_ptr(), "b": b.data_ptr(), "c": c.data_ptr()}
    args = launch_arguments(rendered.params, rendered.tensor_maps, pointers)
    runtime.launch(function, rendered.grid, rendered.block, args, rendered.shared_bytes)
    runtime.synchronize()
    error = relative_l2(c.float().cpu().numpy(), torch.matmul(a, b).float().cpu().numpy())
    print(f"{rendered.name} {rendered.schedule} grid {rendered.grid}: relative L2 {error:.3g}")
    sys.exit(0 if error < 1e-2 else 1)


if __name__ == "__main__":
    main()
