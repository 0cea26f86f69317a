"""Integer index expressions of the abstract-expression check: affine maps with floor-division and remainder atoms.

An `Index` is `sum(coeff * atom) + const`, its terms sorted, over atoms with known bounds: an output coordinate
`("c", axis, size)`, a reduction's bound variable `("r", level, size)`, `("div", index, c)` and `("mod", index, c)`.
Views map an output index to their source's (`view_index`), and reshapes go through the row-major offset, so the
division and remainder of an affine offset are simplified by the bounds of its terms: `(6 i + j) // 6` is `i` when
`0 <= j < 6`, and `c * (a // c) + a % c` is `a`. Equal maps that these rules do not bring to one form stay apart
here; the checker hands them to Z3 as integer arithmetic, which can still show them equal.
"""
from __future__ import annotations

import itertools
import math
import weakref
from functools import lru_cache
from collections import defaultdict

from tensorsmith.ir.node import Node
from tensorsmith.ir.ops import Op

Atom = tuple   # ("c", axis, size) | ("r", level, size) | ("div", Index, c) | ("mod", Index, c)


class Index:
    """An affine combination of atoms: `terms` are (atom, coefficient) pairs, sorted, no zero coefficients.

    Interned (`Index.of`): equal indices are one object, so an index hashes and compares by identity, and the atoms
    that hold it do too (hashing nested indices by value cost more than building them)."""

    __slots__ = ("terms", "const", "serial", "bound", "__weakref__")
    _interned: "weakref.WeakValueDictionary[tuple, Index]" = weakref.WeakValueDictionary()
    _made = itertools.count()

    def __init__(self, terms: tuple[tuple[Atom, int], ...], const: int, serial: int):
        self.terms, self.const, self.serial = terms, const, serial
        self.bound: frozenset = frozenset().union(*(  # the reductions' variables it mentions, inside divisions too
            {atom} if atom[0] == "r" else frozenset() if atom[0] == "c" else atom[1].bound for atom, _ in terms))

    @classmethod
    def of(cls, terms: tuple[tuple[Atom, int], ...] = (), const: int = 0) -> "Index":
        key = (terms, const)
        found = cls._interned.get(key)
        if found is None:
            found = cls._interned[key] = cls(terms, const, next(cls._made))
        return found

    def __repr__(self) -> str:
        return f"Index({self.terms!r}, {self.const})"

    def __add__(self, other: "Index") -> "Index":
        return affine([*self.terms, *other.terms], self.const + other.const)

    def scaled(self, factor: int) -> "Index":
        return affine([(atom, coeff * factor) for atom, coeff in self.terms], self.const * factor)

    def shifted(self, offset: int) -> "Index":
        return Index.of(self.terms, self.const + offset)

    def bounds(self) -> tuple[int, int]:
        """The least and the greatest value over the atoms' ranges."""
        low = high = self.const
        for atom, coeff in self.terms:
            a, b = atom_bounds(atom)
            low += min(coeff * a, coeff * b)
            high += max(coeff * a, coeff * b)
        return low, high


def constant(value: int) -> Index:
    return Index.of((), value)


def variable(kind: str, position: int, size: int) -> Index:
    """A coordinate ("c") or a bound variable ("r") ranging over [0, size); the only value of a size-1 range is 0."""
    return constant(0) if size == 1 else Index.of((((kind, position, size), 1),))


def atom_bounds(atom: Atom) -> tuple[int, int]:
    if atom[0] in ("c", "r"):
        return 0, atom[2] - 1
    low, high = atom[1].bounds()
    if atom[0] == "div":
        return low // atom[2], high // atom[2]
    return (low, high) if 0 <= low and high < atom[2] else (0, atom[2] - 1)


def affine(terms: list[tuple[Atom, int]], const: int) -> Index:
    """The sum of `terms` with like atoms collected, and `c * (a // c) + a % c` folded back into `a`."""
    collected: dict[Atom, int] = defaultdict(int)
    for atom, coeff in terms:
        collected[atom] += coeff
    for atom in [a for a in collected if a[0] == "div"]:
        _, inner, divisor = atom
        remainder = ("mod", inner, divisor)
        step = collected.get(remainder, 0)
        if step and collected[atom] == step * divisor:
            del collected[atom], collected[remainder]
            return affine([*collected.items(), *((a, c * step) for a, c in inner.terms)], const + inner.const * step)
    return Index.of(tuple(sorted(((a, c) for a, c in collected.items() if c), key=_order)), const)


def renamed_index(index: Index, mapping: dict[Atom, Atom]) -> Index:
    """`index` with the variables in `mapping` renamed (inside divisions too)."""
    terms = []
    for atom, coeff in index.terms:
        if atom[0] in ("c", "r"):
            terms.append((mapping.get(atom, atom), coeff))
        else:
            terms.append(((atom[0], renamed_index(atom[1], mapping), atom[2]), coeff))
    return affine(terms, index.const)


def _order(term: tuple[Atom, int]) -> tuple:
    """Terms sorted by atom: variables by kind, position and size, divisions by their index's serial number."""
    atom = term[0]
    return (atom[0], atom[1] if atom[0] in ("c", "r") else atom[1].serial, atom[2])


def _split(index: Index, divisor: int) -> tuple[Index, Index]:
    """index = divisor * whole + rest, the terms whose coefficients `divisor` divides in `whole`."""
    whole = [(atom, coeff // divisor) for atom, coeff in index.terms if coeff % divisor == 0]
    rest = [(atom, coeff) for atom, coeff in index.terms if coeff % divisor]
    return affine(whole, index.const // divisor), affine(rest, index.const % divisor)


@lru_cache(maxsize=1 << 16)
def floordiv(index: Index, divisor: int) -> Index:
    if divisor == 1:
        return index
    whole, rest = _split(index, divisor)
    low, high = rest.bounds()
    if low // divisor == high // divisor:
        return whole.shifted(low // divisor)
    return whole + Index.of(((("div", rest, divisor), 1),))


@lru_cache(maxsize=1 << 16)
def remainder(index: Index, divisor: int) -> Index:
    if divisor == 1:
        return constant(0)
    _, rest = _split(index, divisor)
    low, high = rest.bounds()
    if low // divisor == high // divisor:
        return rest.shifted(-(low // divisor) * divisor)
    return Index.of(((("mod", rest, divisor), 1),))


def strides(shape: tuple[int, ...]) -> list[int]:
    """Row-major strides of `shape`."""
    return [math.prod(shape[k + 1:]) for k in range(len(shape))]


@lru_cache(maxsize=1 << 16)
def reshaped(index: tuple[Index, ...], shape: tuple[int, ...], source: tuple[int, ...]) -> tuple[Index, ...]:
    """The index of `source` at the same row-major offset as `index` in `shape`."""
    offset = constant(0)
    for position, stride in zip(index, strides(shape)):
        offset = offset + position.scaled(stride)
    return tuple(constant(0) if size == 1 else remainder(floordiv(offset, stride), size)
                 for size, stride in zip(source, strides(source)))


Guard = tuple[Index, int, int]   # low <= index < high


def view_index(node: Node, index: tuple[Index, ...]) -> tuple[tuple[Index, ...], list[Guard]]:
    """The index of the view's source that `node` reads at `index`, and the guards under which it reads it (a pad
    reads zero elsewhere)."""
    source = node.srcs[0].shape
    if node.op == Op.RESHAPE:
        return reshaped(index, node.shape, source), []
    if node.op == Op.PERMUTE:
        moved = [constant(0)] * len(index)
        for axis, position in zip(node.arg, index):
            moved[axis] = position
        return tuple(moved), []
    if node.op == Op.EXPAND:
        return tuple(constant(0) if size == 1 else position for size, position in zip(source, index)), []
    if node.op == Op.SLICE:
        return tuple(position.shifted(start) for position, (start, _) in zip(index, node.arg)), []
    if node.op == Op.PAD:
        guards = [(position, before, before + size) for position, (before, _), size in zip(index, node.arg, source)]
        return tuple(position.shifted(-before) for position, (before, _) in zip(index, node.arg)), guards
    raise ValueError(f"{node.op} is not a view")
