"""Renders each kernel of a KernelProgram into CUDA C through its archetype's Jinja template.

Rendering is a pure function of the kernel, its buffers and its schedule. An archetype that cannot
take a body raises `NotFusable` naming the node to materialise, which is how search learns the
kernel boundaries this codegen supports.
"""
from __future__ import annotations

import bisect
import math
import os
import re
from dataclasses import dataclass
from functools import lru_cache

import jinja2

from tensorsmith.ir.kernel_program import Kernel, KernelProgram, Schedule
from tensorsmith.ir.node import Node
from tensorsmith.ir.ops import Op, REDUCE, VIEWS

from .emit import (COMPUTE_TYPE, Emitter, NotFusable, delinearize, is_inline_reduce, linear_index, reduce_combine,
                   reduce_init)
from .attention import attention_body
from .matmul import matmul_body
from .schedules import ARCHETYPES, HOPPER, default_schedule
from .tensor_map import TensorMapSpec

MEASURED_PLACEHOLDER = "measured: not yet (rendered before profiling)"
INT32_LIMIT = 2**31 - 1
VECTOR_BYTES = 16     # the widest load or store one thread issues


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
        body, extra = _pointwise_body(kernel, shapes, schedule)
    elif kernel.archetype == "row_reduce":
        body, extra = _row_reduce_body(kernel, shapes, schedule)
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


def _pointwise_body(kernel: Kernel, shapes: dict, schedule: Schedule) -> tuple[str, dict]:
    shape = shapes[kernel.writes[0]]
    if any(shapes[name] != shape for name in kernel.writes):
        raise NotFusable(kernel.outputs[1][1], "pointwise outputs must share one shape")
    numel = max(1, math.prod(shape))
    block, vec = schedule["block"], schedule.as_dict().get("vec", 1)
    if vec > 1 and (not shape or shape[-1] % vec):
        raise ValueError(f"vec={vec} does not divide the last axis of {kernel.writes[0]}{list(shape)}")
    extra = {"numel": numel, "vec": vec, "block": (block, 1, 1), "grid": (_ceil_div(numel // vec, block), 1, 1)}
    if vec == 1:
        coords = [(f"o{axis}", expr) for axis, expr in enumerate(delinearize("i", shape))]
        index = tuple(name for name, _ in coords)
        emitter = Emitter(shapes)
        for name, node in kernel.outputs:
            emitter.store(name, node.dtype, index, emitter.value(node, index))
        return "\n".join(emitter.lines), {**extra, "coords": coords, "strategy": "one thread per output element"}
    coords = [(f"o{axis}", expr) for axis, expr in enumerate(delinearize("base", shape))]
    probe = Emitter(shapes)      # a first pass finds what the body reads; the second loads it
    _emit_pointwise_vector(probe, kernel, [name for name, _ in coords], vec)
    emitter = Emitter(shapes)
    loaded = _pointwise_vector_loads(emitter, probe.accesses, [name for name, _ in coords], vec)
    _emit_pointwise_vector(emitter, kernel, [name for name, _ in coords], vec)
    broadcast = list(dict.fromkeys(node.arg for node, index in probe.accesses
                                   if not any(_K.search(part) for part in index)))
    scalar = [name for name in dict.fromkeys(node.arg for node, index in probe.accesses
                                             if (node.arg, index) not in loaded) if name not in broadcast]
    how = f"one thread per {vec} consecutive elements of the last axis, written with vector stores"
    if loaded:
        how += f"; {', '.join(dict.fromkeys(name for name, _ in loaded))} read with vector loads"
    if broadcast:
        how += f"; {', '.join(broadcast)} read once per thread"
    if scalar:
        how += f"; {', '.join(scalar)} read element by element"
    return "\n".join(emitter.lines), {**extra, "coords": coords, "strategy": how}


_K = re.compile(r"\bk\b")     # the element index along the last axis in vector loops


def pointwise_vector_width(kernel: Kernel, shapes: dict) -> int:
    """Elements per thread for a pointwise kernel: 16 bytes of its narrowest float buffer (4 x 32 bits where it has
    none), halved until it divides the last axis; 1 where nothing does."""
    floats = [n.dtype.itemsize for n in kernel.body if n.op == Op.INPUT and n.dtype.is_float]
    floats += [node.dtype.itemsize for _, node in kernel.outputs if node.dtype.is_float]
    shape = shapes[kernel.writes[0]]
    width = VECTOR_BYTES // min(floats, default=4)
    while width > 1 and (not shape or shape[-1] % width):
        width //= 2
    return width


def _pointwise_vector_loads(emitter: Emitter, accesses: list[tuple[Node, tuple[str, ...]]], coords: list[str],
                            vec: int) -> dict[tuple[str, tuple[str, ...]], str]:
    """One vector load for each buffer read along the output's last axis; returns what the body reads instead."""
    loaded: dict[tuple[str, tuple[str, ...]], str] = {}
    for node, index in accesses:
        key = (node.arg, index)
        shape = emitter.buffer_shapes[node.arg]
        if (key in loaded or not index or index[-1] != "k" or any(_K.search(part) for part in index[:-1])
                or shape[-1] % vec):   # a scalar, or not along the output's last axis: read by the emitter
            continue
        array = f"r_{node.arg}{len(loaded)}"
        offset = linear_index(index[:-1] + (coords[-1],), shape)
        emitter.line(f"{COMPUTE_TYPE[node.dtype]} {array}[{vec}];")
        emitter.line(f"load_vec<{vec}>(g_{node.arg} + {offset}, {array});")
        loaded[key] = f"{array}[v]"
    emitter.preloaded = dict(loaded)
    return loaded


def _emit_pointwise_vector(emitter: Emitter, kernel: Kernel, coords: list[str], vec: int) -> None:
    """Each output's VEC values into registers (invariants of the loop computed once before it), then stored."""
    index = (*coords[:-1], "k")
    for name, node in kernel.outputs:
        emitter.line(f"{COMPUTE_TYPE[node.dtype]} r_{name}_out[{vec}];")
    emitter.begin_invariants(("k",))
    emitter.line("#pragma unroll")
    emitter.open_scope(f"for (int v = 0; v < {vec}; ++v)")
    emitter.line(f"const idx_t k = {coords[-1]} + v;")
    for name, node in kernel.outputs:
        emitter.line(f"r_{name}_out[v] = {emitter.value(node, index)};")
    emitter.close_scope()
    emitter.end_invariants()
    for name, _ in kernel.outputs:      # outputs are contiguous and of the kernel's shape: the thread's offset is base
        emitter.line(f"store_vec<{vec}>(g_{name} + base, r_{name}_out);")


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
    """Emits every loop over a row: strided (vec == 1) or register-cached with vector loads (vec > 1).

    Each loop's invariants (values at an index without the loop's element, such as a row's mean) are computed
    once before it. With vec > 1, a buffer read along the row by several loops is loaded once into registers
    (`preload`); one read by a single loop is loaded in that loop, VEC elements at a time.
    """

    def __init__(self, emitter: Emitter, plan: RowPlan, vec: int, row_threads: int):
        self.emitter, self.plan, self.vec, self.row_threads = emitter, plan, vec, row_threads
        self.length = plan.out.shape[-1] if plan.out.ndim else 1
        self.items = _ceil_div(self.length, row_threads * vec)
        self.starts: list[int] = []                      # per loop opened, its first access in emitter.accesses
        self.local_loads: dict[int, list[str]] = {}      # loop number -> the vector loads at each of its steps
        self.cached: list[str] = []                      # buffers kept in registers for the whole row
        self.streamed: list[str] = []                    # buffers loaded in the one loop that reads them

    def open(self, length: int, prologue: tuple[str, ...] = ()) -> str:
        """Open a loop over `length` elements of the row; returns the element index variable.

        With vec > 1, `prologue` lines go before the loop over one thread's VEC consecutive elements.
        """
        loop = len(self.starts)
        self.starts.append(len(self.emitter.accesses))
        if self.vec == 1:
            var = self.emitter.fresh("k")
            self.emitter.begin_invariants((var,))
            self.emitter.open_scope(f"for (idx_t {var} = lane; {var} < {length}; {var} += ROW_THREADS)")
            return var
        self.emitter.begin_invariants(("k",))
        self.emitter.line("#pragma unroll")
        self.emitter.open_scope(f"for (int it = 0; it < {self.items}; ++it)")
        self.emitter.line(f"const idx_t base = ((idx_t)lane + it * ROW_THREADS) * {self.vec};")
        self.emitter.open_scope(f"if (base < {length})")
        for line in self.local_loads.get(loop, []) + list(prologue):
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
        self.emitter.end_invariants()

    def preload(self, probe: _RowLoops, buffers: dict) -> None:
        """Plan the vector loads of every float buffer that `probe`'s loops read along the row, and emit the
        ones kept in registers for the whole row."""
        readers: dict[tuple[str, tuple[str, ...]], set[int]] = {}
        for position, (node, index) in enumerate(probe.emitter.accesses):
            shape = buffers[node.arg]
            if (not index or index[-1] != "k" or any(_K.search(part) for part in index[:-1])   # (): a scalar
                    or not node.dtype.is_float or shape[-1] % self.vec):
                continue
            readers.setdefault((node.arg, index), set()).add(bisect.bisect_right(probe.starts, position) - 1)
        for number, ((name, index), loops) in enumerate(readers.items()):
            array = f"r_{name}{number}"
            offset = linear_index(index[:-1] + ("base",), buffers[name])
            if len(loops) == 1:    # read by one loop: loaded there, so its registers are live only in that loop
                self.local_loads.setdefault(loops.pop(), []).extend(
                    [f"float {array}[{self.vec}];", f"load_vec<{self.vec}>(g_{name} + {offset}, {array});"])
                self.emitter.preloaded[name, index] = f"{array}[v]"
                self.streamed.append(name)
                continue
            self.emitter.line(f"float {array}[{self.items}][{self.vec}];")
            self.emitter.line("#pragma unroll")
            self.emitter.open_scope(f"for (int it = 0; it < {self.items}; ++it)")
            self.emitter.line(f"const idx_t base = ((idx_t)lane + it * ROW_THREADS) * {self.vec};")
            self.emitter.line(f"if (base < {self.length}) load_vec<{self.vec}>(g_{name} + {offset}, {array}[it]);")
            self.emitter.close_scope()
            self.emitter.preloaded[name, index] = f"{array}[it][v]"
            self.cached.append(name)


def _row_reduce_body(kernel: Kernel, shapes: dict, schedule: Schedule) -> tuple[str, dict]:
    plan = row_plan(kernel)
    vec = schedule.as_dict().get("vec", 1)
    row_threads, block = schedule["row_threads"], schedule["block"]
    emitter = Emitter(shapes)
    loops = _RowLoops(emitter, plan, vec, row_threads)
    if vec > 1:   # a first pass finds what the loops read along the row; the second loads it
        probe = _RowLoops(Emitter(shapes), plan, vec, row_threads)
        _emit_row_loops(probe)
        loops.preload(probe, shapes)
    _emit_row_loops(loops)
    rows = max(1, math.prod(plan.row_shape))
    how = f"{row_threads} threads per row, {block // row_threads} row(s) per block"
    if loops.cached:
        how += (f", the row of {', '.join(loops.cached)} cached in registers ({loops.items} x {vec} elements"
                " per thread, vector loads)")
    if loops.streamed:
        how += (f", {', '.join(loops.streamed)} loaded {vec} elements at a time in the one loop that reads"
                f" {'it' if len(loops.streamed) == 1 else 'them'}")
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
    if loops.vec == 1:
        var = loops.open(plan.out.shape[-1])
        emitter.store(plan.name, plan.out.dtype, row + (var,), emitter.value(plan.out, row + (var,)))
        loops.close()
        return
    # collect a thread's VEC consecutive outputs, then write them with one vector store
    offset = linear_index(row + ("base",), plan.out.shape)
    var = loops.open(plan.out.shape[-1], prologue=(f"{COMPUTE_TYPE[plan.out.dtype]} r_out[{loops.vec}];",))
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
    alternate = len(emitter.reduced) % 2     # consecutive reductions alternate scratch arrays: one barrier each
    emitter.line(f"{acc} = row_reduce({acc}, {'Sum' if reduce.op == Op.SUM else 'Max'}(), {scratch}[{alternate}]);")
    emitter.reduced[id(reduce)] = (row, acc)


def _ceil_div(a: int, b: int) -> int:
    return max(1, -(-a // b))
