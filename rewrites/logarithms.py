"""The laws of log2: the inverse of exp2, and the log of a product as a sum of logs where a factor is positive.

The term language states positivity only of what it can see: a positive finite constant (its bits, as
max_mul_positive does) and an exp2 (positive in the real model). The other factor may be anything: where it is not
positive both sides are nan (negative, or nan) or -inf (zero) alike: the IEEE claim of log2_scaled proves it for
that rule; for log2_exp2_product only the numeric check, on inputs of both signs, shows it (no IEEE claim).

- log2_exp2: log2(exp2(x)) -> x. Real model: exp2 overflows to inf for x >= 128 in float32 (and underflows to 0
  below -149), where log2 gives inf or -inf back instead of x.
- log2_scaled: log2(x * c) -> log2(x) + log2(c) for a positive finite constant c (floats).
- log2_exp2_product: log2(exp2(u) * x) -> u + log2(x) (the log of a softmax numerator times a scale, as
  log-sum-exp forms make).

Z3 proves the real claims from ground instances of the log2 and exp2 axioms over the claim's own terms
(`log2_product_instances`): with the quantified axioms alone it answers unknown, because the term exp2(log2(a) +
log2(b)) that links the two sides appears in neither.
"""
from __future__ import annotations

import z3
from egglog import String, Vec, i64, rewrite, var

from tensorsmith.ir import primitives as P
from tensorsmith.ir.ops import Op

from .algebra import FLOAT_DTYPES, POS_INF_BITS
from .proofs import EXP2, FIN, LOG2, Claim, Scalar, add, log2, mul
from .rule import Rule, example_graph
from .term import Add, Const, Exp2, Log2, Mul, TExpr

x, u = var("x", TExpr), var("u", TExpr)
shape, dtype, bits = var("shape", Vec[i64]), var("dtype", String), var("bits", i64)


def log2_product_instances(a: z3.ArithRef, b: z3.ArithRef) -> list[z3.BoolRef]:
    """Instances of REAL_AXIOMS that link log2(a * b) to log2(a) + log2(b): exp2 of the sum of logs is a * b."""
    total = LOG2(a) + LOG2(b)
    return [z3.Implies(a > 0, EXP2(LOG2(a)) == a), z3.Implies(b > 0, EXP2(LOG2(b)) == b),
            EXP2(total) == EXP2(LOG2(a)) * EXP2(LOG2(b)), LOG2(EXP2(total)) == total]


def _positive_product(a: z3.ArithRef, b: z3.ArithRef) -> z3.BoolRef:
    return z3.And(a > 0, b > 0, *log2_product_instances(a, b))


def _scaled_claims() -> tuple[Claim, ...]:
    """Real: log2(x * c) = log2(x) + log2(c) for x, c > 0. IEEE: for a positive finite c and any x that is not
    positive and finite (negative, zero, an infinity, nan) both sides are the same special value."""
    def positive_constant_other_x(v: Scalar, c: Scalar) -> z3.BoolRef:
        return z3.And(c.kind == FIN, c.value > 0, z3.Not(z3.And(v.kind == FIN, v.value > 0)))
    return (Claim(lambda v, c: LOG2(v * c), lambda v, c: LOG2(v) + LOG2(c), assuming=_positive_product,
                  sorts=("real", "real"), note="x, c > 0"),
            Claim(lambda v, c: log2(mul(v, c)), lambda v, c: add(log2(v), log2(c)),
                  assuming=positive_constant_other_x, note="c > 0 finite, x not positive"))


def _exp2_product_claim() -> Claim:
    def premises(w: z3.ArithRef, v: z3.ArithRef) -> z3.BoolRef:
        return z3.And(v > 0, *log2_product_instances(EXP2(w), v), LOG2(EXP2(w)) == w)
    return Claim(lambda w, v: LOG2(EXP2(w) * v), lambda w, v: w + LOG2(v), assuming=premises,
                 sorts=("real", "real"), note="x > 0")


LOGARITHMS: tuple[Rule, ...] = (
    Rule("log2_exp2", "log2(exp2(x)) -> x (real model: exp2 may overflow)", rewrite(Log2(Exp2(x))).to(x),
         (Claim(lambda w: LOG2(EXP2(w)), lambda w: w, sorts=("real",)),),
         lambda: example_graph("log2_exp2", lambda v: P.unary(Op.LOG2, P.unary(Op.EXP2, v))), model="real"),
    Rule("log2_scaled", "log2(x * c) -> log2(x) + log2(c) for a positive finite constant c (floats)",
         tuple(rewrite(Log2(Mul(x, Const(bits, shape, d)))).to(Add(Log2(x), Log2(Const(bits, shape, d))),
                                                              bits > i64(0), bits < i64(POS_INF_BITS))
               for d in FLOAT_DTYPES),
         _scaled_claims(),
         lambda: example_graph("log2_scaled", lambda v: P.unary(Op.LOG2, P.binary(
             Op.MUL, v, P.constant(0.75, v.shape, v.dtype)))), model="real"),
    Rule("log2_exp2_product", "log2(exp2(u) * x) -> u + log2(x)",
         rewrite(Log2(Mul(Exp2(u), x))).to(Add(u, Log2(x))), (_exp2_product_claim(),),
         lambda: example_graph("log2_exp2_product", lambda w, v: P.unary(Op.LOG2, P.binary(
             Op.MUL, P.unary(Op.EXP2, w), v)), inputs=2), model="real"),
)
