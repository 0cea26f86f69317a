"""The pointwise archetype: one thread per output element, or per VEC consecutive elements of the last axis with
16-byte loads and stores where VEC divides it (pointwise.cu.j2)."""
from __future__ import annotations

import math

from tensorsmith.ir.kernel_program import Kernel, Schedule
from tensorsmith.ir.node import Node
from tensorsmith.ir.ops import Op
from tensorsmith.ir.patterns import KeptMatch, PointWrite, match_kept, match_point_write

from .emit import (COMPUTE_TYPE, LAST_AXIS_INDEX, Emitter, NotFusable, ceil_div, delinearize, linear_index,
                   vector_loadable)
from .spaces import VECTOR_BYTES


def pointwise_body(kernel: Kernel, shapes: dict, schedule: Schedule) -> tuple[str, dict]:
    shape = shapes[kernel.writes[0]]
    if any(shapes[name] != shape for name in kernel.writes):
        raise NotFusable(kernel.outputs[1][1], "pointwise outputs must share one shape")
    numel = max(1, math.prod(shape))
    block, vec = schedule["block"], schedule.as_dict().get("vec", 1)
    if vec > 1 and (not shape or shape[-1] % vec):
        raise ValueError(f"vec={vec} does not divide the last axis of {kernel.writes[0]}{list(shape)}")
    point = match_point_write(kernel.outputs)
    if point is not None:
        return _point_write_body(kernel, shapes, shape, point, schedule)
    extra = {"numel": numel, "vec": vec, "block": (block, 1, 1),
             "grid": (pointwise_blocks(kernel, shape, block, vec), 1, 1)}
    if vec == 1:
        coords = [(f"o{axis}", expr) for axis, expr in enumerate(delinearize("i", shape))]
        index = tuple(name for name, _ in coords)
        emitter = Emitter(shapes, bind_indices=True)   # one element a thread: no loop, so every index can be named
        kept = _kept(kernel)
        if kept:
            unchanged = " && ".join(f"{_same_memory(name, match)} && !{emitter.value(match.condition, index)}"
                                    for name, match in kept.items())
            emitter.line(f"if ({unchanged}) return;   // written in place, and this element keeps its value")
        for name, node in kernel.outputs:
            emitter.store(name, node.dtype, index, emitter.value(node, index))
        return "\n".join(emitter.lines), {**extra, "coords": coords,
                                          "strategy": "one thread per output element" + _KEPT_NOTE * bool(kept)}
    coords = [(f"o{axis}", expr) for axis, expr in enumerate(delinearize("base", shape))]
    probe = Emitter(shapes)      # a first pass finds what the body reads; the second loads it
    _emit_pointwise_vector(probe, kernel.outputs, [name for name, _ in coords], vec)
    emitter = Emitter(shapes)
    kept = _kept(kernel)
    if kept:
        _return_if_unchanged(emitter, kept, [name for name, _ in coords], vec)
    loaded = _pointwise_vector_loads(emitter, probe.accesses, [name for name, _ in coords], vec)
    _emit_pointwise_vector(emitter, kernel.outputs, [name for name, _ in coords], vec)
    broadcast = list(dict.fromkeys(node.arg for node, index in probe.accesses
                                   if not any(LAST_AXIS_INDEX.search(part) for part in index)))
    scalar = [name for name in dict.fromkeys(node.arg for node, index in probe.accesses
                                             if (node.arg, index) not in loaded) if name not in broadcast]
    how = f"one thread per {vec} consecutive elements of the last axis, written with vector stores"
    if loaded:
        how += f"; {', '.join(dict.fromkeys(name for name, _ in loaded))} read with vector loads"
    if broadcast:
        how += f"; {', '.join(broadcast)} read once per thread"
    if scalar:
        how += f"; {', '.join(scalar)} read element by element"
    how += _KEPT_NOTE * bool(kept)
    return "\n".join(emitter.lines), {**extra, "coords": coords, "strategy": how}


_KEPT_NOTE = ("; where an output is its kept input's memory (written in place), a thread whose elements all keep"
              " their values reads and writes nothing")


def _kept(kernel: Kernel) -> dict[str, KeptMatch]:
    """Each output's kept input, where every output keeps one (ir.patterns.match_kept); else none: a thread may
    then skip its elements where each output is written over its input and no condition holds."""
    kept = {name: match for name, node in kernel.outputs if (match := match_kept(node)) is not None}
    return kept if len(kept) == len(kernel.outputs) else {}


def _same_memory(output: str, match: KeptMatch) -> str:
    return f"(const void*)g_{output} == (const void*)g_{match.kept.arg}"


def _return_if_unchanged(emitter: Emitter, kept: dict[str, KeptMatch], coords: list[str], vec: int) -> None:
    """Before any load: return where every output is its kept input's memory and no condition holds for any of
    the thread's VEC elements (the condition's values are forgotten after: the loads come next)."""
    emitter.line(f"bool unchanged = {' && '.join(_same_memory(name, match) for name, match in kept.items())};")
    emitter.line("#pragma unroll")
    emitter.open_scope(f"for (int v = 0; v < {vec}; ++v)")
    emitter.line(f"const idx_t k = {coords[-1]} + v;")
    index = (*coords[:-1], "k")
    for match in kept.values():
        emitter.line(f"unchanged = unchanged && !{emitter.value(match.condition, index)};")
    emitter.close_scope()
    emitter.line("if (unchanged) return;   // written in place, and these elements keep their values")


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
        if key in loaded or not vector_loadable(index) or shape[-1] % vec:   # else read by the emitter
            continue
        array = f"r_{node.arg}{len(loaded)}"
        offset = linear_index(index[:-1] + (coords[-1],), shape)
        emitter.line(f"{COMPUTE_TYPE[node.dtype]} {array}[{vec}];")
        emitter.line(f"load_vec<{vec}>(g_{node.arg} + {offset}, {array});")
        loaded[key] = f"{array}[v]"
    emitter.preloaded = dict(loaded)
    return loaded


def _point_write_body(kernel: Kernel, shapes: dict, shape: tuple[int, ...], point: PointWrite,
                      schedule: Schedule) -> tuple[str, dict]:
    """Threads over one slice of the outputs, each output's value stored at the position read at run time where
    every output is its kept buffer's memory (a KV cache written in place: there the condition holds, so neither it
    nor the kept element is read); elsewhere (outputs of their own) the launch's threads, at least COPY_BLOCKS
    blocks of them, stride over every element as a plain pointwise kernel computes them. A slice along the last axis
    takes one element a thread, whatever VEC the copy takes."""
    block, vec = schedule["block"], schedule.as_dict().get("vec", 1)
    launched = launched_shape(kernel, shape)
    numel, whole = math.prod(launched), math.prod(shape)
    blocks = pointwise_blocks(kernel, shape, block, vec)
    per_thread = _slice_vec(point, shape, vec)
    emitter = Emitter(shapes)
    kept = _kept(kernel)
    same = " && ".join(_same_memory(name, match) for name, match in kept.items())
    emitter.open_scope(f"if (!({same}))")
    emitter.open_scope(f"for (long long e = {'i' if vec == 1 else 'base'}; e < {whole}LL; "
                       f"e += {blocks * block * vec}LL)")
    _emit_elements(emitter, kernel.outputs, shape, delinearize("e", shape), "e", vec)
    emitter.close_scope()
    emitter.line("return;")
    emitter.close_scope()
    first = "i" if per_thread == 1 else "base"
    emitter.line(f"if ({first} >= {numel}) return;   // past the slice")
    emitter.line(f"const idx_t at = {emitter.value(point.position, point.at)};")
    emitter.line(f"if (at < 0 || at >= {shape[point.axis]}) return;   // no element written: each keeps its value")
    slice_index = delinearize(first, launched)
    index = tuple("at" if axis == point.axis else part for axis, part in enumerate(slice_index))
    values = tuple((name, kept[name].value if kept[name].value.dtype == node.dtype else node)
                   for name, node in kernel.outputs)
    _emit_elements(emitter, values, shape, index, linear_index(index, shape), per_thread)
    how = (f"threads over one position along axis {point.axis}, read at run time, where each output is written in"
           f" place over its kept input; else over every element (grid-stride)"
           + (f"; {vec} consecutive elements of the last axis a thread" if vec > 1 else ""))
    return "\n".join(emitter.lines), {"numel": blocks * block * vec, "vec": vec, "block": (block, 1, 1),
                                      "coords": [], "grid": (blocks, 1, 1), "strategy": how}


def _slice_vec(point: PointWrite, shape: tuple[int, ...], vec: int) -> int:
    """Elements a thread writes of a point write's slice: VEC, but one where the slice is one element wide along the
    last axis (the position's own)."""
    return 1 if point.axis == len(shape) - 1 else vec


COPY_BLOCKS = 256   # a point write's blocks at least, where its outputs are not written in place (one wave)


def pointwise_blocks(kernel: Kernel, shape: tuple[int, ...], block: int, vec: int) -> int:
    """The blocks a pointwise kernel launches: one thread per VEC elements it writes in place (of a point write, its
    slice; but COPY_BLOCKS at least, which stride over every element where the outputs are their own)."""
    point = match_point_write(kernel.outputs)
    if point is None:
        return ceil_div(max(1, math.prod(shape)) // vec, block)
    numel, whole = math.prod(launched_shape(kernel, shape)), max(1, math.prod(shape))
    return max(ceil_div(numel // _slice_vec(point, shape, vec), block),
               min(ceil_div(whole // vec, block), COPY_BLOCKS))


def launched_shape(kernel: Kernel, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape a pointwise kernel's threads cover in place: its outputs', but one position along a point write's
    axis."""
    point = match_point_write(kernel.outputs)
    return shape if point is None else shape[:point.axis] + (1,) + shape[point.axis + 1:]


def _emit_elements(emitter: Emitter, outputs: tuple[tuple[str, Node], ...], shape: tuple[int, ...],
                   index: tuple[str, ...], offset: str, vec: int) -> None:
    """Each output's node at `index` (its first element's row-major `offset`), or at VEC elements from it along the
    last axis, stored, in a scope of its own."""
    emitter.open_scope("")
    names = tuple(f"c{axis}" for axis in range(len(shape)))
    for name, part in zip(names, index):
        emitter.line(f"const idx_t {name} = {part};")
    if vec == 1:
        for name, node in outputs:
            emitter.store(name, node.dtype, names, emitter.value(node, names))
    else:
        emitter.line(f"const idx_t base_{emitter.indent} = {offset};")
        probe = Emitter(emitter.buffer_shapes)
        _emit_pointwise_vector(probe, outputs, list(names), vec)
        _pointwise_vector_loads(emitter, probe.accesses, list(names), vec)
        _emit_pointwise_vector(emitter, outputs, list(names), vec, base=f"base_{emitter.indent}")
        emitter.preloaded = {}
    emitter.close_scope()


def _emit_pointwise_vector(emitter: Emitter, outputs: tuple[tuple[str, Node], ...], coords: list[str], vec: int,
                           base: str = "base") -> None:
    """Each output's VEC values into registers (invariants of the loop computed once before it), then stored."""
    index = (*coords[:-1], "k")
    for name, node in outputs:
        emitter.line(f"{COMPUTE_TYPE[node.dtype]} r_{name}_out[{vec}];")
    emitter.begin_invariants(("k",))
    emitter.line("#pragma unroll")
    emitter.open_scope(f"for (int v = 0; v < {vec}; ++v)")
    emitter.line(f"const idx_t k = {coords[-1]} + v;")
    for name, node in outputs:
        emitter.line(f"r_{name}_out[v] = {emitter.value(node, index)};")
    emitter.close_scope()
    emitter.end_invariants()
    for name, _ in outputs:      # outputs are contiguous and of the kernel's shape: the thread's offset is base
        emitter.line(f"store_vec<{vec}>(g_{name} + {base}, r_{name}_out);")
