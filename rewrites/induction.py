"""Proofs over every length: induction on the length of a reduction, each case a Z3 claim.

A sum of length n is a fold, S(0) = 0 and S(m + 1) = S(m) + term(m), as `Sum` computes it (in order). A law about
sums of a symbolic length n, P(n), is proved by induction on n: the base case P(0), and the step P(n) -> P(n + 1)
for an arbitrary n >= 0. Both are ordinary `Claim`s of the "real" model whose elements and prefix sums are Z3
uninterpreted functions of the index, tied together only by the recurrences the step states at n: Z3 shows each
claim for every interpretation of them, so for the true prefix sums in particular, with nothing bounding n. Z3 does
no induction itself; that base and step give every n is the argument here, and the claims carry it as data:
`Claim.lengths` names the variables that are free lengths (tests/rewrites/test_soundness.py checks that the
premises hold with every one of them at SOME_LARGE_LENGTH, so that no bound hides in them).

A law with two lengths (a double sum) is proved by induction on one of them with the other free, using lemmas
that are themselves proved by induction on the other (`Induction.lemmas`: each a lemma's Induction and where to
instantiate it): a lemma is proved for every interpretation of the functions, so its statement may be assumed of
any instance of them. What is assumed is the lemma's own `holds`, so an assumption no claim proves cannot slip in.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import z3

from .proofs import Claim

Formula = Callable[..., z3.BoolRef]          # of the induction variable n, then the other lengths
Facts = Callable[..., list[z3.BoolRef]]
SOME_LARGE_LENGTH = 10 ** 6                  # a step's premises must hold at a length this large


@dataclass(frozen=True)
class Induction:
    """P(n, *others) for every n >= 0 (and every other length >= 0), by induction on n.

    `holds(n, *others)` is P; `starts(*others)` the folds' values at length 0 (S(0) = 0); `steps(n, *others)` the
    folds' recurrences at n (S(n + 1) = S(n) + term(n)); `lemmas` other inductions, each with the arguments of its
    `holds` as a function of (n, *others): their statements assumed where the step needs them (their own claims are
    proved alongside). `others` is how many other lengths stay free."""

    note: str
    holds: Formula
    starts: Facts
    steps: Facts
    lemmas: tuple[tuple["Induction", Callable[..., tuple]], ...] = ()
    others: int = 0

    def given(self, *v: z3.ArithRef) -> list[z3.BoolRef]:
        """The lemmas' statements, instantiated at (n, *others) = v."""
        return [lemma.holds(*at(*v)) for lemma, at in self.lemmas]

    def claims(self) -> tuple[Claim, Claim]:
        """The base case and the step, as claims over integer lengths (the reals live in the functions)."""
        sorts = ("int",) * (1 + self.others)
        free = tuple(range(1 + self.others))   # the base case pins the induction variable (position 0) to 0

        def nonnegative(*v: z3.ArithRef) -> list[z3.BoolRef]:
            return [length >= 0 for length in v]

        def base_premises(*v: z3.ArithRef) -> z3.BoolRef:
            return z3.And(*nonnegative(*v), v[0] == 0, *self.starts(*v[1:]), *self.given(*v))

        def step_premises(*v: z3.ArithRef) -> z3.BoolRef:
            return z3.And(*nonnegative(*v), self.holds(*v), *self.steps(*v), *self.given(*v))

        base = Claim(lambda *v: self.holds(*v), lambda *v: z3.BoolVal(True), assuming=base_premises, sorts=sorts,
                     note=f"{self.note}: base case, length 0", real=True, lengths=free[1:])
        step = Claim(lambda *v: self.holds(v[0] + 1, *v[1:]), lambda *v: z3.BoolVal(True), assuming=step_premises,
                     sorts=sorts, note=f"{self.note}: step, length n -> n + 1", real=True, lengths=free)
        return base, step


def reals_of_index(name: str, arity: int = 1) -> z3.FuncDeclRef:
    """An uninterpreted real-valued function of `arity` integer indices (elements, or prefix sums)."""
    return z3.Function(name, *([z3.IntSort()] * arity), z3.RealSort())
