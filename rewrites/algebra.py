"""Algebra and reductions: constant folding, factoring, the exp2 law, reassociation, and the laws of sum and max.

Rules proved in the "real" model (rewrites/proofs.py) hold on finite inputs up to rounding and overflow of
intermediates; on inf and nan inputs they may differ (a*b + a*c with a = inf, b = 1, c = -1 is nan either way,
but sum(x * c) with x = [0, 1], c = inf is nan where sum(x) * c is inf), as any reordered float kernel does.
Rules proved in the "ieee" model hold on every value. The max laws are stated for float dtypes only: int32
arithmetic wraps, and a wrapped x + c is not monotone in x.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import z3
from egglog import RewriteOrRule, String, Vec, i64, i64Like, rewrite, var

from tensorsmith.ir import primitives as P
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.node import Node
from tensorsmith.ir.ops import Op

from . import every_length
from .eclasses import EClasses, decode_value, encode_value
from .proofs import EXP2, FIN, MAX_FINITE, Claim, Scalar, add, maximum, mul, real_max
from .rule import Rule, example_graph
from .term import Add, Const, Exp2, Expand, Max, Mul, Recip, Reshape, Sum, TExpr, dtype_of, shape_of, vec

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
ONE = encode_value(1.0)
POS_INF_BITS = encode_value(math.inf)   # positive finite floats are exactly the bit patterns in (0, this)
REDUCTION_LENGTH = 3                    # reductions are proved over this many uninterpreted elements
SPLIT_AT = 2**16                        # a last-axis sum or max this long is also taken over chunks (_split)
SPLIT = 2048                            # the chunk: its reductions are one row each of a row kernel

x, a, b, c = var("x", TExpr), var("a", TExpr), var("b", TExpr), var("c", TExpr)
shape, cs, xs = var("shape", Vec[i64]), var("cs", Vec[i64]), var("xs", Vec[i64])
dtype, bits = var("dtype", String), var("bits", i64)
axis, axis2 = var("axis", i64), var("axis2", i64)


# constant folding: a derive pass, because egglog cannot do float64 arithmetic on bit patterns ----------------

def _constants(classes: EClasses) -> dict[int, tuple[int, tuple[int, ...], str]]:
    """The first float Const e-node (bits, shape, dtype) of every e-class that has one."""
    found = {}
    for cid, enodes in classes.nodes.items():
        for enode in enodes:
            if enode.op == "Const" and enode.lits[2] in FLOAT_DTYPES:
                found[cid] = enode.lits
                break
    return found  # type: ignore[return-value]


def _fold_binary(op: str, fn: Callable[[np.float64, np.float64], np.float64],
                 make: Callable[[TExpr, TExpr], TExpr]) -> Callable[[EClasses], list[tuple[TExpr, TExpr]]]:
    """op(const, const) = const, computed by the interpreter's own numpy float64 operation."""
    def derive(classes: EClasses) -> list[tuple[TExpr, TExpr]]:
        consts, merges = _constants(classes), []
        for cid, enodes in classes.nodes.items():
            if cid in consts:
                continue   # already known to be a constant
            for enode in enodes:
                if enode.op == op and all(child in consts for child in enode.children):
                    (b1, s1, d1), (b2, s2, d2) = (consts[child] for child in enode.children)
                    with np.errstate(all="ignore"):
                        value = fn(np.float64(decode_value(b1)), np.float64(decode_value(b2)))
                    lhs = make(Const(b1, vec(s1), d1), Const(b2, vec(s2), d2))
                    merges.append((lhs, Const(encode_value(float(value)), vec(s1), d1)))
                    break
        return merges
    return derive


def _fold_reduce(op: str, fn: Callable[[np.ndarray], np.float64],
                 make: Callable[[TExpr, int], TExpr]) -> Callable[[EClasses], list[tuple[TExpr, TExpr]]]:
    """op(const, axis) = const, computed by the interpreter's numpy reduction of the same length."""
    def derive(classes: EClasses) -> list[tuple[TExpr, TExpr]]:
        consts, merges = _constants(classes), []
        for cid, enodes in classes.nodes.items():
            if cid in consts:
                continue
            for enode in enodes:
                if enode.op == op and enode.children[0] in consts:
                    bits_, shape_, dtype_ = consts[enode.children[0]]
                    ax = int(enode.lits[0])  # type: ignore[call-overload]
                    if shape_[ax] == 0:
                        continue
                    with np.errstate(all="ignore"):
                        value = fn(np.full(shape_[ax], decode_value(bits_), dtype=np.float64))
                    out_shape = shape_[:ax] + shape_[ax + 1:]
                    merges.append((make(Const(bits_, vec(shape_), dtype_), ax),
                                   Const(encode_value(float(value)), vec(out_shape), dtype_)))
                    break
        return merges
    return derive


def _wide(*_: object) -> z3.BoolRef:
    """The format holds the small integers and values these claims use (float16's largest is 65504)."""
    return MAX_FINITE >= 65504


FOLD_VALUES = [(2.5, -1.0), (0.0, -0.0), (-0.0, -0.0), (math.inf, 1.0), (math.inf, -math.inf), (math.nan, 2.0),
               (0.0, math.inf), (-3.0, 0.5)]


def _fold_claims(op: Callable[[Scalar, Scalar], Scalar], fn: Callable[[float, float], float]) -> tuple[Claim, ...]:
    """The model's op on concrete constants (specials included) is the float64 result the fold computes."""
    def claim(u: float, v: float) -> Claim:
        with np.errstate(all="ignore"):
            folded = float(fn(np.float64(u), np.float64(v)))
        return Claim(lambda: op(Scalar.const(u), Scalar.const(v)), lambda: Scalar.const(folded), assuming=_wide,
                     note=f"{u}, {v}")
    return tuple(claim(u, v) for u, v in FOLD_VALUES)


def _fold_reduce_claims(op: Callable[[Scalar, Scalar], Scalar], fn: Callable[[np.ndarray], float]) -> tuple[Claim, ...]:
    def claim(value: float) -> Claim:
        def lhs() -> Scalar:
            total = Scalar.const(value)
            for _ in range(REDUCTION_LENGTH - 1):
                total = op(total, Scalar.const(value))
            return total
        folded = float(fn(np.full(REDUCTION_LENGTH, value)))
        return Claim(lhs, lambda: Scalar.const(folded), assuming=_wide, note=f"{REDUCTION_LENGTH} x {value}")
    return tuple(claim(value) for value in (1.0, -0.0, 0.0, 2.5, math.inf, -math.inf, math.nan))


def _consts_example(name: str, op: Op) -> Callable[[], Graph]:
    def build() -> Graph:
        def out(v: Node) -> Node:
            return P.binary(op, P.constant(2.5, v.shape, v.dtype), P.constant(-4.0, v.shape, v.dtype))
        return example_graph(name, out)
    return build


def _reduce_const_example(name: str, op: Op) -> Callable[[], Graph]:
    return lambda: example_graph(name, lambda v: P.reduce(op, P.constant(0.1, v.shape, v.dtype), 1))


# helpers for claims --------------------------------------------------------------------------------

def _reals(n: int) -> tuple[str, ...]:
    return ("real",) * n


def _fold(op: Callable, values: list) -> object:
    total = values[0]
    for value in values[1:]:
        total = op(total, value)
    return total


def _plus(u: object, v: object) -> object:
    return u + v  # type: ignore[operator]


N = REDUCTION_LENGTH

# Why a reduction rule's proof stays at fixed lengths (the others are proved at every length: every_length.py).
FOLDED_AT_THE_LENGTH = ("a derive pass: numpy computes the folded value at the actual length; the claims check "
                        "that the IEEE model's op agrees with it on special and ordinary constants, at length 3")
IEEE_ELEMENTS = ("IEEE model: the law must keep nan, ±inf and signed zeros, and the induction's uninterpreted "
                 "prefix functions are reals; an element of the IEEE model is a (kind, value, sign) triple, so it "
                 "is proved over that many extended-real elements")
CHUNKED_AT_FIXED_LENGTHS = ("the split is a reshape, which the induction's one summed axis cannot state; proved for "
                            "2 chunks of 3 and 3 of 2 in the real model, and checked numerically at its own length")
MAX_HAS_NO_EMPTY_CASE = ("an empty max is -inf, which the real model lacks, so the induction has no length-0 base "
                         "(one from length 1 would need a base of its own); proved at length 3")


def _example(name: str, out: Callable[[Graph], Node]) -> Callable[[], Graph]:
    def build() -> Graph:
        g = Graph(name)
        g.outputs["out"] = out(g)
        return g
    return build


def _col(g: Graph, name: str = "c") -> Node:
    """A (3, 1) input: constant along axis 1 of a (3, 4) tensor."""
    return g.input(name, (3, 1), "float32").node


def _x(g: Graph) -> Node:
    return g.input("x", (3, 4), "float32").node


# the rules -------------------------------------------------------------------------------------------

ALGEBRA: tuple[Rule, ...] = (
    # constant folding (derive passes: float64 arithmetic, exactly as the interpreter does it)
    Rule("fold_add", "const + const -> const", (), _fold_claims(add, lambda u, v: u + v),
         _consts_example("fold_add", Op.ADD), derive=_fold_binary("Add", lambda u, v: u + v, Add)),
    Rule("fold_mul", "const * const -> const", (), _fold_claims(mul, lambda u, v: u * v),
         _consts_example("fold_mul", Op.MUL), derive=_fold_binary("Mul", lambda u, v: u * v, Mul)),
    Rule("fold_sum", "sum(const, axis) -> const (numpy's sum of that many copies)", (),
         _fold_reduce_claims(add, lambda v: v.sum()), _reduce_const_example("fold_sum", Op.SUM),
         derive=_fold_reduce("Sum", lambda v: v.sum(), Sum), bounded_because=FOLDED_AT_THE_LENGTH),
    Rule("fold_max", "max(const, axis) -> const", (), _fold_reduce_claims(maximum, lambda v: v.max()),
         _reduce_const_example("fold_max", Op.MAX), derive=_fold_reduce("Max", lambda v: v.max(), Max),
         bounded_because=FOLDED_AT_THE_LENGTH),
    # factoring: a shared factor leaves the sum (one multiply fewer)
    Rule("factor", "a * b + a * c -> a * (b + c)",
         rewrite(Add(Mul(a, b), Mul(a, c))).to(Mul(a, Add(b, c))),
         (Claim(lambda u, v, w: u * v + u * w, lambda u, v, w: u * (v + w), sorts=_reals(3)),
          Claim(lambda u, v, w: u * v + u * w, lambda u, v, w: u * (v + w), sorts=("int",) * 3)),
         lambda: example_graph("factor", lambda u, v, w: P.binary(Op.ADD, P.binary(Op.MUL, u, v),
                                                                   P.binary(Op.MUL, u, w)), inputs=3),
         model="real"),
    Rule("recip_mul", "recip(a) * recip(b) -> recip(a * b) (a, b != 0 in the real proof; zeros give inf alike)",
         rewrite(Mul(Recip(a), Recip(b))).to(Recip(Mul(a, b))),
         (Claim(lambda u, v: (1 / u) * (1 / v), lambda u, v: 1 / (u * v), assuming=lambda u, v: z3.And(u != 0, v != 0),
                sorts=_reals(2)),),
         lambda: example_graph("recip_mul", lambda u, v: P.binary(Op.MUL, P.unary(Op.RECIP, u),
                                                                  P.unary(Op.RECIP, v)), inputs=2),
         model="real"),
    Rule("exp2_merge", "exp2(a) * exp2(b) -> exp2(a + b) (exp2 uninterpreted, with its axiom)",
         rewrite(Mul(Exp2(a), Exp2(b))).to(Exp2(Add(a, b))),
         (Claim(lambda u, v: EXP2(u) * EXP2(v), lambda u, v: EXP2(u + v), sorts=_reals(2)),),
         lambda: example_graph("exp2_merge", lambda u, v: P.binary(Op.MUL, P.unary(Op.EXP2, u),
                                                                   P.unary(Op.EXP2, v)), inputs=2),
         model="real"),
)

# Associativity and distribution grow the e-graph exponentially (DESIGN.md): their own stage, few iterations.
REASSOCIATE: tuple[Rule, ...] = (
    Rule("add_assoc", "(a + b) + c -> a + (b + c)", rewrite(Add(Add(a, b), c)).to(Add(a, Add(b, c))),
         (Claim(lambda u, v, w: (u + v) + w, lambda u, v, w: u + (v + w), sorts=_reals(3)),
          Claim(lambda u, v, w: (u + v) + w, lambda u, v, w: u + (v + w), sorts=("int",) * 3)),
         lambda: example_graph("add_assoc", lambda u, v, w: P.binary(Op.ADD, P.binary(Op.ADD, u, v), w), inputs=3),
         model="real", stage="reassociate"),
    Rule("mul_assoc", "(a * b) * c -> a * (b * c)", rewrite(Mul(Mul(a, b), c)).to(Mul(a, Mul(b, c))),
         (Claim(lambda u, v, w: (u * v) * w, lambda u, v, w: u * (v * w), sorts=_reals(3)),
          Claim(lambda u, v, w: (u * v) * w, lambda u, v, w: u * (v * w), sorts=("int",) * 3)),
         lambda: example_graph("mul_assoc", lambda u, v, w: P.binary(Op.MUL, P.binary(Op.MUL, u, v), w), inputs=3),
         model="real", stage="reassociate"),
    Rule("distribute", "a * (b + c) -> a * b + a * c",
         rewrite(Mul(a, Add(b, c))).to(Add(Mul(a, b), Mul(a, c))),
         (Claim(lambda u, v, w: u * (v + w), lambda u, v, w: u * v + u * w, sorts=_reals(3)),),
         lambda: example_graph("distribute", lambda u, v, w: P.binary(Op.MUL, u, P.binary(Op.ADD, v, w)), inputs=3),
         model="real", stage="reassociate"),
    Rule("exp2_split", "exp2(a + b) -> exp2(a) * exp2(b) (the basis of rescaling a running sum)",
         rewrite(Exp2(Add(a, b))).to(Mul(Exp2(a), Exp2(b))),
         (Claim(lambda u, v: EXP2(u + v), lambda u, v: EXP2(u) * EXP2(v), sorts=_reals(2)),),
         lambda: example_graph("exp2_split", lambda u, v: P.unary(Op.EXP2, P.binary(Op.ADD, u, v)), inputs=2),
         model="real", stage="reassociate"),
)


def _sum_sum_claim() -> Claim:
    """A 2 x 3 array summed rows first or columns first (sequential sums, as written)."""
    def lhs(*v: z3.ArithRef) -> object:
        return _fold(_plus, [_fold(_plus, list(v[3 * r:3 * r + 3])) for r in range(2)])

    def rhs(*v: z3.ArithRef) -> object:
        return _fold(_plus, [_fold(_plus, [v[3 * r + k] for r in range(2)]) for k in range(3)])
    return Claim(lhs, rhs, sorts=_reals(6), note="2 x 3")


def _sum_split_claims() -> tuple[Claim, ...]:
    """A row of 6 summed at once, or as the sums of its 2 chunks of 3 (and of its 3 chunks of 2), in order."""
    def claim(chunks: int, size: int) -> Claim:
        def lhs(*v: z3.ArithRef) -> object:
            return _fold(_plus, list(v))

        def rhs(*v: z3.ArithRef) -> object:
            return _fold(_plus, [_fold(_plus, list(v[size * j:size * j + size])) for j in range(chunks)])
        return Claim(lhs, rhs, sorts=_reals(chunks * size), note=f"{chunks} chunks of {size}")
    return claim(2, 3), claim(3, 2)


def _max_split_claims() -> tuple[Claim, ...]:
    """A row of 6 maxed at once, or as the max of its 2 chunks' maxes of 3 (and 3 of 2), every IEEE value."""
    def claim(chunks: int, size: int) -> Claim:
        def lhs(*v: Scalar) -> Scalar:
            return _fold(maximum, list(v))

        def rhs(*v: Scalar) -> Scalar:
            return _fold(maximum, [_fold(maximum, list(v[size * j:size * j + size])) for j in range(chunks)])
        return Claim(lhs, rhs, sorts=("scalar",) * (chunks * size), note=f"{chunks} chunks of {size}")
    return claim(2, 3), claim(3, 2)


def _split(reduce: Callable[[TExpr, i64Like], TExpr]) -> RewriteOrRule:
    """reduce(x, last axis) of n >= SPLIT_AT elements, as reduce over n / SPLIT chunks of reduce over each chunk."""
    return rewrite(reduce(x, axis)).to(
        reduce(reduce(Reshape(x, xs.pop().push(xs[axis] / i64(SPLIT)).push(i64(SPLIT))), axis + 1), axis),
        shape_of(x) == xs, xs.length() == axis + 1, xs[axis] >= i64(SPLIT_AT), xs[axis] % i64(SPLIT) == i64(0))


def _max_max_claim() -> Claim:
    def lhs(*v: Scalar) -> Scalar:
        return maximum(maximum(v[0], v[1]), maximum(v[2], v[3]))

    def rhs(*v: Scalar) -> Scalar:
        return maximum(maximum(v[0], v[2]), maximum(v[1], v[3]))
    return Claim(lhs, rhs, sorts=("scalar",) * 4, note="2 x 2")


def _sum_factor_claim() -> Claim:
    return Claim(lambda *v: _fold(_plus, [e * v[N] for e in v[:N]]), lambda *v: _fold(_plus, list(v[:N])) * v[N],
                 sorts=_reals(N + 1), note=f"length {N}")


def _sum_broadcast_claims() -> tuple[Claim, ...]:
    return (Claim(lambda u: _fold(add, [u] * N), lambda u: u * _fold(add, [Scalar.const(1.0)] * N),
                  assuming=_wide, note=f"length {N}"),
            Claim(lambda u: _fold(_plus, [u] * N), lambda u: u * N, sorts=("int",), note=f"length {N}"))


def _max_add_claim() -> Claim:
    return Claim(lambda *v: _fold(real_max, [e + v[N] for e in v[:N]]), lambda *v: _fold(real_max, list(v[:N])) + v[N],
                 sorts=_reals(N + 1), note=f"length {N}")


def _max_mul_positive_claim() -> Claim:
    def positive_finite(*v: Scalar) -> z3.BoolRef:
        return z3.And(v[N].kind == FIN, v[N].value > 0)
    return Claim(lambda *v: _fold(maximum, [mul(e, v[N]) for e in v[:N]]),
                 lambda *v: mul(_fold(maximum, list(v[:N])), v[N]),  # type: ignore[arg-type]
                 assuming=positive_finite, sorts=("scalar",) * (N + 1), note=f"length {N}, c > 0 finite")


def _const_along() -> list:
    """Facts: c's shape is cs with a 1 on the reduced axis (c is constant along it)."""
    return [shape_of(c) == cs, cs[axis] == i64(1)]


def _reduced(c_: TExpr) -> TExpr:
    """c (constant along `axis`) with that axis dropped and broadcast to the reduction's result."""
    return Expand(Reshape(c_, cs.remove(axis)), shape.remove(axis))


REDUCTIONS: tuple[Rule, ...] = (
    Rule("sum_sum", "sum(sum(x, i), j) -> the two axes summed in the other order",
         (rewrite(Sum(Sum(x, axis), axis2)).to(Sum(Sum(x, axis2 + 1), axis), axis <= axis2),
          rewrite(Sum(Sum(x, axis), axis2)).to(Sum(Sum(x, axis2), axis - 1), axis > axis2)),
         (_sum_sum_claim(), *every_length.sum_sum()),
         _example("sum_sum", lambda g: P.reduce(Op.SUM, P.reduce(Op.SUM, g.input("x", (2, 3, 4), "float32").node,
                                                                  0), 1)),
         model="real"),
    Rule("sum_split", f"sum(x, last axis) of n >= {SPLIT_AT} elements -> the sum of its n / {SPLIT} chunks' sums "
         f"(one row of a million is one block's work; {SPLIT} a row fills the GPU)",
         _split(Sum), _sum_split_claims(),
         _example("sum_split", lambda g: P.reduce(Op.SUM, g.input("x", (2, SPLIT_AT), "float32").node, 1)),
         model="real", bounded_because=CHUNKED_AT_FIXED_LENGTHS),
    Rule("max_split", f"max(x, last axis) of n >= {SPLIT_AT} elements -> the max of its n / {SPLIT} chunks' maxes",
         _split(Max), _max_split_claims(),
         _example("max_split", lambda g: P.reduce(Op.MAX, g.input("x", (2, SPLIT_AT), "float32").node, 1)),
         bounded_because=IEEE_ELEMENTS),
    Rule("max_max", "max(max(x, i), j) -> the two axes maxed in the other order",
         (rewrite(Max(Max(x, axis), axis2)).to(Max(Max(x, axis2 + 1), axis), axis <= axis2),
          rewrite(Max(Max(x, axis), axis2)).to(Max(Max(x, axis2), axis - 1), axis > axis2)),
         (_max_max_claim(),),
         _example("max_max", lambda g: P.reduce(Op.MAX, P.reduce(Op.MAX, g.input("x", (2, 3, 4), "float32").node,
                                                                  2), 0)),
         bounded_because=IEEE_ELEMENTS),
    Rule("sum_factor", "sum(x * c, axis) -> sum(x, axis) * c for c constant along the axis",
         (rewrite(Sum(Mul(x, Expand(c, shape)), axis)).to(Mul(Sum(x, axis), _reduced(c)), *_const_along()),
          rewrite(Sum(Mul(x, Const(bits, shape, dtype)), axis)).to(
              Mul(Sum(x, axis), Const(bits, shape.remove(axis), dtype)))),
         (_sum_factor_claim(), *every_length.sum_factor()),
         _example("sum_factor", lambda g: P.reduce(Op.SUM, P.binary(Op.MUL, _x(g), P.expand(_col(g), (3, 4))), 1)),
         model="real"),
    Rule("sum_broadcast", "sum(expand(x), axis) over an axis x has size 1 on -> x * size",
         rewrite(Sum(Expand(x, shape), axis)).to(
             Mul(Expand(Reshape(x, xs.remove(axis)), shape.remove(axis)), Sum(Const(ONE, shape, dtype), axis)),
             shape_of(x) == xs, xs[axis] == i64(1), dtype_of(x) == dtype),
         _sum_broadcast_claims(),
         _example("sum_broadcast", lambda g: P.reduce(Op.SUM, P.expand(_col(g), (3, 4)), 1)),
         bounded_because=IEEE_ELEMENTS),
    Rule("max_add", "max(x + c, axis) -> max(x, axis) + c for c constant along the axis (floats)",
         tuple(rewrite(Max(Add(x, Expand(c, shape)), axis)).to(Add(Max(x, axis), _reduced(c)), *_const_along(),
                                                               dtype_of(c) == String(d)) for d in FLOAT_DTYPES)
         + tuple(rewrite(Max(Add(x, Const(bits, shape, d)), axis)).to(
             Add(Max(x, axis), Const(bits, shape.remove(axis), d))) for d in FLOAT_DTYPES),
         (_max_add_claim(),),
         _example("max_add", lambda g: P.reduce(Op.MAX, P.binary(Op.ADD, _x(g), P.expand(_col(g), (3, 4))), 1)),
         model="real", bounded_because=MAX_HAS_NO_EMPTY_CASE),
    Rule("max_mul_positive", "max(x * c, axis) -> max(x, axis) * c for a positive finite constant c (floats)",
         tuple(rewrite(Max(Mul(x, Const(bits, shape, d)), axis)).to(
             Mul(Max(x, axis), Const(bits, shape.remove(axis), d)), bits > i64(0), bits < i64(POS_INF_BITS))
             for d in FLOAT_DTYPES),
         (_max_mul_positive_claim(),),
         _example("max_mul_positive", lambda g: P.reduce(Op.MAX, P.binary(Op.MUL, _x(g),
                                                                          P.constant(0.125, (3, 4), "float32")), 1)),
         bounded_because=IEEE_ELEMENTS),
)
