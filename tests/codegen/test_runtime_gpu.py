"""Launching cubins through the driver API. Tests marked `gpu` run on the H200; the rest run anywhere."""
from __future__ import annotations

import ctypes
import time

import numpy as np
import pytest

from tensorsmith.codegen import runtime
from tensorsmith.codegen.nvrtc import compile_cubin
from tensorsmith.codegen.runtime import DeviceBuffer, Module, launch
from tensorsmith.ir.errors import DeviceError, InputError

POISON = 0xFF  # every float dtype reads 0xFF.. bytes as NaN

AXPB = r"""
#include <cuda_fp16.h>

extern "C" __global__ void axpb_f32(const float* __restrict__ g_x, float* __restrict__ g_y, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) g_y[i] = 2.0f * g_x[i] + b;
}

extern "C" __global__ void axpb_f16(const __half* __restrict__ g_x, __half* __restrict__ g_y, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) g_y[i] = __float2half(2.0f * __half2float(g_x[i]) + b);
}

extern "C" __global__ void scalars(long long* g_i, double* g_f, int a, long long b, float c, double d,
                                   unsigned int e) {
  g_i[0] = a; g_i[1] = b; g_i[2] = e;
  g_f[0] = c; g_f[1] = d;
}

extern "C" __global__ void big_shared(float* g_y, int n) {
  extern __shared__ float s_buf[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) s_buf[i] = (float)i;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) g_y[i] = s_buf[n - 1 - i];
}
"""


@pytest.fixture(scope="module")
def module() -> Module:
    """The test kernels, compiled once for the GPU at hand."""
    major, minor = runtime.device_properties()["compute_capability"]
    return Module(compile_cubin(AXPB, "runtime_test", arch=f"sm_{major}{minor}"))


def blocks_for(n: int, threads: int = 256) -> tuple[int, int, int]:
    """A 1-D grid that covers n elements."""
    return ((n + threads - 1) // threads, 1, 1)


# ---- anywhere --------------------------------------------------------------------------------


def test_gpu_available_answers_quickly_with_a_bool():
    runtime.gpu_available.cache_clear()
    start = time.perf_counter()
    answer = runtime.gpu_available()
    assert isinstance(answer, bool)
    assert time.perf_counter() - start < 5.0


def test_test_kernels_compile(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORSMITH_CACHE_DIR", str(tmp_path))
    assert compile_cubin(AXPB, "runtime_test", arch="sm_90").startswith(b"\x7fELF")


@pytest.mark.skipif(runtime.gpu_available(), reason="checks the behaviour without a GPU")
def test_without_gpu_device_calls_raise_device_error():
    with pytest.raises(DeviceError, match="no usable GPU"):
        DeviceBuffer(16)
    with pytest.raises(DeviceError, match="no usable GPU"):
        runtime.device_name()


def test_pack_args_lays_out_pointers_to_c_values():
    class FakeGpuArray:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0xABC000, False), "version": 3}

    args = [np.int32(-7), np.int64(1 << 40), np.float32(1.5), np.float64(-2.25), np.uint32(3), FakeGpuArray()]
    packed = runtime.pack_args(args)
    pointers = [int(p) for p in packed.pointers]
    read = [
        ctypes.c_int32.from_address(pointers[0]).value,
        ctypes.c_int64.from_address(pointers[1]).value,
        ctypes.c_float.from_address(pointers[2]).value,
        ctypes.c_double.from_address(pointers[3]).value,
        ctypes.c_uint32.from_address(pointers[4]).value,
        ctypes.c_uint64.from_address(pointers[5]).value,
    ]
    assert read == [-7, 1 << 40, 1.5, -2.25, 3, 0xABC000]
    assert ctypes.c_uint64.from_address(packed.address).value == pointers[0]
    assert runtime.pack_args([]).address == 0


@pytest.mark.parametrize("bad", [3, 2.0, np.zeros(4, np.float32), "x", np.bool_(True)])
def test_pack_args_rejects_values_without_a_c_type(bad):
    with pytest.raises(InputError, match="kernel argument 1"):
        runtime.pack_args([np.int32(0), bad])


# ---- on the GPU ------------------------------------------------------------------------------


@pytest.mark.gpu
def test_device_properties_describe_a_gpu():
    props = runtime.device_properties()
    assert props["sm_count"] > 0 and props["l2_bytes"] > 0
    assert props["compute_capability"] >= (7, 0)
    assert props["max_shared_per_block_optin"] >= 48 * 1024
    assert props["name"] == runtime.device_name() and props["name"]


@pytest.mark.gpu
def test_buffer_round_trip_and_poison():
    x = np.arange(1000, dtype=np.float32)
    with DeviceBuffer.from_array(x) as buf:
        np.testing.assert_array_equal(buf.download(x.shape, x.dtype), x)
        buf.fill_bytes(POISON)
        assert np.isnan(buf.download(x.shape, np.float32)).all()
        assert (buf.download(x.nbytes, np.uint8) == POISON).all()


@pytest.mark.gpu
def test_upload_too_large_is_refused():
    with DeviceBuffer(8) as buf, pytest.raises(InputError, match="do not fit"):
        buf.upload(np.zeros(3, np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, kernel", [(np.float32, "axpb_f32"), (np.float16, "axpb_f16")])
@pytest.mark.parametrize("n", [1, 1000, 4096])
def test_axpb_matches_numpy(module, dtype, kernel, n):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(dtype)
    b = np.float32(0.75)
    tail = 37  # elements past n that the kernel must leave poisoned
    with DeviceBuffer.from_array(x) as g_x, DeviceBuffer((n + tail) * x.itemsize) as g_y:
        g_y.fill_bytes(POISON)
        launch(module.function(kernel), blocks_for(n), (256, 1, 1), [g_x, g_y, b, np.int32(n)], sync=True)
        y = g_y.download(n + tail, dtype)
    expected = (2.0 * x.astype(np.float64) + float(b)).astype(dtype)
    np.testing.assert_allclose(y[:n], expected, rtol=1e-3 if dtype == np.float16 else 1e-6)
    assert np.isnan(y[n:]).all()


@pytest.mark.gpu
def test_scalar_arguments_arrive_with_their_c_types(module):
    with DeviceBuffer(3 * 8) as g_i, DeviceBuffer(2 * 8) as g_f:
        g_i.fill_bytes(POISON)
        g_f.fill_bytes(POISON)
        args = [g_i, g_f, np.int32(-123456), np.int64(-(1 << 40) - 5), np.float32(3.25), np.float64(1e300),
                np.uint32(4_000_000_000)]
        launch(module.function("scalars"), (1, 1, 1), (1, 1, 1), args, sync=True)
        ints = g_i.download(3, np.int64)
        floats = g_f.download(2, np.float64)
    assert ints.tolist() == [-123456, -(1 << 40) - 5, 4_000_000_000]
    assert floats.tolist() == [3.25, 1e300]


@pytest.mark.gpu
def test_dynamic_shared_memory_above_48kb(module):
    n = 100 * 1024 // 4  # 100 KB of floats: needs the opt-in attribute
    with DeviceBuffer(n * 4) as g_y:
        g_y.fill_bytes(POISON)
        launch(module.function("big_shared"), (1, 1, 1), (1024, 1, 1), [g_y, np.int32(n)], shared_bytes=n * 4,
               sync=True)
        y = g_y.download(n, np.float32)
    np.testing.assert_array_equal(y, np.arange(n, dtype=np.float32)[::-1])


@pytest.mark.gpu
def test_bad_launch_raises_device_error_naming_the_call(module):
    with DeviceBuffer(4) as g_x, pytest.raises(DeviceError, match="axpb_f32.*cuLaunchKernel.*CUDA_ERROR_INVALID_VALUE"):
        launch(module.function("axpb_f32"), (1, 1, 1), (4096, 1, 1), [g_x, g_x, np.float32(0), np.int32(1)])


@pytest.mark.gpu
def test_missing_kernel_raises_device_error(module):
    with pytest.raises(DeviceError, match="no_such_kernel.*CUDA_ERROR_NOT_FOUND"):
        module.function("no_such_kernel")


@pytest.mark.gpu
def test_time_kernel_returns_positive_times(module):
    n = 1 << 22
    with DeviceBuffer(n * 4) as g_x, DeviceBuffer(n * 4) as g_y:
        g_x.fill_bytes(0)
        function = module.function("axpb_f32")
        args = [g_x, g_y, np.float32(1), np.int32(n)]
        times = runtime.time_kernel(lambda: launch(function, blocks_for(n), (256, 1, 1), args), warmup=2, repeat=10)
    assert len(times) == 10
    assert all(0 < t < 1000 for t in times)


@pytest.mark.gpu
@pytest.mark.parametrize("library", ["cupy", "torch"])
def test_upload_from_gpu_array_copies_device_to_device(module, library):
    lib = pytest.importorskip(library)
    x = np.arange(256, dtype=np.float32)
    gpu_x = lib.asarray(x) if library == "cupy" else lib.tensor(x, device="cuda")
    with DeviceBuffer.from_array(gpu_x) as g_x, DeviceBuffer(x.nbytes) as g_y:
        np.testing.assert_array_equal(g_x.download(x.shape, x.dtype), x)
        launch(module.function("axpb_f32"), blocks_for(256), (256, 1, 1), [gpu_x, g_y, np.float32(1), np.int32(256)],
               sync=True)
        np.testing.assert_array_equal(g_y.download(x.shape, x.dtype), 2 * x + 1)


@pytest.mark.gpu
def test_launch_graph_replays_in_order_and_takes_new_arguments(module):
    """y = 2x + 1, then z = 2y + 2 from the same graph; re-pointed at other buffers, it computes there, while
    the buffers of the earlier replay keep what it wrote."""
    n = 1000
    x = np.arange(n, dtype=np.float32)
    function = module.function("axpb_f32")
    with DeviceBuffer.from_array(x) as g_x, DeviceBuffer(n * 4) as g_y, DeviceBuffer(n * 4) as g_z, \
            DeviceBuffer.from_array(-x) as g_x2, DeviceBuffer(n * 4) as g_z2:
        graph = runtime.LaunchGraph([
            runtime.Launch(function, blocks_for(n), (256, 1, 1), [g_x, g_y, np.float32(1), np.int32(n)]),
            runtime.Launch(function, blocks_for(n), (256, 1, 1), [g_y, g_z, np.float32(2), np.int32(n)])])
        graph.replay()
        graph.repoint([
            runtime.Launch(function, blocks_for(n), (256, 1, 1), [g_x2, g_y, np.float32(1), np.int32(n)]),
            runtime.Launch(function, blocks_for(n), (256, 1, 1), [g_y, g_z2, np.float32(2), np.int32(n)])])
        graph.replay()
        runtime.synchronize()
        z, z2 = g_z.download(n, np.float32), g_z2.download(n, np.float32)
    np.testing.assert_array_equal(z, 4 * x + 4)
    np.testing.assert_array_equal(z2, -4 * x + 4)


@pytest.mark.gpu
def test_launch_graph_takes_more_than_48kb_of_shared_memory(module):
    n = 100 * 1024 // 4
    with DeviceBuffer(n * 4) as g_y:
        g_y.fill_bytes(POISON)
        runtime.LaunchGraph([runtime.Launch(module.function("big_shared"), (1, 1, 1), (1024, 1, 1),
                                            [g_y, np.int32(n)], n * 4)]).replay()
        runtime.synchronize()
        np.testing.assert_array_equal(g_y.download(n, np.float32), np.arange(n, dtype=np.float32)[::-1])


@pytest.mark.gpu
@pytest.mark.parametrize("programmatic", [False, True])
def test_measured_launch_cost_is_a_graph_nodes_microseconds(programmatic: bool):
    from tensorsmith.codegen.launch_cost import measured_launch_seconds
    seconds = measured_launch_seconds(programmatic)
    print(f"one more kernel, {'programmatic' if programmatic else 'ordinary'} launches: {seconds * 1e6:.2f} us")
    assert 0.1e-6 < seconds < 20e-6
