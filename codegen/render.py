"""Renders each kernel of a KernelProgram into CUDA C through its archetype's Jinja template.

Rendering is a pure function of the kernel, its buffers and its schedule. An archetype that cannot
take a body raises `NotFusable` naming the node to materialise, which is how search learns the
kernel boundaries this codegen supports.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import lru_cache

import jinja2

from tensorsmith.ir.kernel_program import Kernel, KernelProgram, Schedule
from tensorsmith.ir.node import Node
from tensorsmith.ir.ops import Op, REDUCE, VIEWS

from .emit import (COMPUTE_TYPE, Emitter, NotFusable, delinearize, is_inline_reduce, linear_index, reduce_combine,
                   reduce_init)
from .matmul import matmul_body
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
    shared_bytes: int = 0     # dynamic shared memory per block, set at launch


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
    shapes = {name: buf.shape for name, buf in program.buffers.items()}
    schedule = kernel.schedule if kernel.schedule.params else default_schedule(kernel, shapes)
    if kernel.archetype == "pointwise":
        body, extra = _pointwise_body(kernel, shapes, schedule)
    elif kernel.archetype == "row_reduce":
        body, extra = _row_reduce_body(kernel, shapes, schedule)
    elif kernel.archetype == "matmul":
        body, extra = "", matmul_body(kernel, shapes, schedule)
    else:
        raise ValueError(f"unknown archetype {kernel.archetype!r}; known: {', '.join(ARCHETYPES)}")
    context = _context(program, position, kernel, schedule, body, extra, version)
    source = _environment().get_template(f"{kernel.archetype}.cu.j2").render(k=context)
    return RenderedKernel(kernel.name, f"{position:02d}_{kernel.writes[0]}", kernel.archetype, source,
                          context["grid"], context["block"], tuple(p["name"] for p in context["params"]),
                          kernel.writes, schedule, context.get("shared_bytes", 0))


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
    numel = max(1, math.prod(shape))
    block = schedule["block"]
    extra = {"coords": coords, "numel": numel, "block": (block, 1, 1), "grid": (_ceil_div(numel, block), 1, 1),
             "strategy": "one thread per output element"}
    return "\n".join(emitter.lines), extra


@dataclass(frozen=True)
class RowPlan:
    """How a row kernel iterates: its output, its cooperative reductions, and its rows."""

    name: str
    out: Node
    reduces: tuple[Node, ...]
    per_row_output: bool        # one value per row (written by lane 0), else a row of values
    row_shape: tuple[int, ...]
    coords: tuple[tuple[str, str], ...]

    @property
    def row(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.coords)


def row_plan(kernel: Kernel) -> RowPlan:
    if len(kernel.outputs) != 1:
        raise NotFusable(kernel.outputs[1][1], "a row-reduction kernel writes one output")
    name, out = kernel.outputs[0]
    reduces = tuple(n for n in kernel.body if n.op in REDUCE and not is_inline_reduce(n))
    per_row_output = any(r.shape == out.shape for r in reduces) or out.ndim == 0
    row_shape = out.shape if per_row_output else out.shape[:-1]
    for reduce in reduces:
        if reduce.shape != row_shape:
            raise NotFusable(reduce, f"{reduce.op} of shape {reduce.shape} is not one value per row of {row_shape}")
    coords = tuple((f"r{axis}", expr) for axis, expr in enumerate(delinearize("row", row_shape)))
    return RowPlan(name, out, reduces, per_row_output, row_shape, coords)


def vector_width(kernel: Kernel, shapes: dict) -> int:
    """Elements per thread per vector load for the register-cached row loop, or 1 where it does not apply.

    It applies when every reduction runs along the last axis over as many elements as the output row has,
    so that every loop of the kernel walks the same row and can read it from registers.
    """
    plan = row_plan(kernel)
    if plan.per_row_output:
        return 1
    length = plan.out.shape[-1]
    if any(r.arg != r.srcs[0].ndim - 1 or r.srcs[0].shape[-1] != length for r in plan.reduces):
        return 1
    width = 8
    while width > 1 and length % width:
        width //= 2
    return width


class _RowLoops:
    """Emits every loop over a row: strided (vec == 1) or register-cached with vector loads (vec > 1)."""

    def __init__(self, emitter: Emitter, plan: RowPlan, vec: int, row_threads: int):
        self.emitter, self.plan, self.vec, self.row_threads = emitter, plan, vec, row_threads
        self.length = plan.out.shape[-1] if plan.out.ndim else 1
        self.items = _ceil_div(self.length, row_threads * vec)

    def open(self, length: int, prologue: tuple[str, ...] = ()) -> str:
        """Open a loop over `length` elements of the row; returns the element index variable.

        With vec > 1, `prologue` lines go before the loop over one thread's VEC consecutive elements.
        """
        if self.vec == 1:
            var = self.emitter.fresh("k")
            self.emitter.open_scope(f"for (idx_t {var} = lane; {var} < {length}; {var} += ROW_THREADS)")
            return var
        self.emitter.line("#pragma unroll")
        self.emitter.open_scope(f"for (int it = 0; it < {self.items}; ++it)")
        self.emitter.line(f"const idx_t base = ((idx_t)lane + it * ROW_THREADS) * {self.vec};")
        self.emitter.open_scope(f"if (base < {length})")
        for line in prologue:
            self.emitter.line(line)
        self.emitter.line("#pragma unroll")
        self.emitter.open_scope(f"for (int v = 0; v < {self.vec}; ++v)")
        self.emitter.line("const idx_t k = base + v;")
        return "k"

    def close(self, epilogue: tuple[str, ...] = ()) -> None:
        """Close the loop; with vec > 1, `epilogue` lines follow the loop over one thread's elements."""
        self.emitter.close_scope()
        if self.vec > 1:
            for line in epilogue:
                self.emitter.line(line)
            self.emitter.close_scope()
            self.emitter.close_scope()

    def preload(self, accesses: list[tuple[Node, tuple[str, ...]]], buffers: dict) -> None:
        """Load, once, every buffer the loops read along the row, VEC elements per 16-byte access."""
        seen: dict[tuple[str, tuple[str, ...]], str] = {}
        for node, index in accesses:
            key = (node.arg, index)
            shape = buffers[node.arg]
            if (key in seen or index[-1] != "k" or any("k" in part for part in index[:-1])
                    or not node.dtype.is_float or shape[-1] % self.vec):
                continue
            array = f"r_{node.arg}{len(seen)}"
            seen[key] = array
            offset = linear_index(index[:-1] + ("base",), shape)
            self.emitter.line(f"float {array}[{self.items}][{self.vec}];")
            self.emitter.line("#pragma unroll")
            self.emitter.open_scope(f"for (int it = 0; it < {self.items}; ++it)")
            self.emitter.line(f"const idx_t base = ((idx_t)lane + it * ROW_THREADS) * {self.vec};")
            self.emitter.line(f"if (base < {self.length}) load_vec<{self.vec}>(g_{node.arg} + {offset}, {array}[it]);")
            self.emitter.close_scope()
        self.emitter.preloaded = seen


def _row_reduce_body(kernel: Kernel, shapes: dict, schedule: Schedule) -> tuple[str, dict]:
    plan = row_plan(kernel)
    vec = schedule.as_dict().get("vec", 1)
    row_threads, block = schedule["row_threads"], schedule["block"]
    if vec > 1:   # a first pass finds what the loops read along the row; the second preloads it
        probe = Emitter(shapes)
        _emit_row_loops(_RowLoops(probe, plan, vec, row_threads))
        emitter = Emitter(shapes)
        loops = _RowLoops(emitter, plan, vec, row_threads)
        loops.preload(probe.accesses, shapes)
    else:
        emitter = Emitter(shapes)
        loops = _RowLoops(emitter, plan, vec, row_threads)
    _emit_row_loops(loops)
    rows = max(1, math.prod(plan.row_shape))
    how = f"{row_threads} threads per row, {block // row_threads} row(s) per block"
    if vec > 1:
        how += f", the row cached in registers ({loops.items} x {vec} elements per thread, vector loads)"
    extra = {"coords": list(plan.coords), "rows": rows, "row_threads": row_threads, "block": (block, 1, 1),
             "grid": (_ceil_div(rows, block // row_threads), 1, 1), "strategy": how}
    return "\n".join(emitter.lines), extra


def _emit_row_loops(loops: _RowLoops) -> None:
    """Every cooperative reduction of the row in order, then the epilogue that writes the output."""
    emitter, plan = loops.emitter, loops.plan
    row = plan.row
    for reduce in plan.reduces:
        _emit_row_reduction(loops, reduce, row)
    if plan.per_row_output:
        value = emitter.value(plan.out, row)
        emitter.open_scope("if (lane == 0)")
        emitter.store(plan.name, plan.out.dtype, row, value)
        emitter.close_scope()
        return
    emitter.line(f"// the epilogue: {plan.name} along its last axis")
    if loops.vec == 1 or not plan.out.dtype.is_float:
        var = loops.open(plan.out.shape[-1])
        emitter.store(plan.name, plan.out.dtype, row + (var,), emitter.value(plan.out, row + (var,)))
        loops.close()
        return
    # collect a thread's VEC consecutive outputs, then write them with one vector store
    offset = linear_index(row + ("base",), plan.out.shape)
    var = loops.open(plan.out.shape[-1], prologue=(f"float r_out[{loops.vec}];",))
    emitter.line(f"r_out[v] = {emitter.value(plan.out, row + (var,))};")
    loops.close(epilogue=(f"store_vec<{loops.vec}>(g_{plan.name} + {offset}, r_out);",))


def _emit_row_reduction(loops: _RowLoops, reduce: Node, row: tuple[str, ...]) -> None:
    """A loop over the reduced axis, then the cooperative reduction across the row's threads."""
    emitter = loops.emitter
    source = reduce.srcs[0]
    acc = emitter.fresh("acc")
    ctype = COMPUTE_TYPE[reduce.dtype]
    emitter.line(f"// {reduce.op} over axis {reduce.arg} of {list(source.shape)}")
    emitter.line(f"{ctype} {acc} = {reduce_init(reduce)};")
    var = loops.open(source.shape[reduce.arg])
    value = emitter.value(source, row[:reduce.arg] + (var,) + row[reduce.arg:])
    emitter.line(f"{acc} = {reduce_combine(reduce, acc, value)};")
    loops.close()
    scratch = "s_scratch_f" if ctype == "float" else "s_scratch_i"
    emitter.line(f"{acc} = row_reduce({acc}, {'Sum' if reduce.op == Op.SUM else 'Max'}(), {scratch});")
    emitter.reduced[id(reduce)] = (row, acc)


def _ceil_div(a: int, b: int) -> int:
    return max(1, -(-a // b))
