"""The rewrite rules, as data: each with its name, a one-line doc, the egglog rewrite, its proof obligations
(`claims`, discharged by Z3 in tests/rewrites/test_soundness.py), the model they are proved in, its stage, and a
small graph whose output is the rule's left-hand side (`example`, for the random numeric check).

This file holds the identities, commutativity, casts and views; rewrites/algebra.py the algebra and the
reductions; rewrites/logarithms.py the laws of log2; rewrites/patterns.py the patterns; rewrites/contractions.py
the laws of matrix products. `RULES` is all of them.

Rules that look right and are not, and so do not ship (the tests show each one refuted):
- x * 0 -> 0: inf * 0 and nan * 0 are nan.
- exp2(log2(x)) -> x: false for x <= 0 and for -inf and nan.
- recip(recip(x)) -> x: 1/x overflows to inf for tiny x (subnormals; float16 below 2**-16), and 1/inf = 0.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Callable

import z3
from egglog import String, Vec, i64, rewrite, var

from tensorsmith.ir import primitives as P
from tensorsmith.ir.dtypes import DType
from tensorsmith.ir.node import Node
from tensorsmith.ir.ops import Op

from .eclasses import encode_value
from .algebra import ALGEBRA, REASSOCIATE, REDUCTIONS
from .contractions import CONTRACTIONS
from .logarithms import LOGARITHMS
from .patterns import PATTERNS
from .rule import Rule, example_graph
from .proofs import Claim, Scalar, expand_source, in_bounds, permute_source, reshape_source
from .term import MAX_RANK, Add, Cast, Const, Expand, Mul, Permute, Reshape, TExpr, dtype_of, gather, shape_of

ONE, ZERO = encode_value(1.0), encode_value(0.0)


# pattern variables
x, a, b = var("x", TExpr), var("a", TExpr), var("b", TExpr)
shape, shape2, p, q = var("shape", Vec[i64]), var("shape2", Vec[i64]), var("p", Vec[i64]), var("q", Vec[i64])
dtype, bits = var("dtype", String), var("bits", i64)


_graph = example_graph


def _raw(op: Op, src: Node, arg: object, shape_: tuple[int, ...], dtype_: DType | None = None) -> Node:
    """A node that the primitives would fold away (a same-dtype cast, an identity view): only other rules make
    such terms, so the examples of the rules that remove them build the node directly."""
    return Node(op, (src,), shape_, dtype_ or src.dtype, arg)


# claims helpers ------------------------------------------------------------------------------------

def _ints(n: int) -> tuple[str, ...]:
    return ("int",) * n


def _both_kinds(lhs: Callable, rhs: Callable, arity: int) -> tuple[Claim, ...]:
    """The claim over float elements (extended reals) and over int32 elements (integers)."""
    return (Claim(lhs, rhs), Claim(lhs, rhs, sorts=_ints(arity)))


def _reshape_reshape(sx: tuple[int, ...], s1: tuple[int, ...], s2: tuple[int, ...]) -> Claim:
    return Claim(lhs=lambda *i: reshape_source(reshape_source(i, s1, s2), sx, s1),
                 rhs=lambda *i: reshape_source(i, sx, s2),
                 assuming=lambda *i: in_bounds(i, s2), sorts=_ints(len(s2)), note=f"{sx} -> {s1} -> {s2}")


def _permute_permute(perm: tuple[int, ...], outer: tuple[int, ...]) -> Claim:
    composed = tuple(perm[k] for k in outer)  # what `gather(p, q)` computes in the rule
    return Claim(lhs=lambda *i: permute_source(permute_source(i, outer), perm),
                 rhs=lambda *i: permute_source(i, composed),
                 assuming=lambda *i: z3.BoolVal(True), sorts=_ints(len(perm)), note=f"{perm} then {outer}")


def _expand_expand(rank: int) -> Claim:
    """Symbolic shapes: x (s0) expanded to s1, then to s2; each step grows only axes of size 1."""
    def split(v: tuple) -> tuple[tuple, tuple, tuple, tuple]:
        return v[:rank], v[rank:2 * rank], v[2 * rank:3 * rank], v[3 * rank:]

    def grows(small: tuple, big: tuple) -> z3.BoolRef:
        return z3.And([z3.Or(m == 1, m == n) for m, n in zip(small, big)])

    def assuming(*v: z3.ArithRef) -> z3.BoolRef:
        s0, s1, s2, i = split(v)
        return z3.And(grows(s0, s1), grows(s1, s2), in_bounds(i, s2))

    return Claim(lhs=lambda *v: expand_source(expand_source(split(v)[3], split(v)[1]), split(v)[0]),
                 rhs=lambda *v: expand_source(split(v)[3], split(v)[0]),
                 assuming=assuming, sorts=_ints(4 * rank), note=f"rank {rank}, symbolic shapes")


def _expand_in_bounds(rank: int) -> Claim:
    """expand(c: s, s2) reads c only in bounds, so it is the constant c of shape s2 (symbolic shapes)."""
    def assuming(*v: z3.ArithRef) -> z3.BoolRef:
        s, s2, i = v[:rank], v[rank:2 * rank], v[2 * rank:]
        return z3.And(z3.And([z3.Or(m == 1, m == n) for m, n in zip(s, s2)]), in_bounds(i, s2))

    return Claim(lhs=lambda *v: in_bounds(expand_source(v[2 * rank:], v[:rank]), v[:rank]),
                 rhs=lambda *v: z3.BoolVal(True), assuming=assuming, sorts=_ints(3 * rank))


def _expand_same(rank: int) -> Claim:
    return Claim(lhs=lambda *v: expand_source(v[rank:], v[:rank]), rhs=lambda *v: tuple(v[rank:]),
                 assuming=lambda *v: in_bounds(v[rank:], v[:rank]), sorts=_ints(2 * rank))


def _reshape_in_bounds(s: tuple[int, ...], s2: tuple[int, ...]) -> Claim:
    return Claim(lhs=lambda *i: in_bounds(reshape_source(i, s, s2), s), rhs=lambda *i: z3.BoolVal(True),
                 assuming=lambda *i: in_bounds(i, s2), sorts=_ints(len(s2)), note=f"{s} -> {s2}")


def _reshape_same(s: tuple[int, ...]) -> Claim:
    return Claim(lhs=lambda *i: reshape_source(i, s, s), rhs=lambda *i: tuple(i),
                 assuming=lambda *i: in_bounds(i, s), sorts=_ints(len(s)), note=f"{s}")


def _permute_identity(rank: int) -> Claim:
    return Claim(lhs=lambda *i: permute_source(i, tuple(range(rank))), rhs=lambda *i: tuple(i),
                 assuming=lambda *i: z3.BoolVal(True), sorts=_ints(rank))


def _cast_same() -> tuple[Claim, ...]:
    """The interpreter's cast to a value's own dtype: floats stay (inf and nan too), ints stay, bools stay."""
    def cast_float(v: Scalar) -> Scalar:
        return v   # astype(float64) of a float64

    def cast_int(v: z3.ArithRef) -> z3.ArithRef:
        return v   # astype(int32) of an int32

    def cast_bool(v: z3.BoolRef) -> z3.BoolRef:
        return v != z3.BoolVal(False)   # x != 0 of a bool

    return (Claim(lambda v: cast_float(v), lambda v: v), Claim(lambda v: cast_int(v), lambda v: v, sorts=("int",)),
            Claim(lambda v: cast_bool(v), lambda v: v, sorts=("bool",)))


RESHAPES = [((2, 3, 4), (6, 4), (4, 3, 2)), ((12,), (3, 4), (2, 6)), ((2, 6), (12,), (3, 2, 2)),
            ((1, 5), (5,), (5, 1)), ((4, 1, 3), (2, 6), (12,))]
PERMUTATIONS = [perm for rank in (1, 2, 3) for perm in itertools.permutations(range(rank))]

# the rules -----------------------------------------------------------------------------------------

BASE: tuple[Rule, ...] = (
    # identities: a constant operand that changes nothing
    Rule("mul_one", "x * 1 -> x", rewrite(Mul(x, Const(ONE, shape, dtype))).to(x),
         _both_kinds(lambda v: v * 1, lambda v: v, 1),
         lambda: _graph("mul_one", lambda v: P.binary(Op.MUL, v, P.constant(1.0, v.shape, v.dtype)))),
    Rule("add_zero", "x + 0 -> x (equal as numbers: -0.0 + 0 is +0.0)",
         rewrite(Add(x, Const(ZERO, shape, dtype))).to(x),
         _both_kinds(lambda v: v + 0, lambda v: v, 1),
         lambda: _graph("add_zero", lambda v: P.binary(Op.ADD, v, P.constant(0.0, v.shape, v.dtype)))),
    # commutativity: lets the identities and later patterns match either operand order
    Rule("add_comm", "a + b -> b + a", rewrite(Add(a, b)).to(Add(b, a)),
         _both_kinds(lambda u, v: u + v, lambda u, v: v + u, 2),
         lambda: _graph("add_comm", lambda u, v: P.binary(Op.ADD, u, v), inputs=2)),
    Rule("mul_comm", "a * b -> b * a", rewrite(Mul(a, b)).to(Mul(b, a)),
         _both_kinds(lambda u, v: u * v, lambda u, v: v * u, 2),
         lambda: _graph("mul_comm", lambda u, v: P.binary(Op.MUL, u, v), inputs=2)),
    # casts: one to the dtype a value already has does nothing
    Rule("cast_same", "cast(x, d) -> x when x is already of dtype d",
         rewrite(Cast(x, dtype)).to(x, dtype_of(x) == dtype), _cast_same(),
         lambda: _graph("cast_same", lambda v: _raw(Op.CAST, v, None, v.shape))),
    # views compose into one view, and an identity view is no view
    Rule("reshape_reshape", "reshape(reshape(x, s1), s2) -> reshape(x, s2): row-major order is kept by both",
         rewrite(Reshape(Reshape(x, shape), shape2)).to(Reshape(x, shape2)),
         tuple(_reshape_reshape(*shapes) for shapes in RESHAPES),
         lambda: _graph("reshape_reshape", lambda v: P.reshape(P.reshape(v, (2, 6)), (4, 3)))),
    Rule("reshape_same", "reshape(x, s) -> x when x has shape s",
         rewrite(Reshape(x, shape)).to(x, shape_of(x) == shape),
         tuple(_reshape_same(s) for s in [(), (5,), (2, 3), (2, 3, 4)]),
         lambda: _graph("reshape_same", lambda v: _raw(Op.RESHAPE, v, v.shape, v.shape))),
    Rule("permute_permute", "permute(permute(x, p), q) -> permute(x, [p[k] for k in q])",
         tuple(rewrite(Permute(Permute(x, p), q)).to(Permute(x, gather(p, q, rank)), q.length() == i64(rank))
               for rank in range(MAX_RANK + 1)),
         tuple(_permute_permute(perm, outer) for perm in PERMUTATIONS for outer in PERMUTATIONS
               if len(perm) == len(outer)),
         lambda: _graph("permute_permute", lambda v: P.permute(P.permute(v, (1, 2, 0)), (1, 0, 2)), (2, 3, 4))),
    Rule("permute_identity", "permute(x, (0, 1, ..., n-1)) -> x",
         rewrite(Permute(x, p)).to(x, p == p.length().range()),
         tuple(_permute_identity(rank) for rank in range(5)),
         lambda: _graph("permute_identity", lambda v: _raw(Op.PERMUTE, v, (0, 1), v.shape))),
    Rule("expand_expand", "expand(expand(x, s1), s2) -> expand(x, s2)",
         rewrite(Expand(Expand(x, shape), shape2)).to(Expand(x, shape2)),
         tuple(_expand_expand(rank) for rank in (1, 2, 3)),
         lambda: _graph("expand_expand", lambda v: P.expand(P.expand(v, (3, 4, 1)), (3, 4, 5)), (3, 1, 1))),
    Rule("expand_same", "expand(x, s) -> x when x has shape s",
         rewrite(Expand(x, shape)).to(x, shape_of(x) == shape),
         tuple(_expand_same(rank) for rank in (1, 2, 3)),
         lambda: _graph("expand_same", lambda v: _raw(Op.EXPAND, v, v.shape, v.shape))),
    # a view of a constant is a constant: every element it reads (in bounds) is the same value
    Rule("expand_const", "expand(const(c, s), s2) -> const(c, s2)",
         rewrite(Expand(Const(bits, shape, dtype), shape2)).to(Const(bits, shape2, dtype)),
         tuple(_expand_in_bounds(rank) for rank in (1, 2, 3)),
         lambda: _graph("expand_const", lambda v: P.expand(P.constant(-1e9, (1, 4), v.dtype), v.shape))),
    Rule("reshape_const", "reshape(const(c, s), s2) -> const(c, s2)",
         rewrite(Reshape(Const(bits, shape, dtype), shape2)).to(Const(bits, shape2, dtype)),
         tuple(_reshape_in_bounds(s, s2) for s, _, s2 in RESHAPES),
         lambda: _graph("reshape_const", lambda v: P.reshape(P.constant(2.5, (2, 6), v.dtype), v.shape))),
)

# view rules are proved as index maps; the rest of the base set in the IEEE model
INDEX_RULES = frozenset({"reshape_reshape", "reshape_same", "permute_permute", "permute_identity", "expand_expand",
                         "expand_same", "expand_const", "reshape_const"})
RULES: tuple[Rule, ...] = (
    tuple(dataclasses.replace(rule, model="index") if rule.name in INDEX_RULES else rule for rule in BASE)
    + ALGEBRA + LOGARITHMS + REDUCTIONS + REASSOCIATE + PATTERNS + CONTRACTIONS)

CLAIMS: dict[str, tuple[Claim, ...]] = {rule.name: rule.claims for rule in RULES}
