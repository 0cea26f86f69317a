"""Structural patterns that several stages recognise: a matrix product written as sum(a * b), a lookup written as a
one-hot sum, and attention."""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from .dtypes import DType
from .node import Node, structure_rows, toposort
from .ops import ELEMENTWISE, VIEWS, Op

Index = tuple[str, ...]   # an index as symbols, one per axis ("0" for an axis that is not indexed)


@dataclass(frozen=True)
class MatmulMatch:
    """A sum that is a matrix product over an (..., M, K, N) space: `lhs` is constant along N, `rhs` along M."""

    reduce: Node
    lhs: Node
    rhs: Node

    @property
    def dims(self) -> tuple[int, int, int]:
        shape = self.reduce.srcs[0].shape
        return shape[-3], shape[-1], shape[-2]        # M, N, K

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return self.reduce.shape[:-2]


def _constant_along(node: Node, axis: int) -> bool:
    return node.op == Op.EXPAND and node.srcs[0].shape[axis] == 1 and node.shape[axis] > 1


def match_matmul(node: Node) -> MatmulMatch | None:
    """The operands of `node` if it is sum(a * b) over axis -2 of an (..., M, K, N) product, else None.

    `tensorsmith.nn.matmul` lowers a @ b to exactly this: SUM(MUL(EXPAND(a'), EXPAND(b')), axis=-2).
    """
    return _matmul(node, _constant_along, casts=False)


def _matmul(node: Node, constant_along: Callable[[Node, int], bool], casts: bool) -> MatmulMatch | None:
    """sum(a * b) over axis -2 where `constant_along` says a is constant along N and b along M; with
    `casts`, float casts between the operands and the product are looked through."""
    if node.op != Op.SUM or node.srcs[0].op != Op.MUL:
        return None
    product = node.srcs[0]
    rank = product.ndim
    if rank < 3 or node.arg != rank - 2:
        return None
    a, b = (_strip_casts(src) for src in product.srcs) if casts else product.srcs
    for lhs, rhs in ((a, b), (b, a)):
        if constant_along(lhs, rank - 1) and constant_along(rhs, rank - 3):
            return MatmulMatch(node, lhs, rhs)
    return None


# ---------------------------------------------------------------------------------------------------------------
# a lookup: sum over r of (r == ids) * values, which is values at row ids (zero where ids is out of range)

@dataclass(frozen=True)
class GatherMatch:
    """`reduce` sums `values` times a selector that is 1 exactly where the index r along the summed axis equals
    `ids`, so its value is `values` at r = ids, or zero where ids lies outside [0, length).

    `ids` is an integer node that the selector compares r with; `ids_axes` says, for each of its axes, which axis
    of the summed product its index is (None: index 0). `selector` is the product's other factor.
    """

    reduce: Node
    values: Node
    ids: Node
    ids_axes: tuple[int | None, ...]
    selector: Node

    def selector_nodes(self) -> list[Node]:
        """The nodes that make the selector from the ids (comparisons with iotas, casts, views), not the ids' own:
        a lookup reads one row only where they are computed in its kernel, so none may be a buffer of its own."""
        return [node for node in toposort([self.selector], {id(self.ids)}) if node is not self.ids]

    @property
    def length(self) -> int:
        return self.reduce.srcs[0].shape[self.reduce.arg]


ROW = "r"              # the summed axis's index in the symbolic product index
SIGNS = (-1, 0, 1)     # r below, at and above ids: a selector is a function of this sign alone


def match_gather(node: Node) -> GatherMatch | None:
    """The lookup `node` computes, if it is sum(selector * values) with the selector r == ids, else None.

    `tensorsmith.nn.embedding` and `take` write a lookup this way, which the e-graph's rules and Z3 reason about as
    any sum; codegen reads the one row it selects. The selector may be any combination (and, not, casts, the views
    that keep each axis's index) of comparisons between the summed axis's iota and one integer value that does not
    vary along it, provided it is true exactly where they are equal.
    """
    return _gather(node) if node.op == Op.SUM and node.srcs[0].op == Op.MUL else None


@lru_cache(maxsize=4096)
def _gather(node: Node) -> GatherMatch | None:
    product = node.srcs[0]
    if product.shape[node.arg] < 2:
        return None
    index = tuple(ROW if axis == node.arg else f"p{axis}" for axis in range(product.ndim))
    for selector, values in (product.srcs, reversed(product.srcs)):
        atoms: dict[tuple[int, Index], Node] = {}
        table = _truth(selector, index, atoms)
        if table == (False, True, False) and len(atoms) == 1:
            ((_, ids_index), ids), = atoms.items()
            axes = tuple(None if name == "0" else int(name[1:]) for name in ids_index)
            return GatherMatch(node, values, ids, axes, selector)
    return None


# The functions that index (tensorsmith's, and the importers' names for PyTorch's and ONNX's): ids given to them are
# checked against their table when a program is called, as PyTorch checks them; a one-hot sum written by hand (a
# loss with an ignored index of -100) is a sum, whose out-of-range ids select nothing.
INDEXING_APIS = frozenset({"embedding", "take", "index", "index_select", "gather", "gather_nd"})
WHOLE_VIEWS = (Op.RESHAPE, Op.EXPAND, Op.PERMUTE)   # views that keep every element of their source


def lookup_ids(roots: list[Node]) -> dict[str, int]:
    """The inputs that indexing functions' lookups under `roots` take as their ids (through views that keep every
    element), each with the fewest rows such a lookup selects from: an id outside [0, rows) selects none."""
    found: dict[str, int] = {}
    for node in toposort(roots):
        lookup = match_gather(node) if node.api in INDEXING_APIS else None
        source = lookup.ids if lookup is not None else None
        while source is not None and source.op in WHOLE_VIEWS:
            source = source.srcs[0]
        if lookup is not None and source is not None and source.op == Op.INPUT:
            found[source.arg] = min(found.get(source.arg, lookup.length), lookup.length)
    return found


def lookup_table(lookup: GatherMatch) -> Node | None:
    """The input a lookup reads rows of where its values are that input's elements (through views), else None: a
    table computed first is computed whole."""
    node = lookup.values
    while node.op in VIEWS:
        node = node.srcs[0]
    return node if node.op == Op.INPUT else None


def lookup_reads(roots: list[Node]) -> dict[str, int]:
    """The inputs under `roots` that are read only as lookup tables, each with the elements its lookups read (a
    row per id, at most the table)."""
    nodes = toposort(roots)
    lookups = [found for node in nodes if (found := match_gather(node)) is not None]
    tables = [(found, table) for found in lookups if (table := lookup_table(found)) is not None]
    if not tables:
        return {}
    stops = {id(found.reduce) for found, _ in tables}
    elsewhere = {n.arg for n in toposort(roots, stops) if n.op == Op.INPUT}
    for found, _ in tables:     # the selectors: what the ids are computed from is read as a whole
        elsewhere |= {n.arg for src in found.reduce.srcs[0].srcs if src is not found.values
                      for n in toposort([src]) if n.op == Op.INPUT}
    reads: dict[str, int] = {}
    for found, table in tables:
        if table.arg not in elsewhere:
            reads[table.arg] = min(table.size, reads.get(table.arg, 0) + found.reduce.size)
    return reads


def _truth(node: Node, index: Index, atoms: dict[tuple[int, Index], Node]) -> tuple[bool, ...] | None:
    """`node` at `index` as a truth value for each of SIGNS (r - ids below, at, above zero), where it is one; the
    ids it compares r with are collected in `atoms` by (node, index)."""
    op = node.op
    if op in (Op.EXPAND, Op.PERMUTE, Op.RESHAPE):
        mapped = _view_index(node, index)
        return None if mapped is None else _truth(node.srcs[0], mapped, atoms)
    if op == Op.CAST and (node.srcs[0].dtype == DType.BOOL or _float_cast(node)):
        return _truth(node.srcs[0], index, atoms)     # a truth value cast to a number and back keeps its value
    if op == Op.CONSTANT and node.dtype == DType.BOOL:
        return (bool(node.arg),) * len(SIGNS)
    if op == Op.CONSTANT and node.dtype.is_float and float(node.arg) in (0.0, 1.0):
        return (bool(node.arg),) * len(SIGNS)
    if op == Op.MUL:
        a, b = (_truth(src, index, atoms) for src in node.srcs)
        return None if a is None or b is None else tuple(x and y for x, y in zip(a, b))
    if op != Op.LESS_THAN:
        return None
    if node.srcs[0].dtype == DType.BOOL:
        a, b = (_truth(src, index, atoms) for src in node.srcs)
        return None if a is None or b is None else tuple(x < y for x, y in zip(a, b))
    first, second = (_index_term(src, index) for src in node.srcs)
    if first is None or second is None or first[0] == second[0]:    # r compared with an id, not with itself
        return None
    row_first = first[0]
    _, ids, at = second if row_first else first
    if ids.dtype != DType.INT32 or ROW in at:
        return None
    atoms[id(ids), at] = ids
    return tuple((sign < 0) if row_first else (sign > 0) for sign in SIGNS)


def _index_term(node: Node, index: Index) -> tuple[bool, Node, Index] | None:
    """Below the index-keeping views of `node`: (whether it is the iota along the summed axis, it, its index)."""
    while node.op in (Op.EXPAND, Op.PERMUTE, Op.RESHAPE):
        mapped = _view_index(node, index)
        if mapped is None:
            return None
        node, index = node.srcs[0], mapped
    return node.op == Op.IOTA and index[node.arg] == ROW, node, index


# ---------------------------------------------------------------------------------------------------------------
# streaming attention: softmax(score(q @ k^T)) @ v

MASK_LIMIT = -1e4   # a mask constant at or below this puts a masked score far below every unmasked one
Affine = dict[str, float]   # symbol -> coefficient; "" is the constant term


@dataclass(frozen=True)
class AttentionMatch:
    """softmax(s) @ v, with s an elementwise function of one q @ k^T and of indices, over (..., TQ, TK).

    `output` is the P @ V sum over an (..., TQ, TK, DV) space and `v` its right operand (below any cast);
    `qk` is the score matmul over (..., TQ, DQK, TK): its lhs is the q operand, its rhs the k operand.
    `row_max` is max(s) along the keys, `exp` is exp2(exp_scale * (s - row_max)), and the probabilities
    are exp times `norm` (a factor constant along the keys, e.g. 1 / sum(exp)) or, where the normalisation
    comes after the product, exp alone (`norm` None). `mask` is the addend of s that is
    mask_value * (key > query + causal_offset + offset_base), with mask_value <= MASK_LIMIT, where s has one;
    `offset_base` is None, or an integer scalar read at run time (a decode step's position in its cache).
    """

    output: Node
    qk: MatmulMatch
    v: Node
    score: Node
    row_max: Node
    exp: Node
    exp_scale: float
    norm: Node | None
    mask: Node | None = None
    mask_value: float = 0.0
    causal_offset: int | None = None
    offset_base: Node | None = None

    @property
    def q(self) -> Node:
        return self.qk.lhs

    @property
    def k(self) -> Node:
        return self.qk.rhs

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return self.output.shape[:-2]

    @property
    def dims(self) -> tuple[int, int, int, int]:
        tq, tk = self.score.shape[-2:]
        return tq, tk, self.qk.dims[2], self.output.shape[-1]     # TQ, TK, DQK, DV


def attention_index(shape: tuple[int, ...], names: tuple[str, ...]) -> Index:
    """Symbolic index names for the trailing axes of `shape` (batch axes b0, b1, ...), "0" for axes of size 1."""
    batch = tuple(f"b{axis}" for axis in range(len(shape) - len(names)))
    return tuple("0" if dim == 1 else name for dim, name in zip(shape, batch + names))


def match_attention(node: Node) -> AttentionMatch | None:
    """The parts of `node` if it is softmax(s) @ v with s a function of one q @ k^T and of indices, else None.

    `tensorsmith.nn.attention` lowers to this, and so do the forms extraction makes of it (the normalisation
    moved after the product, constants at full shape). Only views that keep each axis's index (expand,
    permute, reshapes that add or drop size-1 axes) are looked through between the parts.
    """
    operands = _product_operands(node)
    if operands is None:
        return None
    lhs, v = operands
    product = node.srcs[0].shape          # (..., TQ, TK, DV)
    full = attention_index(product, ("qi", "kj", "hd"))
    p_node, p_index = _below_views(lhs, full, casts=True)
    score_index = full[:-1]
    if p_node is None or p_index != score_index:
        return None
    found = _probabilities(p_node, score_index)
    if found is None:
        return None
    exp, norm = found
    parts = _exponent(exp, score_index)
    if parts is None:
        return None
    score, row_max, scale = parts
    qk = _score_matmul(score)
    if qk is None or qk.reduce.shape != score.shape or score.shape != product[:-1]:
        return None
    mask = _causal_mask(score, score_index)
    if mask is None:
        return AttentionMatch(node, qk, v, score, row_max, exp, scale, norm)
    return AttentionMatch(node, qk, v, score, row_max, exp, scale, norm, *mask)


def _float_cast(node: Node) -> bool:
    return node.op == Op.CAST and node.dtype.is_float and node.srcs[0].dtype.is_float


def _product_operands(node: Node) -> tuple[Node, Node] | None:
    """The (lhs, rhs) of sum(a * b) over axis -2 of an (..., M, K, N) product, float casts looked through."""
    match = match_loose_matmul(node, casts=True)
    return None if match is None else (match.lhs, match.rhs)


def match_loose_matmul(node: Node, casts: bool = False) -> MatmulMatch | None:
    """Like `match_matmul`, but an operand is also constant along an axis of size 1 (a single query) whatever
    it is, and with `casts` float casts between the operands and the product are looked through."""
    return _matmul(node, _broadcast_along, casts)


def _broadcast_along(node: Node, axis: int) -> bool:
    return node.shape[axis] == 1 or _constant_along(node, axis)


def _strip_casts(node: Node) -> Node:
    while _float_cast(node):
        node = node.srcs[0]
    return node


def _view_index(node: Node, index: Index) -> Index | None:
    """The index into a view's source for views that keep each axis's index, else None."""
    src = node.srcs[0]
    if node.op == Op.EXPAND:
        return tuple("0" if s != d else i for i, s, d in zip(index, src.shape, node.shape))
    if node.op == Op.PERMUTE:
        mapped = [""] * node.ndim
        for out_axis, src_axis in enumerate(node.arg):
            mapped[src_axis] = index[out_axis]
        return tuple(mapped)
    if node.op == Op.RESHAPE and [d for d in node.shape if d != 1] == [d for d in src.shape if d != 1]:
        kept = iter(i for i, d in zip(index, node.shape) if d != 1)
        return tuple("0" if d == 1 else next(kept) for d in src.shape)
    return None


def _below_views(node: Node, index: Index, casts: bool = False) -> tuple[Node | None, Index]:
    """The first node under `node`'s index-keeping views (and float casts, with `casts`), and its index there."""
    while node.op in (Op.EXPAND, Op.PERMUTE, Op.RESHAPE) or (casts and _float_cast(node)):
        if node.op != Op.CAST:
            mapped = _view_index(node, index)
            if mapped is None:
                return None, index
            index = mapped
        node = node.srcs[0]
    return node, index


def _probabilities(node: Node, index: Index) -> tuple[Node, Node | None] | None:
    """(exp, norm) where `node` is exp or exp * norm with norm constant along the keys (index[-1])."""
    if node.op == Op.EXP2:
        return node, None
    if node.op != Op.MUL:
        return None
    for exp_side, norm_side in (node.srcs, reversed(node.srcs)):
        exp, exp_index = _below_views(exp_side, index)
        if exp is None or exp.op != Op.EXP2 or exp_index != index:
            continue
        base, base_index = _below_views(norm_side, index)
        if base is not None and (index[-1] == "0" or index[-1] not in base_index):   # the key index is gone
            return exp, norm_side
    return None


def _exponent(exp: Node, index: Index) -> tuple[Node, Node, float] | None:
    """(s, max(s), c) where exp = exp2(c * (s - max(s))) with c > 0, max along the last axis of s.

    The argument is compared with c * (s - max) as sums of terms (so a regrouped sum still matches): every
    node that is not a sum, a product with a constant, a view or a cast is a term of its own at its index.
    """
    argument = exp.srcs[0]
    row = index[:-1]
    for candidate in toposort([argument]):
        if candidate.op != Op.MAX or candidate.arg != candidate.srcs[0].ndim - 1:
            continue
        score = candidate.srcs[0]
        leaves = {id(candidate): (row, "m")}
        form = _affine(argument, index, leaves, atoms=True)
        scale = -form.get("m", 0.0) if form is not None else 0.0
        if not scale > 0:
            continue
        expected = {key: scale * value for key, value in (_affine(score, index, leaves, atoms=True) or {}).items()}
        expected["m"] = expected.get("m", 0.0) - scale
        if form is not None and _same_form(form, expected):
            return score, candidate, scale
    return None


def _same_form(a: Affine, b: Affine) -> bool:
    return all(math.isclose(a.get(key, 0.0), b.get(key, 0.0), rel_tol=1e-9, abs_tol=1e-12) for key in a.keys() | b.keys())


def _affine(node: Node, index: Index, leaves: dict[int, tuple[Index, str]], atoms: bool = False) -> Affine | None:
    """`node` at `index` as a sum of coefficients times symbols (leaves, index names) plus a constant.

    Where a node is not affine in those: None, or with `atoms` a symbol of its own (the node at that index).
    """
    form: Affine | None = None
    op = node.op
    if id(node) in leaves:
        at, symbol = leaves[id(node)]
        form = {symbol: 1.0} if at == index else None
    elif op == Op.CONSTANT and node.dtype != DType.BOOL:
        form = {"": float(node.arg)}
    elif op == Op.IOTA:
        name = index[node.arg]
        form = {} if name == "0" else {name: 1.0}
    elif op in (Op.EXPAND, Op.PERMUTE, Op.RESHAPE):
        mapped = _view_index(node, index)
        form = None if mapped is None else _affine(node.srcs[0], mapped, leaves, atoms)
    elif op == Op.CAST and node.srcs[0].dtype != DType.BOOL and (node.dtype.is_float or not node.srcs[0].dtype.is_float):
        form = _affine(node.srcs[0], index, leaves, atoms)      # widening, or int to float: the value is kept
    elif op in (Op.ADD, Op.MUL):
        a, b = (_affine(src, index, leaves, atoms) for src in node.srcs)
        if a is not None and b is not None and op == Op.ADD:
            form = {key: a.get(key, 0.0) + b.get(key, 0.0) for key in a.keys() | b.keys()}
        elif a is not None and b is not None:
            for terms, factor in ((a, b), (b, a)):
                if set(factor) <= {""}:
                    form = {key: value * factor.get("", 0.0) for key, value in terms.items()}
                    break
    if form is None and atoms:
        return {f"#{id(node)}@{','.join(index)}": 1.0}
    return form


def _score_matmul(score: Node) -> MatmulMatch | None:
    """The one matmul that `score` is an elementwise function of, where everything else is built from indices and
    inputs read elementwise (a bias, a padding mask: the kernel loads them at each score's indices)."""
    matmuls = [match for node in toposort([score]) if (match := match_loose_matmul(node)) is not None]
    if not matmuls:
        return None
    qk = matmuls[-1].reduce
    above = _depends_on(score, qk)
    for node in toposort([score], {id(qk)}):
        if node is qk:
            continue
        if id(node) in above:            # on the way from the product to the score: elementwise, same shape
            if node.op not in ELEMENTWISE or node.shape != score.shape:
                return None
        elif node.op in (Op.SUM, Op.MAX):
            return None
    return matmuls[-1]


def _depends_on(root: Node, target: Node) -> set[int]:
    """Ids of the nodes of `root`'s cone (target included) whose value depends on `target`."""
    found: set[int] = set()
    for node in toposort([root], {id(target)}):
        if node is target or any(id(src) in found for src in node.srcs):
            found.add(id(node))
    return found


def _causal_mask(score: Node, index: Index) -> tuple[Node, float, int, Node | None] | None:
    """(addend, C, d, base) where an addend of `score` is C * (key > query + d + base) with C <= MASK_LIMIT, else
    None. `base` is None, or an integer scalar the mask reads (a decode step's position: its one query, always
    query 0, need not appear)."""
    addends, stack = [], [score]
    while stack:
        node = stack.pop()
        if node.op == Op.ADD:
            stack.extend(node.srcs)
        else:
            addends.append(node)
    for addend in addends:
        form = _mask_form(addend, index)
        if form is None:
            continue
        value, difference = form      # masked where difference < 0, difference = qi - kj + d (+ base)
        offset = difference.get("", 0.0)
        atoms = [key for key in difference if key.startswith("#")]
        base = _scalar_atom(addend, atoms[0], difference[atoms[0]]) if len(atoms) == 1 else None
        if atoms and base is None:
            continue
        query = difference.get("qi") == 1.0 or ("qi" not in index and "qi" not in difference)
        if (math.isfinite(value) and value <= MASK_LIMIT and query and difference.get("kj") == -1.0
                and set(difference) - set(atoms) <= {"qi", "kj", ""} and float(offset).is_integer()):
            return addend, value, int(offset), base
    return None


def _scalar_atom(root: Node, atom: str, coefficient: float) -> Node | None:
    """The node an affine form's `atom` stands for (`_affine` with atoms) where it is an integer read at one index
    for every element (a scalar broadcast) with coefficient 1, else None."""
    node_id, at = atom[1:].split("@")
    node = next((node for node in toposort([root]) if id(node) == int(node_id)), None)
    if node is None or coefficient != 1.0 or node.dtype.is_float or node.dtype == DType.BOOL:
        return None
    return node if all(name in ("", "0") for name in at.split(",")) else None


def _rounded(dtype: DType) -> bool:
    """Whether positions compared in `dtype` may be rounded (a 16-bit float holds integers exactly only to 256 or
    2048): such a mask hides what the rounded comparison hides, which no offset describes."""
    return dtype.is_float and dtype.itemsize < 4


def _mask_form(node: Node, index: Index) -> tuple[float, Affine] | None:
    """(C, A - B) where `node` at `index` is C * float(A < B) with A, B affine in the index, else None."""
    if node.op in (Op.EXPAND, Op.PERMUTE, Op.RESHAPE):
        mapped = _view_index(node, index)
        return None if mapped is None else _mask_form(node.srcs[0], mapped)
    if node.op == Op.MUL:
        for factor_side, mask_side in (node.srcs, reversed(node.srcs)):
            factor = _affine(factor_side, index, {})
            if factor is None or not set(factor) <= {""}:
                continue
            inner = _mask_form(mask_side, index)
            if inner is not None:
                return inner[0] * factor.get("", 0.0), inner[1]
        return None
    if _float_cast(node) and node.dtype.itemsize >= node.srcs[0].dtype.itemsize:   # widening: C is kept
        return _mask_form(node.srcs[0], index)
    if node.op == Op.CAST and node.dtype.is_float and node.srcs[0].dtype == DType.BOOL:
        condition, at = _below_views(node.srcs[0], index)
        if condition is None or condition.op != Op.LESS_THAN or _rounded(condition.srcs[0].dtype):
            return None
        a, b = (_affine(src, at, {}, atoms=True) for src in condition.srcs)
        if a is None or b is None:
            return None
        return 1.0, {key: a.get(key, 0.0) - b.get(key, 0.0) for key in a.keys() | b.keys()}
    return None


# ---------------------------------------------------------------------------------------------------------------
# an element kept where a condition is false: where(condition, value, x), x a buffer read at the element's index

@dataclass(frozen=True)
class KeptMatch:
    """`node` is where(`condition`, value, `kept`) as `where` writes it (value * pick + kept * (1 - pick), pick the
    bool condition cast), `kept` an INPUT of the node's shape read at the node's own index: the element is the
    buffer's own wherever the condition is false (a KV cache written at a few positions); `value` is what it is
    where the condition holds."""

    condition: Node
    kept: Node
    value: Node


def match_kept(node: Node) -> KeptMatch | None:
    """The condition and the kept buffer of `node`, if it is such a blend, else None."""
    if node.op != Op.ADD or not all(src.op == Op.MUL for src in node.srcs):
        return None
    for chosen, other in (node.srcs, node.srcs[::-1]):
        for pick in chosen.srcs:
            if pick.op != Op.CAST or pick.srcs[0].dtype != DType.BOOL:
                continue
            for kept, rest in (other.srcs, other.srcs[::-1]):
                if kept.op == Op.INPUT and kept.shape == node.shape and _one_minus(rest, pick):
                    value = chosen.srcs[1] if chosen.srcs[0] is pick else chosen.srcs[0]
                    return KeptMatch(pick.srcs[0], kept, value)
    return None


def _one_minus(node: Node, pick: Node) -> bool:
    """`node` is 1 - pick, as 1 + pick * -1."""
    if node.op != Op.ADD:
        return False
    return any(_constant(one, 1) and term.op == Op.MUL and any(s is pick for s in term.srcs)
               and any(_constant(s, -1) for s in term.srcs) for one, term in (node.srcs, node.srcs[::-1]))


def _constant(node: Node, value: float) -> bool:
    """`node` is `value` everywhere: a constant, or one reshaped and expanded."""
    while node.op in (Op.RESHAPE, Op.EXPAND):
        node = node.srcs[0]
    return node.op == Op.CONSTANT and node.arg == value


@dataclass(frozen=True)
class PointWrite:
    """Outputs that each keep a buffer (`match_kept`) but at one position along `axis`, read at run time: the
    condition is index == `position` there, `position` an int32 node read at the fixed index `at` (a decode step's
    cache position). A kernel writing them in place touches that slice alone, not the whole buffer."""

    axis: int
    position: Node
    at: Index


@lru_cache(maxsize=4096)
def match_point_write(outputs: tuple[tuple[str, Node], ...]) -> PointWrite | None:
    """The one axis and position every output's kept blend writes at, where all of them are such blends; else None."""
    found: set[tuple[int, tuple, Index]] = set()
    positions: dict[tuple, Node] = {}
    for _, node in outputs:
        kept = match_kept(node)
        if kept is None:
            return None
        point = _point_of(kept.condition)
        if point is None:
            return None
        axis, position, at = point
        key = _computed_as(position)   # a K and a V write joined in one kernel compute their positions alike
        found.add((axis, key, at))
        positions.setdefault(key, position)
    if len(found) != 1:
        return None
    ((axis, key, at),) = found
    return PointWrite(axis, positions[key], at)


@lru_cache(maxsize=4096)
def _computed_as(node: Node) -> tuple:
    """How `node` is computed, from its leaves: equal for nodes that compute the same value the same way."""
    return tuple(structure_rows(toposort([node]))[0])


def _point_of(condition: Node) -> tuple[int, Node, Index] | None:
    """(axis, position, its index) where `condition` holds exactly where the index along that axis equals one int32
    value the same for every element; else None."""
    for axis in range(condition.ndim):
        if condition.shape[axis] < 2:
            continue
        atoms: dict[tuple[int, Index], Node] = {}
        index = tuple(ROW if a == axis else f"p{a}" for a in range(condition.ndim))
        if _truth(condition, index, atoms) == (False, True, False) and len(atoms) == 1:
            ((_, at), position), = atoms.items()
            if all(part == "0" for part in at):   # the same element for every thread: a scalar of the launch
                return axis, position, at
    return None
