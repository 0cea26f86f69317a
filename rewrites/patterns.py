"""Patterns: the higher-level forms that later stages match on, recognised in the primitive e-graph.

- matmul: sum(expand(a) * expand(b), axis) is a contraction, `MatMul(a, b, shape, axis)`.
- rmsnorm_matmul: (x * s) @ W = s * (x @ W) for s constant along the contracted axis (a per-row scale, as
  RMSNorm makes), so that the normalisation leaves the matmul's prologue for its epilogue.
- matmul_scaled_weight: x @ (W * c) = (x @ W) * c for a constant c: the scale, a pointwise pass over the whole
  weight as written, becomes a multiply in the product's epilogue (W plain or transposed, as a linear layer reads it).
- online_softmax: the softmax expression is `OnlineSoftmax(x, axis, block)`, its streaming form (a running
  max and a running sum rescaled by exp2(old max - new max), one block at a time). The claim proves that
  algorithm equal to softmax over a small concrete length, with a partial last block.
MatMul is built as the contraction it stands for (rewrites/eclasses.py); OnlineSoftmax costs infinity in extraction
until codegen has an archetype for it (search/extract.py).
"""
from __future__ import annotations

from typing import Any

import z3
from egglog import String, Vec, i64, rewrite, var

from tensorsmith.ir import nn
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.tensor import LOG2_E, Tensor

from . import every_length
from .eclasses import encode_value
from .proofs import EXP2, Claim, Scalar, add, mul, real_max
from .rule import Rule, tensor_example
from .term import (Add, Const, Exp2, Expand, Max, MatMul, Mul, OnlineSoftmax, Permute, Recip, Reshape, Sum, TExpr,
                   dtype_of, shape_of)

BLOCK = 128          # the streaming softmax's block length (the last block may be partial)
NEG_ONE, LOG2_E_BITS = encode_value(-1.0), encode_value(LOG2_E)
K = 3                # contractions are proved over this many uninterpreted elements

x, a, b, c, w = var("x", TExpr), var("a", TExpr), var("b", TExpr), var("c", TExpr), var("w", TExpr)
shape, t_shape, r_shape, cs = var("shape", Vec[i64]), var("t_shape", Vec[i64]), var("r_shape", Vec[i64]), var(
    "cs", Vec[i64])
w_shape, p = var("w_shape", Vec[i64]), var("p", Vec[i64])
dtype, axis, bits = var("dtype", String), var("axis", i64), var("bits", i64)


def contraction(left: list[Scalar], right: list[Scalar]) -> Scalar:
    """What MatMul means for one output element: the products summed in order, as Sum computes them."""
    total = mul(left[0], right[0])
    for u, v in zip(left[1:], right[1:]):
        total = add(total, mul(u, v))
    return total


def _matmul_claim() -> Claim:
    def lhs(*v: Scalar) -> Scalar:
        total = v[0] * v[K]
        for k in range(1, K):
            total = total + v[k] * v[K + k]
        return total
    return Claim(lhs, lambda *v: contraction(list(v[:K]), list(v[K:])), sorts=("scalar",) * (2 * K),
                 note="definitional: MatMul is the contraction it was recognised from")


def _sum(values: list[Any]) -> Any:
    total = values[0]
    for value in values[1:]:
        total = total + value
    return total


def _rmsnorm_claims() -> tuple[Claim, ...]:
    """x: K elements of one row, s: the row's scale, y: K elements of one column of W (w: a weight)."""
    plain = Claim(lambda *v: _sum([(v[k] * v[K]) * v[K + 1 + k] for k in range(K)]),
                  lambda *v: _sum([v[k] * v[K + 1 + k] for k in range(K)]) * v[K], sorts=("real",) * (2 * K + 1),
                  note="sum((x*s)*y) = sum(x*y)*s")
    weighted = Claim(lambda *v: _sum([((v[k] * v[K]) * v[2 * K + 1 + k]) * v[K + 1 + k] for k in range(K)]),
                     lambda *v: _sum([(v[k] * v[2 * K + 1 + k]) * v[K + 1 + k] for k in range(K)]) * v[K],
                     sorts=("real",) * (3 * K + 1), note="sum(((x*s)*w)*y) = sum((x*w)*y)*s")
    return plain, weighted, *every_length.row_scale()


def _weight_scale_claims() -> tuple[Claim, ...]:
    """x: K elements of one row, w: K elements of one column of the weight, c: the constant."""
    plain = Claim(lambda *v: _sum([v[k] * (v[K + k] * v[2 * K]) for k in range(K)]),
                  lambda *v: _sum([v[k] * v[K + k] for k in range(K)]) * v[2 * K], sorts=("real",) * (2 * K + 1),
                  note="sum(x*(w*c)) = sum(x*w)*c")
    return plain, *every_length.weight_scale()


def _scaled_weight(g: Graph) -> Tensor:
    x_, w_ = g.input("x", (4, 8), "float32"), g.input("W", (6, 8), "float32")
    return x_ @ (w_ * 0.5).transpose(0, 1)


def _scaled_weight_rewrites() -> tuple[Any, ...]:
    """The weight's view chain as matmul builds it, W plain or transposed first: the constant leaves it."""
    scaled = Mul(w, Const(bits, w_shape, dtype))
    plain = (scaled, w)
    transposed = (Permute(scaled, p), Permute(w, p))
    return tuple(
        rewrite(Sum(Mul(a, Expand(Reshape(lhs, r_shape), shape)), axis)).to(
            Mul(Sum(Mul(a, Expand(Reshape(rhs, r_shape), shape)), axis), Const(bits, shape.remove(axis), dtype)),
            dtype_of(w) == dtype)
        for lhs, rhs in (plain, transposed))


def softmax_state(xs: list[Any], scale: Any) -> tuple[Any, Any]:
    """What the graph's softmax divides by: the max, and the sum of exp2((x + -1 * max) * scale)."""
    top = xs[0]
    for value in xs[1:]:
        top = real_max(top, value)
    return top, _sum([EXP2((value + -1 * top) * scale) for value in xs])


def online_state(xs: list[Any], scale: Any, block: int) -> tuple[Any, Any]:
    """The streaming form's final (running max, running sum): per block, a new running max, and the running
    sum rescaled to it by exp2((old max - new max) * scale) before the block's terms are added."""
    top, total = None, None
    for start in range(0, len(xs), block):
        chunk = xs[start:start + block]
        new_top = chunk[0] if top is None else real_max(top, chunk[0])
        for value in chunk[1:]:
            new_top = real_max(new_top, value)
        part = _sum([EXP2((value + -1 * new_top) * scale) for value in chunk])
        total = part if total is None else total * EXP2((top + -1 * new_top) * scale) + part
        top = new_top
    return top, total


def exp2_instances(*exprs: Any) -> z3.BoolRef:
    """Ground instances of the exp2 axiom over the exp2 terms in `exprs`: exp2(u) * exp2(v) = exp2(w) wherever
    u + v = w. Sound (each is an instance of REAL_AXIOMS) and what Z3 needs: the quantified axiom alone leaves
    several blocks `unknown`, because the arguments meet only modulo arithmetic. Two blocks (a full and a
    partial one) are proved; three need exp2 terms that no side contains (the induction step is the same)."""
    args: dict[int, z3.ArithRef] = {}
    todo = [e for e in exprs if isinstance(e, z3.ExprRef)]
    while todo:
        e = todo.pop()
        if z3.is_app(e) and z3.eq(e.decl(), EXP2):
            args[e.arg(0).get_id()] = e.arg(0)
        todo.extend(e.children())
    terms = list(args.values())
    return z3.And([z3.Implies(u + v == w, EXP2(u) * EXP2(v) == EXP2(w)) for u in terms for v in terms for w in terms])


def _online_softmax_claim(length: int, block: int) -> Claim:
    """Streaming and plain softmax reach the same max and the same sum; each output is then the same
    exp2((x_i + -1 * max) * scale) / sum on both sides (congruence), so the claim is stated on that state."""
    scale = z3.RealVal(LOG2_E)

    def lhs(*v: z3.ArithRef) -> tuple[Any, Any]:
        return online_state(list(v), scale, block)

    def rhs(*v: z3.ArithRef) -> tuple[Any, Any]:
        return softmax_state(list(v), scale)

    return Claim(lhs, rhs, assuming=lambda *v: exp2_instances(*lhs(*v), *rhs(*v)), sorts=("real",) * length,
                 note=f"length {length}, block {block}")


def _softmax_pattern() -> TExpr:
    """softmax(x, axis) as nn.softmax builds it, after the constants have been folded into full shapes."""
    r = shape.set(axis, i64(1))   # the reduced shape with its axis kept (keepdim)
    shifted = Add(x, Expand(Mul(Reshape(Max(x, axis), r), Const(NEG_ONE, r, dtype)), shape))
    e = Exp2(Mul(shifted, Const(LOG2_E_BITS, shape, dtype)))
    return Mul(e, Expand(Recip(Reshape(Sum(e, axis), r)), shape))


def _row_scaled_matmul(g: Graph) -> Tensor:
    x_, s_, W_ = g.input("x", (4, 8), "float32"), g.input("s", (4, 1), "float32"), g.input("W", (8, 6), "float32")
    return (x_ * s_) @ W_


def _scale_conditions() -> list:
    """The contracted axis is the last of x's shape t (matmul reshapes x to t + (1,)); c is constant along it."""
    return [r_shape == t_shape.push(i64(1)), axis == t_shape.length() - i64(1), shape_of(c) == cs, cs[axis] == i64(1)]

PATTERNS: tuple[Rule, ...] = (
    Rule("matmul", "sum(expand(a, s) * expand(b, s), axis) -> MatMul(a, b, s, axis)",
         rewrite(Sum(Mul(Expand(a, shape), Expand(b, shape)), axis)).to(MatMul(a, b, shape, axis)),
         (_matmul_claim(),),
         tensor_example("matmul", lambda g: g.input("x", (4, 8), "float32") @ g.input("y", (8, 6), "float32")),
         stage="patterns", bounded_because="IEEE model, definitional (both sides are the same fold of extended-real "
                                           "elements, specials included); checked at length 3"),
    Rule("rmsnorm_matmul", "(x * s) @ W -> s * (x @ W) for s constant along the contracted axis",
         (rewrite(Sum(Mul(Expand(Reshape(Mul(x, Expand(c, t_shape)), r_shape), shape), b), axis)).to(
             Mul(Sum(Mul(Expand(Reshape(x, r_shape), shape), b), axis), Expand(c, shape.remove(axis))),
             *_scale_conditions()),
          rewrite(Sum(Mul(Expand(Reshape(Mul(Mul(x, Expand(c, t_shape)), a), r_shape), shape), b), axis)).to(
              Mul(Sum(Mul(Expand(Reshape(Mul(x, a), r_shape), shape), b), axis), Expand(c, shape.remove(axis))),
              *_scale_conditions())),
         _rmsnorm_claims(), tensor_example("rmsnorm_matmul", _row_scaled_matmul), model="real", stage="patterns"),
    Rule("matmul_scaled_weight", "x @ (W * c) -> (x @ W) * c for a constant c (W plain or transposed)",
         _scaled_weight_rewrites(), _weight_scale_claims(), tensor_example("matmul_scaled_weight", _scaled_weight),
         model="real", stage="patterns"),
    Rule("online_softmax", f"softmax(x, axis) -> OnlineSoftmax(x, axis, {BLOCK}): running max, rescaled running sum",
         rewrite(_softmax_pattern()).to(OnlineSoftmax(x, axis, i64(BLOCK))),
         (_online_softmax_claim(4, 2), _online_softmax_claim(3, 2), _online_softmax_claim(2, 1)),
         tensor_example("online_softmax", lambda g: nn.softmax(g.input("x", (4, 8), "float32"), -1)),
         model="real", stage="patterns",
         bounded_because="the step rescales a running sum by exp2 of a difference of maxima: Z3 needs ground "
                         "instances of the exp2 axiom over each block's terms (exp2_instances), which a symbolic "
                         "number of blocks does not give it; proved for lengths 4, 3 and 2 with full and partial "
                         "blocks"),
)
