"""The row_reduce archetype: each reduction of a row computed cooperatively by the row's threads, then the
epilogue that writes the output (row_reduce.cu.j2); a row that several loops read is kept in registers."""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from tensorsmith.ir.kernel_program import Kernel, Schedule
from tensorsmith.ir.node import Node
from tensorsmith.ir.ops import Op, REDUCE

from .emit import (COMPUTE_TYPE, Emitter, NotFusable, ceil_div, delinearize, is_inline_reduce, linear_index,
                   reduce_combine, reduce_init, vector_loadable)


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
    """The kernel's row plan; an output that reshapes what the rows compute (a product of one row returned as
    (1, 1, N)) is that value, stored in the same row-major order."""
    if len(kernel.outputs) != 1:
        raise NotFusable(kernel.outputs[1][1], "a row-reduction kernel writes one output")
    name, out = kernel.outputs[0]
    while out.op == Op.RESHAPE:
        out = out.srcs[0]
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

    It applies when every reduction runs along the last axis over as many elements as the output row has (or,
    where each row's output is one value, as a matrix-vector product's is, over as many as each other, along any
    axis), so that every loop of the kernel walks the same row; each buffer read along that walk with its last
    axis (a weight row) is loaded VEC elements at a time, any other element by element.
    """
    plan = row_plan(kernel)
    length = row_length(plan)
    if plan.per_row_output:
        if not plan.reduces or any(r.srcs[0].shape[r.arg] != length for r in plan.reduces):
            return 1
    elif any(r.arg != r.srcs[0].ndim - 1 or r.srcs[0].shape[-1] != length for r in plan.reduces):
        return 1
    width = 8
    while width > 1 and length % width:
        width //= 2
    return width


def row_length(plan: RowPlan) -> int:
    """The elements each loop of a row walks: the output row's, or where each row's output is one value, the first
    reduction's (along whichever axis it sums: a matrix-vector product's K)."""
    if plan.per_row_output:
        return plan.reduces[0].srcs[0].shape[plan.reduces[0].arg] if plan.reduces else 1
    return plan.out.shape[-1] if plan.out.ndim else 1


class _RowLoops:
    """Emits every loop over a row: strided (vec == 1) or register-cached with vector loads (vec > 1).

    Each loop's invariants (values at an index without the loop's element, such as a row's mean) are computed
    once before it. With vec > 1, a buffer read along the row by several loops is loaded once into registers
    (`preload`); one read by a single loop is loaded in that loop, VEC elements at a time.
    """

    def __init__(self, emitter: Emitter, plan: RowPlan, vec: int, row_threads: int):
        self.emitter, self.plan, self.vec, self.row_threads = emitter, plan, vec, row_threads
        self.length = row_length(plan)
        self.items = ceil_div(self.length, row_threads * vec)
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
            if not vector_loadable(index) or not node.dtype.is_float or shape[-1] % self.vec:
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


def row_reduce_body(kernel: Kernel, shapes: dict, schedule: Schedule) -> tuple[str, dict]:
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
             "grid": (ceil_div(rows, block // row_threads), 1, 1), "strategy": how}
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
        emitter.store(plan.name, plan.out.dtype, row, value, plan.out.shape)
        emitter.close_scope()
        return
    emitter.line(f"// the epilogue: {plan.name} along its last axis")
    if loops.vec == 1:
        var = loops.open(plan.out.shape[-1])
        emitter.store(plan.name, plan.out.dtype, row + (var,), emitter.value(plan.out, row + (var,)), plan.out.shape)
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
