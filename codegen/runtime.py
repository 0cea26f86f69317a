"""Run cubins on the GPU through the CUDA driver API (cuda.bindings.driver); never hangs without a driver.

    if gpu_available():
        module = Module(compile_cubin(source, "axpb"))
        with DeviceBuffer.from_array(x) as g_x, DeviceBuffer(x.nbytes) as g_y:
            g_y.fill_bytes(0xFF)                  # poison: NaN in every float dtype
            launch(module.function("axpb"), (blocks, 1, 1), (256, 1, 1), [g_x, g_y, np.float32(b), np.int32(n)])
            y = g_y.download(x.shape, x.dtype)

Everything runs in device 0's primary context (the one the CUDA runtime, torch and cupy use too),
so pointers from those libraries are valid here. Work goes to the legacy default stream unless a
stream is given; the synchronous copies of DeviceBuffer wait for it. Kernel faults are reported
late, by the next call that synchronizes: `launch(..., sync=True)` or `synchronize()` pins them to
one kernel. `launch(..., programmatic=True)` is a programmatic dependent launch (sm_90, cuLaunchKernelEx): the
kernel may start while the one before it finishes, and waits for it in its first statement (griddepcontrol.wait,
which every template emits). `LaunchGraph` holds a sequence of launches as one CUDA graph, replayed on any stream
with one call.

Only the driver API is used: on a machine without a driver a cuda.core runtime object can leave
a lock held so that the next `Device()` hangs for ever (see DESIGN.md), so nothing here touches
cuda.core, and every entry point checks `gpu_available()` first.
"""
from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from cuda.bindings import driver

from tensorsmith.ir.errors import DeviceError, InputError

Dim3 = tuple[int, int, int]

DEFAULT_DYNAMIC_SHARED_LIMIT = 48 * 1024  # above this a kernel must opt in to more dynamic shared memory

# The by-value kernel argument types, each passed with the C type of the same size.
SCALAR_DTYPES: frozenset[np.dtype] = frozenset(
    np.dtype(t) for t in (np.int32, np.uint32, np.int64, np.uint64, np.float16, np.float32, np.float64)
)

# device_properties() keys -> driver attributes.
DEVICE_ATTRIBUTES: dict[str, driver.CUdevice_attribute] = {
    "sm_count": driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    "l2_bytes": driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE,
    "max_shared_per_block_optin": driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
    "max_shared_per_sm": driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
    "max_registers_per_block": driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK,
    "max_threads_per_block": driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
    "warp_size": driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_WARP_SIZE,
}
_CC_MAJOR = driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
_CC_MINOR = driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
_MAX_DYNAMIC_SHARED = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_PROGRAMMATIC = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


# ---- errors and the context ---------------------------------------------------------------------


def _cu(call: Callable[..., tuple], *args: Any) -> Any:
    """Call a driver function; raise DeviceError naming it on failure; return its value(s), if any."""
    err, *values = call(*args)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise DeviceError(f"{call.__name__} failed: {_error_name(err)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _error_name(err: driver.CUresult) -> str:
    """The driver's name for a result code, e.g. CUDA_ERROR_ILLEGAL_ADDRESS."""
    try:
        status, name = driver.cuGetErrorName(err)
        if status == driver.CUresult.CUDA_SUCCESS and name:
            return name.decode()
    except Exception:  # no driver to ask: fall back to the enum's own name
        pass
    return getattr(err, "name", str(err))


@functools.cache
def gpu_available() -> bool:
    """Whether a CUDA driver and at least one GPU are present (checked once; never hangs)."""
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return False
        err, count = driver.cuDeviceGetCount()
        return err == driver.CUresult.CUDA_SUCCESS and count > 0
    except Exception:  # no libcuda.so: cuda.pathfinder raises DynamicLibNotFoundError
        return False


@dataclass(frozen=True)
class _Context:
    device: driver.CUdevice
    handle: driver.CUcontext


_context_lock = threading.Lock()
_context: _Context | None = None
_current = threading.local()  # per thread: whether the context has been made current there


def _ensure_context() -> _Context:
    """Device 0's primary context, retained on first use and made current in the calling thread."""
    global _context
    if _context is None:
        with _context_lock:
            if _context is None:
                if not gpu_available():
                    raise DeviceError("no usable GPU: the CUDA driver is missing or reports no device")
                device = _cu(driver.cuDeviceGet, 0)
                _context = _Context(device, _cu(driver.cuDevicePrimaryCtxRetain, device))
    if not getattr(_current, "done", False):
        _cu(driver.cuCtxSetCurrent, _context.handle)
        _current.done = True
    return _context


def _release(call: Callable[..., tuple], handle: Any) -> None:
    """Free a buffer or unload a module, from whichever thread the garbage collector runs in."""
    _ensure_context()
    _cu(call, handle)


_last_launch = ""  # the kernel launched last, named in asynchronous errors


def synchronize() -> None:
    """Wait for all work on the GPU; a kernel fault surfaces here as DeviceError."""
    _ensure_context()
    try:
        _cu(driver.cuCtxSynchronize)
    except DeviceError as err:
        raise DeviceError(f"{err} (the last kernel launched was {_last_launch or 'none'})") from None


# ---- device facts -------------------------------------------------------------------------------


def device_name() -> str:
    """The GPU's name, e.g. 'NVIDIA H200'."""
    name = _cu(driver.cuDeviceGetName, 256, _ensure_context().device)
    return name.split(b"\x00", 1)[0].decode()


def device_properties() -> dict[str, Any]:
    """Device 0's name, compute capability, SM count, L2 size and shared-memory limits."""
    return dict(_device_properties())


def sm_count() -> int:
    """Device 0's SMs (read once): how many blocks a persistent kernel launches at most."""
    return _device_properties()["sm_count"]


@functools.cache
def _device_properties() -> dict[str, Any]:
    """device_properties(), read once."""
    device = _ensure_context().device
    props: dict[str, Any] = {"name": device_name()}
    props["compute_capability"] = (_cu(driver.cuDeviceGetAttribute, _CC_MAJOR, device),
                                   _cu(driver.cuDeviceGetAttribute, _CC_MINOR, device))
    for key, attribute in DEVICE_ATTRIBUTES.items():
        props[key] = _cu(driver.cuDeviceGetAttribute, attribute, device)
    return props


# ---- memory -------------------------------------------------------------------------------------


_allocations = 0   # cuMemAlloc calls made by DeviceBuffer in this process


def allocation_count() -> int:
    """How many device allocations (cuMemAlloc) DeviceBuffer has made in this process: a call that should reuse its
    memory can be shown to."""
    return _allocations


class DeviceBuffer:
    """A block of GPU memory: upload, download, poison with a byte; freed by free(), `with` or GC."""

    def __init__(self, nbytes: int):
        global _allocations
        _ensure_context()
        if nbytes < 0:
            raise InputError(f"a device buffer needs nbytes >= 0, got {nbytes}")
        self.nbytes = int(nbytes)
        self.ptr: int = int(_cu(driver.cuMemAlloc, max(self.nbytes, 1)))  # cuMemAlloc(0) is an error
        _allocations += 1
        self._finalizer = weakref.finalize(self, _release, driver.cuMemFree, self.ptr)
        self._finalizer.atexit = False  # at exit the process gives the memory back anyway

    @classmethod
    def from_array(cls, data: Any) -> DeviceBuffer:
        """A new buffer holding a copy of `data` (numpy-like, or a __cuda_array_interface__ array)."""
        buffer = cls(_nbytes_of(data))
        buffer.upload(data)
        return buffer

    def upload(self, data: Any) -> None:
        """Copy `data` into the start of the buffer: device-to-device for GPU arrays, else from host."""
        _ensure_context()
        if hasattr(data, "__cuda_array_interface__"):
            pointer, nbytes = _cuda_array(data)
            self._check_fits(nbytes)
            if nbytes:
                _cu(driver.cuMemcpyDtoD, self.ptr, pointer, nbytes)
            return
        array = np.asarray(data, order="C")
        self._check_fits(array.nbytes)
        if array.nbytes:
            _cu(driver.cuMemcpyHtoD, self.ptr, array.ctypes.data, array.nbytes)

    def copy_from(self, pointer: int, nbytes: int) -> None:
        """Copy `nbytes` from another device address (any alignment) into the start of the buffer."""
        _ensure_context()
        self._check_fits(nbytes)
        if nbytes:
            _cu(driver.cuMemcpyDtoD, self.ptr, pointer, nbytes)

    def download(self, shape: Sequence[int] | int, dtype: Any) -> np.ndarray:
        """A new numpy array of `shape` and `dtype` read from the start of the buffer."""
        _ensure_context()
        out = np.empty(shape, dtype=dtype)
        self._check_fits(out.nbytes)
        if out.nbytes:
            _cu(driver.cuMemcpyDtoH, out.ctypes.data, self.ptr, out.nbytes)
        return out

    def fill_bytes(self, byte: int) -> None:
        """Set every byte to `byte` (0xFF poisons floats with NaN) with cuMemsetD8."""
        _ensure_context()
        _cu(driver.cuMemsetD8, self.ptr, byte & 0xFF, self.nbytes)

    def free(self) -> None:
        """Give the memory back now; later calls do nothing."""
        self._finalizer()

    def __enter__(self) -> DeviceBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __repr__(self) -> str:
        return f"DeviceBuffer(nbytes={self.nbytes}, ptr={self.ptr:#x})"

    def _check_fits(self, nbytes: int) -> None:
        """Raise InputError when `nbytes` do not fit in the buffer."""
        if nbytes > self.nbytes:
            raise InputError(f"{nbytes} bytes do not fit in a device buffer of {self.nbytes} bytes")


def _nbytes_of(data: Any) -> int:
    """The size in bytes of a numpy-like or __cuda_array_interface__ array."""
    if hasattr(data, "__cuda_array_interface__"):
        return _cuda_array(data)[1]
    return int(np.asarray(data).nbytes)


def _cuda_array(data: Any) -> tuple[int, int]:
    """(device pointer, nbytes) of a C-contiguous __cuda_array_interface__ array."""
    interface = data.__cuda_array_interface__
    shape = tuple(interface["shape"])
    itemsize = np.dtype(interface["typestr"]).itemsize
    strides = interface.get("strides")
    if strides is not None and tuple(strides) != _contiguous_strides(shape, itemsize):
        raise InputError(f"a GPU array must be C-contiguous to copy, got strides {tuple(strides)} for {shape}")
    return int(interface["data"][0]), int(np.prod(shape, dtype=np.int64)) * itemsize


def _contiguous_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """The byte strides of a C-contiguous array of `shape`."""
    strides, step = [], itemsize
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


# ---- modules and launches -----------------------------------------------------------------------


class Function:
    """One kernel of a loaded Module."""

    def __init__(self, module: Module, name: str, handle: driver.CUfunction):
        self.module = module  # keeps the module loaded while the function lives
        self.name = name
        self.handle = handle
        self.dynamic_shared_limit = DEFAULT_DYNAMIC_SHARED_LIMIT

    def allow_dynamic_shared(self, nbytes: int) -> None:
        """Let launches of this kernel use up to `nbytes` of dynamic shared memory (above 48 KB)."""
        if nbytes > self.dynamic_shared_limit:
            _cu(driver.cuFuncSetAttribute, self.handle, _MAX_DYNAMIC_SHARED, nbytes)
            self.dynamic_shared_limit = nbytes

    def __repr__(self) -> str:
        return f"Function({self.name!r})"


class Module:
    """A cubin loaded into the context; `.function(name)` gets a kernel by its extern "C" name."""

    def __init__(self, cubin: bytes):
        _ensure_context()
        self.handle: driver.CUmodule = _cu(driver.cuModuleLoadData, cubin)
        self._finalizer = weakref.finalize(self, _release, driver.cuModuleUnload, self.handle)
        self._finalizer.atexit = False

    def function(self, name: str) -> Function:
        """The kernel called `name` (its extern "C" name)."""
        try:
            handle = _cu(driver.cuModuleGetFunction, self.handle, name.encode())
        except DeviceError as err:
            raise DeviceError(f"kernel {name!r} not found in module: {err}") from None
        return Function(self, name, handle)

    def unload(self) -> None:
        """Unload the module now; its functions must not be launched afterwards."""
        self._finalizer()


@dataclass(frozen=True)
class PackedArgs:
    """Kernel arguments laid out for cuLaunchKernel: an array of pointers to one value each."""

    pointers: np.ndarray  # uint64[n]: the `void** kernelParams`
    values: tuple[np.ndarray, ...]  # the storage the pointers point into, kept alive with them

    @property
    def address(self) -> int:
        """The `void**` to hand to cuLaunchKernel (0 for a kernel without parameters)."""
        return int(self.pointers.ctypes.data) if len(self.values) else 0


def pack_args(args: Sequence[Any]) -> PackedArgs:
    """Lay out `args`: DeviceBuffers and GPU arrays as pointers, numpy scalars by value with their C type."""
    values = tuple(_arg_value(arg, i) for i, arg in enumerate(args))
    pointers = np.array([value.ctypes.data for value in values], dtype=np.uint64)
    return PackedArgs(pointers, values)


def _arg_value(arg: Any, index: int) -> np.ndarray:
    """One kernel argument as an array holding exactly the bytes the kernel reads."""
    if isinstance(arg, TensorMap):
        return arg.words
    if isinstance(arg, DeviceBuffer):
        if not arg._finalizer.alive:
            raise InputError(f"kernel argument {index} is a DeviceBuffer that has been freed")
        return np.array([arg.ptr], dtype=np.uint64)
    if hasattr(arg, "__cuda_array_interface__"):
        return np.array([arg.__cuda_array_interface__["data"][0]], dtype=np.uint64)
    if isinstance(arg, (np.generic, np.ndarray)) and arg.shape == () and arg.dtype in SCALAR_DTYPES:
        return np.array([arg], dtype=arg.dtype)
    raise InputError(
        f"kernel argument {index} is {type(arg).__name__}: pass a DeviceBuffer, a GPU array, or a numpy scalar "
        f"of {sorted(str(d) for d in SCALAR_DTYPES)} (a Python int or float has no C type)"
    )


TENSOR_MAP_BYTES, TENSOR_MAP_ALIGN = 128, 64


@dataclass(frozen=True, eq=False)
class TensorMap:
    """An encoded TMA descriptor, passed by value (a kernel's `const __grid_constant__` parameter)."""

    words: np.ndarray   # uint64[16], 64-byte aligned


@functools.lru_cache(maxsize=256)
def _encoded_tensor_map(spec: Any, pointer: int) -> TensorMap:
    rank = len(spec.dims)
    dtype = driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT16 if spec.element_bytes == 2 else \
        driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8
    try:
        encoded = _cu(driver.cuTensorMapEncodeTiled, dtype, rank, pointer,
                      [driver.cuuint64_t(d) for d in spec.dims], [driver.cuuint64_t(s) for s in spec.strides],
                      [driver.cuuint32_t(b) for b in spec.box], [driver.cuuint32_t(1)] * rank,
                      driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
                      driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
                      driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                      driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    except DeviceError as err:
        raise DeviceError(f"encoding the tensor map of {spec.buffer} (dims {spec.dims}, box {spec.box}) at "
                          f"{pointer:#x}: {err}") from None
    storage = np.zeros(TENSOR_MAP_BYTES // 8 + TENSOR_MAP_ALIGN // 8, dtype=np.uint64)
    start = (-storage.ctypes.data % TENSOR_MAP_ALIGN) // 8
    words = storage[start:start + TENSOR_MAP_BYTES // 8]
    words[:] = [int(word) for word in encoded.opaque]
    return TensorMap(words)


def tensor_map(spec: Any, pointer: int) -> TensorMap:
    """The TMA descriptor of `spec` (a codegen.tensor_map.TensorMapSpec) for its buffer at `pointer`."""
    _ensure_context()
    return _encoded_tensor_map(spec, pointer)


def launch(
    function: Function,
    grid: Dim3,
    block: Dim3,
    args: Sequence[Any],
    shared_bytes: int = 0,
    stream: Any = None,
    sync: bool = False,
    programmatic: bool = False,
) -> None:
    """Launch `function` on `grid` x `block`; with sync=True wait and report a fault as this kernel's.

    With `programmatic` the launch is a programmatic dependent launch (sm_90): the kernel may start while the kernel
    before it on the stream finishes, so it must execute griddepcontrol.wait before it reads what that one wrote."""
    global _last_launch
    _ensure_context()
    function.allow_dynamic_shared(shared_bytes)
    packed = pack_args(args)
    try:
        if programmatic:
            _cu(driver.cuLaunchKernelEx, _programmatic_config(grid, block, shared_bytes, stream), function.handle,
                packed.address, 0)
        else:
            _cu(driver.cuLaunchKernel, function.handle, *grid, *block, shared_bytes,
                0 if stream is None else stream, packed.address, 0)
    except DeviceError as err:
        raise DeviceError(f"launching {function.name} with grid={grid} block={block} shared_bytes={shared_bytes}"
                          f"{' (programmatic)' if programmatic else ''}: {err}") from None
    _last_launch = function.name
    if sync:
        synchronize()


def _programmatic_config(grid: Dim3, block: Dim3, shared_bytes: int, stream: Any) -> driver.CUlaunchConfig:
    """cuLaunchKernelEx's configuration of a launch that may overlap the end of the kernel before it on `stream`
    (a programmatic dependent launch); built without a driver, so that it can be checked anywhere."""
    attribute = driver.CUlaunchAttribute()
    attribute.id = _PROGRAMMATIC
    attribute.value.programmaticStreamSerializationAllowed = 1
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes = shared_bytes
    config.hStream = 0 if stream is None else stream
    config.attrs = [attribute]     # copied into the config's own array
    config.numAttrs = 1
    return config


def copy_async(destination: int, source: int, nbytes: int, stream: int = 0) -> None:
    """Queue a copy of `nbytes` from device address `source` to `destination` on `stream`."""
    _ensure_context()
    _cu(driver.cuMemcpyDtoDAsync, destination, source, nbytes, stream)


def stream_is_capturing(stream: int) -> bool:
    """Whether work queued on `stream` is being captured into a CUDA graph (torch.cuda.graph, cupy's capture)
    rather than run: then launches must go to the stream one by one, and nothing may synchronize."""
    _ensure_context()
    return _cu(driver.cuStreamIsCapturing, stream) != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


@dataclass(frozen=True)
class Launch:
    """One kernel launch, as `launch` takes it."""

    function: Function
    grid: Dim3
    block: Dim3
    args: Sequence[Any]
    shared_bytes: int = 0
    programmatic: bool = False


def launch_item(item: Launch, stream: Any = None) -> None:
    """`launch` of one `Launch` (programmatic where it is marked so), on `stream`."""
    launch(item.function, item.grid, item.block, item.args, item.shared_bytes, stream=stream,
           programmatic=item.programmatic)


class LaunchGraph:
    """Launches in a fixed order as one instantiated CUDA graph: `replay(stream)` queues them all with one driver
    call, leaving no launch gaps of Python's between them. `repoint(launches)` gives the same kernels other
    arguments for the replays after, including while an earlier replay still runs.

    The graph is recorded by capturing `launch` on a private stream, so that each node is exactly the launch
    `launch` makes (a kernel's compile-time cluster dimensions included; a programmatic launch's edge from the
    kernel before it is a programmatic one)."""

    def __init__(self, launches: Sequence[Launch]):
        _ensure_context()
        self.description = f"the graph of {', '.join(item.function.name for item in launches)}"  # for errors
        graph = _captured(launches)
        try:
            self.handle: driver.CUgraphExec = _cu(driver.cuGraphInstantiate, graph, 0)
        finally:
            _cu(driver.cuGraphDestroy, graph)
        finalize = weakref.finalize(self, _release, driver.cuGraphExecDestroy, self.handle)
        finalize.atexit = False

    def repoint(self, launches: Sequence[Launch]) -> None:
        """The same kernels, in the same order and shapes, on other arguments from the next replay on."""
        graph = _captured(launches)
        try:
            _cu(driver.cuGraphExecUpdate, self.handle, graph)
        finally:
            _cu(driver.cuGraphDestroy, graph)

    def replay(self, stream: int = 0) -> None:
        """Queue every launch on `stream`, in order."""
        global _last_launch
        _cu(driver.cuGraphLaunch, self.handle, stream)
        _last_launch = self.description


_capture_stream = threading.local()   # per thread: the private stream launches are captured on


def _captured(launches: Sequence[Launch]) -> driver.CUgraph:
    """A CUDA graph of `launches` in order, captured from `launch` on this thread's private stream (the caller
    destroys it)."""
    stream = getattr(_capture_stream, "handle", None)
    if stream is None:
        stream = _capture_stream.handle = _cu(driver.cuStreamCreate, driver.CUstream_flags.CU_STREAM_NON_BLOCKING)
    for item in launches:       # attributes are set before the capture, which records launches only
        item.function.allow_dynamic_shared(item.shared_bytes)
    _cu(driver.cuStreamBeginCapture, stream, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
    try:
        for item in launches:
            launch_item(item, stream)
    except DeviceError:
        err, graph = driver.cuStreamEndCapture(stream)     # end the capture; the launch's own error is the one told
        if err == driver.CUresult.CUDA_SUCCESS and graph:
            driver.cuGraphDestroy(graph)
        raise
    return _cu(driver.cuStreamEndCapture, stream)


# ---- timing -------------------------------------------------------------------------------------


@functools.cache
def _l2_scratch() -> DeviceBuffer:
    """A buffer twice the size of L2; writing it evicts whatever a previous run left in L2."""
    return DeviceBuffer(2 * _device_properties()["l2_bytes"])


def flush_l2_cache() -> None:
    """Evict L2 by writing a scratch buffer twice its size (on the legacy default stream)."""
    _l2_scratch().fill_bytes(0)


def time_kernel(run: Callable[[], None], warmup: int = 5, repeat: int = 50, flush_l2: bool = True) -> list[float]:
    """Milliseconds of each of `repeat` calls of `run`, by CUDA events, L2 flushed before each; take the median.

    `run` must put its work on the legacy default stream (launch's default), where the events are
    recorded. All runs are queued before one synchronize, so the GPU stays busy and a run's time is
    the GPU's, not Python's; for kernels shorter than the launch overhead keep flush_l2 on, as the
    flush gives the CPU a head start.
    """
    _ensure_context()
    for _ in range(warmup):
        _flush_if(flush_l2)
        run()
    starts = [_cu(driver.cuEventCreate, 0) for _ in range(repeat)]
    ends = [_cu(driver.cuEventCreate, 0) for _ in range(repeat)]
    try:
        for start, end in zip(starts, ends):
            _flush_if(flush_l2)
            _cu(driver.cuEventRecord, start, 0)
            run()
            _cu(driver.cuEventRecord, end, 0)
        synchronize()
        return [_cu(driver.cuEventElapsedTime, start, end) for start, end in zip(starts, ends)]
    finally:
        for event in (*starts, *ends):
            driver.cuEventDestroy(event)


def _flush_if(enabled: bool) -> None:
    """Flush L2 when `enabled`."""
    if enabled:
        flush_l2_cache()
