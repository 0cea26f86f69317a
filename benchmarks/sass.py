"""Where the tensor cores wait, from the SASS of a kernel: no GPU needed, only NVRTC and nvdisasm.

For the wgmma attention kernel (causal and not) and the TMA matmul, prints the order of
the instructions that matter for overlap: groups of wgmma (HGMMA), the waits for them (`wait<=N`: at most N
groups still running) and the softmax's exponentials (MUFU.EX2). In a pipeline that overlaps, a step's
exponentials lie between the wait for its scores (wait<=1) and the wait for the previous P V (wait<=0).

    pip install nvidia-cuda-nvdisasm      # once, outside the project: NVIDIA's disassembler
    python benchmarks/sass.py [--nvdisasm PATH]
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import shutil
import subprocess
import sys
import tempfile

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.codegen.nvrtc import build_options, run_nvrtc
from tensorsmith.codegen.render import render_kernel
from tensorsmith.ir.kernel_program import Schedule
from tensorsmith.search.partition import partition

EVENTS = {"HGMMA": "wgmma", "DEPBAR.LE gsb0, 0x0": "wait<=0", "DEPBAR.LE gsb0, 0x1": "wait<=1", "MUFU.EX2": "exp2",
          " STL": "spill store", " LDL": "spill load"}   # local memory: registers spilled


def find_nvdisasm() -> str | None:
    """nvdisasm on PATH, or where the nvidia-cuda-nvdisasm wheel puts it."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    for folder in sys.path:
        hits = glob.glob(os.path.join(folder, "nvidia", "cu*", "bin", "nvdisasm"))
        if hits:
            return hits[0]
    return None


def instruction_order(graph: ts.Graph, schedule: dict[str, int], nvdisasm: str) -> str:
    """The graph's one kernel under `schedule`, compiled for sm_90a: its HGMMA, wait, MUFU.EX2 and spill runs in
    order."""
    program = partition(graph)
    kernel = dataclasses.replace(program.kernels[0], schedule=Schedule.of(**schedule))
    rendered = render_kernel(dataclasses.replace(program, kernels=[kernel]), 0)
    result = run_nvrtc(rendered.source, rendered.name, build_options(rendered.arch or "sm_90a", []))
    if result.cubin is None:
        raise SystemExit(f"NVRTC failed:\n{result.log}")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(result.cubin)
        cubin.flush()
        sass = subprocess.run([nvdisasm, "-c", cubin.name], capture_output=True, text=True, check=True).stdout
    runs: list[list] = []
    for line in sass.splitlines():
        event = next((name for key, name in EVENTS.items() if key in line), None)
        if event is None:
            continue
        if runs and runs[-1][0] == event:
            runs[-1][1] += 1
        else:
            runs.append([event, 1])
    return " | ".join(f"{event} x{count}" for event, count in runs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nvdisasm", default=None, help="path of nvdisasm (default: PATH, then the pip wheel)")
    args = parser.parse_args()
    nvdisasm = args.nvdisasm or find_nvdisasm()
    if nvdisasm is None:
        raise SystemExit("nvdisasm not found: pip install nvidia-cuda-nvdisasm, or pass --nvdisasm PATH")
    for causal in (True, False):
        g = ts.Graph("attention")
        q, k, v = (g.input(name, (4, 32, 2048, 128), "float16") for name in "qkv")
        g.output("o", nn.attention(q, k, v, causal=causal))
        order = instruction_order(g, dict(bq=128, bkv=128, wgmma=1), nvdisasm)
        print(f"attention causal={causal}:\n  {order}")
    g = ts.Graph("matmul")
    g.output("c", g.input("a", (4096, 4096), "float16") @ g.input("b", (4096, 4096), "float16"))
    tile = dict(bm=128, bn=256, bk=64, stages=4, warps_m=2, warps_n=4, split_k=1, wgmma=1)
    print(f"matmul 4096^3 TMA 128x256:\n  {instruction_order(g, tile, nvdisasm)}")


if __name__ == "__main__":
    main()
