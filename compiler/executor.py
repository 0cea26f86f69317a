"""Runs a Program's cubins on the GPU: uploads inputs, launches the kernels in order, times them."""
from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from statistics import median

import numpy as np

from tensorsmith.codegen import runtime
from tensorsmith.ir.dtypes import DType, bfloat16_to_float, float_to_bfloat16, numpy_dtype

POISON_BYTE = 0xFF   # NaN in every float dtype: an element the kernels never write cannot pass a check


def to_device_layout(array: np.ndarray, dtype: DType) -> np.ndarray:
    """Host array -> the exact bytes device memory holds for `dtype` (bfloat16 as raw bits)."""
    if dtype == DType.BFLOAT16:
        return float_to_bfloat16(np.asarray(array, np.float32))
    return np.ascontiguousarray(array, dtype=numpy_dtype(dtype))


def from_device_layout(raw: np.ndarray, dtype: DType) -> np.ndarray:
    """Device bytes -> a numpy array (bfloat16 widens to float32, numpy has no bfloat16)."""
    return bfloat16_to_float(raw) if dtype == DType.BFLOAT16 else raw


@dataclass
class Session:
    """Device buffers and loaded modules for one Program, so that launches can be repeated and timed."""

    program: "Program"  # noqa: F821 (compiler.program.Program; imported lazily to keep this module light)
    stack: ExitStack

    def __post_init__(self) -> None:
        self.modules = [runtime.Module(k.cubin) for k in self.program.kernels]
        self.functions = [m.function(k.name) for m, k in zip(self.modules, self.program.kernels)]
        self.memory = {name: self.stack.enter_context(runtime.DeviceBuffer(max(buf.nbytes, 1)))
                       for name, buf in self.program.buffers.items()}

    def upload(self, arrays: dict[str, np.ndarray]) -> None:
        for name, array in arrays.items():
            self.memory[name].upload(to_device_layout(array, self.program.buffers[name].dtype))
        for name, buf in self.program.buffers.items():
            if buf.role != "input":
                self.memory[name].fill_bytes(POISON_BYTE)

    def launch(self, position: int) -> None:
        kernel = self.program.kernels[position]
        runtime.launch(self.functions[position], kernel.grid, kernel.block, [self.memory[p] for p in kernel.params])

    def run_all(self) -> None:
        for position in range(len(self.program.kernels)):
            self.launch(position)

    def download(self) -> dict[str, np.ndarray]:
        runtime.synchronize()
        out = {}
        for name in self.program.outputs:
            buf = self.program.buffers[name]
            raw = self.memory[name].download(buf.shape, numpy_dtype(buf.dtype))
            out[name] = from_device_layout(raw, buf.dtype)
        return out


def run_on_gpu(program: "Program", arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:  # noqa: F821
    """One run of every kernel on fresh device buffers; outputs are poisoned first."""
    with ExitStack() as stack:
        session = Session(program, stack)
        session.upload(arrays)
        session.run_all()
        return session.download()


def profile_on_gpu(program: "Program", arrays: dict[str, np.ndarray],  # noqa: F821
                   warmup: int = 10, repeat: int = 50) -> tuple[dict[str, np.ndarray], list[float], float]:
    """Outputs of one checked run, then each kernel's and the whole program's median time in ms (L2 flushed)."""
    with ExitStack() as stack:
        session = Session(program, stack)
        session.upload(arrays)
        session.run_all()
        outputs = session.download()
        per_kernel = [median(runtime.time_kernel(lambda p=p: session.launch(p), warmup, repeat))
                      for p in range(len(program.kernels))]
        total = median(runtime.time_kernel(session.run_all, warmup, repeat))
        return outputs, per_kernel, total
