"""A Program called on the caller's GPU arrays (torch tensors, cupy arrays), as a framework's own op is called.

The kernels read the inputs where they are and write outputs allocated in the caller's framework (or the caller's
own, `out=`), on the framework's current stream; the call returns without synchronizing. For each stream a
program is called on (`_StreamState`):

- its temporaries live in one workspace, allocated once from the caller's framework (so it shows where users look,
  e.g. torch.cuda.memory_allocated) and kept while the program lives (for the STREAMS_KEPT streams used last);
- its launches are one CUDA graph (`runtime.LaunchGraph`), replayed with one driver call: one graph for each set
  of input and output addresses, up to GRAPHS_PER_STREAM, after which the least recently used is re-pointed;
- an input or output of at most STAGED_BYTES met at a new address (a generate loop's token and position, new
  tensors at every step, and a decode step's cache counters, written into new tensors) is staged from then on:
  the graph reads or writes a slot of the workspace, copied from the input before the replay or to the output
  after it, so that new addresses do not re-point the graph (a Llama-3.2-1B decode step's 92 launches);
- the next call's outputs are allocated right after this call's replay is queued, while the GPU runs it, so
  that allocating them does not delay the next call's kernels.

While the stream is being captured into the caller's own CUDA graph (`torch.cuda.graph`), the kernels are
launched onto it one by one, and their temporaries and outputs are allocated at the call, so that the caller's
graph owns them as it owns any op's.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensorsmith.codegen import runtime
from tensorsmith.ir.dtypes import DType, numpy_dtype
from tensorsmith.ir.errors import DeviceError, InputError

from .compiled import CompiledProgram
from .executor import VECTOR_ALIGNMENT, Session, kernel_launches, loaded_functions


GRAPHS_PER_STREAM = 4      # address sets kept replayable per stream: a caller alternating a few output buffers hits
STREAMS_KEPT = 8           # streams whose workspace and graphs are kept; the least recently used is let go after
WORKSPACE_ALIGNMENT = 256  # bytes between temporaries in the workspace: as cudaMalloc aligns, for any vector access
STAGED_BYTES = 1024        # inputs this small may be staged (see the module's docstring): a copy costs less than a
                           # re-pointed graph
DEVICE = 0                 # the GPU tensorsmith runs on (the runtime's context is device 0's)

_TORCH_DTYPES = {"float32": DType.FLOAT32, "float16": DType.FLOAT16, "bfloat16": DType.BFLOAT16,
                 "int32": DType.INT32, "bool": DType.BOOL}


def is_device_array(value: Any) -> bool:
    """A torch tensor on a GPU, or anything with `__cuda_array_interface__` (cupy, numba)."""
    if type(value).__module__.startswith("torch"):
        return bool(value.is_cuda)
    return hasattr(value, "__cuda_array_interface__")


class _Torch:
    """torch's side of a call: describe tensors, allocate on their device, find the current stream."""

    name = "torch"

    def __init__(self) -> None:
        import torch
        self.torch = torch
        self.dtypes = {dtype: getattr(torch, name) for name, dtype in _TORCH_DTYPES.items()}
        self.ours = {torch_dtype: dtype for dtype, torch_dtype in self.dtypes.items()}
        self._is_capturing = torch.cuda.is_current_stream_capturing

    def describe(self, value: Any) -> tuple[int, tuple[int, ...], DType | None, bool]:
        """(address, shape, dtype, contiguous), read without copying; the shape is torch's Size, a tuple."""
        return value.data_ptr(), value.shape, self.ours.get(value.dtype), value.is_contiguous()

    def address(self, value: Any) -> int:
        return int(value.data_ptr())

    def native(self, dtype: DType) -> Any:
        return self.dtypes[dtype]

    def checked_address(self, value: Any, shape: tuple[int, ...], dtype: Any) -> int | None:
        """`value`'s address where it is a contiguous, aligned array of `shape` and (torch) `dtype`; else None."""
        if value.shape == shape and value.dtype is dtype and value.is_contiguous():
            ptr = value.data_ptr()
            if not ptr % VECTOR_ALIGNMENT:
                return int(ptr)
        return None

    def capturing(self, stream: int) -> bool:
        return bool(self._is_capturing())

    def device_index(self, value: Any) -> int:
        return int(value.get_device())

    def stream(self) -> int:
        return int(self.torch._C._cuda_getCurrentRawStream(DEVICE))

    def empty(self, shape: tuple[int, ...], dtype: DType) -> Any:
        return self.torch.empty(shape, dtype=self.dtypes[dtype], device=f"cuda:{DEVICE}")

    def bytes(self, nbytes: int) -> Any:
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device=f"cuda:{DEVICE}")

    def aligned_copy(self, value: Any) -> Any:
        return value.clone()


class _Cupy:
    """cupy's (and any `__cuda_array_interface__` array's) side of a call."""

    name = "cupy"

    def __init__(self) -> None:
        import cupy
        self.cupy = cupy

    def address(self, value: Any) -> int:
        return int(value.__cuda_array_interface__["data"][0])

    def native(self, dtype: DType) -> Any:
        return dtype

    def checked_address(self, value: Any, shape: tuple[int, ...], dtype: Any) -> int | None:
        ptr, actual_shape, actual_dtype, contiguous = self.describe(value)
        ok = actual_shape == shape and actual_dtype == dtype and contiguous and not ptr % VECTOR_ALIGNMENT
        return int(ptr) if ok else None

    def capturing(self, stream: int) -> bool:
        return runtime.stream_is_capturing(stream)

    def describe(self, value: Any) -> tuple[int, tuple[int, ...], DType | None, bool]:
        cai = value.__cuda_array_interface__
        np_dtype = np.dtype(cai["typestr"])
        itemsize, shape = np_dtype.itemsize, tuple(cai["shape"])
        expected = tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) * itemsize for i in range(len(shape)))
        return cai["data"][0], shape, _TORCH_DTYPES.get(str(np_dtype)), cai.get("strides") in (None, expected)

    def device_index(self, value: Any) -> int:
        device = getattr(value, "device", None)
        return int(getattr(device, "id", DEVICE))

    def stream(self) -> int:
        return int(self.cupy.cuda.get_current_stream().ptr)

    def empty(self, shape: tuple[int, ...], dtype: DType) -> Any:
        if dtype == DType.BFLOAT16:
            raise InputError("cupy has no bfloat16: pass torch tensors or numpy arrays for this program")
        return self.cupy.empty(shape, dtype=numpy_dtype(dtype))

    def bytes(self, nbytes: int) -> Any:
        return self.cupy.empty(nbytes, dtype=np.uint8)

    def aligned_copy(self, value: Any) -> Any:
        return self.cupy.array(value, copy=True)


_frameworks: dict[str, _Torch | _Cupy] = {}


def framework_of(value: Any) -> _Torch | _Cupy:
    """The framework `value` belongs to (made once per process)."""
    name = "torch" if type(value).__module__.startswith("torch") else "cupy"
    if name not in _frameworks:
        _frameworks[name] = _Torch() if name == "torch" else _Cupy()
    return _frameworks[name]


PER_THREAD_STREAM = 2      # CU_STREAM_PER_THREAD: one handle that names another stream in every thread


def _stream_key(framework: _Torch | _Cupy, stream: int) -> tuple[str, int, int]:
    """What names a stream for the workspaces: its handle, and the thread where the handle is the per-thread
    default stream's (the same number in every thread)."""
    return framework.name, stream, threading.get_ident() if stream == PER_THREAD_STREAM else 0


def workspace_layout(program: CompiledProgram) -> tuple[dict[str, int], int]:
    """Each temporary's byte offset in one workspace, and the workspace's size."""
    offsets, size = {}, 0
    for name, buf in program.buffers.items():
        if buf.role == "temp":
            offsets[name] = size
            size += -(-max(buf.nbytes, 1) // WORKSPACE_ALIGNMENT) * WORKSPACE_ALIGNMENT
    return offsets, size


def staging_layout(program: CompiledProgram, start: int) -> tuple[dict[str, int], int]:
    """Each input and output of at most STAGED_BYTES given a slot in the workspace, at byte offsets from `start`
    (the end of the temporaries), and the workspace's size with them."""
    offsets, size = {}, start
    for name in (*program.inputs, *program.outputs):
        if (nbytes := program.buffers[name].nbytes) <= STAGED_BYTES:
            offsets[name] = size
            size += -(-max(nbytes, 1) // WORKSPACE_ALIGNMENT) * WORKSPACE_ALIGNMENT
    return offsets, size


def input_pointer(program: CompiledProgram, framework: _Torch | _Cupy, name: str, value: Any, held: list[Any]) -> int:
    """The device address the kernels read input `name` at, once `value` is checked to be what the program takes; a
    view at an address not 16-byte aligned is copied first (into `held`), as the kernels read 16 bytes at a time."""
    ptr, shape, dtype, contiguous = framework.describe(value)
    buf = program.buffers[name]
    if shape != buf.shape or dtype != buf.dtype or not contiguous:
        raise InputError(f"input {name!r}: expected a contiguous {buf.dtype} array of shape {buf.shape}, got "
                         f"{dtype or 'an unsupported dtype'} of shape {tuple(shape)}{'' if contiguous else ' (strided)'}")
    if ptr % VECTOR_ALIGNMENT:
        held.append(framework.aligned_copy(value))
        ptr = framework.address(held[-1])
    return int(ptr)


@dataclass
class _StreamState:
    """What one stream's calls of one program reuse: the workspace, the replayable graphs, the next outputs."""

    workspace: Any
    temporaries: dict[str, int]                     # temporary -> device address inside the workspace
    slots: dict[str, int]                           # small input or output -> its staging slot's address there
    graphs: OrderedDict[tuple[int, ...], runtime.LaunchGraph] = field(default_factory=OrderedDict)
    spare: dict[str, Any] = field(default_factory=dict)   # outputs allocated for the next call


class DeviceCaller:
    """A Program's calls on GPU arrays; see the module's docstring. One per CompiledProgram, made on its first such call."""

    def __init__(self, program: CompiledProgram):
        self.program = program
        self.lock = threading.Lock()
        self.kernels = list(program.kernels)
        self.inputs = frozenset(program.inputs)
        self.offsets, temporaries_bytes = workspace_layout(program)
        self.slot_offsets, self.workspace_bytes = staging_layout(program, temporaries_bytes)
        self.last_address: dict[str, int] = {}     # each small input's and output's address at the last call
        self.staged: set[str] = set()              # those met at a new address: staged from then on
        self.graphs_made = 0                       # graphs built or re-pointed: one per set of addresses, at best
        self.streams: OrderedDict[tuple[str, int, int], _StreamState] = OrderedDict()
        self.input_specs: dict[str, list[tuple[str, tuple[int, ...], Any]]] = {}

    def __call__(self, inputs: dict[str, Any], out: dict[str, Any] | None = None) -> dict[str, Any]:
        program = self.program
        framework = framework_of(inputs[program.inputs[0]])
        with self.lock:
            if self.kernels != program.kernels:      # kernels swapped in since: what was built for them goes
                self.kernels, self.streams = list(program.kernels), OrderedDict()
            stream = framework.stream()
            held: list[Any] = []                     # copies made for alignment, alive until the launch is queued
            pointers = {}
            for name, shape, dtype in self._specs(framework):
                ptr = framework.checked_address(inputs[name], shape, dtype)
                pointers[name] = ptr if ptr is not None else input_pointer(program, framework, name, inputs[name], held)
            if framework.capturing(stream):
                return self._launch_captured(framework, stream, inputs, pointers, out or {})
            key = _stream_key(framework, stream)
            state = self.streams.get(key)
            if state is None:
                state = self._new_state(framework, key)
            elif len(self.streams) > 1:
                self.streams.move_to_end(key)
            outputs = {name: self._output(framework, state.spare, name, out) for name in program.outputs}
            for name, array in outputs.items():
                pointers[name] = framework.address(array)
            staged = self._staged(pointers)
            addresses = tuple(0 if name in staged else pointer for name, pointer in pointers.items())
            graph = state.graphs.get(addresses)
            if graph is None:
                self._check_addresses(framework, inputs, outputs, pointers)
                slots = {name: state.slots[name] for name in staged}
                graph = self._graph_for(state, addresses, {**pointers, **state.temporaries, **slots})
            elif out and not staged.isdisjoint(out):   # the caller's own arrays at addresses the key leaves out
                state.graphs.move_to_end(addresses)
                self._check_addresses(framework, inputs, outputs, pointers)
            else:
                state.graphs.move_to_end(addresses)
                for name in staged & self.inputs:    # checked here, not once per set of addresses
                    _check_device(framework, name, inputs[name])
            for name in staged & self.inputs:
                runtime.copy_async(state.slots[name], pointers[name], self.program.buffers[name].nbytes, stream)
            graph.replay(stream)
            for name in staged - self.inputs:
                runtime.copy_async(pointers[name], state.slots[name], self.program.buffers[name].nbytes, stream)
            for name in program.outputs:             # the next call's outputs, allocated while the GPU works
                if name not in state.spare and not (out and name in out):
                    state.spare[name] = framework.empty(program.buffers[name].shape, program.buffers[name].dtype)
            return outputs

    def _staged(self, pointers: dict[str, int]) -> set[str]:
        """The small inputs and outputs to stage at this call: those met at a new address at this call or before."""
        for name in self.slot_offsets:
            last = self.last_address.get(name)
            if last is not None and last != pointers[name]:
                self.staged.add(name)
            self.last_address[name] = pointers[name]
        return self.staged

    def _specs(self, framework: _Torch | _Cupy) -> list[tuple[str, tuple[int, ...], Any]]:
        """Each input's name, shape and dtype as `framework` spells it (made once per framework)."""
        specs = self.input_specs.get(framework.name)
        if specs is None:
            specs = self.input_specs[framework.name] = [
                (name, self.program.buffers[name].shape, framework.native(self.program.buffers[name].dtype))
                for name in self.program.inputs]
        return specs

    def _output(self, framework: _Torch | _Cupy, spare: dict[str, Any], name: str, out: dict[str, Any] | None) -> Any:
        buf = self.program.buffers[name]
        if out and name in out:
            ptr, shape, dtype, contiguous = framework.describe(out[name])
            if shape != buf.shape or dtype != buf.dtype or not contiguous or ptr % VECTOR_ALIGNMENT:
                raise InputError(f"out[{name!r}]: expected a contiguous, 16-byte aligned {buf.dtype} array of shape "
                                 f"{buf.shape}, got {dtype or 'an unsupported dtype'} of shape {tuple(shape)}"
                                 f"{'' if contiguous else ' (strided)'}")
            return out[name]
        ready = spare.pop(name, None)
        return ready if ready is not None else framework.empty(buf.shape, buf.dtype)

    def _check_addresses(self, framework: _Torch | _Cupy, inputs: dict[str, Any], outputs: dict[str, Any],
                         pointers: dict[str, int]) -> None:
        """Checked once per set of addresses (a device address names its GPU): every array is on the program's GPU,
        and no output overlaps an input or another output (the kernels would read what they are writing), but an
        output given the very memory of the input it may be written over (`written_in_place`)."""
        for name, value in {**inputs, **outputs}.items():
            _check_device(framework, name, value)
        spans = {name: (pointers[name], pointers[name] + self.program.buffers[name].nbytes) for name in pointers}
        for name in self.program.outputs:
            start, end = spans[name]
            in_place = self.program.written_in_place.get(name)
            for other, (other_start, other_end) in spans.items():
                if other == in_place and (start, end) == (other_start, other_end):
                    continue
                if other != name and start < other_end and other_start < end:
                    raise InputError(f"out[{name!r}] overlaps {other!r} in memory; pass an output buffer of its own")

    def _new_state(self, framework: _Torch | _Cupy, key: tuple[str, int, int]) -> _StreamState:
        workspace = framework.bytes(self.workspace_bytes) if self.workspace_bytes else None
        base = framework.address(workspace) if workspace is not None else 0
        state = _StreamState(workspace, {name: base + offset for name, offset in self.offsets.items()},
                             {name: base + offset for name, offset in self.slot_offsets.items()})
        self.streams[key] = state
        if len(self.streams) > STREAMS_KEPT:   # its workspace goes back to the framework's pool for its own stream,
            self.streams.popitem(last=False)   # reused there only after the work queued on that stream
        return state

    def _launches(self, pointers: dict[str, int]) -> list[runtime.Launch]:
        return kernel_launches(self.kernels, loaded_functions(self.program), pointers)

    def _graph_for(self, state: _StreamState, key: tuple[int, ...], pointers: dict[str, int]) -> runtime.LaunchGraph:
        """A graph replaying the launches on `pointers`: a new one, or the least recently used one re-pointed."""
        launches = self._launches(pointers)
        self.graphs_made += 1
        graph = None
        if len(state.graphs) >= GRAPHS_PER_STREAM:
            _, graph = state.graphs.popitem(last=False)
            try:
                graph.repoint(launches)
            except DeviceError:             # the driver could not update it in place: make a new one
                graph = None
        graph = graph or runtime.LaunchGraph(launches)
        state.graphs[key] = graph
        return graph

    def _launch_captured(self, framework: _Torch | _Cupy, stream: int, inputs: dict[str, Any],
                         pointers: dict[str, int], out: dict[str, Any]) -> dict[str, Any]:
        """Launch one by one onto a stream that is being captured, on temporaries and outputs allocated now."""
        workspace = framework.bytes(self.workspace_bytes) if self.workspace_bytes else None
        base = framework.address(workspace) if workspace is not None else 0
        outputs = {name: self._output(framework, {}, name, out) for name in self.program.outputs}
        pointers.update({name: framework.address(array) for name, array in outputs.items()})
        self._check_addresses(framework, inputs, outputs, pointers)
        pointers.update({name: base + offset for name, offset in self.offsets.items()})
        for item in self._launches(pointers):
            runtime.launch_item(item, stream)
        return outputs


def _check_device(framework: _Torch | _Cupy, name: str, value: Any) -> None:
    index = framework.device_index(value)
    if index != DEVICE:
        raise InputError(f"{name!r} is {'on the host' if index < 0 else f'on GPU {index}'}; the program's "
                         f"inputs and outputs must all be on GPU {DEVICE} (cuda:{DEVICE}), where it runs")


def bind_device_arrays(program: CompiledProgram, inputs: dict[str, Any], stack: ExitStack) -> tuple[Session, dict[str, Any]]:
    """A Session whose inputs are the caller's GPU arrays and whose outputs are new arrays of the caller's framework
    (returned too), launching on the legacy default stream, so that its launches can be repeated and timed one by
    one; temporaries live as long as `stack`."""
    framework = framework_of(inputs[program.inputs[0]])
    held: list[Any] = []
    pointers = {name: input_pointer(program, framework, name, inputs[name], held) for name in program.inputs}
    outputs = {name: framework.empty(program.buffers[name].shape, program.buffers[name].dtype)
               for name in program.outputs}
    pointers.update({name: framework.address(array) for name, array in outputs.items()})
    stack.callback(held.clear)    # the aligned copies live as long as the session
    runtime.synchronize()     # the caller's framework may still be writing the inputs or the aligned copies
    return Session(program, stack, borrowed=pointers), outputs
