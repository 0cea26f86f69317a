"""On the GPU: the matmul archetype under several schedules matches the reference on fresh random inputs."""
from __future__ import annotations

import numpy as np
import pytest

import tensorsmith as ts
from matmul_cases import MATMUL_CASES, MATMUL_SCHEDULES, matmul_program
from tensorsmith.codegen import runtime
from tensorsmith.codegen.nvrtc import compile_cubin
from tensorsmith.executor import from_device_layout, to_device_layout
from tensorsmith.ir.dtypes import numpy_dtype
from tensorsmith.search.verify import random_inputs, relative_l2

pytestmark = pytest.mark.gpu


def _run_matmul_kernel(graph: ts.Graph, schedule: dict[str, int] | None, inputs: dict[str, np.ndarray]) -> np.ndarray:
    program, kernel = matmul_program(graph, schedule)
    assert program.kernels == [k for k in program.kernels if k.archetype == "matmul"], "one kernel: the matmul"
    function = runtime.Module(compile_cubin(kernel.source, kernel.name, arch=kernel.arch or "sm_90")).function(kernel.name)
    buffers = {}
    for name, buf in program.buffers.items():
        buffers[name] = runtime.DeviceBuffer(buf.nbytes)
        if buf.role == "input":
            buffers[name].upload(to_device_layout(inputs[name], buf.dtype))
        else:
            buffers[name].fill_bytes(0xFF)   # NaN: an element the kernel does not write fails the check
    runtime.launch(function, kernel.grid, kernel.block, [buffers[p] for p in kernel.params], kernel.shared_bytes,
                   sync=True)
    (out,) = program.outputs.values()
    buf = program.buffers[out]
    return from_device_layout(buffers[out].download(buf.shape, numpy_dtype(buf.dtype)), buf.dtype)


@pytest.mark.parametrize("schedule", MATMUL_SCHEDULES, ids=lambda s: "default" if s is None else "x".join(map(str, s.values())))
@pytest.mark.parametrize("case", sorted(MATMUL_CASES))
def test_matmul_matches_reference(case: str, schedule: dict[str, int] | None) -> None:
    graph = MATMUL_CASES[case]()
    for draw in range(2):   # fresh inputs: the kernel computes the function, not one answer
        inputs = random_inputs(graph, seed=100 + draw)
        out = _run_matmul_kernel(graph, schedule, inputs)
        (name,) = graph.outputs
        reference = ts.evaluate(graph, inputs)[name]
        assert not np.isnan(out).any(), "unwritten (poisoned) elements"
        assert relative_l2(out, reference) < 1e-2
