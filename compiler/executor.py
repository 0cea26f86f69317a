"""Runs a Program's cubins on the GPU: uploads inputs, launches the kernels in order, times them."""
from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from statistics import median
from typing import TYPE_CHECKING

import numpy as np

from tensorsmith.codegen import runtime
from tensorsmith.ir.dtypes import DType, bfloat16_to_float, float_to_bfloat16, numpy_dtype
from tensorsmith.ir.errors import InputError

if TYPE_CHECKING:
    from .program import Program

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
    """Device memory and loaded modules for one Program, so that launches can be repeated and timed.

    `borrowed` maps buffer names to device pointers the caller owns (zero-copy inputs and outputs);
    every other buffer is allocated here and freed with `stack`.
    """

    program: Program
    stack: ExitStack
    borrowed: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.modules = [runtime.Module(k.cubin) for k in self.program.kernels]
        self.functions = [m.function(k.name) for m, k in zip(self.modules, self.program.kernels)]
        self.memory = {name: self.stack.enter_context(runtime.DeviceBuffer(max(buf.nbytes, 1)))
                       for name, buf in self.program.buffers.items() if name not in self.borrowed}
        self.pointers = {**{name: buf.ptr for name, buf in self.memory.items()}, **self.borrowed}

    def upload(self, arrays: dict[str, np.ndarray]) -> None:
        for name, array in arrays.items():
            self.memory[name].upload(to_device_layout(array, self.program.buffers[name].dtype))
        for name, buf in self.program.buffers.items():
            if buf.role != "input":
                self.memory[name].fill_bytes(POISON_BYTE)

    def launch(self, position: int) -> None:
        kernel = self.program.kernels[position]
        args = [np.uint64(self.pointers[p]) for p in kernel.params]
        runtime.launch(self.functions[position], kernel.grid, kernel.block, args, kernel.shared_bytes)

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


def run_on_gpu(program: "Program", arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One run of every kernel on fresh device buffers; outputs are poisoned first."""
    with ExitStack() as stack:
        session = Session(program, stack)
        session.upload(arrays)
        session.run_all()
        return session.download()


def profile_on_gpu(program: "Program", arrays: dict[str, np.ndarray],
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


# zero-copy: the caller's GPU arrays in, outputs allocated in the caller's framework -------------------

_TORCH_DTYPES = {"float32": DType.FLOAT32, "float16": DType.FLOAT16, "bfloat16": DType.BFLOAT16,
                 "int32": DType.INT32, "bool": DType.BOOL}


def is_device_array(value: object) -> bool:
    """A torch tensor on a GPU, or anything with `__cuda_array_interface__` (cupy, numba)."""
    if type(value).__module__.startswith("torch"):
        return bool(value.is_cuda)
    return hasattr(value, "__cuda_array_interface__")


def _describe(value: object) -> tuple[int, tuple[int, ...], DType | None, bool]:
    """(pointer, shape, dtype, contiguous) of a GPU array, read without copying it."""
    if type(value).__module__.startswith("torch"):
        dtype = _TORCH_DTYPES.get(str(value.dtype).removeprefix("torch."))
        return value.data_ptr(), tuple(value.shape), dtype, value.is_contiguous()
    cai = value.__cuda_array_interface__
    np_dtype = np.dtype(cai["typestr"])
    dtype = _TORCH_DTYPES.get(str(np_dtype))
    itemsize, shape = np_dtype.itemsize, tuple(cai["shape"])
    expected = tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) * itemsize for i in range(len(shape)))
    contiguous = cai.get("strides") in (None, expected)
    return cai["data"][0], shape, dtype, contiguous


def _allocate_like(example: object, shape: tuple[int, ...], dtype: DType) -> object:
    """An uninitialised output in the framework (and on the device) of `example`."""
    if type(example).__module__.startswith("torch"):
        import torch
        return torch.empty(shape, dtype=getattr(torch, dtype.value), device=example.device)
    import cupy
    if dtype == DType.BFLOAT16:
        raise InputError("cupy has no bfloat16: pass torch tensors or numpy arrays for this program")
    return cupy.empty(shape, dtype=numpy_dtype(dtype))


def run_on_device_arrays(program: "Program", inputs: dict[str, object]) -> dict[str, object]:
    """Launch the kernels on the caller's GPU arrays; outputs come back in the caller's framework, uncopied."""
    pointers: dict[str, int] = {}
    for name in program.inputs:
        ptr, shape, dtype, contiguous = _describe(inputs[name])
        buf = program.buffers[name]
        if shape != buf.shape or dtype != buf.dtype or not contiguous:
            raise InputError(f"input {name!r}: expected a contiguous {buf.dtype} array of shape {buf.shape}, got "
                             f"{dtype or 'an unsupported dtype'} of shape {shape}{'' if contiguous else ' (strided)'}")
        pointers[name] = ptr
    example = inputs[program.inputs[0]]
    outputs = {name: _allocate_like(example, program.buffers[name].shape, program.buffers[name].dtype)
               for name in program.outputs}
    pointers.update({name: _describe(array)[0] for name, array in outputs.items()})
    with ExitStack() as stack:
        session = Session(program, stack, borrowed=pointers)
        runtime.synchronize()     # the caller's framework may still be writing the inputs
        session.run_all()
        runtime.synchronize()
    return outputs


def time_program(program: "Program", arrays: dict[str, np.ndarray], warmup: int = 3,
                 repeat: int = 10) -> float:
    """Median ms of the whole program on `arrays`, L2 flushed before each run: the search's reward."""
    with ExitStack() as stack:
        session = Session(program, stack)
        session.upload(arrays)
        return median(runtime.time_kernel(session.run_all, warmup, repeat))
