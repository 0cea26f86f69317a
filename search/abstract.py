"""Abstract expressions that keep index detail: each output element as a term over the inputs' elements.

The normal form. An output of shape S is one term in free integer coordinates c0..c(n-1) (0 <= ck < S[k]):
- a graph input is read at an index (`index.Index`: affine in the coordinates and the reductions' bound variables,
  with floor-division and remainder atoms), `("read", name, index)`; a view is no term of its own: it maps the index
  its consumer reads to its source's (`index.view_index`), so views are pushed through elementwise ops to the leaves
  and a chain of them composes into one index map (permute(a + b) and permute(a) + permute(b), reshape(reshape(x))
  and reshape(x) are one term); CONTIGUOUS is the identity; a pad is `("where", guards, value)`, zero outside;
- a reduction binds a variable `("r", level, length)` at the axis it removes, the level one above the highest bound
  variable its index mentions (so the name depends on the term only, not on where it was built);
- add and mul are flattened and their operands sorted (real arithmetic in Z3); rational constants fold exactly;
- a sum's body is multiplied out into monomials (up to MAX_MONOMIALS) and each monomial's factors that do not mention
  the bound variable leave the sum: sum(a + b) = sum(a) + sum(b), sum(s * x) = s * sum(x), sum(c) = n * c; the
  factors that stay, where one of them is itself a sum, move into it (f * sum_c(g) = sum_c(f * g)), so nested sums
  form one chain over the product of everything that depends on them;
- a chain of directly nested reductions of one op (up to MAX_COMMUTED deep) takes, of every order of its variables
  (each renamed to the level of its position), the least term: sum(sum(x, 1), 0) and sum(sum(x, 0), 0), and
  (a @ b) @ c and a @ (b @ c), are one term;
- every other op (exp2, log2, sin, sqrt, recip, mod, less_than, each cast, max) is an uninterpreted function, and a
  sum or max over length n an uninterpreted function of its body as a Z3 array (`Lambda` over the bound variable,
  zero outside [0, n)), so two reductions are equal exactly when their bodies are equal at every index in range.

Terms are hash-consed (`Terms`): a term is an int, equal structure gives the same int, so two programs built from the
same graph (every partition of it) give the same ints and need no Z3 at all. Other pairs go to Z3: the coordinates
as bounded integers, indices as integer arithmetic (`/` and `%` by constants), reads as uninterpreted functions of
their indices.

What holds by construction: the laws of views (composition, commuting with elementwise ops and with reductions over
other axes, pads and slices as index guards and shifts), commutativity, associativity and distributivity of add and
mul, linearity of sums, the order of nested sums or maxes (chains up to three deep). What the abstraction does not
know: laws of the uninterpreted ops (exp2(a + b) = exp2(a) * exp2(b), recip(a) * recip(b) = recip(a * b), max's
laws), the order of a chain whose body holds a reduction binding one of the chain's names (a softmax's max inside a
double sum), reindexing a reduction, float64 rounding of folded constants. Programs equal only by those come out
different here (Z3 finds them different, or cannot decide), which is why a rewritten form is refuted only where
the index-blind projection agrees and the exact check does too (search/prune.py `form_equivalent`).
"""
from __future__ import annotations

import itertools
import math
import time
from fractions import Fraction
from typing import Callable

import z3

from tensorsmith.ir.node import Node
from tensorsmith.ir.ops import Op, REDUCE, VIEWS

from .index import Guard, Index, renamed_index, reshaped, variable, view_index

Term = int
MAX_MONOMIALS = 64   # a sum's body multiplied out beyond this many monomials is left as one factor
MAX_COMMUTED = 3     # the longest chain of nested reductions put in a canonical order (3! orders tried)
MAX_TERMS = 40_000   # new terms one check may make (about 1 s); past them it is not made (TooLarge): left to random
                     # testing. A small Hugging Face Llama's ONNX graph (626 nodes) makes 13,260
ZERO, ONE = Fraction(0), Fraction(1)


class TooLarge(Exception):
    """A check needs more terms than `Terms.limit`, more time to build its terms than `Terms.deadline` (a 4-layer
    Llama's graph took 5 s, mostly index arithmetic on terms made before), or more time to build its Z3 expressions
    than `Z3Terms.deadline` (a Hugging Face model's nested reductions as Z3 lambdas took minutes): it is not made."""


class Terms:
    """A hash-consing table of value terms, and each term's free bound variables."""

    def __init__(self) -> None:
        self.ids: dict[tuple, Term] = {}
        self.nodes: list[tuple] = []
        self.free: list[frozenset] = []
        self.binders: list[frozenset] = []   # the variables reductions inside a term bind
        self.limit: float = math.inf   # the number of terms past which making one raises TooLarge
        self.deadline = math.inf       # time.monotonic() past which building a node's term raises TooLarge
        self._reduced: dict[tuple, Term] = {}
        self._renamed: dict[tuple, Term] = {}
        self._expanded: dict[Term, list[list[Term]]] = {}
        self.zero, self.one = self.const(ZERO), self.const(ONE)

    def make(self, key: tuple, free: frozenset = frozenset()) -> Term:
        if key not in self.ids:
            if len(self.nodes) >= self.limit:
                raise TooLarge(f"the abstract expressions need more than {self.limit} terms")
            self.ids[key] = len(self.nodes)
            self.nodes.append(key)
            self.free.append(free)
            own = frozenset({key[2]}) if key[0] == "reduce" else frozenset()
            self.binders.append(own.union(*(self.binders[t] for t in _children(key))))
        return self.ids[key]

    def const(self, value: Fraction) -> Term:
        return self.make(("const", value))

    def read(self, name: str, index: tuple[Index, ...]) -> Term:
        return self.make(("read", name, index), _bound(index))

    def add(self, *operands: Term) -> Term:
        return self._flat("add", operands, ZERO, lambda a, b: a + b)

    def mul(self, *operands: Term) -> Term:
        if self.zero in operands:
            return self.zero
        return self._flat("mul", operands, ONE, lambda a, b: a * b)

    def apply(self, name: str, *operands: Term) -> Term:
        return self.make(("fn", name, operands), _union(self.free[t] for t in operands))

    def where(self, guards: list[Guard], value: Term) -> Term:
        """`value` where every guard holds, else zero; guards the bounds decide are dropped."""
        kept = []
        for position, low, high in guards:
            a, b = position.bounds()
            if b < low or a >= high:
                return self.const(ZERO)
            if not (a >= low and b < high):
                kept.append((position, low, high))
        if not kept:
            return value
        free = self.free[value] | _bound(tuple(position for position, _, _ in kept))
        return self.make(("where", tuple(kept), value), free)

    def _flat(self, kind: str, operands: tuple[Term, ...], unit: Fraction,
              combine: Callable[[Fraction, Fraction], Fraction]) -> Term:
        """An add or mul with nested ones flattened, constants folded and operands sorted."""
        flat: list[Term] = []
        constants: list[Fraction] = []
        for term in operands:
            node = self.nodes[term]
            for part in node[1] if node[0] == kind else (term,):
                if self.nodes[part][0] == "const":
                    constants.append(self.nodes[part][1])
                else:
                    flat.append(part)
        folded = unit
        for value in constants:
            folded = combine(folded, value)
        if kind == "mul" and folded == ZERO:
            return self.zero
        if constants and folded != unit:
            flat.append(self.const(folded))
        if not flat:
            return self.const(unit)
        if len(flat) == 1:
            return flat[0]
        flat.sort()
        return self.make((kind, tuple(flat)), _union(self.free[t] for t in flat))

    # ---- reductions ----------------------------------------------------------------------------------------------
    def reduce(self, op: str, var: tuple, body: Term) -> Term:
        """A sum (linear: monomials split, factors free of `var` taken out) or a max (uninterpreted) over `var`, with
        directly nested reductions of the same op in a canonical order (`_commuted`); memoised, since renaming a
        term rebuilds the reductions inside it."""
        key = (op, var, body)
        if key not in self._reduced:
            self._reduced[key] = self._reduce(op, var, body)
        return self._reduced[key]

    def _reduce(self, op: str, var: tuple, body: Term) -> Term:
        if op != "sum":   # a max over copies of one value is that value
            return body if var not in self.free[body] else self._commuted(op, self._reduction(op, var, body))
        groups: dict[Term, list[Term]] = {}
        for monomial in self._monomials(body):
            bound = [f for f in monomial if var in self.free[f]]
            free = [f for f in monomial if var not in self.free[f]]
            groups.setdefault(self.mul(*bound), []).append(self.mul(*free))
        parts = []
        for inside, factors in groups.items():
            scale = self.add(*factors)
            if inside == self.one:
                parts.append(self.mul(scale, self.const(Fraction(var[2]))))
            else:
                parts.append(self.mul(scale, self._commuted("sum", self._reduction("sum", var, self._pushed(inside)))))
        return self.add(*parts)

    def _pushed(self, product: Term) -> Term:
        """A product with one factor a sum (or a chain of them) as that sum of the product: f * sum_c(g) =
        sum_c(f * g) for c not free in f, so that nested sums form one chain (`_commuted`) whichever factors the
        inner sums took out."""
        factors = self.nodes[product][1] if self.nodes[product][0] == "mul" else (product,)
        sums = [f for f in factors if self.nodes[f][0] == "reduce" and self.nodes[f][1] == "sum"]
        if len(factors) < 2 or len(sums) != 1:
            return product
        others = [f for f in factors if f != sums[0]]
        chain, body = [], sums[0]
        while self.nodes[body][0] == "reduce" and self.nodes[body][1] == "sum":
            chain.append(self.nodes[body][2])
            body = self.nodes[body][3]
        if set(chain) & _union(self.free[f] | self.binders[f] for f in others):
            return product
        nested = self.mul(*others, body)
        for var in reversed(chain):
            nested = self._reduction("sum", var, nested)
        return nested

    def _commuted(self, op: str, term: Term) -> Term:
        """A chain of directly nested reductions of one op (sum(sum(x, i), j)) in the order, of every order of its
        variables (each renamed to the level its position had), whose term is the least: the same term however the
        chain was nested. Chains longer than MAX_COMMUTED, or whose body binds one of the names, are left as built."""
        chain, body = [], term
        while self.nodes[body][0] == "reduce" and self.nodes[body][1] == op:
            chain.append(self.nodes[body][2])
            body = self.nodes[body][3]
        levels = [var[1] for var in chain]
        if not 2 <= len(chain) <= MAX_COMMUTED or len(set(levels)) < len(chain) or set(chain) & self.binders[body]:
            return term
        options = []
        for order in itertools.permutations(chain):
            names = [("r", level, var[2]) for level, var in zip(levels, order)]
            if set(names) & (self.binders[body] | self.free[term]):
                continue
            nested = self.renamed(body, dict(zip(order, names)))
            for name in reversed(names):
                nested = self._reduction(op, name, nested)
            options.append(nested)
        return min(options)

    def renamed(self, term: Term, mapping: dict[tuple, tuple]) -> Term:
        """`term` with its free bound variables renamed by `mapping` (none of whose names a reduction inside binds)."""
        if not self.free[term] & mapping.keys():
            return term
        key = (term, tuple(sorted(mapping.items())))
        if key not in self._renamed:
            self._renamed[key] = self._rename(term, mapping)
        return self._renamed[key]

    def _rename(self, term: Term, mapping: dict[tuple, tuple]) -> Term:
        node = self.nodes[term]
        kind = node[0]
        if kind == "read":
            return self.read(node[1], tuple(renamed_index(p, mapping) for p in node[2]))
        if kind == "iota":
            position = renamed_index(node[1], mapping)
            return self.make(("iota", position), _bound((position,)))
        if kind == "where":
            return self.where([(renamed_index(p, mapping), low, high) for p, low, high in node[1]],
                              self.renamed(node[2], mapping))
        if kind in ("add", "mul"):
            parts = [self.renamed(t, mapping) for t in node[1]]
            return self.add(*parts) if kind == "add" else self.mul(*parts)
        if kind == "fn":
            return self.apply(node[1], *(self.renamed(t, mapping) for t in node[2]))
        return self.reduce(node[1], node[2], self.renamed(node[3], mapping))

    def _reduction(self, op: str, var: tuple, body: Term) -> Term:
        return self.make(("reduce", op, var, body), self.free[body] - {var})

    def _monomials(self, term: Term) -> list[list[Term]]:
        """`term` multiplied out: a list of products, each a list of factors (one factor past MAX_MONOMIALS)."""
        if term not in self._expanded:
            self._expanded[term] = self._expand(term)
        return self._expanded[term]

    def _expand(self, term: Term) -> list[list[Term]]:
        node = self.nodes[term]
        if node[0] == "add":
            found = [m for part in node[1] for m in self._monomials(part)]
        elif node[0] == "mul":
            found = [[]]
            for factor in node[1]:
                found = [a + b for a, b in itertools.product(found, self._monomials(factor))]
                if len(found) > MAX_MONOMIALS:
                    return [[term]]
        else:
            return [[term]]
        return found if len(found) <= MAX_MONOMIALS else [[term]]


def _children(key: tuple) -> tuple[Term, ...]:
    """The value terms a term is built from."""
    if key[0] in ("add", "mul"):
        return key[1]
    if key[0] == "fn":
        return key[2]
    if key[0] in ("where", "reduce"):
        return (key[-1],)
    return ()


def _bound(index: tuple[Index, ...]) -> frozenset:
    return frozenset().union(*(position.bound for position in index))


def _union(sets) -> frozenset:
    return frozenset().union(*sets)


# ---------------------------------------------------------------------------------------------------------------
# from nodes to terms

Leaf = Callable[[Node, tuple[Index, ...]], Term]   # the term an INPUT node reads at an index


class Builder:
    """Terms of nodes at indices, memoised by (node, index); `leaf` says what an INPUT reads."""

    def __init__(self, terms: Terms, leaf: Leaf):
        self.terms = terms
        self.leaf = leaf
        self.memo: dict[tuple[int, tuple[Index, ...]], Term] = {}

    def at(self, node: Node, index: tuple[Index, ...]) -> Term:
        key = (id(node), index)
        if key not in self.memo:
            if time.monotonic() > self.terms.deadline:
                raise TooLarge("the abstract expressions took longer to build than the check may take")
            self.memo[key] = self._term(node, index)
        return self.memo[key]

    def output(self, node: Node) -> Term:
        """`node`'s element at the free coordinates of its shape."""
        return self.at(node, coordinates(node.shape))

    def _term(self, node: Node, index: tuple[Index, ...]) -> Term:
        op, t = node.op, self.terms
        if op == Op.INPUT:
            return self.leaf(node, index)
        if op == Op.CONSTANT:
            value = float(node.arg)
            return t.const(Fraction(value)) if math.isfinite(value) else t.apply(f"const_{value}")
        if op == Op.IOTA:
            position = index[node.arg]
            return t.const(Fraction(position.const)) if not position.terms else t.make(("iota", position),
                                                                                       _bound((position,)))
        if op in VIEWS:
            source, guards = view_index(node, index)
            return t.where(guards, self.at(node.srcs[0], source))
        if op == Op.CONTIGUOUS:
            return self.at(node.srcs[0], index)
        if op in REDUCE:
            return self._reduce(node, index)
        args = [self.at(src, index) for src in node.srcs]
        if op == Op.ADD:
            return t.add(*args)
        if op == Op.MUL:
            return t.mul(*args)
        if op == Op.CAST:
            return t.apply(f"cast_{node.dtype.value}", *args)
        return t.apply(op.value, *args)

    def _reduce(self, node: Node, index: tuple[Index, ...]) -> Term:
        length = node.srcs[0].shape[node.arg]
        level = 1 + max((atom[1] for atom in _bound(index)), default=-1)
        var = ("r", level, length)
        inner = (*index[:node.arg], variable("r", level, length), *index[node.arg:])
        body = self.at(node.srcs[0], inner)
        if length == 1:
            return body
        return self.terms.reduce(node.op.value, var, body)


def coordinates(shape: tuple[int, ...]) -> tuple[Index, ...]:
    return tuple(variable("c", axis, size) for axis, size in enumerate(shape))


def buffer_read(builder: Builder, writer: Node, shape: tuple[int, ...]) -> Callable[[tuple[Index, ...]], Term]:
    """What reading a buffer of `shape` written by `writer` (row-major) gives at an index."""
    def read(index: tuple[Index, ...]) -> Term:
        if writer.shape != shape:
            index = reshaped(index, shape, writer.shape)
        return builder.at(writer, index)
    return read


# ---------------------------------------------------------------------------------------------------------------
# to Z3

class Z3Terms:
    """Z3 expressions of hash-consed terms (memoised by term)."""

    def __init__(self, terms: Terms):
        self.terms = terms
        self.memo: dict[Term, z3.ExprRef] = {}
        self.blind_memo: dict[Term, z3.ExprRef] = {}
        self.functions: dict[tuple, z3.FuncDeclRef] = {}
        self.coordinates: dict[tuple, z3.ArithRef] = {}
        self.deadline = math.inf   # time.monotonic() past which building expressions raises TooLarge

    def expr(self, term: Term) -> z3.ExprRef:
        if term not in self.memo:
            if time.monotonic() > self.deadline:
                raise TooLarge("building the Z3 expressions took longer than the check's time")
            self.memo[term] = self._expr(self.terms.nodes[term])
        return self.memo[term]

    def blind(self, term: Term) -> z3.ExprRef:
        """The term with its index detail erased: a read by its input's name alone, a pad its value, a reduction an
        uninterpreted function of its body named by op and length. Two terms whose blind forms are equal differ in
        which elements they read and reduce over, not in the ops applied to them."""
        if term not in self.blind_memo:
            self.blind_memo[term] = self._blind(term)
        return self.blind_memo[term]

    def _blind(self, term: Term) -> z3.ExprRef:
        node = self.terms.nodes[term]
        kind = node[0]
        if kind == "read":
            return z3.Real(f"in_{node[1]}")
        if kind == "iota":
            return z3.Real("iota")
        if kind == "where":
            return self.blind(node[2])
        if kind == "add":
            return z3.Sum([self.blind(t) for t in node[1]])
        if kind == "mul":
            return z3.Product([self.blind(t) for t in node[1]])
        if kind == "fn" and node[2]:
            return self._function(node[1], len(node[2]))(*(self.blind(t) for t in node[2]))
        if kind == "reduce":
            return self._function(f"{node[1]}{node[2][2]}", 1)(self.blind(node[3]))
        return self.expr(term)   # a constant: no index detail

    def ranges(self) -> list[z3.BoolRef]:
        """0 <= c < size for every coordinate met."""
        return [z3.And(0 <= var, var < atom[2]) for atom, var in self.coordinates.items()]

    def _expr(self, node: tuple) -> z3.ExprRef:
        kind = node[0]
        if kind == "const":
            return z3.RealVal(f"{node[1].numerator}/{node[1].denominator}")
        if kind == "read":
            index = [self.index(position) for position in node[2]]
            return self._function(f"in_{node[1]}", len(index))(*index) if index else z3.Real(f"in_{node[1]}")
        if kind == "add":
            return z3.Sum([self.expr(t) for t in node[1]])
        if kind == "mul":
            return z3.Product([self.expr(t) for t in node[1]])
        if kind == "fn":
            args = [self.expr(t) for t in node[2]]
            return self._function(node[1], len(args))(*args) if args else z3.Real(node[1])
        if kind == "iota":
            return z3.ToReal(self.index(node[1]))
        if kind == "where":
            held = [z3.And(low <= self.index(p), self.index(p) < high) for p, low, high in node[1]]
            return z3.If(z3.And(held), self.expr(node[2]), z3.RealVal(0))
        _, op, var, body = node      # a reduction: an uninterpreted function of its body as an array
        bound = self.variable(var)
        array = z3.Lambda([bound], z3.If(z3.And(0 <= bound, bound < var[2]), self.expr(body), z3.RealVal(0)))
        key = (f"{op}{var[2]}", "array")
        if key not in self.functions:
            self.functions[key] = z3.Function(key[0], z3.ArraySort(z3.IntSort(), z3.RealSort()), z3.RealSort())
        return self.functions[key](array)

    def index(self, position: Index) -> z3.ArithRef:
        parts = [z3.IntVal(position.const)]
        for atom, coeff in position.terms:
            parts.append(coeff * self._atom(atom))
        return z3.Sum(parts) if len(parts) > 1 else parts[0]

    def variable(self, atom: tuple) -> z3.ArithRef:
        name = f"{atom[0]}{atom[1]}_{atom[2]}"
        var = z3.Int(name)
        if atom[0] == "c":
            self.coordinates[atom] = var
        return var

    def _atom(self, atom: tuple) -> z3.ArithRef:
        if atom[0] in ("c", "r"):
            return self.variable(atom)
        inner = self.index(atom[1])
        return inner / atom[2] if atom[0] == "div" else inner % atom[2]

    def _function(self, name: str, arity: int) -> z3.FuncDeclRef:
        key = (name, arity)
        if key not in self.functions:
            sort = z3.IntSort() if name.startswith("in_") else z3.RealSort()
            self.functions[key] = z3.Function(name, *([sort] * arity), z3.RealSort())
        return self.functions[key]
