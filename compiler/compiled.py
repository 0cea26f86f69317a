"""A compiled program as plain data: its kernels (source, cubin, launch shape, measured time), buffers, and the
graph and kernel program they came from. The executor, the device calls and the report read this; `program.Program`
adds calling and saving on top of it."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from tensorsmith.codegen.tensor_map import TensorMapSpec
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.kernel_program import Buffer, KernelProgram

PROGRAM_FORMAT = 1


@dataclass(frozen=True)
class CompiledKernel:
    """One generated kernel: its source, cubin, launch shape and measured time (ms, None if not profiled)."""

    name: str
    file_stem: str
    archetype: str
    schedule: dict[str, int]
    source: str
    cubin: bytes
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    params: tuple[str, ...]
    writes: tuple[str, ...]
    measured_ms: float | None = None
    predicted_ms: float | None = None
    shared_bytes: int = 0              # dynamic shared memory per block
    tensor_maps: tuple[TensorMapSpec, ...] = ()   # TMA descriptors, encoded at launch after the params
    persistent: bool = False           # blocks walk the work by gridDim.x: launched at most one per SM of the GPU
    entry: str = ""                    # the function's name in the cubin, where it is not `name` (kernels that
                                       # compute alike share one: codegen.render.entry_name)
    programmatic: bool = False         # launched as a programmatic dependent launch: it may start while the kernel
                                       # before it finishes, and waits for its writes (Target.programmatic_launch)

    @property
    def symbol(self) -> str:
        return self.entry or self.name


@dataclass
class CompiledProgram:
    """A compiled graph as data: its kernels, buffers and the graph they were compiled from."""

    name: str
    target: str
    buffers: dict[str, Buffer]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    kernels: list[CompiledKernel]
    graph: Graph                     # kept so the program can be checked against the reference anywhere
    kernel_program: KernelProgram    # kept so the program runs in numpy where there is no GPU
    seed: int = 0
    compiler_version: str = ""
    report: dict[str, Any] = field(default_factory=dict)
    # inputs bound to values at import (a model's weights), as host arrays: a call or `run` gives only the others
    bound: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # what its runs on the GPU keep between calls (device buffers, workspaces, CUDA graphs): executor, device_call
    gpu_state: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @cached_property
    def written_in_place(self) -> dict[str, str]:
        """{output: the input it may be written over} (`KernelProgram.written_in_place`): a call may pass such an
        input's own array as that output's `out=`."""
        return self.kernel_program.written_in_place()

    def describe(self) -> dict[str, Any]:
        """The program.json document (its fields are listed in the README's "What you get")."""
        def tensor(name: str) -> dict[str, Any]:
            buf = self.buffers[name]
            return {"name": name, "shape": list(buf.shape), "dtype": buf.dtype.value}
        return {
            "format": PROGRAM_FORMAT, "graph": self.name, "target": self.target,
            "compiler_version": self.compiler_version, "seed": self.seed,
            "inputs": [tensor(n) for n in self.inputs], "outputs": [tensor(n) for n in self.outputs],
            "buffers": [{**tensor(b.name), "role": b.role, "bytes": b.nbytes} for b in self.buffers.values()],
            "kernels": [{"name": k.name, "entry": k.symbol, "source": f"kernels/{k.file_stem}.cu",
                         "cubin": f"kernels/{k.file_stem}.cubin",
                         "archetype": k.archetype, "schedule": k.schedule, "grid": list(k.grid),
                         "block": list(k.block), "shared_bytes": k.shared_bytes,
                         "params": list(k.params), "writes": list(k.writes),
                         "tensor_maps": [spec.as_dict() for spec in k.tensor_maps], "persistent": k.persistent,
                         "programmatic": k.programmatic,
                         "measured_ms": k.measured_ms,
                         "predicted_ms": k.predicted_ms}
                        for k in self.kernels],
            "report": self.report,
        }
