"""Rendered kernels launched by themselves on the GPU, for the archetype tests: poisoned outputs, host results, and
the CPU executor's prediction of them checked on every launch."""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

from tensorsmith.codegen import runtime
from tensorsmith.codegen.nvrtc import compile_cubin
from tensorsmith.codegen.render import RenderedKernel
from tensorsmith.codegen.tensor_map import launch_arguments
from tensorsmith.executor import from_device_layout, to_device_layout
from tensorsmith.ir.dtypes import DType, numpy_dtype
from tensorsmith.ir.kernel_program import KernelProgram
from tensorsmith.search.verify import relative_l2

POISON = 0xFF   # NaN in every float dtype (-1 as int32, 255 as bool): an element never written fails a check


def run_rendered(program: KernelProgram, kernels: Sequence[RenderedKernel],
                 inputs: dict[str, np.ndarray], replay: bool = False) -> dict[str, np.ndarray]:
    """`kernels` launched in order on fresh device buffers, every non-input poisoned; outputs by graph name.
    With `replay`, the launches are made as a program's call on sm90 makes them: one CUDA graph of programmatic
    dependent launches, replayed."""
    buffers = {}
    for name, buf in program.buffers.items():
        buffers[name] = runtime.DeviceBuffer(buf.nbytes)
        if buf.role == "input":
            buffers[name].upload(to_device_layout(inputs[name], buf.dtype))
        else:
            buffers[name].fill_bytes(POISON)
    launches = []
    for kernel in kernels:
        cubin = compile_cubin(kernel.build_source, kernel.name, arch=kernel.arch or "sm_90")   # as the pipeline does
        function = runtime.Module(cubin).function(kernel.entry)
        pointers = {name: buf.ptr for name, buf in buffers.items()}
        args = launch_arguments(kernel.params, kernel.tensor_maps, pointers)
        launches.append(runtime.Launch(function, kernel.grid, kernel.block, args, kernel.shared_bytes,
                                       programmatic=True))
        if not replay:
            runtime.launch(function, kernel.grid, kernel.block, args, kernel.shared_bytes, sync=True)
    if replay:
        runtime.LaunchGraph(launches).replay()
        runtime.synchronize()
    outputs = {}
    for out, name in program.outputs.items():
        buf = program.buffers[name]
        outputs[out] = from_device_layout(buffers[name].download(buf.shape, numpy_dtype(buf.dtype)), buf.dtype)
    if len(kernels) == len(program.kernels):
        assert_cpu_predicts(program, inputs, outputs)
    return outputs


# How far the CPU executor's outputs may lie from the GPU's (relative L2): float32 registers on both sides, summed in
# another order, a few units in the last place of the least precise float the program stores. That dtype, not the
# output's: attention rounds its probabilities to V's dtype for the tensor cores however the graph types them (in
# examples/attention.py float32 probabilities times float16 V: 1.3e-4 on the H200), which the executor does not.
AGREEMENT = {DType.FLOAT32: 1e-5, DType.FLOAT16: 1e-3, DType.BFLOAT16: 8e-3, DType.INT32: 0.0, DType.BOOL: 0.0}


def assert_cpu_predicts(program: KernelProgram, inputs: Mapping[str, np.ndarray],
                        gpu_outputs: Mapping[str, np.ndarray], label: str = "") -> None:
    """The CPU executor (`KernelProgram.execute`) gives what the GPU gave: inf and nan in the same places, the rest
    within AGREEMENT. With TS_AGREEMENT_LOG set, each output's figure is appended to that file."""
    predicted = program.execute(inputs)
    floats = [buf.dtype for buf in program.buffers.values() if buf.dtype.is_float]
    for out, name in program.outputs.items():
        dtype = max(floats, key=AGREEMENT.__getitem__) if program.buffers[name].dtype.is_float else \
            program.buffers[name].dtype
        cpu, gpu = np.asarray(predicted[out], np.float64), np.asarray(gpu_outputs[out], np.float64)
        same_specials = (np.array_equal(np.isnan(cpu), np.isnan(gpu))
                         and np.array_equal(np.where(np.isinf(cpu), cpu, 0), np.where(np.isinf(gpu), gpu, 0)))
        finite = np.isfinite(cpu) & np.isfinite(gpu)
        error = relative_l2(cpu[finite], gpu[finite]) if finite.any() else 0.0
        if os.environ.get("TS_AGREEMENT_LOG"):
            with open(os.environ["TS_AGREEMENT_LOG"], "a") as log:
                log.write(f"{label or program.kernels[0].name}\t{out}\t{dtype}\t{error:.3g}\t{same_specials}\n")
        assert same_specials, f"{out}: the CPU executor's inf/nan differ from the GPU's (unwritten ones are NaN there)"
        assert error <= AGREEMENT[dtype], f"{out} ({dtype}): CPU executor vs GPU relative L2 {error:.3g}"
