"""A model's repeated layers: the graph cut where one value carries everything forward, and the longest run of
identical pieces between such cuts, each piece a graph of its own whose inputs are what it reads from outside.

Identical layers (the same ops, shapes and dtypes, up to which weights they read) have equal `Piece.structure`, so a
compiler searches one of them and binds its program to the others' weights (issue 41)."""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from . import primitives as P
from .dtypes import DType
from .graph import Graph
from .kernel_program import Buffer, Kernel, KernelProgram, merged_pointwise, output_copies
from .node import Node, consumers, toposort
from .ops import VIEWS, Op
from .patterns import match_matmul

MIN_REPEATS = 2           # identical layers in a row before they are searched once
FEW_POSITIONS = 4096      # an integer input this small is positions or ids, from which each piece computes its own
FEW_VALUES = 256          # a float input this small is a table (rotary frequencies): each piece computes its own
PIECE_TAG = re.compile(r"^(prefix|suffix|layer\d+)_")   # what `stitched` puts before a piece's kernel names


def untagged(name: str) -> str:
    """A stitched kernel's name without its piece's tag: the same for every layer's copy of one kernel."""
    return PIECE_TAG.sub("", name)


@dataclass(frozen=True)
class Piece:
    """A stretch of the model as a graph of its own: its input `x<i>` is the model's node `reads[i]` (a weight, a
    shared input, or the value the previous piece carried), its i-th output the model's node `writes[i]`."""

    tag: str                      # "prefix", "layer0", "layer1", ..., "suffix": names its kernels and buffers
    graph: Graph
    reads: tuple[Node, ...]
    writes: tuple[Node, ...]
    structure: str                # equal for identical layers, whatever weights they read

    @property
    def binding(self) -> dict[str, Node]:
        """The model's node each input of `graph` stands for, by input name."""
        return dict(zip(self.graph.inputs, self.reads))

    @property
    def results(self) -> dict[str, Node]:
        """The model's node each output of `graph` computes, by output name."""
        return dict(zip(self.graph.outputs, self.writes))


@dataclass(frozen=True)
class Layers:
    """The model as pieces in order: a prefix and a suffix where there are such, and `repeats` layers between."""

    pieces: tuple[Piece, ...]
    repeats: int

    def identical(self) -> int:
        """How many layers are the first layer's piece exactly (a layer that differs in how its own spans connect is
        a distinct piece, searched on its own)."""
        first = next(piece for piece in self.pieces if piece.tag == "layer0")
        return sum(piece.structure == first.structure for piece in self.pieces)

    def distinct(self) -> list[Piece]:
        """One piece of each structure, first seen first: what a compiler searches."""
        first: dict[str, Piece] = {}
        for piece in self.pieces:
            first.setdefault(piece.structure, piece)
        return list(first.values())


def find_layers(graph: Graph, min_repeats: int = MIN_REPEATS) -> Layers | None:
    """The model's longest run of identical layers, each holding a matrix product, cut where one value carries
    everything forward; None where there is no such run of `min_repeats` or more."""
    cut = _Cut.of(graph)
    if cut is None or len(cut.spans) < min_repeats:
        return None
    layers = _layers(cut, min_repeats)
    if layers is None:
        return None
    groups: list[tuple[str, int, int]] = []
    if layers[0][0]:
        groups.append(("prefix", 0, layers[0][0]))
    groups += [(f"layer{i}", first, end) for i, (first, end) in enumerate(layers)]
    if layers[-1][1] < len(cut.spans):
        groups.append(("suffix", layers[-1][1], len(cut.spans)))
    return Layers(tuple(cut.piece(tag, first, end) for tag, first, end in groups), len(layers))


@dataclass(frozen=True)
class _Cut:
    """A graph cut into spans: its nodes in a late order, which of them are free, who uses each, the spans of non-free
    nodes between cuts and how many nodes come before each span."""

    graph: Graph
    order: list[Node]
    free: set[int]
    users: dict[int, list[Node]]
    spans: list[list[Node]]
    before: list[int]

    @staticmethod
    def of(graph: Graph) -> "_Cut | None":
        """None where an output is an input: no piece computes it."""
        order = _late_order(graph)
        free = _free(order, {id(node) for node in graph.outputs.values()})
        if any(id(node) in free for node in graph.outputs.values()):
            return None
        users = consumers(order)
        spans = _spans(graph, order, free, users)
        before = [0]
        for span in spans:
            before.append(before[-1] + len(span))
        return _Cut(graph, order, free, users, spans, before)

    def size(self, first: int, end: int) -> int:
        return self.before[end] - self.before[first]

    def has_matmul(self, first: int, end: int) -> bool:
        """Whether the spans hold a matrix product, or a product with a weight matrix over one row (a decode step's)."""
        return any(match_matmul(node) is not None or _weighs_a_row(node)
                   for span in self.spans[first:end] for node in span)

    def structure(self, first: int, end: int) -> str:
        return self.piece("span", first, end).structure

    def piece(self, tag: str, first: int, end: int) -> Piece:
        """Spans first..end-1 as a graph: what they read from outside becomes inputs x0, x1, ... by first use, free
        nodes they read are computed again inside, and what is used outside (or is a model output) becomes its
        outputs, in order, each named by its op."""
        nodes = [node for span in self.spans[first:end] for node in span]
        inside = {id(node) for node in nodes}
        outputs = {id(node) for node in self.graph.outputs.values()}
        writes = [node for node in nodes
                  if id(node) in outputs or any(id(user) not in inside for user in self.users[id(node)])]
        reads: list[Node] = []
        copies: dict[int, Node] = {}
        outside = {id(n) for n in self.order if id(n) not in inside and (n.op == Op.INPUT or id(n) not in self.free)}
        for node in toposort(writes, stops=outside):
            if id(node) in outside:
                copies[id(node)] = P.input_(f"x{len(reads)}", node.shape, node.dtype)
                reads.append(node)
            else:
                copies[id(node)] = replace(node, srcs=tuple(copies[id(src)] for src in node.srcs))
        piece = Graph(f"{self.graph.name}_{tag}")
        piece.inputs = {f"x{i}": copies[id(node)] for i, node in enumerate(reads)}
        piece.outputs = {_output_name(node, i): copies[id(node)] for i, node in enumerate(writes)}
        shape_only = Graph("piece")
        shape_only.inputs, shape_only.outputs = piece.inputs, piece.outputs
        return Piece(tag, piece, tuple(reads), tuple(writes), shape_only.structural_hash())


def _widened(cut: _Cut, layers: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The run with the layers before and after it that are cut differently but are the same piece: the first
    layer reads an input where the others read a computed value, and so has cuts of its own inside. A stretch is
    built as a piece only where it holds as many nodes as the unit."""
    size = cut.size(*layers[0])
    unit = cut.structure(*layers[0])
    grown = True
    while grown:
        grown = False
        start, end = layers[0][0], layers[-1][1]
        first = next((first for first in range(start - 1, -1, -1) if cut.size(first, start) == size), None)
        if first is not None and cut.structure(first, start) == unit:
            layers, grown = [(first, start)] + layers, True
        last = next((last for last in range(end + 1, len(cut.spans) + 1) if cut.size(end, last) == size), None)
        if last is not None and cut.structure(end, last) == unit:
            layers, grown = layers + [(end, last)], True
    return layers


def _late_order(graph: Graph) -> list[Node]:
    """The nodes the outputs depend on, each as late as its sources allow: a node's tallest source is walked first,
    so a weight's own ops (a transpose, a cast) come just before the op that uses them, not before the layer; the
    tallest output first, so that outputs beside the main line (each layer's updated cache) fall in their layers."""
    height: dict[int, int] = {}
    for node in toposort(graph.outputs.values()):
        height[id(node)] = 1 + max((height[id(src)] for src in node.srcs), default=-1)
    roots = sorted(graph.outputs.values(), key=lambda node: -height[id(node)])
    return toposort(roots, first=lambda src: -height[id(src)])


def _free(order: list[Node], outputs: set[int] = frozenset()) -> set[int]:
    """Inputs, and nodes that depend on no input but positions (constants, iotas, a few integers given, such as a
    decode step's cache positions, very few values, and what is computed from them only: masks, rotary tables) and
    are not among the model's `outputs` (a cache's length, counted on), which a piece must write: any piece may
    read an input, and computes its own copy of the rest."""
    free: set[int] = set()
    for node in order:
        if node.op == Op.INPUT or id(node) not in outputs and all(
                id(src) in free and (src.op != Op.INPUT or _positions(src)) for src in node.srcs):
            free.add(id(node))
    return free


def _positions(node: Node) -> bool:
    """An input of a few integers (positions, ids) or of very few values (a rotary frequency table): what is
    computed from such inputs alone is cheap to compute again."""
    return node.size <= (FEW_POSITIONS if node.dtype in (DType.INT32, DType.BOOL) else FEW_VALUES)


def _spans(graph: Graph, order: list[Node], free: set[int], users: dict[int, list[Node]]) -> list[list[Node]]:
    """The non-free nodes of `order` cut after each node that is the only computed value used later. A model output
    counts as used only by its users: the piece computing it writes it out (a layer's updated KV cache), so it
    carries nothing forward."""
    place = {id(node): i for i, node in enumerate(order)}
    last_use = {id(node): max((place[id(user)] for user in users[id(node)]), default=place[id(node)])
                for node in order}
    ending: dict[int, int] = {}
    for node in order:
        if id(node) not in free:
            ending[last_use[id(node)]] = ending.get(last_use[id(node)], 0) + 1
    spans: list[list[Node]] = [[]]
    live = 0
    for i, node in enumerate(order):
        live -= ending.get(i, 0)
        if id(node) in free:
            continue
        spans[-1].append(node)
        if last_use[id(node)] > i:
            live += 1
            if live == 1 and i < len(order) - 1:
                spans.append([])
    return [span for span in spans if span]


FEW_SPANS = 200           # spans few enough to try every stretch of them as the unit a run repeats


def _layers(cut: _Cut, min_repeats: int) -> list[tuple[int, int]] | None:
    """The spans (first, end) of each layer of the longest run: the run of identical groups of spans that covers the
    most nodes, widened by the layers around it that are cut differently (`_widened`). Where no group repeats as cut
    but the spans are few (two layers, the first cut differently), every stretch is tried as the unit."""
    run = _longest_run(cut, min_repeats)
    if run is not None:
        start, period, repeats = run
        return _widened(cut, [(start + i * period, start + (i + 1) * period) for i in range(repeats)])
    spans = len(cut.spans)
    if spans > FEW_SPANS:
        return None
    best: list[tuple[int, int]] | None = None
    ending = [{cut.size(b, i) for b in range(i)} for i in range(spans + 1)]   # sizes of the stretches ending at i
    starting = [{cut.size(i, b) for b in range(i + 1, spans + 1)} for i in range(spans + 1)]   # and starting there
    for start in range(spans):
        for end in range(start + 1, spans + 1):
            size = cut.size(start, end)
            if not (size in ending[start] or size in starting[end]) or not cut.has_matmul(start, end):
                continue    # nothing beside it holds as many nodes, so nothing beside it is the same piece
            layers = _widened(cut, [(start, end)])
            if len(layers) >= min_repeats and (best is None or _covered(cut, layers) > _covered(cut, best)):
                best = layers
    return best


def _covered(cut: _Cut, layers: list[tuple[int, int]]) -> int:
    return sum(cut.size(first, end) for first, end in layers)


def _longest_run(cut: _Cut, min_repeats: int) -> tuple[int, int, int] | None:
    """(start, period, repeats) of the run of identical groups of spans covering the most nodes (the shortest period
    among equals), each group holding a matrix product."""
    shapes = [cut.structure(i, i + 1) for i in range(len(cut.spans))]
    best: tuple[int, int, int] | None = None
    best_covered = 0
    for period in range(1, len(shapes) // min_repeats + 1):
        for start in range(len(shapes) - period * min_repeats + 1):
            unit = shapes[start:start + period]
            repeats = 1
            while shapes[start + repeats * period:start + (repeats + 1) * period] == unit:
                repeats += 1
            covered = repeats * cut.size(start, start + period)
            if repeats >= min_repeats and covered > best_covered and cut.has_matmul(start, start + period):
                best, best_covered = (start, period, repeats), covered
    return best


def _weighs_a_row(node: Node) -> bool:
    """sum(a * W) with W a matrix given as an input (seen through views): a vector-matrix product."""
    if node.op != Op.SUM or node.srcs[0].op != Op.MUL:
        return False
    for operand in node.srcs[0].srcs:
        while operand.op in VIEWS:
            operand = operand.srcs[0]
        if operand.op == Op.INPUT and operand.ndim >= 2 and min(operand.shape) > 1:
            return True
    return False


def _output_name(node: Node, position: int) -> str:
    """A piece's output named by what computes it (`add0`), as the kernel that writes it and its function are."""
    label = re.sub(r"[^A-Za-z0-9]+", "_", node.api or node.op.value).strip("_") or "out"
    if label == "x":                        # inputs are x0, x1, ...
        label = "out"
    return f"{label}_{position}" if label[-1].isdigit() else f"{label}{position}"   # exp2_1 is not exp21


def inline(graph: Graph, reads: dict[str, Node]) -> dict[str, Node]:
    """What `graph`'s outputs compute, by output name, with its inputs bound to the nodes `reads` names."""
    copies: dict[int, Node] = {}
    for node in toposort(graph.outputs.values()):
        copies[id(node)] = (reads[node.arg] if node.op == Op.INPUT else
                            replace(node, srcs=tuple(copies[id(src)] for src in node.srcs)))
    return {name: copies[id(node)] for name, node in graph.outputs.items()}


def stitched(model: Graph, layers: Layers, programs: dict[str, KernelProgram]) -> KernelProgram:
    """The model's program: each piece's program (`programs`, by structure) bound to the buffers of that piece, its
    temporaries and kernels named after the piece (`layer3_...`), so identical layers run identical kernels."""
    buffers = {name: Buffer(name, node.shape, node.dtype, "input") for name, node in model.inputs.items()}
    buffer_of = {id(node): name for name, node in model.inputs.items()}
    output_of: dict[int, str] = {}
    for name, node in model.outputs.items():
        output_of.setdefault(id(node), name)
    kernels: list[Kernel] = []
    taken = {*model.inputs, *model.outputs}
    for piece in layers.pieces:
        program = programs[piece.structure]
        names = {name: buffer_of[id(node)] for name, node in piece.binding.items()}
        for name, node in piece.results.items():
            names[program.outputs[name]] = buffer_of[id(node)] = (
                output_of.get(id(node)) or _fresh(f"{piece.tag}_{name}", taken))
        for name, buffer in program.buffers.items():
            if name not in names:
                names[name] = _fresh(f"{piece.tag}_{name}", taken)
            if buffer.role != "input":
                renamed = names[name]
                buffers[renamed] = Buffer(renamed, buffer.shape, buffer.dtype,
                                          "output" if renamed in model.outputs else "temp")
        prefix = program.name + "_"
        kernels += [Kernel(f"{model.name}_{piece.tag}_{kernel.name.removeprefix(prefix)}", kernel.archetype,
                           _renamed(kernel.outputs, names), kernel.schedule) for kernel in program.kernels]
    kernels = merged_pointwise(kernels + output_copies(model.name, model.outputs, buffer_of, buffers))
    return KernelProgram(model.name, buffers, kernels, tuple(model.inputs), {name: name for name in model.outputs})


def _fresh(name: str, taken: set[str]) -> str:
    """`name`, with underscores added where a name `taken` holds has it; then taken too."""
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def _renamed(outputs: tuple[tuple[str, Node], ...], names: dict[str, str]) -> tuple[tuple[str, Node], ...]:
    """A kernel's outputs and body over the buffers `names` renames."""
    copies: dict[int, Node] = {}
    for node in toposort(node for _, node in outputs):
        copies[id(node)] = (replace(node, arg=names[node.arg]) if node.op == Op.INPUT else
                            replace(node, srcs=tuple(copies[id(src)] for src in node.srcs)))
    return tuple((names[name], copies[id(node)]) for name, node in outputs)
