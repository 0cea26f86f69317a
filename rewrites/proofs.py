"""Proof obligations of rewrite rules, and Z3 to discharge them.

A `Claim` says lhs == rhs for every value of its variables that satisfies `assuming`. Variables are of one of
three kinds (`sorts`):

- "scalar": a float element, modelled as an extended real (`Scalar`): a finite real of magnitude at most a
  symbolic `MAX_FINITE`, +inf, -inf or nan, with the sign of zero. Every op follows IEEE-754 on the special
  values and overflows to inf beyond `MAX_FINITE`; finite results are exact reals (rounding is not modelled,
  so a claim holds up to rounding). Pure real arithmetic would prove `x * 0 -> 0`, false for inf and nan.
  exp2, log2, sin and sqrt are uninterpreted on finite values, with the facts stated where they are applied.
  Two scalars are the same when both are nan, or both are the same infinity, or both are finite and equal
  (so -0.0 and 0.0 are the same, as in numpy's allclose).
- "int" and "bool": Z3 integers and booleans (index arithmetic for views, int32 and bool elements).

Two proof models, and the policy for choosing between them (each rule states its model, `Rule.model`):

- "ieee" (sorts "scalar"): the strict model above. A rule proved here holds on every float value, specials
  included, up to rounding of finite results. Identities, commutativity, view and cast rules, constant folding,
  and the max laws whose operations are monotone live here: they must not change a nan, an inf or a signed zero.
- "real" (sorts "real"): plain real arithmetic (`z3.Real`), with division by zero stated away in `assuming`
  and exp2, log2, sin, sqrt uninterpreted with the axioms in `REAL_AXIOMS` (exp2(a + b) = exp2(a) * exp2(b),
  exp2 > 0) and, for claims that mention log2, `LOG2_AXIOMS` (log2(exp2(a)) = a, exp2(log2(a)) = a for a > 0).
  The algebraic rules whose only deviation from the real numbers is floating-point rounding, or overflow or
  underflow of an intermediate, live here: associativity, distributivity, factoring a constant out of a sum,
  recip(a) * recip(b) = recip(a * b), the exp2 and log2 laws, online softmax. The strict model refutes them (for
  example (a + b) + c overflows where a + (b + c) does not), so they are proved "as real arithmetic where
  exact, with the conditions made explicit", and their numeric check runs on finite random inputs with a
  tolerance instead of bit-level agreement on special values (tests/rewrites/test_soundness.py).
  Real-model rules are guaranteed on finite inputs only: on inf or nan inputs they may turn a nan into an inf
  or back (sum(x * c) with x = [0, 1] and c = inf is nan, sum(x) * c is inf), as any reordering of float
  arithmetic may; a rule that must keep specials exactly is proved in the IEEE model or does not ship.
- "index" (sorts "int"/"bool" only): views as integer index maps, exact.

Reductions are proved over every length where Z3 can, by induction on the length (rewrites/induction.py: a base
case and a step over uninterpreted prefix sums, no bound); the others over a small concrete length with
uninterpreted elements (one variable each), which is what the rule does to any one output element. Each such rule
says why its proof stays bounded (`Rule.bounded_because`).

View rules are claims over indices: lhs and rhs map an output index to the index of the source element it
reads, and the claim is that they agree wherever the output index is in bounds (see `reshape_source`...).
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Sequence

import z3

Kind, (FIN, POS_INF, NEG_INF, NAN) = z3.EnumSort("Kind", ["fin", "pos_inf", "neg_inf", "nan"])
MAX_FINITE = z3.Real("max_finite")      # the largest finite magnitude of the format; any format will do
EXP2 = z3.Function("exp2", z3.RealSort(), z3.RealSort())
LOG2 = z3.Function("log2", z3.RealSort(), z3.RealSort())
SIN = z3.Function("sin", z3.RealSort(), z3.RealSort())
SQRT = z3.Function("sqrt", z3.RealSort(), z3.RealSort())
DEFAULT_TIMEOUT_MS = 5000

# the "real" model: the axioms its uninterpreted functions obey (quantified; Z3 instantiates them by matching)
_U, _V = z3.Reals("u v")
REAL_AXIOMS = (z3.ForAll([_U, _V], EXP2(_U + _V) == EXP2(_U) * EXP2(_V),
                         patterns=[EXP2(_U + _V), z3.MultiPattern(EXP2(_U), EXP2(_V))]),
               z3.ForAll([_U], EXP2(_U) > 0, patterns=[EXP2(_U)]))
# log2 is the inverse of exp2: on every real one way, on the positive reals the other. Added only to claims that
# mention log2: with them Z3 can no longer build a model of a false claim that does not (it answers unknown).
LOG2_AXIOMS = (z3.ForAll([_U], LOG2(EXP2(_U)) == _U, patterns=[EXP2(_U)]),
               z3.ForAll([_U], z3.Implies(_U > 0, EXP2(LOG2(_U)) == _U), patterns=[LOG2(_U)]))


@dataclass(frozen=True)
class Scalar:
    """An extended-real element: `kind` (fin, ±inf, nan), `value` (meaningful when finite), `negative` (sign bit)."""

    kind: z3.ExprRef
    value: z3.ArithRef
    negative: z3.BoolRef
    facts: tuple[z3.BoolRef, ...] = field(default=(), compare=False)

    @staticmethod
    def var(name: str) -> "Scalar":
        return Scalar(z3.Const(f"{name}_kind", Kind), z3.Real(f"{name}_value"), z3.Bool(f"{name}_negative"))

    @staticmethod
    def const(value: float) -> "Scalar":
        """A Python float as a Scalar (inf, nan and -0.0 included)."""
        if math.isnan(value):
            return Scalar(NAN, z3.RealVal(0), z3.BoolVal(False))
        if math.isinf(value):
            return Scalar(POS_INF if value > 0 else NEG_INF, z3.RealVal(0), z3.BoolVal(value < 0))
        return Scalar(FIN, z3.RealVal(value), z3.BoolVal(math.copysign(1.0, value) < 0))

    def well_formed(self) -> z3.BoolRef:
        """The constraints every element satisfies: finite values are in range and carry their sign."""
        finite = z3.And(self.value <= MAX_FINITE, -MAX_FINITE <= self.value,
                        z3.Implies(self.value != 0, self.negative == (self.value < 0)))
        return z3.And(z3.Implies(self.kind == FIN, finite), z3.Implies(self.kind == POS_INF, z3.Not(self.negative)),
                      z3.Implies(self.kind == NEG_INF, self.negative))

    def same(self, other: "Scalar") -> z3.BoolRef:
        """Numerically equal: nan and nan, one infinity and itself, equal finite values (±0 alike)."""
        return z3.And(self.kind == other.kind, z3.Implies(self.kind == FIN, self.value == other.value))

    def __add__(self, other: "Scalar | float") -> "Scalar":
        return add(self, _scalar(other))

    def __radd__(self, other: float) -> "Scalar":
        return add(_scalar(other), self)

    def __mul__(self, other: "Scalar | float") -> "Scalar":
        return mul(self, _scalar(other))

    def __rmul__(self, other: float) -> "Scalar":
        return mul(_scalar(other), self)


def _scalar(x: "Scalar | float") -> Scalar:
    return x if isinstance(x, Scalar) else Scalar.const(float(x))


def _pick(cond: z3.BoolRef, a: Scalar, b: Scalar) -> Scalar:
    return Scalar(z3.If(cond, a.kind, b.kind), z3.If(cond, a.value, b.value), z3.If(cond, a.negative, b.negative),
                  a.facts + b.facts)


def _special(kind: z3.ExprRef, negative: z3.BoolRef | bool) -> Scalar:
    return Scalar(kind, z3.RealVal(0), z3.BoolVal(negative) if isinstance(negative, bool) else negative)


def _inf(negative: z3.BoolRef) -> Scalar:
    return Scalar(z3.If(negative, NEG_INF, POS_INF), z3.RealVal(0), negative)


def _finite(value: z3.ArithRef, zero_negative: z3.BoolRef, facts: tuple = ()) -> Scalar:
    """An exact real result: inf beyond MAX_FINITE, else finite (a zero result takes `zero_negative`)."""
    negative = z3.If(value == 0, zero_negative, value < 0)
    over = z3.Or(value > MAX_FINITE, value < -MAX_FINITE)
    return Scalar(z3.If(over, z3.If(value < 0, NEG_INF, POS_INF), FIN), value, negative, facts)


def _is_inf(x: Scalar) -> z3.BoolRef:
    return z3.Or(x.kind == POS_INF, x.kind == NEG_INF)


def add(a: Scalar, b: Scalar) -> Scalar:
    """a + b: nan if either is nan or for inf + -inf; an infinity wins over finite values; -0 + -0 = -0."""
    facts = a.facts + b.facts
    nan = z3.Or(a.kind == NAN, b.kind == NAN, z3.And(_is_inf(a), _is_inf(b), a.kind != b.kind))
    result = _finite(a.value + b.value, z3.And(a.negative, b.negative), facts)
    result = _pick(b.kind != FIN, _special(b.kind, b.negative), result)
    result = _pick(a.kind != FIN, _special(a.kind, a.negative), result)
    return _pick(nan, _special(NAN, False), result)


def mul(a: Scalar, b: Scalar) -> Scalar:
    """a * b: nan for nan operands and inf * 0; the sign is the xor of the signs."""
    facts = a.facts + b.facts
    negative = z3.Xor(a.negative, b.negative)
    zero = z3.Or(z3.And(a.kind == FIN, a.value == 0), z3.And(b.kind == FIN, b.value == 0))
    nan = z3.Or(a.kind == NAN, b.kind == NAN, z3.And(z3.Or(_is_inf(a), _is_inf(b)), zero))
    result = _pick(z3.Or(_is_inf(a), _is_inf(b)), _inf(negative), _finite(a.value * b.value, negative, facts))
    return _pick(nan, _special(NAN, False), result)


def recip(a: Scalar) -> Scalar:
    """1 / a: ±0 -> ±inf, ±inf -> ±0, and overflow to inf for |a| < 1 / MAX_FINITE."""
    zero = Scalar(FIN, z3.RealVal(0), a.negative)
    result = _pick(a.value == 0, _inf(a.negative), _finite(1 / a.value, a.negative, a.facts))
    result = _pick(_is_inf(a), zero, result)
    return _pick(a.kind == NAN, _special(NAN, False), result)


def exp2(a: Scalar) -> Scalar:
    """2**a: uninterpreted and positive on finite values; -inf -> 0, inf -> inf."""
    value = EXP2(a.value)
    result = _finite(value, z3.BoolVal(False), a.facts + (value > 0,))
    result = _pick(a.kind == NEG_INF, Scalar(FIN, z3.RealVal(0), z3.BoolVal(False)), result)
    result = _pick(a.kind == POS_INF, _special(POS_INF, False), result)
    return _pick(a.kind == NAN, _special(NAN, False), result)


def log2(a: Scalar) -> Scalar:
    """log2(a): uninterpreted on positive finite values, with 2**log2(a) = a; ±0 -> -inf, negative -> nan."""
    value = LOG2(a.value)
    result = Scalar(FIN, value, value < 0, a.facts + (z3.Implies(a.value > 0, EXP2(value) == a.value),))
    result = _pick(a.value == 0, _special(NEG_INF, True), result)
    result = _pick(z3.Or(a.kind == NAN, a.kind == NEG_INF, z3.And(a.kind == FIN, a.value < 0)),
                   _special(NAN, False), _pick(a.kind == POS_INF, _special(POS_INF, False), result))
    return result


def sqrt(a: Scalar) -> Scalar:
    """sqrt(a): the non-negative root on positive finite values; ±0 -> ±0; negative -> nan."""
    value = SQRT(a.value)
    facts = a.facts + (z3.Implies(a.value > 0, z3.And(value > 0, value * value == a.value)),)
    result = _pick(a.value == 0, a, Scalar(FIN, value, z3.BoolVal(False), facts))
    result = _pick(z3.Or(a.kind == NAN, a.kind == NEG_INF, z3.And(a.kind == FIN, a.value < 0)),
                   _special(NAN, False), _pick(a.kind == POS_INF, _special(POS_INF, False), result))
    return result


def sin(a: Scalar) -> Scalar:
    """sin(a): uninterpreted in [-1, 1] on finite values; nan for ±inf."""
    value = SIN(a.value)
    result = Scalar(FIN, value, value < 0, a.facts + (value >= -1, value <= 1))
    return _pick(a.kind == FIN, result, _special(NAN, False))


def maximum(a: Scalar, b: Scalar) -> Scalar:
    """numpy's max of two elements: nan if either is nan, else the larger (-inf < finite < inf)."""
    nan = z3.Or(a.kind == NAN, b.kind == NAN)
    a_wins = z3.Or(a.kind == POS_INF, b.kind == NEG_INF,
                   z3.And(a.kind == FIN, b.kind == FIN, a.value >= b.value))
    return _pick(nan, _special(NAN, False), _pick(a_wins, a, b))


def real_max(a: z3.ArithRef, b: z3.ArithRef) -> z3.ArithRef:
    """max of two reals (the "real" model)."""
    return z3.If(a >= b, a, b)


# views as index maps -----------------------------------------------------------------------------

Index = Sequence[Any]  # Z3 integer expressions, or ints


def in_bounds(index: Index, shape: Index) -> z3.BoolRef:
    """0 <= index[k] < shape[k] on every axis."""
    return z3.And([z3.And(0 <= i, i < n) for i, n in zip(index, shape)]) if index else z3.BoolVal(True)


def flat(index: Index, shape: Sequence[int]) -> Any:
    """The row-major offset of `index` in `shape` (concrete shape)."""
    offset: Any = 0
    for i, n in zip(index, shape):
        offset = offset * n + i
    return offset


def unflat(offset: Any, shape: Sequence[int]) -> tuple[Any, ...]:
    """The index at row-major `offset` in `shape` (concrete shape)."""
    index = []
    for n in reversed(shape):
        index.append(offset % n)
        offset = offset / n if isinstance(offset, z3.ArithRef) else offset // n
    return tuple(reversed(index))


def reshape_source(index: Index, in_shape: Sequence[int], out_shape: Sequence[int]) -> tuple[Any, ...]:
    """The source index that reshape(x: in_shape, out_shape)[index] reads (row-major order kept)."""
    assert math.prod(in_shape) == math.prod(out_shape), (in_shape, out_shape)
    return unflat(flat(index, out_shape), in_shape)


def permute_source(index: Index, axes: Sequence[int]) -> tuple[Any, ...]:
    """The source index that permute(x, axes)[index] reads: source axis axes[k] is output axis k."""
    source: list[Any] = [None] * len(axes)
    for k, axis in enumerate(axes):
        source[axis] = index[k]
    return tuple(source)


def expand_source(index: Index, in_shape: Index) -> tuple[Any, ...]:
    """The source index that expand(x: in_shape, ...)[index] reads: 0 on the axes of size 1."""
    return tuple(z3.If(n == 1, 0, i) if isinstance(n, z3.ArithRef) else (0 if n == 1 else i)
                 for i, n in zip(index, in_shape))


# claims ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Claim:
    """lhs(*vars) == rhs(*vars) whenever assuming(*vars); one variable per parameter of lhs, of kinds `sorts`."""

    lhs: Callable[..., Any]
    rhs: Callable[..., Any]
    assuming: Callable[..., Any] | None = None
    sorts: tuple[str, ...] | None = None   # default: every variable a "scalar"
    note: str = ""
    real: bool = False   # proved in the "real" model (set it for claims without variables)
    lengths: tuple[int, ...] = ()   # the positions of the variables that are symbolic lengths (rewrites/induction.py)

    @property
    def model(self) -> str:
        """"real" when proved in real arithmetic (a "real" variable or `real=True`), else "ieee"."""
        return "real" if self.real or (self.sorts is not None and "real" in self.sorts) else "ieee"

    def variables(self) -> tuple[Any, ...]:
        """Fresh Z3 variables, one per parameter of lhs."""
        names = list(inspect.signature(self.lhs).parameters)
        sorts = self.sorts if self.sorts is not None else ("scalar",) * len(names)
        if len(sorts) != len(names):
            names = [f"v{k}" for k in range(len(sorts))]  # lhs takes *args: name them by position
        makers = {"scalar": Scalar.var, "int": z3.Int, "bool": z3.Bool, "real": z3.Real}
        return tuple(makers[sort](name) for name, sort in zip(names, sorts))


class Verdict(Enum):
    PROVED = "proved"
    REFUTED = "refuted"
    UNKNOWN = "unknown"


def _equal(lhs: Any, rhs: Any) -> z3.BoolRef:
    if isinstance(lhs, Scalar) or isinstance(rhs, Scalar):
        return _scalar(lhs).same(_scalar(rhs))
    if isinstance(lhs, tuple):
        assert isinstance(rhs, tuple) and len(lhs) == len(rhs), (lhs, rhs)
        return z3.And([_equal(a, b) for a, b in zip(lhs, rhs)]) if lhs else z3.BoolVal(True)
    return lhs == rhs


def _facts(value: Any) -> tuple[z3.BoolRef, ...]:
    if isinstance(value, Scalar):
        return value.facts
    if isinstance(value, tuple):
        return tuple(f for v in value for f in _facts(v))
    return ()


def _solver(claim: Claim, timeout_ms: int, axioms: bool = True) -> tuple[z3.Solver, Any, Any]:
    """A solver holding the claim's premises (and the real model's axioms, unless `axioms` is False), and its
    two sides."""
    variables = claim.variables()
    lhs, rhs = claim.lhs(*variables), claim.rhs(*variables)
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    solver.add(MAX_FINITE > 1)
    solver.add(*[v.well_formed() for v in variables if isinstance(v, Scalar)])
    solver.add(*_facts(lhs), *_facts(rhs))
    premises = claim.assuming(*variables) if claim.assuming is not None else z3.BoolVal(True)
    if claim.model == "real" and axioms:
        solver.add(*REAL_AXIOMS)
        if any(_mentions(term, LOG2) for term in (lhs, rhs, premises) if isinstance(term, z3.ExprRef)):
            solver.add(*LOG2_AXIOMS)
    solver.add(premises)
    return solver, lhs, rhs


def _mentions(term: z3.ExprRef, function: z3.FuncDeclRef) -> bool:
    """Whether `function` is applied anywhere in `term`."""
    todo, seen = [term], set()
    while todo:
        e = todo.pop()
        if e.get_id() in seen:
            continue
        seen.add(e.get_id())
        if z3.is_app(e) and z3.eq(e.decl(), function):
            return True
        todo.extend(e.children())
    return False


def check(claim: Claim, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> tuple[Verdict, z3.ModelRef | None]:
    """Ask Z3 for a counterexample: none is PROVED, one is REFUTED (with the model), a timeout UNKNOWN."""
    solver, lhs, rhs = _solver(claim, timeout_ms)
    solver.add(z3.Not(_equal(lhs, rhs)))
    answer = solver.check()
    if answer == z3.unsat:
        return Verdict.PROVED, None
    if answer == z3.sat:
        return Verdict.REFUTED, solver.model()
    return Verdict.UNKNOWN, None


def prove(claim: Claim, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> bool:
    """True only when Z3 shows that no counterexample exists."""
    return check(claim, timeout_ms)[0] == Verdict.PROVED


def consistent(claim: Claim, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> bool:
    """True when the premises can hold at all, so that a proof of the claim is not vacuous.

    The real model's quantified axioms are left out: the real exp2 satisfies them, but Z3 cannot build a model
    of them (it answers unknown), so the check is of the claim's own premises."""
    return _solver(claim, timeout_ms, axioms=False)[0].check() == z3.sat
