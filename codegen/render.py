"""Renders each kernel of a KernelProgram into CUDA C through its archetype's Jinja template.

Rendering is a pure function of the kernel, its buffers and its schedule. An archetype that cannot
take a body raises `NotFusable` naming the node to materialise, which is how search learns the
kernel boundaries this codegen supports.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

import jinja2

from tensorsmith.ir.kernel_program import Kernel, KernelProgram, Schedule
from tensorsmith.ir.ops import Op, VIEWS

from .attention import attention_body
from .matmul import matmul_body
from .pointwise import pointwise_body
from .row_reduce import row_reduce_body
from .schedules import default_schedule
from .spaces import ARCHETYPES, HOPPER
from .tensor_map import TensorMapSpec

MEASURED_PLACEHOLDER = "measured: not yet (rendered before profiling)"
INT32_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class RenderedKernel:
    """CUDA source for one kernel and how to launch it; `params` are buffer names in argument order."""

    name: str
    file_stem: str
    archetype: str
    source: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    params: tuple[str, ...]
    writes: tuple[str, ...]
    schedule: Schedule
    shared_bytes: int = 0     # dynamic shared memory per block, set at launch
    arch: str | None = None   # the NVRTC architecture this kernel needs (sm_90a for wgmma); None: the target's
    tensor_maps: tuple[TensorMapSpec, ...] = ()   # TMA descriptors passed after the buffer pointers
    persistent: bool = False  # blocks walk the work by gridDim.x: grid.x (one per SM of an H200) is the most
                              # worth launching, and fewer, one per SM of a smaller GPU, compute the same


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    folder = os.path.join(os.path.dirname(__file__), "templates")
    return jinja2.Environment(loader=jinja2.FileSystemLoader(folder), undefined=jinja2.StrictUndefined,
                              trim_blocks=False, lstrip_blocks=False, keep_trailing_newline=True)


def render_program(program: KernelProgram, version: str = "", arch: str = HOPPER) -> list[RenderedKernel]:
    """Every kernel of `program`, in order (kernels without a schedule at `arch`'s default)."""
    return [render_kernel(program, position, version, arch) for position in range(len(program.kernels))]


def render_kernel(program: KernelProgram, position: int, version: str = "", arch: str = HOPPER) -> RenderedKernel:
    """One kernel's CUDA source and launch shape; raises NotFusable if its archetype cannot take the body."""
    kernel = program.kernels[position]
    shapes = {name: buf.shape for name, buf in program.buffers.items()}
    schedule = kernel.schedule if kernel.schedule.params else default_schedule(kernel, shapes, arch)
    if kernel.archetype == "pointwise":
        body, extra = pointwise_body(kernel, shapes, schedule)
    elif kernel.archetype == "row_reduce":
        body, extra = row_reduce_body(kernel, shapes, schedule)
    elif kernel.archetype == "matmul":
        body, extra = "", matmul_body(kernel, shapes, schedule)
    elif kernel.archetype == "attention":
        body, extra = "", attention_body(kernel, shapes, schedule)
    else:
        raise ValueError(f"unknown archetype {kernel.archetype!r}; known: {', '.join(ARCHETYPES)}")
    context = _context(program, position, kernel, schedule, body, extra, version)
    source = _environment().get_template(f"{context.get('template', kernel.archetype)}.cu.j2").render(k=context)
    return RenderedKernel(kernel.name, f"{position:02d}_{kernel.writes[0]}", kernel.archetype, source,
                          context["grid"], context["block"], tuple(p["name"] for p in context["params"]),
                          kernel.writes, schedule, context.get("shared_bytes", 0), context.get("arch"),
                          tuple(context.get("tensor_maps", ())), bool(context.get("persistent")))


def _index_type(program: KernelProgram) -> str:
    largest = max(buf.nbytes // buf.dtype.itemsize for buf in program.buffers.values())
    return "int" if largest <= INT32_LIMIT else "long long"


def _context(program: KernelProgram, position: int, kernel: Kernel, schedule: Schedule, body: str,
             extra: dict, version: str) -> dict:
    bufs = program.buffers
    params = [{"name": n, "ctype": bufs[n].dtype.cuda_name, "const": False} for n in kernel.writes]
    params += [{"name": n, "ctype": bufs[n].dtype.cuda_name, "const": True} for n in kernel.reads]
    describe = [f"{n}[{', '.join(map(str, bufs[n].shape))}] {bufs[n].dtype}" for n in kernel.writes + kernel.reads]
    return {
        "name": kernel.name, "graph": program.name, "position": position, "version": version,
        "archetype": kernel.archetype, "schedule": str(schedule), "params": params,
        "outputs": describe[:len(kernel.writes)], "inputs": describe[len(kernel.writes):],
        "nodes": _node_lines(kernel), "measured": MEASURED_PLACEHOLDER, "body": body,
        "index_type": _index_type(program), **extra,
    }


def _node_lines(kernel: Kernel) -> list[str]:
    """The graph nodes this kernel computes, grouped by the user's line that built them (a kernel that only moves
    data: its views)."""
    by_line: dict[str, list[str]] = {}
    computes = any(node.op not in (Op.INPUT, Op.CONSTANT) and node.op not in VIEWS for node in kernel.body)
    for node in kernel.body:
        if node.op not in (Op.INPUT, Op.CONSTANT) and (node.op not in VIEWS or not computes):
            where = os.path.basename(node.where)   # file:line of the user's model, stable wherever it runs
            by_line.setdefault(where or "<unknown>", []).append(node.op.value)
    return [f"{where}: {', '.join(ops)}" for where, ops in by_line.items()]
