"""Runs a Program's cubins on the GPU: uploads inputs, launches the kernels in order, times them.

Measuring is done in one of two places, chosen by the caller:

- `InProcess()`: here. Fast, but a kernel that faults leaves this process's CUDA context unusable, and
  one that hangs hangs this process. For programs already trusted: the final profile, tests.
- `InWorker()`: in a persistent worker process (`isolation.Worker`) with a deadline from the predicted
  time. A fault or a hang raises KernelFault and costs only the worker, which is replaced. For search
  candidates, which are untrusted by nature.

Both check nothing themselves: they return the outputs of one run on poisoned buffers, then the times.
"""
from __future__ import annotations

import functools
import itertools
import logging
import threading
import weakref
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from statistics import median
from typing import Protocol

import numpy as np

from tensorsmith.codegen import runtime
from tensorsmith.codegen.tensor_map import launch_arguments
from tensorsmith.ir.dtypes import DType, bfloat16_to_float, float_to_bfloat16, numpy_dtype
from tensorsmith.ir.errors import DeviceError, KernelFault
from tensorsmith.ir.kernel_program import Buffer

from .compiled import CompiledKernel, CompiledProgram
from .isolation import Worker, WorkerCrashed, WorkerStartFailed, WorkerTimedOut
from .shared_arrays import SharedArrays, received


log = logging.getLogger(__name__)

VECTOR_ALIGNMENT = 16   # bytes: the kernels' widest access (cudaMalloc'd and torch/cupy arrays start aligned)
POISON_BYTE = 0xFF   # NaN in every float dtype: an element the kernels never write cannot pass a check
Profile = tuple[dict[str, np.ndarray], list[float], float]   # outputs, each kernel's median ms, the program's


def to_device_layout(array: np.ndarray, dtype: DType) -> np.ndarray:
    """Host array -> the exact bytes device memory holds for `dtype` (bfloat16 as raw bits)."""
    if dtype == DType.BFLOAT16:
        return float_to_bfloat16(np.asarray(array, np.float32))
    return np.asarray(array, dtype=numpy_dtype(dtype), order="C")   # rank 0 stays rank 0


def from_device_layout(raw: np.ndarray, dtype: DType) -> np.ndarray:
    """Device bytes -> a numpy array (bfloat16 widens to float32, numpy has no bfloat16)."""
    return bfloat16_to_float(raw) if dtype == DType.BFLOAT16 else raw


@dataclass(frozen=True)
class LaunchPlan:
    """What running a Program on the GPU takes, and no more: picklable, so that a worker process can run it."""

    kernels: tuple[CompiledKernel, ...]
    buffers: dict[str, Buffer]
    outputs: tuple[str, ...]

    @staticmethod
    def of(program: CompiledProgram | LaunchPlan) -> LaunchPlan:
        return LaunchPlan(tuple(program.kernels), dict(program.buffers), tuple(program.outputs))


def launch_grid(kernel: CompiledKernel, sm_count: int) -> tuple[int, int, int]:
    """The kernel's grid on a GPU of `sm_count` SMs: a persistent kernel, rendered with one block per SM of an
    H200 (132), gets at most one per SM of this one, since a block beyond that would wait for a whole walk."""
    if not kernel.persistent:
        return kernel.grid
    return (min(kernel.grid[0], sm_count), kernel.grid[1], kernel.grid[2])


def kernel_launch(kernel: CompiledKernel, function: runtime.Function, pointers: dict[str, int]) -> runtime.Launch:
    """`kernel`'s launch on this GPU with its buffers at `pointers` (and its tensor maps encoded for them)."""
    return runtime.Launch(function, launch_grid(kernel, runtime.sm_count()), kernel.block,
                          launch_arguments(kernel.params, kernel.tensor_maps, pointers), kernel.shared_bytes,
                          kernel.programmatic)


def kernel_launches(kernels: Sequence[CompiledKernel], functions: Sequence[runtime.Function],
                    pointers: dict[str, int]) -> list[runtime.Launch]:
    """Each kernel's launch, in order, with its buffers at `pointers`."""
    return [kernel_launch(kernel, function, pointers) for kernel, function in zip(kernels, functions)]


# Each Program's loaded kernels, so that calling it again does not load its modules again: keyed by the
# Program's id and dropped when the Program is collected; within, by (name, cubin), so a kernel swapped in
# is loaded and the one it replaced is let go.
_loaded: dict[int, dict[tuple[str, bytes], runtime.Function]] = {}


def loaded_functions(program: CompiledProgram | LaunchPlan) -> list[runtime.Function]:
    """The loaded kernel functions of `program`, in launch order (a LaunchPlan's are loaded each time)."""
    keys = [(kernel.symbol, kernel.cubin) for kernel in program.kernels]
    if isinstance(program, LaunchPlan):
        return [runtime.Module(cubin).function(name) for name, cubin in keys]
    if id(program) not in _loaded:
        weakref.finalize(program, _loaded.pop, id(program), None)
    before = _loaded.get(id(program), {})
    loaded = {key: before.get(key) or runtime.Module(key[1]).function(key[0]) for key in keys}
    _loaded[id(program)] = loaded
    return [loaded[key] for key in keys]


@dataclass
class Session:
    """Device memory and loaded modules for one CompiledProgram, so that launches can be repeated and timed.

    `borrowed` maps buffer names to device pointers the caller owns (zero-copy inputs and outputs);
    every other buffer is allocated here and freed with `stack`. A Program's modules stay loaded
    between sessions (for as long as the Program lives).
    """

    program: CompiledProgram | LaunchPlan
    stack: ExitStack
    borrowed: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.functions = loaded_functions(self.program)
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
        item = kernel_launch(self.program.kernels[position], self.functions[position], self.pointers)
        runtime.launch_item(item)

    def launches(self) -> list[runtime.Launch]:
        """Every kernel's launch on this session's buffers, in order."""
        return kernel_launches(self.program.kernels, self.functions, self.pointers)

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


def run_on_gpu(program: CompiledProgram, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One run of every kernel on host arrays, copied in and out; outputs are poisoned first. The device buffers are
    the program's own, allocated on its first run and kept while it lives, so that later runs allocate nothing."""
    state = program.gpu_state
    with state.setdefault("host_lock", threading.Lock()):
        session = state.get("host_session")
        if session is None:     # its buffers are freed with it, when the program is collected
            session = state["host_session"] = Session(program, ExitStack())
        session.functions = loaded_functions(program)    # kernels may have been swapped in since
        session.upload(arrays)
        session.run_all()
        return session.download()


def profile_on_gpu(program: CompiledProgram | LaunchPlan, arrays: dict[str, np.ndarray], warmup: int = 10,
                   repeat: int = 50, per_kernel: bool = True) -> Profile:
    """Outputs of one run on poisoned buffers, then each kernel's median ms (with `per_kernel`; else []) and the
    whole program's, its launches replayed as one CUDA graph (L2 flushed before each run)."""
    with ExitStack() as stack:
        session = Session(program, stack)
        session.upload(arrays)
        session.run_all()
        outputs = session.download()
        kernel_ms = [median(runtime.time_kernel(functools.partial(session.launch, p), warmup, repeat))
                     for p in range(len(program.kernels))] if per_kernel else []
        replayed = runtime.LaunchGraph(session.launches())   # as a program is called: one graph, no Python between
        total = median(runtime.time_kernel(replayed.replay, warmup, repeat))
        return outputs, kernel_ms, total


class Profiler(Protocol):
    """Where programs are measured: `InProcess` or `InWorker`."""

    def profile(self, program: CompiledProgram | LaunchPlan, arrays: dict[str, np.ndarray], warmup: int = 10,
                repeat: int = 50, per_kernel: bool = True, expected_s: float = 0.0) -> Profile:
        """profile_on_gpu's outputs and times; `expected_s` is the program's predicted time, for a deadline."""
        ...

    def close(self) -> None:
        ...


class InProcess:
    """Measure in this process (profile_on_gpu): for trusted programs, as a fault here is this process's."""

    def profile(self, program: CompiledProgram | LaunchPlan, arrays: dict[str, np.ndarray], warmup: int = 10,
                repeat: int = 50, per_kernel: bool = True, expected_s: float = 0.0) -> Profile:
        return profile_on_gpu(program, arrays, warmup, repeat, per_kernel)

    def close(self) -> None:
        pass

    def __enter__(self) -> InProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


TIMEOUT_FLOOR_S = 20.0    # the least a measurement is given: the worker's CUDA context and module loads take ~1 s
TIMEOUT_SLACK = 50.0      # times the predicted time of every run: the cost model can be far off


class InWorker:
    """Measure in a persistent worker process; a fault or a hang raises KernelFault and the worker is replaced.

    The inputs go to the worker once and are kept there while they are the same object. Where no worker can
    start at all, this says so once (a warning) and measures in this process from then on.
    """

    def __init__(self, timeout_floor_s: float = TIMEOUT_FLOOR_S, timeout_slack: float = TIMEOUT_SLACK,
                 worker: Worker | None = None):
        self.timeout_floor_s = timeout_floor_s
        self.timeout_slack = timeout_slack
        self.worker = worker or Worker()
        self._held: tuple[int, object, int] | None = None   # (worker start, the arrays, their key there)
        self._shared: SharedArrays | None = None   # the held arrays, as a worker (a new one too) receives them
        self._keys = itertools.count()
        self._fallback: InProcess | None = None

    def profile(self, program: CompiledProgram | LaunchPlan, arrays: dict[str, np.ndarray], warmup: int = 10,
                repeat: int = 50, per_kernel: bool = True, expected_s: float = 0.0) -> Profile:
        if self._fallback is not None:
            return self._fallback.profile(program, arrays, warmup, repeat, per_kernel)
        plan = LaunchPlan.of(program)
        runs = (warmup + repeat) * (1 + (len(plan.kernels) if per_kernel else 0)) + 1
        timeout_s = self.timeout_floor_s + self.timeout_slack * runs * max(expected_s, 0.0)
        names = ", ".join(k.name for k in plan.kernels)
        try:
            key = self._hold(arrays)
            return self.worker.call(_profile_held, plan, key, warmup, repeat, per_kernel, timeout_s=timeout_s)
        except WorkerStartFailed as err:
            log.warning("no measurement worker could start (%s); measuring in this process instead, where a kernel"
                        " that faults or hangs stops the compilation", err)
            self._fallback = InProcess()
            return self._fallback.profile(program, arrays, warmup, repeat, per_kernel)
        except WorkerTimedOut:
            raise KernelFault(f"kernels {names} did not finish in {timeout_s:.1f} s; their worker was killed",
                              "timed out") from None
        except WorkerCrashed as err:
            raise KernelFault(f"kernels {names}: {err}", "faulted") from None
        except DeviceError as err:   # the worker's context is lost after a fault: start afresh
            self.worker.stop()
            raise KernelFault(f"kernels {names}: {err}", "faulted") from None

    def close(self) -> None:
        self.worker.close()
        self._held = None
        if self._shared is not None:
            self._shared.close()
            self._shared = None

    def __enter__(self) -> InWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _hold(self, arrays: dict[str, np.ndarray]) -> int:
        """The key under which the worker holds `arrays`, sending them when it does not hold them yet."""
        self.worker.start()
        held = self._held
        if held is not None and held[0] == self.worker.starts and held[1] is arrays:
            return held[2]
        key = next(self._keys)
        if self._shared is None or self._shared.arrays is not arrays:
            if self._shared is not None:
                self._shared.close()
            self._shared = SharedArrays(arrays)
        self.worker.call(_hold_inputs, key, self._shared.payload,
                         timeout_s=self.timeout_floor_s + self.worker.start_timeout_s)
        self._held = (self.worker.starts, arrays, key)
        return key


# the worker's side: one set of inputs held between calls --------------------------------------------

_held_inputs: dict[int, dict[str, np.ndarray]] = {}


def _hold_inputs(key: int, payload: dict[str, np.ndarray | str]) -> None:
    """In the worker: keep the payload's arrays (shared_arrays) under `key` (only the latest set is kept), and open
    the CUDA context (where there is a GPU), so that a measurement's deadline counts the kernels, not the driver's
    start."""
    _held_inputs.clear()
    _held_inputs[key] = received(payload)
    if runtime.gpu_available():
        runtime.device_properties()


def _profile_held(plan: LaunchPlan, key: int, warmup: int, repeat: int, per_kernel: bool) -> Profile:
    """In the worker: profile_on_gpu on the inputs held under `key`; a fault is reported as it first surfaced."""
    try:
        return profile_on_gpu(plan, _held_inputs[key], warmup, repeat, per_kernel)
    except DeviceError as err:
        first = err    # freeing the buffers after a fault fails too, and that error would hide the fault
        while isinstance(first.__context__, DeviceError):
            first = first.__context__
        raise first from None


def time_program(program: CompiledProgram | LaunchPlan, arrays: dict[str, np.ndarray], warmup: int = 3,
                 repeat: int = 10) -> float:
    """Median ms of the whole program on `arrays`, L2 flushed before each run, in this process."""
    with ExitStack() as stack:
        session = Session(program, stack)
        session.upload(arrays)
        return median(runtime.time_kernel(session.run_all, warmup, repeat))
