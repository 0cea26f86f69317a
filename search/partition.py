"""Kernel boundaries: split a Graph into the fewest kernels that codegen's archetypes accept.

Start with one kernel per graph output, every other node fused into its consumers; whenever an
archetype refuses a body (`NotFusable`), materialise the node it names into a buffer of its own and
try again. Each round materialises at least one more node, so this ends.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from tensorsmith.codegen.emit import NotFusable, is_inline_reduce
from tensorsmith.codegen.attention import attention_match, kernel_attention
from tensorsmith.codegen.matmul import MIN_DIM, tensor_core_match
from tensorsmith.codegen.render import check_renders
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.kernel_program import Buffer, Kernel, KernelProgram, output_copies
from tensorsmith.ir.node import Node, squeezed, toposort
from tensorsmith.ir.ops import COMPUTE, ELEMENTWISE, Op, REDUCE, VIEWS
from tensorsmith.ir.patterns import match_gather, match_loose_matmul, match_matmul

Origins = dict[int, Node]  # id of a node in a kernel body -> the graph node it copies


def partition(graph: Graph) -> KernelProgram:
    """The graph as kernels: fused as far as the archetypes allow, one kernel per materialised node."""
    return legalise(graph, set())[0]


def legalise(graph: Graph, materialised: set[int], bodies: Bodies | None = None) -> tuple[KernelProgram, set[int]]:
    """The program for `materialised` plus every node codegen refuses to fuse, and that grown set.

    Search starts from any set of materialised nodes; this is the one place that learns from codegen
    (`NotFusable`) which further nodes need a buffer of their own. Each round rebuilds the program once for all the
    refusals `_refusals` finds in it, remaking only the kernels whose cones changed (`bodies`, which the caller may
    keep across calls), so that a model's many layers are not a whole rebuild per refusal.
    """
    materialised = set(materialised)
    bodies = {} if bodies is None else bodies
    while True:
        program, origins = build_program(graph, materialised, bodies)
        refused = _refusals(program, origins, bodies)
        if not refused:
            return _views_absorbed(graph, program, origins, materialised, bodies)
        again = refused.keys() & materialised
        if again:
            raise AssertionError(f"codegen refused {refused[next(iter(again))]} again")
        materialised |= set(refused)


def _views_absorbed(graph: Graph, program: KernelProgram, origins: Origins, materialised: set[int],
                    bodies: Bodies) -> tuple[KernelProgram, set[int]]:
    """`program` without the kernels that only copy a temporary through views (a (T, N) product as the model's
    (1, T, N) output, an attention's heads as the rows a product reads), where the kernel writing that temporary
    takes the views itself (codegen stores through them) and nothing else reads it: a refusal that gave a matmul
    its own buffer, or a search's move, leaves such copies, which cost a pass over the whole value."""
    outputs = {id(node) for node in graph.outputs.values()}
    copied = [origins[id(source)] for kernel in program.kernels if (source := _view_source(kernel)) is not None]
    copied = [node for node in copied if id(node) in materialised and id(node) not in outputs]
    if not copied:
        return program, materialised
    readers = _readers(graph.nodes())
    for node in copied:
        if not _read_through_views_once(node, readers, materialised | outputs):
            continue
        fewer = materialised - {id(node)}
        fused, fused_origins = build_program(graph, fewer, bodies)
        if not _refusals(fused, fused_origins, bodies):
            program, materialised = fused, fewer
    return program, materialised


def _view_source(kernel: Kernel) -> Node | None:
    """The one buffer load a kernel of views alone copies, else None."""
    body = kernel.body
    loads = [node for node in body if node.op == Op.INPUT]
    return loads[0] if len(loads) == 1 and all(node.op in VIEWS for node in body if node.op != Op.INPUT) else None


def _read_through_views_once(node: Node, readers: dict[int, list[Node]], roots: set[int]) -> bool:
    """Whether `node` is read by one chain of views, each read by the next alone, up to a kernel's root."""
    while len(readers.get(id(node), [])) == 1:
        node = readers[id(node)][0]
        if node.op not in VIEWS:
            return False
        if id(node) in roots:
            return True
    return False


def _refusals(program: KernelProgram, origins: Origins, bodies: Bodies) -> dict[int, Node]:
    """The graph nodes codegen refuses in `program`'s kernels, at most one a kernel, by id. A kernel whose interior
    holds a node refused in an earlier kernel is left to the next round, since a buffer for that node changes its
    body; any other kernel's body stays as it is, so its refusal is the one a round of its own would find."""
    refused: dict[int, Node] = {}
    for position, kernel in enumerate(program.kernels):
        root = origins.get(id(kernel.outputs[0][1]))
        made = bodies.get(id(root)) if root is not None else None
        if made is not None and (made.renders or not made.interior.isdisjoint(refused)):
            continue
        try:
            check_renders(program, position)
            if made is not None:
                made.renders = True
        except NotFusable as refusal:
            original = origins[id(_attention_first(kernel, refusal.node))]
            refused[id(original)] = original
    return refused


def _attention_first(kernel: Kernel, refused: Node) -> Node:
    """The attention inside `kernel` (not its output) that `refused` lies in, else `refused`: an attention gets a
    kernel of its own before any node of it does, since that kernel computes its scores, max and sum inside."""
    if kernel.archetype == "attention":     # the kernel is that attention: what it refuses is an operand's
        return refused
    root = kernel.outputs[0][1]
    for node in kernel.body:
        if (node is not root and node.op == Op.SUM and attention_match(node) is not None
                and any(inner is refused for inner in toposort([node]))):
            return node
    return refused


def computed_operands(graph: Graph) -> list[Node]:
    """What to materialise so that each tensor-core matmul reads its operands as plain buffers, in graph order.

    An operand computed elementwise (a normalised activation, a scaled weight) is computed element by element as
    its tiles load, which rules out the asynchronous copies and TMA: its elementwise node is listed. An operand
    that is a view of another kernel's output (an attention's heads permuted back into rows) is listed as its
    view, whose buffer is then a plain copy, but for a lookup of a table's rows, which the matmul copies from
    those rows. An attention's two products are not counted: its kernel computes them from its operands.
    """
    nodes = graph.nodes()
    in_attention = _attention_products(nodes)
    found: dict[int, Node] = {}
    for node in nodes:
        match = tensor_core_match(node) if node.op == Op.SUM and id(node) not in in_attention else None
        for operand in (match.lhs, match.rhs) if match is not None else ():
            view = operand.srcs[0]
            while view.op == Op.RESHAPE and squeezed(view.shape) == squeezed(view.srcs[0].shape):
                view = view.srcs[0]   # past the unit axes that matmul's lowering adds: the operand as a matrix
            source = _below_views(operand.srcs[0])
            if source.op in ELEMENTWISE:
                found.setdefault(id(source), source)
            elif source.op in REDUCE and view is not source and not _copied_lookup(source):
                found.setdefault(id(view), view)
    return _in_graph_order(nodes, found)


def _copied_lookup(node: Node) -> bool:
    """Whether `node` is a lookup of a table that is not computed elementwise (an expert's weight, a buffer's rows),
    which the matmul copies from the rows it selects, through any view: a buffer of its own would copy it first."""
    lookup = match_gather(node)
    return lookup is not None and _below_views(lookup.values).op not in ELEMENTWISE


def vector_operands(graph: Graph) -> list[Node]:
    """The computed vectors of the products too narrow for the tensor cores (a decode step's, one row), in graph
    order: the row kernel that runs such a product computes its vector again for each of its output rows, so each
    is listed (its elementwise node), as `computed_operands` lists a tensor-core matmul's. Inline, Llama-3.2-1B's
    final norm was computed once per row of its 128256-row vocabulary projection: 1169 us predicted, not 125."""
    nodes = graph.nodes()
    in_attention = _attention_products(nodes)
    found: dict[int, Node] = {}
    for node in nodes:
        if (node.op != Op.SUM or id(node) in in_attention or tensor_core_match(node) is not None
                or match_gather(node) is not None):
            continue
        match = match_loose_matmul(node)
        if match is None or max(match.dims[:2]) < MIN_DIM:
            continue
        rows, columns, _ = match.dims
        vector = match.lhs if columns >= rows else match.rhs    # the operand read again for every output row
        source = _below_views(vector.srcs[0])
        if source.op in ELEMENTWISE:
            found.setdefault(id(source), source)
    return _in_graph_order(nodes, found)


def _below_views(node: Node) -> Node:
    while node.op in VIEWS:
        node = node.srcs[0]
    return node


def _in_graph_order(nodes: list[Node], found: dict[int, Node]) -> list[Node]:
    order = {id(node): i for i, node in enumerate(nodes)}
    return sorted(found.values(), key=lambda node: order[id(node)])


def _attention_products(nodes: list[Node]) -> set[int]:
    """The ids of every attention's two products (its kernel computes them from its operands)."""
    found: set[int] = set()
    for node in nodes:
        if node.op == Op.SUM and (attention := attention_match(node)) is not None:
            found |= {id(attention.output), id(attention.qk.reduce)}
    return found


def inside_operands(graph: Graph, operands: list[Node]) -> list[Node]:
    """The nodes under `operands` (computed_operands') that their kernels may compute themselves: a norm's sum of
    squares (one row kernel writes the normalised rows), and the one matmul an operand is computed from
    elementwise, nothing else reading it (the activation then its epilogue). Other matmuls and attentions keep
    kernels of their own."""
    nodes = graph.nodes()
    readers = _readers(nodes)
    products = {id(node) for node in nodes
                if node.op == Op.SUM and (tensor_core_match(node) is not None or attention_match(node) is not None)}
    keep = {id(node) for node in operands} | products
    inside: dict[int, Node] = {}
    for operand in operands:
        cone = toposort([operand], keep - {id(operand)})
        inside.update((id(node), node) for node in cone if id(node) not in keep)
        within = {id(node) for node in cone}
        reductions = [node for node in cone if node.op in REDUCE and not is_inline_reduce(node)]
        if (len(reductions) == 1 and tensor_core_match(reductions[0]) is not None
                and all(id(reader) in within for reader in readers.get(id(reductions[0]), []))):
            inside[id(reductions[0])] = reductions[0]
    return list(inside.values())


def recomputed(graph: Graph, materialised: set[int]) -> list[Node]:
    """The compute nodes that two or more kernels of `materialised`'s program compute each and that some node
    outside them reads, in graph order: the last of each chain of values computed again, whose buffer makes the
    chain computed once. A model's residual stream is the costly case: each layer's kernels would otherwise add up
    every earlier layer's outputs again, their reads growing with depth."""
    nodes = graph.nodes()
    stops = materialised | {id(node) for node in graph.inputs.values()}
    roots = [node for node in nodes if id(node) in stops and node.op != Op.INPUT]
    roots += [node for node in graph.outputs.values() if id(node) not in stops]
    computed: dict[int, int] = {}
    for root in dict.fromkeys(roots):
        for node in toposort([root], stops - {id(root)}):
            if node is not root and id(node) not in stops and node.op in COMPUTE:
                computed[id(node)] = computed.get(id(node), 0) + 1
    again = {key for key, count in computed.items() if count > 1}
    read_outside = {id(src) for node in nodes if id(node) not in again for src in node.srcs}
    return [node for node in nodes if id(node) in again and id(node) in read_outside]


def absorbed(graph: Graph, materialised: set[int], added: list[Node]) -> set[int]:
    """The ids of nodes of `materialised` that only the kernels of `added` (nodes about to get buffers) read: a
    matmul whose one reader is a residual add given a buffer, which then computes it, the add as its epilogue."""
    readers = _readers(graph.nodes())
    stops = materialised | {id(node) for node in added} | {id(node) for node in graph.inputs.values()}
    found: set[int] = set()
    for root in added:
        cone = toposort([root], stops - {id(root)})
        inside = {id(node) for node in cone if id(node) not in stops} | {id(root)}
        found |= {id(node) for node in cone if id(node) in materialised and node is not root
                  and all(id(reader) in inside for reader in readers.get(id(node), []))}
    return found


def _readers(nodes: list[Node]) -> dict[int, list[Node]]:
    """Each node's readers among `nodes`, by the read node's id."""
    readers: dict[int, list[Node]] = {}
    for node in nodes:
        for src in node.srcs:
            readers.setdefault(id(src), []).append(node)
    return readers


def materialisable(graph: Graph) -> list[Node]:
    """The nodes that may get a buffer of their own, in graph order: compute ops and casts (views stay free, but
    for a view of a kernel's output that a matmul reads: see computed_operands).

    A matmul's (..., M, K, N) product is never one, nor a lookup's or its selector: each exists only inside its sum
    (a lookup whose selector is a buffer sums every row of its table).
    """
    nodes = graph.nodes()
    products = {id(match.reduce.srcs[0]) for node in nodes if (match := match_matmul(node)) is not None}
    lookups = [found for node in nodes if (found := match_gather(node)) is not None]
    products |= {id(lookup.reduce.srcs[0]) for lookup in lookups}   # a lookup's: one row read, from its selector
    products |= {id(node) for lookup in lookups for node in lookup.selector_nodes()}
    operand_views = {id(node) for node in computed_operands(graph) if node.op in VIEWS}
    return [node for node in nodes if (node.op in COMPUTE or node.op == Op.CAST or id(node) in operand_views)
            and id(node) not in products]


# A temporary (and its kernel) is named after what it computes: a matrix product or an attention by that name, since
# their last op (a sum, or the bias added after it) says little; any other kernel by the function of tensorsmith
# the user called for it (`Node.api`: its row reduction's, else its value's), else by the op that makes its value.
KERNEL_LABELS = {"matmul": "matmul", "attention": "attention"}
API_LABELS = {"truediv": "div", "rtruediv": "div", "radd": "add", "rsub": "sub", "rmul": "mul", "getitem": "slice",
              "lt": "less", "gt": "greater", "le": "less_equal", "ge": "greater_equal", "eq": "equal",
              "ne": "not_equal", "rmatmul": "matmul", "rmod": "mod", "pow": "power", "rpow": "power", "invert": "not"}


def kernel_label(archetype: str, body: Node) -> str:
    """What a kernel and its temporary are named after (see KERNEL_LABELS), a C identifier."""
    if archetype in KERNEL_LABELS:
        return KERNEL_LABELS[archetype]
    rows = [n for n in toposort([body]) if n.op in REDUCE and not is_inline_reduce(n)]
    named = rows[-1] if rows and archetype == "row_reduce" else body
    api = re.sub(r"\W", "_", named.api.strip("_"))
    label = API_LABELS.get(api, api) if api and api[0].isalpha() else ""
    return label or named.op.value


def unfused(graph: Graph) -> KernelProgram:
    """The baseline: one kernel per compute op (views still fold into their consumers)."""
    return build_program(graph, {id(node) for node in materialisable(graph) if node.op not in VIEWS})[0]


@dataclass
class KernelBody:
    """One kernel's body as `build_program` made it, with what it depends on: it is the body again in any set of
    materialised nodes where its interior has no buffer and each buffer it reads is there under the same name."""

    body: Node
    archetype: str
    label: str
    interior: frozenset[int]              # ids of the graph nodes computed inside, the root's but for the root
    reads: tuple[tuple[int, str], ...]    # (graph node id, buffer name) of each buffer it reads
    origins: Origins                      # its nodes -> the graph nodes they copy
    renders: bool = False                 # codegen took it once (it reads buffers of the same shapes every time)

    def holds(self, buffer_of: dict[int, str]) -> bool:
        return (all(buffer_of.get(node) == name for node, name in self.reads)
                and not any(node in buffer_of for node in self.interior))


Bodies = dict[int, KernelBody]   # by the id of the graph node a kernel computes: build_program's bodies, to reuse


def build_program(graph: Graph, materialised: set[int], bodies: Bodies | None = None) -> tuple[KernelProgram, Origins]:
    """One kernel per graph output and per node whose id is in `materialised`, in topological order. `bodies` keeps
    the kernel bodies made, by their root, across calls: one that still `holds` is not made again (a search's
    partitions differ in a few kernels of many)."""
    bodies = {} if bodies is None else bodies
    buffers = {name: Buffer(name, node.shape, node.dtype, "input") for name, node in graph.inputs.items()}
    buffer_of: dict[int, str] = {id(node): name for name, node in graph.inputs.items()}
    output_of: dict[int, str] = {}
    for name, node in graph.outputs.items():
        output_of.setdefault(id(node), name)
    taken = {*buffers, *graph.outputs}
    kernels: list[Kernel] = []
    origins: Origins = {}
    for place, node in enumerate(graph.nodes()):
        if node.op == Op.INPUT or (id(node) not in materialised and id(node) not in output_of):
            continue
        made = bodies.get(id(node))
        if made is None or not made.holds(buffer_of):
            made = bodies[id(node)] = _kernel_body(node, buffer_of)
        origins.update(made.origins)
        # numbered by the node's place in the graph, not the kernel's in the program: a kernel keeps its name, and
        # so its source, in every partition the search tries (one source is compiled once)
        name = output_of.get(id(node)) or _fresh(f"{made.label}{place}", taken)
        taken.add(name)
        buffers[name] = Buffer(name, node.shape, node.dtype, "output" if id(node) in output_of else "temp")
        kernels.append(Kernel(f"{graph.name}_{name}", made.archetype, ((name, made.body),)))
        buffer_of[id(node)] = name
    kernels += output_copies(graph.name, graph.outputs, buffer_of, buffers)
    program = KernelProgram(graph.name, buffers, kernels, tuple(graph.inputs), {n: n for n in graph.outputs})
    return program, origins


def _fresh(name: str, taken: set[str]) -> str:
    """`name`, or with underscores added where an input, an output or an earlier temporary has it."""
    while name in taken:
        name += "_"
    return name


def _archetype(body: Node) -> str:
    """Tensor cores for a matmul and its elementwise neighbours, a row reduction for other sums, else pointwise."""
    cooperative = [n for n in toposort([body]) if n.op in REDUCE and not is_inline_reduce(n)]
    if not cooperative:
        return "pointwise"
    if kernel_attention(body) is not None:     # softmax(score(q @ k^T)) @ v and its elementwise epilogue
        return "attention"
    if (len(cooperative) == 1 and tensor_core_match(cooperative[0])
            and squeezed(cooperative[0].shape) == squeezed(body.shape)):
        return "matmul"
    return "row_reduce"


def _kernel_body(root: Node, buffer_of: dict[int, str]) -> KernelBody:
    """`root`'s cone, with each node that already has a buffer replaced by a load of that buffer."""
    copies: dict[int, Node] = {}
    origins: Origins = {}
    reads: list[tuple[int, str]] = []
    for node in toposort([root], buffer_of.keys()):    # the root has no buffer yet
        if id(node) in buffer_of:
            new = dataclasses.replace(node, op=Op.INPUT, srcs=(), arg=buffer_of[id(node)])
            reads.append((id(node), buffer_of[id(node)]))
        else:
            new = dataclasses.replace(node, srcs=tuple(copies[id(src)] for src in node.srcs))
        origins[id(new)] = node
        copies[id(node)] = new
    body = copies[id(root)]
    archetype = _archetype(body)
    interior = frozenset(copies) - {id(root)} - {node for node, _ in reads}
    return KernelBody(body, archetype, kernel_label(archetype, body), interior, tuple(reads), origins)
