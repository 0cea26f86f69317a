"""The e-graph as plain tables (e-class -> e-nodes), the cheapest choice per e-class, and the Graph it gives.

egglog's own extraction is not used to leave the e-graph: its tree costs saturate at 2**64 on graphs with
much sharing (every choice then ties), and egglog-python turns the extracted term into a Python expression
recursively (about four frames per level, so a 2000-op chain overflows the default recursion limit). The
tables come from the e-graph's frozen rows and are walked without recursion.

A chosen term that the checked primitives refuse (a shape that does not fit) raises `ExtractionError`, naming
the e-class, its e-node, the shapes of its children and the shape the analysis derived. There is no fallback
to the input graph: an e-graph that holds an ill-shaped term means an unsound rule or a wrong analysis, and a
silent fallback would hide it (and make compiled programs depend on which bug happened to fire).
"""
from __future__ import annotations

import heapq
import struct
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from egglog import EGraph, get_let_name

from tensorsmith.ir import primitives as P
from tensorsmith.ir.errors import TensorsmithError
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.node import Node
from tensorsmith.ir.ops import Op

TERM_SORT = "TExpr"
# higher-level constructors that later stages match on. MatMul is built as the primitive contraction it stands
# for (`node_of`); OnlineSoftmax has no Node of its own (extraction gives it infinite cost, and building one
# raises ExtractionError)
PATTERN_OPS = frozenset({"MatMul", "OnlineSoftmax"})
UNBUILT_PATTERNS = frozenset({"OnlineSoftmax"})


class ExtractionError(TensorsmithError, ValueError):
    """A chosen e-node could not become a Node: a bug in a rule or in the term language, never the user's."""

ANALYSES = ("shape_of", "dtype_of")
OPS: dict[str, Op] = {
    "Input": Op.INPUT, "Const": Op.CONSTANT, "Iota": Op.IOTA, "Exp2": Op.EXP2, "Log2": Op.LOG2, "Sin": Op.SIN,
    "Sqrt": Op.SQRT, "Recip": Op.RECIP, "Add": Op.ADD, "Mul": Op.MUL, "Mod": Op.MOD, "LessThan": Op.LESS_THAN,
    "Sum": Op.SUM, "Max": Op.MAX, "Cast": Op.CAST, "Reshape": Op.RESHAPE, "Permute": Op.PERMUTE,
    "Expand": Op.EXPAND, "Slice": Op.SLICE, "Pad": Op.PAD, "Contiguous": Op.CONTIGUOUS,
}


def encode_value(value: float | int | bool) -> int:
    """A constant's value as the signed 64-bit pattern of its float64 (exact for -0.0, inf, nan, int32, bool)."""
    return struct.unpack("<q", struct.pack("<d", float(value)))[0]


def decode_value(bits: int) -> float:
    """The float64 whose bit pattern `encode_value` produced."""
    return struct.unpack("<d", struct.pack("<q", bits))[0]


@dataclass(frozen=True)
class ENode:
    """One constructor application: its egg_fn name, its child e-classes, its literal arguments (in order)."""

    op: str
    children: tuple[int, ...]
    lits: tuple[object, ...]


@dataclass(frozen=True)
class EClasses:
    """The e-nodes of every e-class (ids 0..n-1), the e-class of each root, and the shape and dtype that the
    `analysis` ruleset found for each e-class (empty where it has not run)."""

    nodes: dict[int, list[ENode]]
    roots: dict[str, int]
    shapes: dict[int, tuple[int, ...]]
    dtypes: dict[int, str]

    @property
    def num_enodes(self) -> int:
        return sum(len(nodes) for nodes in self.nodes.values())


def _decoder(egraph: EGraph, sort: str) -> Callable[[Any], object]:
    # egglog.EGraph keeps its Rust e-graph in `_egraph`; its frozen rows hold raw values that only it decodes.
    raw = egraph._egraph
    if sort == "String":
        return raw.value_to_string
    if sort == "i64":
        return raw.value_to_i64
    if sort.startswith("egglog.builtins.Vec"):
        return lambda value: tuple(raw.value_to_i64(v) for v in raw.value_to_vec(value))
    raise TypeError(f"no decoder for the egglog sort {sort}")


def read_eclasses(egraph: EGraph, roots: Mapping[str, object]) -> EClasses:
    """The e-graph's term e-classes and the e-class of each root (roots must be let-bound terms)."""
    frozen = egraph._egraph.freeze()
    ids: dict[object, int] = {}
    nodes: dict[int, list[ENode]] = {}

    def class_id(value: object) -> int:
        if value not in ids:
            ids[value] = len(ids)
            nodes[ids[value]] = []
        return ids[value]

    analyses: dict[str, dict[int, object]] = {name: {} for name in ANALYSES}
    for name, fn in frozen.functions.items():
        if name in ANALYSES:
            decode = _decoder(egraph, fn.output_sort)
            analyses[name].update((class_id(row.inputs[0]), decode(row.output)) for row in fn.rows)
        if name not in OPS and name not in PATTERN_OPS:
            continue
        kinds = [None if sort == TERM_SORT else _decoder(egraph, sort) for sort in fn.input_sorts]
        for row in fn.rows:
            if row.subsumed:
                continue
            children = tuple(class_id(v) for v, kind in zip(row.inputs, kinds) if kind is None)
            lits = tuple(kind(v) for v, kind in zip(row.inputs, kinds) if kind is not None)
            nodes[class_id(row.output)].append(ENode(name, children, lits))
    root_ids = {}
    for out, term in roots.items():
        let = get_let_name(term)  # type: ignore[arg-type]
        if let is None or f"${let}" not in frozen.functions:
            raise ValueError(f"root {out!r} is not a let-bound term of this e-graph: {term}")
        root_ids[out] = class_id(frozen.functions[f"${let}"].rows[0].output)
    return EClasses(nodes, root_ids, analyses["shape_of"], analyses["dtype_of"])  # type: ignore[arg-type]


def cheapest(classes: EClasses, cost: Callable[[ENode], float]) -> dict[int, ENode]:
    """The e-node of least tree cost in every e-class that has a finite term (Knuth's generalised Dijkstra).

    A class is settled when popped; an e-node is offered once all its child classes are settled, so the
    choice is acyclic. Costs are floats (inf only past 1e308; a shared subterm counts once per use).
    """
    parents: dict[int, list[tuple[int, int]]] = {c: [] for c in classes.nodes}
    waiting: dict[tuple[int, int], int] = {}
    heap: list[tuple[float, int, int]] = []  # (cost, e-class, index of the e-node in it)
    for c, enodes in classes.nodes.items():
        for k, enode in enumerate(enodes):
            pending = set(enode.children)
            waiting[(c, k)] = len(pending)
            for child in pending:
                parents[child].append((c, k))
            if not pending:
                heapq.heappush(heap, (cost(enode), c, k))
    best: dict[int, float] = {}
    choice: dict[int, ENode] = {}
    while heap:
        total, c, k = heapq.heappop(heap)
        if c in best:
            continue
        best[c], choice[c] = total, classes.nodes[c][k]
        for parent, j in parents[c]:
            waiting[(parent, j)] -= 1
            if waiting[(parent, j)] == 0 and parent not in best:
                enode = classes.nodes[parent][j]
                parent_cost = cost(enode) + sum(best[child] for child in enode.children)
                heapq.heappush(heap, (parent_cost, parent, j))
    return choice


def node_of(enode: ENode, srcs: list[Node], graph: Graph) -> Node:
    """The Node for one e-node, built by the checked primitives (shapes and dtypes re-inferred); a MatMul as
    sum(expand(a, shape) * expand(b, shape), axis), the contraction it was recognised from or derived as."""
    if enode.op == "MatMul":
        shape, axis = enode.lits
        product = P.binary(Op.MUL, P.expand(srcs[0], shape), P.expand(srcs[1], shape))  # type: ignore[arg-type]
        return P.reduce(Op.SUM, product, axis)  # type: ignore[arg-type]
    op, lits = OPS[enode.op], enode.lits
    if op == Op.INPUT:
        name, shape, dtype = lits
        node = graph.inputs.get(str(name))
        if node is None or node.shape != shape or node.dtype.value != dtype:
            raise ValueError(f"e-graph input {name!r} {shape} {dtype} is not an input of graph {graph.name!r}")
        return node
    if op == Op.CONSTANT:
        bits, shape, dtype = lits
        return P.constant(decode_value(bits), shape, dtype)  # type: ignore[arg-type]
    if op == Op.IOTA:
        return P.iota(lits[0], lits[1])  # type: ignore[arg-type]
    if op in (Op.EXP2, Op.LOG2, Op.SIN, Op.SQRT, Op.RECIP):
        return P.unary(op, srcs[0])
    if op in (Op.ADD, Op.MUL, Op.MOD, Op.LESS_THAN):
        return P.binary(op, srcs[0], srcs[1])
    if op in (Op.SUM, Op.MAX):
        return P.reduce(op, srcs[0], lits[0])  # type: ignore[arg-type]
    if op == Op.CAST:
        return P.cast(srcs[0], lits[0])  # type: ignore[arg-type]
    if op == Op.CONTIGUOUS:
        return P.contiguous(srcs[0])
    if op == Op.RESHAPE:
        return P.reshape(srcs[0], lits[0])  # type: ignore[arg-type]
    if op == Op.EXPAND:
        return P.expand(srcs[0], lits[0])  # type: ignore[arg-type]
    if op == Op.PERMUTE:
        return P.permute(srcs[0], lits[0])  # type: ignore[arg-type]
    starts, shape = lits
    if op == Op.SLICE:
        return P.slice_(srcs[0], [(s, s + n) for s, n in zip(starts, shape)])  # type: ignore[call-overload]
    widths = [(s, n - d - s) for s, n, d in zip(starts, shape, srcs[0].shape)]  # type: ignore[call-overload]
    return P.pad(srcs[0], widths)


def build_graph(classes: EClasses, choice: Mapping[int, ENode], graph: Graph,
                built: dict[int, Node] | None = None) -> Graph:
    """A Graph named like `graph`, with its input Nodes, whose outputs are the chosen terms of the roots; `built`,
    where given, receives the Node made for each e-class."""
    out = Graph(graph.name)
    out.inputs.update(graph.inputs)
    built = {} if built is None else built
    for name, root in classes.roots.items():
        stack: list[tuple[int, bool]] = [(root, False)]
        on_path: set[int] = set()
        while stack:
            c, expanded = stack.pop()
            if c in built:
                continue
            if c not in choice:
                raise ValueError(f"no e-node chosen for e-class {c} (output {name!r})")
            enode = choice[c]
            if expanded:
                built[c] = _build_node(classes, c, enode, [built[child] for child in enode.children], graph)
                on_path.discard(c)
                continue
            if c in on_path:
                raise ValueError(f"the choice is cyclic at e-class {c} (output {name!r})")
            on_path.add(c)
            stack.append((c, True))
            stack.extend((child, False) for child in reversed(enode.children) if child not in built)
        out.outputs[name] = built[root]
    return out


OP_NAMES = {op: name for name, op in OPS.items()}


def enode_of(node: Node, children: tuple[int, ...]) -> ENode:
    """The e-node a graph Node entered the e-graph as (`term.term_of`'s constructor and literals), given the
    e-classes of its sources."""
    op, arg, shape, dtype = node.op, node.arg, tuple(node.shape), node.dtype.value
    lits: tuple[object, ...]
    if op == Op.INPUT:
        lits = (arg, shape, dtype)
    elif op == Op.CONSTANT:
        lits = (encode_value(arg), shape, dtype)
    elif op == Op.IOTA:
        lits = (shape, arg)
    elif op in (Op.SUM, Op.MAX):
        lits = (arg,)
    elif op == Op.CAST:
        lits = (dtype,)
    elif op in (Op.RESHAPE, Op.EXPAND, Op.PERMUTE):
        lits = (tuple(arg),)
    elif op in (Op.SLICE, Op.PAD):
        lits = (tuple(lo for lo, _ in arg), shape)
    else:
        lits = ()
    return ENode(OP_NAMES[op], children, lits)


def enode_classes(classes: EClasses) -> dict[ENode, int]:
    """The e-class of each e-node (an e-graph holds each e-node in one e-class)."""
    return {enode: c for c, enodes in classes.nodes.items() for enode in enodes}


def classes_of(classes: EClasses, nodes: list[Node], contractions: bool = False) -> dict[int, int]:
    """The e-class of each of `nodes` (by id; in topological order) that the e-graph still holds as it was added:
    where an e-node was dropped, that node and those built on it have none. With `contractions`, a contraction
    sum(expand(a, s) * expand(b, s), axis) has one also where the e-graph holds MatMul(a, b, s, axis), as `node_of`
    builds it (its expands need not be in the e-graph)."""
    index = enode_classes(classes)
    found: dict[int, int] = {}
    for node in nodes:
        c = None
        if node.op in OP_NAMES and all(id(src) in found for src in node.srcs):
            c = index.get(enode_of(node, tuple(found[id(src)] for src in node.srcs)))
        product = node.srcs[0] if contractions and node.op == Op.SUM else None
        if c is None and product is not None and product.op == Op.MUL:
            operands = [src.srcs[0] if src.op == Op.EXPAND else src for src in product.srcs]
            if all(id(operand) in found for operand in operands):
                c = index.get(ENode("MatMul", tuple(found[id(operand)] for operand in operands),
                                    (tuple(product.shape), node.arg)))
        if c is not None:
            found[id(node)] = c
    return found


def _build_node(classes: EClasses, c: int, enode: ENode, srcs: list[Node], graph: Graph) -> Node:
    """node_of, with a refusal turned into an ExtractionError that says where in the e-graph it came from."""
    if enode.op in UNBUILT_PATTERNS:
        raise ExtractionError(f"e-class {c}: {enode.op} is a pattern node with no primitive form; extraction "
                              "must give it infinite cost")
    try:
        return node_of(enode, srcs, graph)
    except TensorsmithError as error:
        children = ", ".join(f"e-class {child} {src.op} {src.shape} {src.dtype.value}"
                             for child, src in zip(enode.children, srcs))
        raise ExtractionError(
            f"e-class {c} (analysis: shape {classes.shapes.get(c)}, dtype {classes.dtypes.get(c)}): the chosen "
            f"{enode.op}{enode.lits} of [{children}] is not a valid node: {error}. The e-graph holds an ill-formed "
            "term (a rule or the shape analysis is wrong); not falling back to the input graph") from error
