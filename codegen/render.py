"""Renders each kernel of a KernelProgram into CUDA C through its archetype's Jinja template.

Rendering is a pure function of the kernel, its buffers and its schedule, so each is rendered once: a kernel met
again (in another of the search's kernel partitions, in a measured candidate, in the program finally chosen, or
under other buffer names) is taken from a cache keyed by its structure, its names filled in after. The source does
not say where in the program the kernel runs (its file's number does), so that the same kernel in another partition
is the same source, compiled once. An archetype that cannot take a body raises `NotFusable` naming the node to
materialise, which is how search learns the kernel boundaries this codegen supports; refusals are cached too.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
from collections import Counter, OrderedDict
from dataclasses import dataclass
from functools import lru_cache

import jinja2

from tensorsmith.ir.kernel_program import Kernel, KernelProgram, Schedule, kernel_structure
from tensorsmith.ir.layers import untagged
from tensorsmith.ir.node import Node
from tensorsmith.ir.ops import Op, VIEWS

from .attention import attention_body
from .emit import NotFusable
from .matmul import matmul_body
from .pointwise import pointwise_body
from .row_reduce import row_reduce_body
from .schedules import default_schedule
from .spaces import ARCHETYPES, HOPPER
from .tensor_map import TensorMapSpec

MEASURED_PLACEHOLDER = "measured: not yet (rendered before profiling)"
INT32_LIMIT = 2**31 - 1
KERNEL = "TSKERNELQ"            # rendered in place of the kernel's name, filled in from the cache
ENTRY = "TSENTRYQ"              # and of its function's (`entry_name`)
VERSION = "TSVERSIONQ"          # and of the compiler's version
CACHED_RENDERS = 4096           # renders (or refusals) kept; a compile of a 16-layer model makes about this many
RENDERS: Counter = Counter()    # each (kernel, schedule) key rendered: counted by tests, one per key per process


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
    entry: str = ""           # the function's name in the source and the cubin (`entry_name`)
    build_source: str = ""    # what NVRTC compiles: `source` but for the buffers' and the kernel's names, so that
                              # the kernels of identical layers are one source, compiled once


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    folder = os.path.join(os.path.dirname(__file__), "templates")
    return jinja2.Environment(loader=jinja2.FileSystemLoader(folder), undefined=jinja2.StrictUndefined,
                              trim_blocks=False, lstrip_blocks=False, keep_trailing_newline=True)


def render_template(name: str, **context: object) -> str:
    """A template of templates/ that no kernel of a program uses (launch_cost.py's empty kernel), rendered."""
    return _environment().get_template(name).render(**context)


def render_program(program: KernelProgram, version: str = "", arch: str = HOPPER) -> list[RenderedKernel]:
    """Every kernel of `program`, in order (kernels without a schedule at `arch`'s default)."""
    return [render_kernel(program, position, version, arch) for position in range(len(program.kernels))]


def render_kernel(program: KernelProgram, position: int, version: str = "", arch: str = HOPPER) -> RenderedKernel:
    """One kernel's CUDA source and launch shape; raises NotFusable if its archetype cannot take the body.

    Rendered once per structure and schedule: with its buffers and itself under placeholder names, filled in here."""
    kernel = program.kernels[position]
    rendered = _cached(program, kernel, arch)
    entry = entry_name(kernel, program.name, rendered.source)
    build_source = _filled(rendered.source, {KERNEL: entry, ENTRY: entry, VERSION: version})
    names = _placeholders(kernel)
    source = _filled(rendered.source, {**names, KERNEL: kernel.name, ENTRY: entry, VERSION: version})
    return dataclasses.replace(rendered, name=kernel.name, source=source, entry=entry, build_source=build_source,
                               file_stem=f"{position:02d}_{kernel.writes[0]}",
                               params=tuple(names[p] for p in rendered.params),
                               writes=tuple(names[w] for w in rendered.writes),
                               tensor_maps=tuple(dataclasses.replace(t, buffer=names[t.buffer])
                                                 for t in rendered.tensor_maps))


def entry_name(kernel: Kernel, graph: str, placeholder_source: str) -> str:
    """The kernel's function name: what it computes (its name without the graph's or its place's) and a digest of
    its source under placeholder names, so that kernels that compute alike (a model's identical layers) have one
    name, one source and one cubin, while the kernel keeps its own name in its file and the report."""
    label = re.sub(r"\d*_*$", "", untagged(kernel.name.removeprefix(f"{graph}_"))) or kernel.archetype
    return f"{label}_{hashlib.sha256(placeholder_source.encode()).hexdigest()[:10]}"


def _filled(source: str, names: dict[str, str]) -> str:
    for placeholder, name in names.items():
        source = source.replace(placeholder, name)
    return source


def check_renders(program: KernelProgram, position: int, arch: str = HOPPER) -> None:
    """Raise NotFusable where `render_kernel` would (what the search learns kernel boundaries and schedules from),
    without filling in the names of a source nobody reads."""
    _cached(program, program.kernels[position], arch)


_RENDERED: OrderedDict[tuple, RenderedKernel | tuple[int, str]] = OrderedDict()


def _cached(program: KernelProgram, kernel: Kernel, arch: str) -> RenderedKernel:
    """`kernel` rendered under placeholder names, from the cache where it is there (raises its refusal)."""
    chosen = kernel.schedule if kernel.schedule.params else arch   # else the default at `arch`, worked out on a miss
    key = (kernel_structure(kernel, lines=True), program.name, _index_type(program), chosen)
    rendered = _RENDERED.get(key)
    if rendered is None:
        rendered = _render_once(program, kernel, arch)
        RENDERS[key] += 1
        _RENDERED[key] = rendered
        if len(_RENDERED) > CACHED_RENDERS:
            _RENDERED.popitem(last=False)
    else:
        _RENDERED.move_to_end(key)
    if isinstance(rendered, tuple):   # a refusal, kept as the refused node's place in the body
        raise NotFusable(kernel.body[rendered[0]], rendered[1])
    return rendered


def _render_once(program: KernelProgram, kernel: Kernel, arch: str) -> RenderedKernel | tuple[int, str]:
    """`kernel` rendered under placeholder names, or where its archetype refuses the body, (the refused node's
    place in the body, the reason)."""
    shapes = {name: buf.shape for name, buf in program.buffers.items()}
    try:
        schedule = kernel.schedule if kernel.schedule.params else default_schedule(kernel, shapes, arch)
    except NotFusable as refusal:
        return _refused(refusal, {id(node): place for place, node in enumerate(kernel.body)})
    renamed, counterpart = _renamed(kernel, {name: placeholder for placeholder, name in _placeholders(kernel).items()})
    buffers = {counterpart_name: dataclasses.replace(program.buffers[name], name=counterpart_name)
               for counterpart_name, name in _placeholders(kernel).items()}
    stand_in = KernelProgram(program.name, buffers, [renamed], (), {})
    try:
        return _render(stand_in, renamed, schedule, _index_type(program))
    except NotFusable as refusal:
        return _refused(refusal, counterpart)


def _refused(refusal: NotFusable, places: dict[int, int]) -> tuple[int, str]:
    """A refusal as (the refused node's place in the body, the reason); one naming a node not in the body is
    raised as it is."""
    place = places.get(id(refusal.node))
    if place is None:
        raise refusal
    return place, str(refusal)


def _placeholders(kernel: Kernel) -> dict[str, str]:
    """Placeholder -> buffer name: the buffers `kernel` reads, in order of first use, then those it writes."""
    reads = list(dict.fromkeys(node.arg for node in kernel.body if node.op == Op.INPUT))
    return {**{f"TSREAD{i}Q": name for i, name in enumerate(reads)},
            **{f"TSWRITE{j}Q": name for j, (name, _) in enumerate(kernel.outputs)}}


def _renamed(kernel: Kernel, names: dict[str, str]) -> tuple[Kernel, dict[int, int]]:
    """`kernel` with its buffers renamed by `names` and itself named KERNEL, and for each node of the new body,
    its place in the old body."""
    new: dict[int, Node] = {}
    counterpart: dict[int, int] = {}
    for place, node in enumerate(kernel.body):   # sources before their users
        if node.op == Op.INPUT:
            copy = dataclasses.replace(node, arg=names[node.arg])
        else:
            copy = dataclasses.replace(node, srcs=tuple(new[id(src)] for src in node.srcs))
        new[id(node)] = copy
        counterpart[id(copy)] = place
    outputs = tuple((names[name], new[id(node)]) for name, node in kernel.outputs)
    return Kernel(KERNEL, kernel.archetype, outputs, kernel.schedule), counterpart


def _render(program: KernelProgram, kernel: Kernel, schedule: Schedule, index_type: str) -> RenderedKernel:
    shapes = {name: buf.shape for name, buf in program.buffers.items()}
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
    context = _context(program, kernel, schedule, body, extra, index_type)
    source = _environment().get_template(f"{context.get('template', kernel.archetype)}.cu.j2").render(k=context)
    return RenderedKernel(kernel.name, "", kernel.archetype, source,
                          context["grid"], context["block"], tuple(p["name"] for p in context["params"]),
                          kernel.writes, schedule, context.get("shared_bytes", 0), context.get("arch"),
                          tuple(context.get("tensor_maps", ())), bool(context.get("persistent")))


def _index_type(program: KernelProgram) -> str:
    largest = max(math.prod(buf.shape) for buf in program.buffers.values())
    return "int" if largest <= INT32_LIMIT else "long long"


def _context(program: KernelProgram, kernel: Kernel, schedule: Schedule, body: str, extra: dict,
             index_type: str) -> dict:
    bufs = program.buffers
    params = [{"name": n, "ctype": bufs[n].dtype.cuda_name, "const": False} for n in kernel.writes]
    params += [{"name": n, "ctype": bufs[n].dtype.cuda_name, "const": True} for n in kernel.reads]
    describe = [f"{n}[{', '.join(map(str, bufs[n].shape))}] {bufs[n].dtype}" for n in kernel.writes + kernel.reads]
    return {
        "name": kernel.name, "entry": ENTRY, "graph": program.name, "version": VERSION,
        "archetype": kernel.archetype, "schedule": str(schedule), "params": params,
        "outputs": describe[:len(kernel.writes)], "inputs": describe[len(kernel.writes):],
        "nodes": _node_lines(kernel), "measured": MEASURED_PLACEHOLDER, "body": body,
        "index_type": index_type, **extra,
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
