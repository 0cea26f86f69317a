"""The pointwise archetype: one thread per output element, or per VEC consecutive elements of the last axis with
16-byte loads and stores where VEC divides it (pointwise.cu.j2)."""
from __future__ import annotations

import math

from tensorsmith.ir.kernel_program import Kernel, Schedule
from tensorsmith.ir.node import Node
from tensorsmith.ir.ops import Op
from tensorsmith.ir.patterns import KeptMatch, match_kept

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
    extra = {"numel": numel, "vec": vec, "block": (block, 1, 1), "grid": (ceil_div(numel // vec, block), 1, 1)}
    if vec == 1:
        coords = [(f"o{axis}", expr) for axis, expr in enumerate(delinearize("i", shape))]
        index = tuple(name for name, _ in coords)
        emitter = Emitter(shapes)
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
    _emit_pointwise_vector(probe, kernel, [name for name, _ in coords], vec)
    emitter = Emitter(shapes)
    kept = _kept(kernel)
    if kept:
        _return_if_unchanged(emitter, kept, [name for name, _ in coords], vec)
    loaded = _pointwise_vector_loads(emitter, probe.accesses, [name for name, _ in coords], vec)
    _emit_pointwise_vector(emitter, kernel, [name for name, _ in coords], vec)
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
