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
from tensorsmith.ir.node import Node
from tensorsmith.ir.ops import Op, REDUCE, VIEWS

from .emit import COMPUTE_TYPE, Emitter, NotFusable, delinearize, is_inline_reduce, reduce_combine, reduce_init
from .schedules import ARCHETYPES, default_schedule

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


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    folder = os.path.join(os.path.dirname(__file__), "templates")
    return jinja2.Environment(loader=jinja2.FileSystemLoader(folder), undefined=jinja2.StrictUndefined,
                              trim_blocks=False, lstrip_blocks=False, keep_trailing_newline=True)


def render_program(program: KernelProgram, version: str = "") -> list[RenderedKernel]:
    """Every kernel of `program`, in order."""
    return [render_kernel(program, position, version) for position in range(len(program.kernels))]


def render_kernel(program: KernelProgram, position: int, version: str = "") -> RenderedKernel:
    """One kernel's CUDA source and launch shape; raises NotFusable if its archetype cannot take the body."""
    kernel = program.kernels[position]
    schedule = kernel.schedule if kernel.schedule.params else default_schedule(kernel)
    shapes = {name: buf.shape for name, buf in program.buffers.items()}
    if kernel.archetype == "pointwise":
        body, extra = _pointwise_body(kernel, shapes, schedule)
    elif kernel.archetype == "row_reduce":
        body, extra = _row_reduce_body(kernel, shapes, schedule)
    else:
        raise ValueError(f"unknown archetype {kernel.archetype!r}; known: {', '.join(ARCHETYPES)}")
    context = _context(program, position, kernel, schedule, body, extra, version)
    source = _environment().get_template(f"{kernel.archetype}.cu.j2").render(k=context)
    return RenderedKernel(kernel.name, f"{position:02d}_{kernel.writes[0]}", kernel.archetype, source,
                          context["grid"], context["block"], tuple(p["name"] for p in context["params"]),
                          kernel.writes, schedule)


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
    """The graph nodes this kernel computes, grouped by the user's line that built them."""
    by_line: dict[str, list[str]] = {}
    for node in kernel.body:
        if node.op not in (Op.INPUT, Op.CONSTANT) and node.op not in VIEWS:
            where = os.path.basename(node.where)   # file:line of the user's model, stable wherever it runs
            by_line.setdefault(where or "<unknown>", []).append(node.op.value)
    return [f"{where}: {', '.join(ops)}" for where, ops in by_line.items()]


def _pointwise_body(kernel: Kernel, shapes: dict, schedule: Schedule) -> tuple[str, dict]:
    shape = shapes[kernel.writes[0]]
    if any(shapes[name] != shape for name in kernel.writes):
        raise NotFusable(kernel.outputs[1][1], "pointwise outputs must share one shape")
    coords = [(f"o{axis}", expr) for axis, expr in enumerate(delinearize("i", shape))]
    index = tuple(name for name, _ in coords)
    emitter = Emitter(shapes)
    for name, node in kernel.outputs:
        emitter.store(name, node.dtype, index, emitter.value(node, index))
    numel = max(1, _prod(shape))
    block = schedule["block"]
    extra = {"coords": coords, "numel": numel, "block": (block, 1, 1), "grid": (_ceil_div(numel, block), 1, 1),
             "strategy": "one thread per output element"}
    return "\n".join(emitter.lines), extra


def _row_reduce_body(kernel: Kernel, shapes: dict, schedule: Schedule) -> tuple[str, dict]:
    if len(kernel.outputs) != 1:
        raise NotFusable(kernel.outputs[1][1], "a row-reduction kernel writes one output")
    name, out = kernel.outputs[0]
    reduces = [n for n in kernel.body if n.op in REDUCE and not is_inline_reduce(n)]
    per_row_output = any(r.shape == out.shape for r in reduces) or out.ndim == 0
    row_shape = out.shape if per_row_output else out.shape[:-1]
    coords = [(f"r{axis}", expr) for axis, expr in enumerate(delinearize("row", row_shape))]
    row = tuple(n for n, _ in coords)
    emitter = Emitter(shapes)
    for reduce in reduces:
        if reduce.shape != row_shape:
            raise NotFusable(reduce, f"{reduce.op} of shape {reduce.shape} is not one value per row of {row_shape}")
        _emit_row_reduction(emitter, reduce, row)
    if per_row_output:
        value = emitter.value(out, row)
        emitter.open_scope("if (lane == 0)")
        emitter.store(name, out.dtype, row, value)
        emitter.close_scope()
    else:
        emitter.line(f"// the epilogue: {name} along its last axis")
        emitter.open_scope(f"for (idx_t c = lane; c < {out.shape[-1]}; c += ROW_THREADS)")
        emitter.store(name, out.dtype, row + ("c",), emitter.value(out, row + ("c",)))
        emitter.close_scope()
    row_threads, block = schedule["row_threads"], schedule["block"]
    rows = max(1, _prod(row_shape))
    extra = {"coords": coords, "rows": rows, "row_threads": row_threads, "block": (block, 1, 1),
             "grid": (_ceil_div(rows, block // row_threads), 1, 1),
             "strategy": f"{row_threads} threads per row, {block // row_threads} row(s) per block"}
    return "\n".join(emitter.lines), extra


def _emit_row_reduction(emitter: Emitter, reduce: Node, row: tuple[str, ...]) -> None:
    """A strided loop over the reduced axis, then the cooperative reduction across the row's threads."""
    source = reduce.srcs[0]
    length = source.shape[reduce.arg]
    acc, var = emitter.fresh("acc"), emitter.fresh("k")
    ctype = COMPUTE_TYPE[reduce.dtype]
    emitter.line(f"// {reduce.op} over axis {reduce.arg} of {list(source.shape)}")
    emitter.line(f"{ctype} {acc} = {reduce_init(reduce)};")
    emitter.open_scope(f"for (idx_t {var} = lane; {var} < {length}; {var} += ROW_THREADS)")
    value = emitter.value(source, row[:reduce.arg] + (var,) + row[reduce.arg:])
    emitter.line(f"{acc} = {reduce_combine(reduce, acc, value)};")
    emitter.close_scope()
    scratch = "s_scratch_f" if ctype == "float" else "s_scratch_i"
    emitter.line(f"{acc} = row_reduce({acc}, {'Sum' if reduce.op == Op.SUM else 'Max'}(), {scratch});")
    emitter.reduced[id(reduce)] = (row, acc)


def _prod(shape: tuple[int, ...]) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total


def _ceil_div(a: int, b: int) -> int:
    return max(1, -(-a // b))
