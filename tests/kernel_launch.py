"""Rendered kernels launched by themselves on the GPU, for the archetype tests: poisoned outputs, host results."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tensorsmith.codegen import runtime
from tensorsmith.codegen.nvrtc import compile_cubin
from tensorsmith.codegen.render import RenderedKernel
from tensorsmith.codegen.tensor_map import launch_arguments
from tensorsmith.executor import from_device_layout, to_device_layout
from tensorsmith.ir.dtypes import numpy_dtype
from tensorsmith.ir.kernel_program import KernelProgram

POISON = 0xFF   # NaN in every float dtype (-1 as int32, 255 as bool): an element never written fails a check


def run_rendered(program: KernelProgram, kernels: Sequence[RenderedKernel],
                 inputs: dict[str, np.ndarray], replay: bool = False) -> dict[str, np.ndarray]:
    """`kernels` launched in order on fresh device buffers, every non-input poisoned; outputs by graph name.
    With `replay`, the launches are made as a program's call makes them: one CUDA graph, replayed."""
    buffers = {}
    for name, buf in program.buffers.items():
        buffers[name] = runtime.DeviceBuffer(buf.nbytes)
        if buf.role == "input":
            buffers[name].upload(to_device_layout(inputs[name], buf.dtype))
        else:
            buffers[name].fill_bytes(POISON)
    launches = []
    for kernel in kernels:
        cubin = compile_cubin(kernel.source, kernel.name, arch=kernel.arch or "sm_90")
        function = runtime.Module(cubin).function(kernel.name)
        pointers = {name: buf.ptr for name, buf in buffers.items()}
        args = launch_arguments(kernel.params, kernel.tensor_maps, pointers)
        launches.append(runtime.Launch(function, kernel.grid, kernel.block, args, kernel.shared_bytes))
        if not replay:
            runtime.launch(function, kernel.grid, kernel.block, args, kernel.shared_bytes, sync=True)
    if replay:
        runtime.LaunchGraph(launches).replay()
        runtime.synchronize()
    outputs = {}
    for out, name in program.outputs.items():
        buf = program.buffers[name]
        outputs[out] = from_device_layout(buffers[name].download(buf.shape, numpy_dtype(buf.dtype)), buf.dtype)
    return outputs
