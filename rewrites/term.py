# mypy: disable-error-code="empty-body"
"""The egglog term language of the IR: one constructor per primitive op, and the graph <-> e-graph bridge.

Every constructor carries what `from_egglog` needs to rebuild its Node; the shapes and dtypes of the
other terms are derived by the `analysis` ruleset (`shape_of`, `dtype_of`) so that rules can test them.

Encodings chosen for egglog 13.2 (see `encode_value`):
- a constant's value travels as the IEEE-754 bits of its float64 value (an i64): egglog's f64 compares
  -0.0 and 0.0 as equal, so an f64 field would merge `Const(0.0)` with `Const(-0.0)` (1/x tells them apart);
  int32 and bool constants are exact in float64.
- shapes, axes and offsets are `Vec[i64]`; dtypes are their names (`"float32"`).
- SLICE and PAD are stored as windows, `(starts, out_shape)`: slice reads x[i + starts]; pad reads
  x[i - starts] inside the window and 0 outside. Their result shape is then an argument, which keeps
  the shape analysis free of element-wise vector arithmetic (egglog's Vec has no zip).
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Iterator, Mapping

from egglog import (Action, EGraph, Expr, RewriteOrRule, String, StringLike, Vec, eq, function, i64, i64Like, rule,
                    ruleset, set_, var)

from tensorsmith.ir.dtypes import DType
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.node import Node, consumers
from tensorsmith.ir.ops import Op

from .eclasses import OPS, PATTERN_OPS, EClasses, ENode, build_graph, cheapest, encode_value, read_eclasses

SHARED_TERM_LIMIT = 16   # a shared node whose term is larger than this is let-bound, not repeated
DEPTH_LIMIT = 24         # a term nested deeper than this is let-bound (egglog-python recurses ~4 frames a level)
LET_DIGITS = 9           # every global's name ends in a number of exactly LET_DIGITS + 1 digits (`_fixed_width_lets`)

# Constructor costs (egglog's own extraction and `constructor_cost`): views nearly free, reductions twice.
LEAF_COST, VIEW_COST, ELEMENTWISE_COST, REDUCE_COST = 1, 1, 10, 20
CONTRACTION_COST = REDUCE_COST + ELEMENTWISE_COST + 2 * VIEW_COST   # a MatMul: what its primitive form costs


class TExpr(Expr, egg_sort="TExpr"):
    """A tensor-valued term of the primitive language."""


# leaves ------------------------------------------------------------------------------------------

@function(egg_fn="Input", cost=LEAF_COST)
def Input(name: StringLike, shape: Vec[i64], dtype: StringLike) -> TExpr: ...


@function(egg_fn="Const", cost=LEAF_COST)
def Const(bits: i64Like, shape: Vec[i64], dtype: StringLike) -> TExpr: ...


@function(egg_fn="Iota", cost=LEAF_COST)
def Iota(shape: Vec[i64], axis: i64Like) -> TExpr: ...


# compute -----------------------------------------------------------------------------------------

@function(egg_fn="Exp2", cost=ELEMENTWISE_COST)
def Exp2(x: TExpr) -> TExpr: ...


@function(egg_fn="Log2", cost=ELEMENTWISE_COST)
def Log2(x: TExpr) -> TExpr: ...


@function(egg_fn="Sin", cost=ELEMENTWISE_COST)
def Sin(x: TExpr) -> TExpr: ...


@function(egg_fn="Sqrt", cost=ELEMENTWISE_COST)
def Sqrt(x: TExpr) -> TExpr: ...


@function(egg_fn="Recip", cost=ELEMENTWISE_COST)
def Recip(x: TExpr) -> TExpr: ...


@function(egg_fn="Add", cost=ELEMENTWISE_COST)
def Add(a: TExpr, b: TExpr) -> TExpr: ...


@function(egg_fn="Mul", cost=ELEMENTWISE_COST)
def Mul(a: TExpr, b: TExpr) -> TExpr: ...


@function(egg_fn="Mod", cost=ELEMENTWISE_COST)
def Mod(a: TExpr, b: TExpr) -> TExpr: ...


@function(egg_fn="LessThan", cost=ELEMENTWISE_COST)
def LessThan(a: TExpr, b: TExpr) -> TExpr: ...


@function(egg_fn="Sum", cost=REDUCE_COST)
def Sum(x: TExpr, axis: i64Like) -> TExpr: ...


@function(egg_fn="Max", cost=REDUCE_COST)
def Max(x: TExpr, axis: i64Like) -> TExpr: ...


@function(egg_fn="Cast", cost=ELEMENTWISE_COST)
def Cast(x: TExpr, dtype: StringLike) -> TExpr: ...


# views -------------------------------------------------------------------------------------------

@function(egg_fn="Reshape", cost=VIEW_COST)
def Reshape(x: TExpr, shape: Vec[i64]) -> TExpr: ...


@function(egg_fn="Permute", cost=VIEW_COST)
def Permute(x: TExpr, axes: Vec[i64]) -> TExpr: ...


@function(egg_fn="Expand", cost=VIEW_COST)
def Expand(x: TExpr, shape: Vec[i64]) -> TExpr: ...


@function(egg_fn="Slice", cost=VIEW_COST)
def Slice(x: TExpr, starts: Vec[i64], shape: Vec[i64]) -> TExpr: ...


@function(egg_fn="Pad", cost=VIEW_COST)
def Pad(x: TExpr, starts: Vec[i64], shape: Vec[i64]) -> TExpr: ...


@function(egg_fn="Contiguous", cost=ELEMENTWISE_COST)
def Contiguous(x: TExpr) -> TExpr: ...


# patterns: higher-level forms that later stages match on -----------------------------------------
# Each equals a primitive expression (the rule that introduces it says which, with its proof). A MatMul is
# built as that expression (eclasses.node_of); OnlineSoftmax has no Node of its own yet: extraction gives it
# infinite cost, so a graph is only ever built from primitives.

@function(egg_fn="MatMul", cost=CONTRACTION_COST)
def MatMul(a: TExpr, b: TExpr, shape: Vec[i64], axis: i64Like) -> TExpr:
    """sum(expand(a, shape) * expand(b, shape), axis): a contraction recognised as a matmul."""


@function(egg_fn="OnlineSoftmax", cost=REDUCE_COST)
def OnlineSoftmax(x: TExpr, axis: i64Like, block: i64Like) -> TExpr:
    """softmax(x) along `axis`, computed in one pass over blocks of `block` elements with a running max and a
    rescaled running sum (the streaming form that flash attention uses)."""


# analysis: the shape and dtype of every term -----------------------------------------------------
# Functions without a merge: two merged terms of different shapes or dtypes stop egglog with an error,
# which is what an unsound rule should do.

@function(egg_fn="shape_of")
def shape_of(x: TExpr) -> Vec[i64]: ...


@function(egg_fn="dtype_of")
def dtype_of(x: TExpr) -> String: ...


MAX_RANK = 6   # permutes of rank 0..MAX_RANK get a shape (analysis) and compose (rules.permute_permute)


def gather(values: Vec[i64], indices: Vec[i64], rank: int) -> Vec[i64]:
    """[values[indices[0]], ..., values[indices[rank - 1]]] as an egglog expression, for a rule whose
    facts pin `indices.length()` to `rank`.

    Written out element by element with constant positions: an earlier version mapped a partially applied
    `vec-get` over `indices` (`Vec.map(UnstableFn[i64, i64](vec_get, values))`), and on Python 3.12 that
    produced wrong vectors (a transpose's shape came out as (0, 1, 2, 2)). Nothing here needs functions as
    values, so every rule that gathers is specialised to one rank (`MAX_RANK` of them).
    """
    if rank == 0:
        return Vec[i64].empty()
    return Vec[i64](*(values[indices[i64(k)]] for k in range(rank)))


UNARY_FNS: dict[Op, Callable[[TExpr], TExpr]] = {Op.EXP2: Exp2, Op.LOG2: Log2, Op.SIN: Sin, Op.SQRT: Sqrt,
                                                 Op.RECIP: Recip}
BINARY_FNS: dict[Op, Callable[[TExpr, TExpr], TExpr]] = {Op.ADD: Add, Op.MUL: Mul, Op.MOD: Mod,
                                                         Op.LESS_THAN: LessThan}
REDUCE_FNS: dict[Op, Callable[[TExpr, i64Like], TExpr]] = {Op.SUM: Sum, Op.MAX: Max}


def _analysis_rules() -> Iterator[RewriteOrRule]:
    x, a, b = var("x", TExpr), var("a", TExpr), var("b", TExpr)
    shape, starts, axes = var("shape", Vec[i64]), var("starts", Vec[i64]), var("axes", Vec[i64])
    dtype, name = var("dtype", String), var("name", String)
    bits, axis = var("bits", i64), var("axis", i64)
    # leaves state their shape and dtype
    yield rule(eq(x).to(Input(name, shape, dtype))).then(set_(shape_of(x)).to(shape), set_(dtype_of(x)).to(dtype))
    yield rule(eq(x).to(Const(bits, shape, dtype))).then(set_(shape_of(x)).to(shape), set_(dtype_of(x)).to(dtype))
    yield rule(eq(x).to(Iota(shape, axis))).then(set_(shape_of(x)).to(shape), set_(dtype_of(x)).to(String(DType.INT32.value)))
    # elementwise ops keep their operand's shape; all but less_than keep its dtype
    for fn in [*UNARY_FNS.values(), Contiguous]:
        yield rule(eq(x).to(fn(a)), shape_of(a) == shape, dtype_of(a) == dtype).then(
            set_(shape_of(x)).to(shape), set_(dtype_of(x)).to(dtype))
    for op, fn2 in BINARY_FNS.items():
        out_dtype = String(DType.BOOL.value) if op == Op.LESS_THAN else dtype
        yield rule(eq(x).to(fn2(a, b)), shape_of(a) == shape, dtype_of(a) == dtype).then(
            set_(shape_of(x)).to(shape), set_(dtype_of(x)).to(out_dtype))
    yield rule(eq(x).to(Cast(a, dtype)), shape_of(a) == shape).then(
        set_(shape_of(x)).to(shape), set_(dtype_of(x)).to(dtype))
    # reductions drop their axis
    for fn_r in REDUCE_FNS.values():
        yield rule(eq(x).to(fn_r(a, axis)), shape_of(a) == shape, dtype_of(a) == dtype).then(
            set_(shape_of(x)).to(shape.remove(axis)), set_(dtype_of(x)).to(dtype))
    # views: the new shape is an argument, except for permute, which gathers the old one
    for view in (Reshape, Expand):
        yield rule(eq(x).to(view(a, shape)), dtype_of(a) == dtype).then(
            set_(shape_of(x)).to(shape), set_(dtype_of(x)).to(dtype))
    for window in (Slice, Pad):
        yield rule(eq(x).to(window(a, starts, shape)), dtype_of(a) == dtype).then(
            set_(shape_of(x)).to(shape), set_(dtype_of(x)).to(dtype))
    # patterns
    yield rule(eq(x).to(MatMul(a, b, shape, axis)), dtype_of(a) == dtype).then(
        set_(shape_of(x)).to(shape.remove(axis)), set_(dtype_of(x)).to(dtype))
    yield rule(eq(x).to(OnlineSoftmax(a, axis, bits)), shape_of(a) == shape, dtype_of(a) == dtype).then(
        set_(shape_of(x)).to(shape), set_(dtype_of(x)).to(dtype))
    for rank in range(MAX_RANK + 1):
        yield rule(eq(x).to(Permute(a, axes)), shape_of(a) == shape, dtype_of(a) == dtype,
                   axes.length() == i64(rank)).then(
            set_(shape_of(x)).to(gather(shape, axes, rank)), set_(dtype_of(x)).to(dtype))


analysis = ruleset(*_analysis_rules(), name="analysis")

CONSTRUCTORS: dict[str, Callable[..., TExpr]] = {
    "Input": Input, "Const": Const, "Iota": Iota, "Exp2": Exp2, "Log2": Log2, "Sin": Sin, "Sqrt": Sqrt,
    "Recip": Recip, "Add": Add, "Mul": Mul, "Mod": Mod, "LessThan": LessThan, "Sum": Sum, "Max": Max, "Cast": Cast,
    "Reshape": Reshape, "Permute": Permute, "Expand": Expand, "Slice": Slice, "Pad": Pad, "Contiguous": Contiguous,
    "MatMul": MatMul, "OnlineSoftmax": OnlineSoftmax,
}
LEAVES, VIEWS, REDUCTIONS = {"Input", "Const", "Iota"}, {"Reshape", "Permute", "Expand", "Slice", "Pad"}, {"Sum", "Max"}
COSTS: dict[str, float] = {name: LEAF_COST if name in LEAVES else VIEW_COST if name in VIEWS
                           else REDUCE_COST if name in REDUCTIONS else CONTRACTION_COST if name == "MatMul"
                           else math.inf if name in PATTERN_OPS
                           else ELEMENTWISE_COST for name in CONSTRUCTORS}
assert set(CONSTRUCTORS) == set(OPS) | PATTERN_OPS, "every constructor is read back by eclasses, and only those"


# graph -> e-graph --------------------------------------------------------------------------------

def vec(values: tuple[int, ...] | list[int]) -> Vec[i64]:
    """A Vec[i64] literal (shapes, axes, offsets)."""
    return _vec(tuple(int(v) for v in values))


@functools.lru_cache(maxsize=4096)
def _vec(values: tuple[int, ...]) -> Vec[i64]:
    # cached: building an egglog expression costs ~50 us a call, and graphs repeat their shapes
    return Vec[i64](*(i64(v) for v in values)) if values else Vec[i64].empty()


def term_of(node: Node, srcs: list[TExpr]) -> TExpr:
    """The constructor application for one Node, given the terms of its sources."""
    op, arg = node.op, node.arg
    if op == Op.INPUT:
        return Input(arg, vec(node.shape), node.dtype.value)
    if op == Op.CONSTANT:
        return Const(encode_value(arg), vec(node.shape), node.dtype.value)
    if op == Op.IOTA:
        return Iota(vec(node.shape), arg)
    if op in UNARY_FNS:
        return UNARY_FNS[op](srcs[0])
    if op in BINARY_FNS:
        return BINARY_FNS[op](srcs[0], srcs[1])
    if op in REDUCE_FNS:
        return REDUCE_FNS[op](srcs[0], arg)
    if op == Op.CAST:
        return Cast(srcs[0], node.dtype.value)
    if op == Op.CONTIGUOUS:
        return Contiguous(srcs[0])
    if op == Op.RESHAPE:
        return Reshape(srcs[0], vec(arg))
    if op == Op.EXPAND:
        return Expand(srcs[0], vec(arg))
    if op == Op.PERMUTE:
        return Permute(srcs[0], vec(arg))
    if op == Op.SLICE:
        return Slice(srcs[0], vec([lo for lo, _ in arg]), vec(node.shape))
    if op == Op.PAD:
        return Pad(srcs[0], vec([before for before, _ in arg]), vec(node.shape))
    raise NotImplementedError(f"no egglog term for {op}")


def to_egglog(graph: Graph) -> tuple[EGraph, dict[str, TExpr]]:
    """A fresh e-graph holding `graph`, and one root term per output (each a let binding).

    A node's term is sent nested inside its users' terms, except where it is cut off into a let binding:
    outputs; shared nodes whose term has grown past SHARED_TERM_LIMIT (egglog-python serialises a nested
    term as a tree, exponential on a DAG); and every DEPTH_LIMIT levels (its serialisation is recursive).
    Cuts are kept few because each let binding is a table of its own in egglog 13, and adding one costs
    time in proportion to the tables already there (quadratic in the number of lets).
    The shape and dtype of every cut are set here, so the `analysis` rules need at most DEPTH_LIMIT
    iterations to reach every term, not one per level of the graph. Every global is named at one width
    (`_fixed_width_lets`).
    """
    egraph = EGraph()
    _fixed_width_lets(egraph)
    order = graph.nodes()
    users = consumers(order)
    outputs = {id(node) for node in graph.outputs.values()}
    terms: dict[int, tuple[TExpr, int, int]] = {}  # id(node) -> (term, tree size, depth) as its users see it
    facts: list[Action] = []
    lets = 0
    for node in order:
        children = [terms[id(src)] for src in node.srcs]
        term = term_of(node, [child[0] for child in children])
        size = 1 + sum(child[1] for child in children)
        depth = 1 + max((child[2] for child in children), default=0)
        shared = len(users[id(node)]) > 1 and size > SHARED_TERM_LIMIT
        if id(node) in outputs or shared or depth >= DEPTH_LIMIT:
            term = egraph.let(f"n{10 ** LET_DIGITS + lets}", term)
            lets += 1
            facts += [set_(shape_of(term)).to(vec(node.shape)), set_(dtype_of(term)).to(String(node.dtype.value))]
            size, depth = 1, 0
        terms[id(node)] = (term, size, depth)
    if facts:
        egraph.register(*facts)
    roots = {name: terms[id(node)][0] for name, node in graph.outputs.items()}
    return egraph, roots


def _fixed_width_lets(egraph: EGraph) -> None:
    """Make every global of `egraph` a name of one width: ours (`$n1000000000`, ...) and those egglog-python adds.

    egglog 13 names the query variable of a global in a rule or a top-level action as the global's name followed by
    a per-name use counter, so the 31st use of `$__expr_1` and the first use of `$__expr_13` are both
    `$__expr_130`, and a command that reads both gets one value for the two (egraphs-good/egglog#1006). egglog-python
    let-binds every literal that a term repeats as `$__expr_<k>`, k counting from 0, and rules that mention such a
    literal then use the global: permute_permute's gather indices 1 and 2 read as one, a composed permutation
    came out as (0, 2, 0), a shape as (32, 32, 2048, 1), and the analysis merged different shapes, in a few
    percent of the processes that saturate a transformer block (which literal gets which k follows Python's set
    order). A name followed by a counter is never another name of the same width, so starting egglog-python's
    counter at 10**LET_DIGITS (a private field; checked here, so that an egglog-python without it fails loudly)
    rules the collision out.
    """
    state = egraph._state
    if not isinstance(getattr(state, "expr_to_let_counter", None), int):
        raise RuntimeError("egglog-python has no EGraphState.expr_to_let_counter; see term._fixed_width_lets")
    state.expr_to_let_counter = 10 ** LET_DIGITS


def constructor_cost(enode: ENode) -> float:
    """The cost its constructor declares (`cost=` above), for egglog's extraction and ours alike."""
    return float(COSTS[enode.op])


def from_egglog(egraph: EGraph, roots: Mapping[str, TExpr], graph: Graph,
                choose: Callable[[EClasses], Mapping[int, ENode]] | None = None) -> Graph:
    """A new Graph computing `roots` from the e-graph: same name, same input Nodes, checked primitives.

    `choose` picks one e-node per e-class; by default the cheapest by `constructor_cost`.
    """
    classes = read_eclasses(egraph, roots)
    choice = choose(classes) if choose is not None else cheapest(classes, constructor_cost)
    return build_graph(classes, choice, graph)
