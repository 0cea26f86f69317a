"""On the GPU: a kernel that faults or hangs is reported and skipped, and measuring goes on in a fresh worker.

Run with `pytest -m gpu tests/gpu/test_isolation_gpu.py`; each hang costs its deadline (a few seconds).
"""
from __future__ import annotations

import dataclasses
import multiprocessing

import numpy as np
import pytest

import tensorsmith as ts
from graph_cases import CASES
from tensorsmith import pipeline
from tensorsmith.codegen import runtime
from tensorsmith.codegen.nvrtc import compile_cubin
from tensorsmith.executor import InProcess, InWorker, LaunchPlan
from tensorsmith.ir.dtypes import DType
from tensorsmith.ir.errors import KernelFault
from tensorsmith.ir.kernel_program import Buffer, KernelProgram
from tensorsmith.ir.targets import Target, get_target
from tensorsmith.program import CompiledKernel
from tensorsmith.search.beam import BeamConfig
from tensorsmith.search.engine import SearchConfig, search_program
from tensorsmith.search.mcts import MCTSConfig
from tensorsmith.search.verify import compare, random_inputs

pytestmark = pytest.mark.gpu

N = 1 << 20
THREADS = 256
HANG_DEADLINE_S = 5.0     # the floor of the deadline in these tests; a real search gives 20 s

KERNELS = r"""
#define N (1 << 20)

extern "C" __global__ void good(const float* __restrict__ g_x, float* __restrict__ g_y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < N) g_y[i] = 2.0f * g_x[i] + 1.0f;
}

// Every thread stores through a pointer into the unmapped first page: CUDA_ERROR_ILLEGAL_ADDRESS.
extern "C" __global__ void faulting(const float* __restrict__ g_x, float* __restrict__ g_y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  volatile float* bad = reinterpret_cast<volatile float*>(8ull * (1 + (i & 63)));
  if (i < N) *bad = g_x[i];
}

// Spins for ever (2^62 clocks): clock64() is volatile, so the compiler must keep the loop. (A loop on a
// volatile local was measured to finish on the H200: the compiler may drop it.)
extern "C" __global__ void spinning(const float* __restrict__ g_x, float* __restrict__ g_y) {
  const long long start = clock64();
  while (clock64() - start < (1ll << 62)) {}
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < N) g_y[i] = g_x[i];
}
"""


@pytest.fixture(scope="module")
def cubin() -> bytes:
    major, minor = runtime.device_properties()["compute_capability"]
    return compile_cubin(KERNELS, "isolation_test", arch=f"sm_{major}{minor}")


def plan(cubin: bytes, name: str) -> LaunchPlan:
    """y = kernel(x) over N floats, as the executor runs a Program."""
    kernel = CompiledKernel(name, f"00_{name}", "pointwise", {}, KERNELS, cubin, (N // THREADS, 1, 1),
                            (THREADS, 1, 1), ("x", "y"), ("y",))
    buffers = {"x": Buffer("x", (N,), DType.FLOAT32, "input"), "y": Buffer("y", (N,), DType.FLOAT32, "output")}
    return LaunchPlan((kernel,), buffers, ("y",))


INPUTS = {"x": np.random.default_rng(0).standard_normal(N).astype(np.float32)}
EXPECTED = 2.0 * INPUTS["x"] + 1.0


def assert_good(gpu, cubin: bytes) -> None:
    outputs, kernel_ms, total_ms = gpu.profile(plan(cubin, "good"), INPUTS, warmup=2, repeat=5)
    np.testing.assert_allclose(outputs["y"], EXPECTED, rtol=1e-6)
    assert len(kernel_ms) == 1 and 0 < kernel_ms[0] < 1000 and 0 < total_ms < 1000


def test_a_faulting_and_a_hanging_kernel_are_reported_and_measuring_goes_on(cubin: bytes) -> None:
    with InWorker(timeout_floor_s=HANG_DEADLINE_S) as gpu:
        assert_good(gpu, cubin)
        first = gpu.worker.pid
        with pytest.raises(KernelFault, match="kernels faulting: .*CUDA_ERROR_") as fault:
            gpu.profile(plan(cubin, "faulting"), INPUTS, warmup=2, repeat=5)
        assert fault.value.verdict == "faulted"
        assert_good(gpu, cubin)                     # in a new worker: the old one's context is gone
        assert gpu.worker.pid != first
        with pytest.raises(KernelFault, match="kernels spinning did not finish") as hang:
            gpu.profile(plan(cubin, "spinning"), INPUTS, warmup=2, repeat=5, expected_s=1e-4)
        assert hang.value.verdict == "timed out"
        assert_good(gpu, cubin)
        assert gpu.worker.starts == 3
    assert_good(InProcess(), cubin)                 # and this process's own context was never touched


FAULT = "{ *reinterpret_cast<volatile float*>(8) = 1.0f; }"
SPIN = "{ const long long start = clock64(); while (clock64() - start < (1ll << 62)) {} }"


def sabotaged(source: str, statement: str) -> str:
    """`source` with `statement` as the first statement of its kernel's body."""
    body = source.index("{", source.index('extern "C"'))
    return source[:body + 1] + "\n  " + statement + "\n" + source[body + 1:]


def test_a_search_skips_candidates_that_fault_or_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = CASES["many_short_rows"]()
    real_render = pipeline.render
    plans = iter([FAULT, SPIN])      # the first candidate measured faults, the second hangs, the rest are real

    def render(program: KernelProgram, target: Target) -> pipeline.Rendered:
        rendered = real_render(program, target)
        statement = next(plans, None)
        if statement is None:
            return rendered
        first = rendered.kernels[0]      # NVRTC compiles build_source; the file shows source: sabotage both
        return pipeline.Rendered([dataclasses.replace(first, source=sabotaged(first.source, statement),
                                                      build_source=sabotaged(first.build_source, statement)),
                                  *rendered.kernels[1:]])

    monkeypatch.setattr(pipeline, "render", render)
    context = pipeline.Context(graph, pipeline.CompileOptions(), get_target("sm90"))
    config = SearchConfig(BeamConfig(width=2, rounds=1), MCTSConfig(iterations=12, schedules_per_kernel=4))
    with InWorker(timeout_floor_s=HANG_DEADLINE_S) as gpu:
        measure = pipeline._measure_on_gpu(context, context.target, gpu)
        result = search_program(graph, "sm90", budget_s=120, measure=measure, config=config)
    stats = result.stats
    assert (stats.faulted, stats.timed_out) == (1, 1)
    assert stats.measured >= 1 and result.measured_us is not None and result.measured_us > 0
    verdicts = [entry["verdict"] for entry in result.history]
    assert "faulted" in verdicts and "timed out" in verdicts
    monkeypatch.setattr(pipeline, "render", real_render)
    winner = pipeline.built_program(graph, get_target("sm90"), result.program)
    pipeline.measure(graph, winner, random_inputs(graph, seed=3))


def test_profiled_compile_measures_in_a_worker_and_leaves_none_behind() -> None:
    graph = CASES["norms"]()
    program = ts.compile(graph, profile=True, cache=False, budget_s=60)
    search = program.report["search"]
    assert search["measured"] >= 1 and search["faulted"] == search["timed_out"] == search["wrong_on_gpu"] == 0
    assert program.report["total_ms"] > 0 and all(k.measured_ms for k in program.kernels)
    assert not [p for p in multiprocessing.active_children() if p.name == "tensorsmith-worker"]
    inputs = random_inputs(graph, seed=9)
    for check in compare(graph, program(device="cuda", **inputs), ts.evaluate(graph, inputs)):
        assert check.ok, f"{check.output}: relative L2 {check.error:.3g} > {check.tolerance:g}"


def test_calling_a_program_again_does_not_load_its_modules_again(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = CASES["norms"]()
    program = ts.compile(graph, profile=False)
    loads: list[bytes] = []
    real = runtime.Module

    class Counting(real):
        def __init__(self, cubin: bytes):
            loads.append(cubin)
            super().__init__(cubin)

    monkeypatch.setattr(runtime, "Module", Counting)
    inputs = random_inputs(graph, seed=4)
    first = program(device="cuda", **inputs)
    again = program(device="cuda", **inputs)
    assert len(loads) == len(program.kernels)
    for name in first:
        np.testing.assert_array_equal(first[name], again[name])
