"""The pointwise archetype: one thread per output element, or per VEC consecutive elements of the last axis with
16-byte loads and stores where VEC divides it (pointwise.cu.j2)."""
from __future__ import annotations

import math

from tensorsmith.ir.kernel_program import Kernel, Schedule
from tensorsmith.ir.node import Node
from tensorsmith.ir.ops import Op

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
    return "\n".join(emitter.lines), {**extra, "coords": coords, "strategy": how}


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
