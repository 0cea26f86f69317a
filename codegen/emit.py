"""The expression emitter: renders a kernel body's nodes into CUDA C, one statement per value.

Values are computed at a symbolic index (a tuple of C integer expressions, one per axis). Views never
move data: they rewrite the index and ask for the source's value there. Each (node, index) pair is
emitted once per scope and named `v<N>`; reductions are either supplied by the archetype (a value
already reduced cooperatively for the current row) or refused with `NotFusable`.

Inside a loop that the archetype marks with `begin_invariants(variables)`, a value whose index names none
of the loop's variables (a broadcast operand, a statistic of the row) is emitted once before the loop and
shared by every iteration and every later loop of the scope.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from tensorsmith.ir.dtypes import DType
from tensorsmith.ir.node import Node, squeezed
from tensorsmith.ir.ops import Op
from tensorsmith.ir.patterns import GatherMatch, match_gather

Index = tuple[str, ...]
INLINE_REDUCE_LIMIT = 4   # reductions over at most this many elements are unrolled where used
INDEX_NAME_LENGTH = 40    # a view's index longer than this is bound to a name (Emitter.bind_indices)

COMPUTE_TYPE = {DType.FLOAT32: "float", DType.FLOAT16: "float", DType.BFLOAT16: "float",
                DType.INT32: "int", DType.BOOL: "bool"}
LOAD = {DType.FLOAT16: "__half2float({})", DType.BFLOAT16: "__bfloat162float({})"}
STORE = {DType.FLOAT16: "__float2half_rn({})", DType.BFLOAT16: "__float2bfloat16_rn({})"}
PAIRS = {DType.FLOAT16: ("__half2", "__floats2half2_rn"), DType.BFLOAT16: ("__nv_bfloat162", "__floats2bfloat162_rn")}
# RECIP is the hardware reciprocal (MUFU.RCP, within 2 ulp) rather than IEEE division's correctly rounded
# subroutine: sigmoid and GELU are one reciprocal per element, and IEEE division made GELU compute-bound on the
# H200 (79.9 us at 8192 x 8192 fp16, 81% of copy bandwidth). 2 ulp of fp32 is far below every check's tolerance.
UNARY_C = {Op.EXP2: "exp2f({})", Op.LOG2: "log2f({})", Op.SIN: "sinf({})", Op.SQRT: "sqrtf({})",
           Op.RECIP: "__fdividef(1.0f, {})"}
BINARY_C = {Op.ADD: "({} + {})", Op.MUL: "({} * {})", Op.LESS_THAN: "({} < {})"}
REDUCE_INIT = {(Op.SUM, "float"): "0.0f", (Op.SUM, "int"): "0", (Op.MAX, "float"): "(-TS_INFINITY)",
               (Op.MAX, "int"): "(-2147483647 - 1)"}
REDUCE_COMBINE = {(Op.SUM, "float"): "{} + {}", (Op.SUM, "int"): "{} + {}",
                  (Op.MAX, "float"): "ts_fmax({}, {})", (Op.MAX, "int"): "max({}, {})"}


class NotFusable(Exception):
    """The body cannot be emitted in this archetype because `node` would have to be recomputed off-row."""

    def __init__(self, node: Node, reason: str):
        super().__init__(reason)
        self.node = node


def c_literal(value: float | int | bool, dtype: DType) -> str:
    """A C literal for a constant of this dtype (floats as float32 literals, inf and nan by name)."""
    if dtype == DType.BOOL:
        return "true" if value else "false"
    if dtype == DType.INT32:
        return str(int(value))
    if math.isnan(value):
        return "TS_NAN"
    if math.isinf(value):
        return "TS_INFINITY" if value > 0 else "(-TS_INFINITY)"
    text = repr(float(value))
    return f"{text}f" if text[0] != "-" else f"({text}f)"


def row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))


def linear_index(index: Index, shape: tuple[int, ...]) -> str:
    """The row-major offset of `index` in a contiguous tensor of `shape`."""
    terms = [f"({i})" if stride == 1 else f"({i}) * {stride}"
             for i, stride, dim in zip(index, row_major_strides(shape), shape) if dim != 1]
    return " + ".join(terms) or "0"


def delinearize(flat: str, shape: tuple[int, ...]) -> Index:
    """Per-axis indices of the row-major offset `flat` in `shape`."""
    out = []
    for axis, (stride, dim) in enumerate(zip(row_major_strides(shape), shape)):
        if dim == 1:
            out.append("0")
            continue
        part = flat if stride == 1 else f"({flat}) / {stride}"
        out.append(part if axis == 0 else f"({part}) % {dim}")
    return tuple(out)


def stored_through_views(out: Node) -> tuple[Node, tuple[int, ...], tuple[int, ...]]:
    """`out` as reshapes of permutes of the node a kernel computes: that node, the order of its axes in which the
    permutes store it, and the permuted shape. A kernel that computes the node at index I stores it at the output's
    row-major offset of (I[a] for a in the order) in that shape (a reshape keeps the row-major order): an attention
    writes (B, H, T, D) straight into the (B, T, H * D) rows that the next product reads, with no copy kernel."""
    node = out
    while node.op == Op.RESHAPE:
        node = node.srcs[0]
    shape, order = node.shape, tuple(range(node.ndim))
    while node.op == Op.PERMUTE:
        order = tuple(node.arg[axis] for axis in order)
        node = node.srcs[0]
    return node, order, shape


def view_source_index(node: Node, index: Index) -> tuple[Index, str | None]:
    """The index into a view's source, and a C condition under which the element exists (PAD only)."""
    src = node.srcs[0]
    if node.op == Op.PERMUTE:
        mapped = [""] * node.ndim
        for out_axis, src_axis in enumerate(node.arg):
            mapped[src_axis] = index[out_axis]
        return tuple(mapped), None
    if node.op == Op.EXPAND:
        return tuple("0" if s != d else i for i, s, d in zip(index, src.shape, node.shape)), None
    if node.op == Op.SLICE:
        return tuple(i if lo == 0 else f"({i} + {lo})" for i, (lo, _) in zip(index, node.arg)), None
    if node.op == Op.PAD:
        inside, mapped = [], []
        for i, (lo, hi), dim in zip(index, node.arg, src.shape):
            shifted = i if lo == 0 else f"({i} - {lo})"
            if lo or hi:
                inside.append(f"{shifted} >= 0 && {shifted} < {dim}")
                shifted = f"min(max({shifted}, 0), {dim - 1})"   # clamped so the load stays in bounds
            mapped.append(shifted)
        return tuple(mapped), " && ".join(inside) or None
    if node.op == Op.RESHAPE:
        return _reshape_index(index, node.shape, src.shape), None
    raise AssertionError(f"not a view: {node.op}")


def _reshape_index(index: Index, shape: tuple[int, ...], src_shape: tuple[int, ...]) -> Index:
    """The source's index of a reshape's element at `index`. Size-1 axes are index 0; of the others, the leading
    and trailing axes the reshape keeps are carried across, and those between are re-indexed through their row-major
    offset: rows of 64 tokens viewed as one row axis read (b * 64 + m, k), k still a plain index (a copy's)."""
    dims, src_dims = squeezed(shape), squeezed(src_shape)
    kept = [i for i, d in zip(index, shape) if d != 1]
    lead = 0
    while lead < min(len(dims), len(src_dims)) and dims[lead] == src_dims[lead]:
        lead += 1
    trail = 0
    while (trail < min(len(dims), len(src_dims)) - lead
           and dims[len(dims) - 1 - trail] == src_dims[len(src_dims) - 1 - trail]):
        trail += 1
    middle, src_middle = dims[lead:len(dims) - trail], src_dims[lead:len(src_dims) - trail]
    inner = delinearize(linear_index(tuple(kept[lead:len(kept) - trail]), middle), src_middle) if src_middle else ()
    carried = iter(tuple(kept[:lead]) + inner + tuple(kept[len(kept) - trail:]))
    return tuple("0" if d == 1 else next(carried) for d in src_shape)


@dataclass(frozen=True)
class Gathered:
    """A lookup the emitter read: the variable holding the row it selects, the condition under which that row is
    in the table (else the lookup is zero), and how many statements compute the row (the first `lines`)."""

    lookup: GatherMatch
    row: str
    valid: str
    lines: int


@dataclass
class Emitter:
    """Accumulates the statements that compute values of a kernel body."""

    buffer_shapes: dict[str, tuple[int, ...]]
    lines: list[str] = field(default_factory=list)
    reduced: dict[int, tuple[Index, str]] = field(default_factory=dict)
    accesses: list[tuple[Node, Index]] = field(default_factory=list)        # every load, for planning
    preloaded: dict[tuple[str, Index], str] = field(default_factory=dict)  # (buffer, index) -> register value
    gathers: list[Gathered] = field(default_factory=list)   # every lookup read, for planning
    _memo: list[dict[tuple[int, Index], str]] = field(default_factory=lambda: [{}])
    _invariants: _Invariants | None = None
    _count: int = 0
    indent: int = 1
    bind_indices: bool = False   # name each long index a view computes (only where no loop variable can be in one)

    def fresh(self, prefix: str = "v") -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def line(self, text: str) -> None:
        self.lines.append("  " * self.indent + text)

    def open_scope(self, header: str) -> None:
        """Start a C block (a loop or an if); values emitted inside are forgotten when it closes."""
        self.line(header + " {")
        self.indent += 1
        self._memo.append(dict(self._memo[-1]))

    def close_scope(self) -> None:
        self._memo.pop()
        self.indent -= 1
        self.line("}")

    def begin_invariants(self, variables: tuple[str, ...]) -> None:
        """Values emitted from here until `end_invariants` whose index names none of `variables` (the loop's, which
        must open next) go before the loop, in the current scope."""
        pattern = re.compile(r"\b(" + "|".join(map(re.escape, variables)) + r")\b")
        self._invariants = _Invariants(pattern, len(self.lines), self.indent, self._memo[-1])

    def end_invariants(self) -> None:
        self._invariants = None

    def value(self, node: Node, index: Index) -> str:
        """A C expression holding `node`'s value at `index` (emitting the statements it needs)."""
        key = (id(node), index)
        hoist = self._invariants
        if hoist is not None and not any(hoist.variables.search(part) for part in index):
            if key not in hoist.memo:
                hoist.memo[key] = self._emit_before_loop(node, index, hoist)
            return hoist.memo[key]
        memo = self._memo[-1]
        if key not in memo:
            memo[key] = self._emit(node, index)
        return memo[key]

    def _emit_before_loop(self, node: Node, index: Index, hoist: _Invariants) -> str:
        """Emit `node` at `index` where the loop begins (its sources' indices name no loop variable either)."""
        saved = self.lines, self.indent, self._memo, self._invariants
        self.lines, self.indent, self._memo, self._invariants = [], hoist.indent, [hoist.memo], None
        try:
            name = self._emit(node, index)
            hoisted = self.lines
        finally:
            self.lines, self.indent, self._memo, self._invariants = saved
        self.lines[hoist.position:hoist.position] = hoisted
        hoist.position += len(hoisted)
        return name

    def _bind(self, node: Node, expr: str) -> str:
        name = self.fresh()
        self.line(f"const {COMPUTE_TYPE[node.dtype]} {name} = {expr};")
        return name

    def _emit(self, node: Node, index: Index) -> str:
        op = node.op
        if op == Op.INPUT:
            self.accesses.append((node, index))
            if (node.arg, index) in self.preloaded:
                return self.preloaded[node.arg, index]
            load = f"g_{node.arg}[{linear_index(index, self.buffer_shapes[node.arg])}]"
            return self._bind(node, LOAD.get(node.dtype, "{}").format(load))
        if op == Op.CONSTANT:
            return c_literal(node.arg, node.dtype)
        if op == Op.IOTA:
            return f"((int)({index[node.arg]}))"
        if op in (Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.SLICE, Op.PAD):
            src_index, inside = view_source_index(node, index)
            if self.bind_indices:
                src_index = tuple(self._named_index(part) for part in src_index)
            inner = self.value(node.srcs[0], src_index)
            if inside is None:
                return inner
            zero = c_literal(0, node.dtype)
            return self._bind(node, f"({inside}) ? {inner} : {zero}")
        if op == Op.CONTIGUOUS:
            return self.value(node.srcs[0], index)
        if op in (Op.SUM, Op.MAX):
            return self._reduced_value(node, index)
        args = [self.value(src, index) for src in node.srcs]
        return self._bind(node, self._compute(node, args))

    def _named_index(self, part: str) -> str:
        """`part`, or where it is long, a name bound to it: each view writes its source's index in terms of its own,
        so inlined through a chain of reshapes and pads (a pooling window's) the text grows by a factor a view (one
        kernel of two pools was 4.7 MB of C that NVRTC took 26 s over); named once, each index is one line."""
        if len(part) <= INDEX_NAME_LENGTH or part.isidentifier():
            return part
        key = (-1, (part,))     # in the scope's memo beside the values (no node has id -1)
        memo = self._memo[-1]
        if key not in memo:
            memo[key] = self.fresh("i")
            self.line(f"const idx_t {memo[key]} = {part};")
        return memo[key]

    def _compute(self, node: Node, args: list[str]) -> str:
        op = node.op
        if op in UNARY_C:
            return UNARY_C[op].format(*args)
        if op in BINARY_C:
            return BINARY_C[op].format(*args)
        if op == Op.MOD:
            return f"fmodf({args[0]}, {args[1]})" if node.dtype.is_float else f"({args[0]} % {args[1]})"
        if op == Op.CAST:
            src = node.srcs[0].dtype
            if node.dtype == DType.BOOL:
                return f"({args[0]} != 0)"
            if node.dtype.is_float and src.is_float:
                return args[0]
            return f"(({COMPUTE_TYPE[node.dtype]}){args[0]})"
        raise AssertionError(f"no C form for {op}")

    def _reduced_value(self, node: Node, index: Index) -> str:
        if (lookup := match_gather(node)) is not None:
            return self._gather(lookup, index)
        if is_inline_reduce(node):
            return self._inline_reduce(node, index)
        if id(node) not in self.reduced:
            raise NotFusable(node, f"{node.op} is not reduced cooperatively in this kernel")
        row_index, name = self.reduced[id(node)]
        if len(index) != len(row_index) or any(at != row and size != 1   # a unit axis has one index
                                               for at, row, size in zip(index, row_index, node.shape)):
            raise NotFusable(node, f"{node.op} is needed at {index}, not at the current row {row_index}")
        return name

    def _inline_reduce(self, node: Node, index: Index) -> str:
        """A reduction over a few elements, unrolled where it is used (so `maximum` stays pointwise)."""
        axis = node.arg
        acc = reduce_init(node)
        for j in range(node.srcs[0].shape[axis]):
            element = self.value(node.srcs[0], index[:axis] + (str(j),) + index[axis:])
            acc = element if j == 0 else reduce_combine(node, acc, element)
        return self._bind(node, acc)

    def _gather(self, lookup: GatherMatch, index: Index) -> str:
        """A one-hot sum read as the one row it selects: values at r = ids, zero where ids is out of range."""
        axis, length = lookup.reduce.arg, lookup.length
        product_index = index[:axis] + ("0",) + index[axis:]
        ids = self.value(lookup.ids, tuple("0" if a is None else product_index[a] for a in lookup.ids_axes))
        row = self.fresh("row")
        self.line(f"const int {row} = min(max({ids}, 0), {length - 1});   // clamped: the load stays in bounds")
        self.gathers.append(Gathered(lookup, row, f"({ids} >= 0 && {ids} < {length})", len(self.lines)))
        if self._invariants is not None:    # in a loop, and the row depends on its variables: so do the row's loads
            self._invariants.add_variable(row)
        picked = self.value(lookup.values, index[:axis] + (row,) + index[axis:])
        zero = c_literal(0, lookup.reduce.dtype)
        return self._bind(lookup.reduce, f"({ids} >= 0 && {ids} < {length}) ? {picked} : {zero}")

    def store(self, buffer: str, dtype: DType, index: Index, value: str, shape: tuple[int, ...] | None = None) -> None:
        """Write `value` at `index` of `buffer`; at `index` of `shape` where the buffer is a reshape of that (the same
        elements in the same row-major order)."""
        offset = linear_index(index, shape or self.buffer_shapes[buffer])
        self.line(f"g_{buffer}[{offset}] = {STORE.get(dtype, '{}').format(value)};")


@dataclass
class _Invariants:
    """Where a loop's invariant values go: before the loop, in the scope (and memo) that encloses it."""

    variables: re.Pattern[str]
    position: int
    indent: int
    memo: dict[tuple[int, Index], str]

    def add_variable(self, name: str) -> None:
        """`name` is bound inside the loop: a value whose index names it is not invariant."""
        self.variables = re.compile(f"{self.variables.pattern}|\\b{re.escape(name)}\\b")


LAST_AXIS_INDEX = re.compile(r"\bk\b")   # the element index along the last axis in the templates' vector loops
LOOKUP_ROW = re.compile(r"\brow\d+\b")   # the row a lookup selects (Emitter._gather), known only where it is read


def vector_loadable(index: Index) -> bool:
    """Whether a template may load the elements at `index` for a thread's VEC values of the last axis (`k`) ahead of
    its loop, with one vector load: indexed by k along the last axis alone, and at no looked-up row."""
    return (bool(index) and index[-1] == "k" and not any(LAST_AXIS_INDEX.search(part) for part in index[:-1])
            and not any(LOOKUP_ROW.search(part) for part in index))


def ceil_div(a: int, b: int) -> int:
    """a / b rounded up, at least 1: the blocks (or loop steps) that cover `a` items `b` at a time."""
    return max(1, -(-a // b))


def is_inline_reduce(node: Node) -> bool:
    """Whether a reduction is computed in place rather than cooperatively: short enough to unroll, or a lookup (a
    one-hot sum reads its one row)."""
    return node.op in (Op.SUM, Op.MAX) and (node.srcs[0].shape[node.arg] <= INLINE_REDUCE_LIMIT
                                            or match_gather(node) is not None)


def reduce_init(node: Node) -> str:
    return REDUCE_INIT[(node.op, COMPUTE_TYPE[node.dtype])]


def reduce_combine(node: Node, acc: str, value: str) -> str:
    return REDUCE_COMBINE[(node.op, COMPUTE_TYPE[node.dtype])].format(acc, value)


def pair_store(emitter: Emitter, value: str, buffer: str, dtype: DType, index: Index) -> dict | None:
    """An output's value (`emitter`'s statements, then `value`) for a template that stores a lane's two neighbouring
    elements of a 16-bit output with one 4-byte store at `index` (its last axis even, so is its offset: outputs
    and intermediates are allocated at least 16-byte aligned); None for other dtypes."""
    if dtype not in PAIRS:
        return None
    vector, pack = PAIRS[dtype]
    return {"lines": "\n".join(emitter.lines), "value": value, "vector": vector, "pack": pack,
            "target": f"g_{buffer}[{linear_index(index, emitter.buffer_shapes[buffer])}]"}
