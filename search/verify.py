"""Random testing: a candidate counts only once it matches the reference interpreter on fresh inputs."""
from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from statistics import NormalDist
from typing import Iterable, Mapping

import numpy as np

from tensorsmith.ir.interpreter import evaluate_nodes
from tensorsmith.ir.ops import VIEWS, Op
from tensorsmith.ir.patterns import match_loose_matmul, match_matmul

from tensorsmith.ir.dtypes import DType, host_float_dtype, round_to_host
from tensorsmith.ir.errors import TensorsmithError
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.host_arrays import Request, drawn, drawn_many
from tensorsmith.ir.interpreter import check_inputs, evaluate, graph_lookup_ids, held_sizes, to_numpy
from tensorsmith.ir.kernel_program import ExecutionMemo, KernelProgram
from tensorsmith.ir.node import Node, toposort

from .error_bound import relative_error_bounds

# Relative L2 error allowed for an output stored in this dtype (METHOD.md's figures).
TOLERANCE = {DType.FLOAT32: 1e-5, DType.FLOAT16: 1e-2, DType.BFLOAT16: 1e-2, DType.INT32: 0.0, DType.BOOL: 0.0}


class VerificationError(TensorsmithError, AssertionError):
    """A candidate program disagrees with the reference interpreter."""


class NoiseOnlyError(VerificationError):
    """A candidate program matched the reference only within the graph's own rounding noise on every draw made: it
    may be right (an output that cancels), but nothing shows it; more draws, or the exact check, may."""

    def __init__(self, message: str, checks: list[Check]):
        super().__init__(message)
        self.checks = checks   # the last draw's, within the noise allowance


class InconclusiveError(NoiseOnlyError):
    """On every draw made, some value of the graph overflowed its dtype where the float64 reference did not: the
    graph as written gives inf there, so no float comparison judges the candidate; the exact check may."""


class TooLargeToVerify(TensorsmithError, ValueError):
    """The graph's inputs and float64 reference do not fit in this machine's memory, so it cannot be verified here."""


def computed_sizes(graph: Graph) -> list[int]:
    """Elements of each array evaluating `graph` makes: every node but its inputs, its views (numpy views of their
    source) and its matmuls' (..., M, K, N) products (evaluated as matmuls)."""
    nodes = toposort(graph.outputs.values())
    products = {id(m.reduce.srcs[0]) for n in nodes if (m := match_matmul(n)) is not None}
    return [int(np.prod(n.shape, dtype=np.int64)) for n in nodes
            if id(n) not in products and n.op not in VIEWS and n.op != Op.INPUT]


def verification_bytes(graph: Graph) -> int:
    """About how much memory verifying `graph` takes: each input as the host holds it (float16 in 2 bytes, the
    reference widening a weight a block at a time), the largest array the reference holds (a streamed reduction
    holds its blocks, not its source), each output from both sides."""
    def elements(node: Node) -> int:
        return int(np.prod(node.shape, dtype=np.int64))

    def held(node: Node) -> int:
        return host_float_dtype(node.dtype).itemsize if node.dtype.is_float else 4
    return (sum(held(node) * elements(node) for node in graph.inputs.values())
            + 16 * max(held_sizes(graph.outputs.values()), default=0) + 16 * sum(map(elements, graph.outputs.values())))


def meets_tolerance(graph: Graph, checks: list[Check]) -> bool:
    """Whether every output's error is within its dtypes' own tolerance, not only within rounding noise."""
    return bool(checks) and all(check.error <= tolerance(graph.outputs[check.output]) for check in checks)


def available_memory() -> int | None:
    """Bytes of memory this machine has free (MemAvailable), or None where that cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_verifiable(graph: Graph) -> None:
    """Raise TooLargeToVerify, in one line, where verifying `graph` would not fit in memory: said before a compile
    starts rather than as a MemoryError after its search."""
    need, free = verification_bytes(graph), available_memory()
    if free is not None and need > free:
        raise TooLargeToVerify(f"graph {graph.name!r} is too large to verify on this machine: its random inputs and"
                               f" float64 reference take about {need / 2**30:.1f} GiB and {free / 2**30:.1f} GiB are"
                               f" free; compile it at a smaller size (its kernels do not depend on the data) or where"
                               f" there is more memory")


@dataclass(frozen=True)
class Check:
    """One output compared with the reference: its relative L2 error and the tolerance it had to meet."""

    output: str
    error: float
    tolerance: float
    inconclusive: bool = False   # the graph at its own dtypes overflows on this draw where the reference does not

    @property
    def ok(self) -> bool:
        return bool(np.isfinite(self.error)) and self.error <= self.tolerance


def weight_scales(graph: Graph) -> dict[str, float]:
    """1/sqrt(K) for each input that is a weight matrix: a 2-D input that some matrix product reads, through views
    only, as its right operand over K terms (`x @ W`, and `nn.linear`'s `x @ W.T`); the smallest where several do.

    Drawn at that scale, as initialisers draw weights (fan-in), a product keeps its left operand's magnitude
    instead of growing by sqrt(K) a layer, so that the float16 values of a deep realistic layer (a SwiGLU MLP at
    4096 x 11008) stay in range and the float64 reference is not the only one that does not overflow. A product of
    one row (a decode step's) counts too: drawn at scale 1, its 2048 x 8192 weights overflow float16."""
    scales: dict[str, float] = {}
    for node in toposort(graph.outputs.values()):
        match = match_loose_matmul(node)
        if match is None:
            continue
        source = match.rhs
        while source.op in VIEWS:
            source = source.srcs[0]
        k = match.dims[2]
        if source.op == Op.INPUT and source.ndim == 2 and k > 0:   # K = 0: an empty weight, nothing to scale
            scales[source.arg] = min(scales.get(source.arg, 1.0), 1.0 / float(np.sqrt(k)))
    return scales


def random_inputs(graph: Graph, seed: int, scale: float = 1.0,
                  only: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Fresh inputs for `graph` (or those named in `only`): normal floats (never zeros; weight matrices at their
    `weight_scales`, the rest standard), small ints (a lookup's ids: rows of its table), random bools. Each input is
    drawn from generators of its own, all of them at once on every core (host_arrays.drawn_many): a real-size
    model's weights take seconds."""
    weights = weight_scales(graph)
    rows = graph_lookup_ids(graph)
    names = set(graph.inputs if only is None else only)
    requests: dict[str, Request] = {}
    for key, (name, node) in enumerate(graph.inputs.items()):
        if name not in names:
            continue
        if node.dtype.is_float:
            factor = np.float32(scale * weights.get(name, 1.0))
            values = partial(_normal, factor=factor, dtype=node.dtype)
            requests[name] = (node.shape, key, values, host_float_dtype(node.dtype))
        elif node.dtype == DType.INT32:    # a lookup's ids select rows of its table
            low, high = (0, rows[name]) if name in rows else (-100, 100)
            requests[name] = (node.shape, key, partial(_integers, low=low, high=high), np.int32)
        else:
            requests[name] = (node.shape, key, _bools, np.bool_)
    return dict(zip(requests, drawn_many(seed, list(requests.values()))))


def _normal(rng: np.random.Generator, n: int, factor: np.float32, dtype: DType) -> np.ndarray:
    """Normal values at scale `factor`, as `dtype` holds them: a float32 draw rounded once, or, for the 16-bit
    dtypes, a draw among NORMAL_LEVELS equally likely values, in a third of the time (a real-size model's weights
    are billions of them)."""
    if dtype in (DType.FLOAT16, DType.BFLOAT16):
        return np.take(_normal_levels(float(factor), dtype), rng.integers(0, NORMAL_LEVELS, n, dtype=np.uint16))
    values = rng.standard_normal(n, dtype=np.float32)
    if factor != 1.0:
        values *= factor
    return round_to_host(values, dtype)


NORMAL_LEVELS = 1 << 16   # the values a 16-bit float input is drawn among: as many as the dtype has


@lru_cache(maxsize=64)
def _normal_levels(factor: float, dtype: DType) -> np.ndarray:
    """The standard normal's quantiles at the middles of NORMAL_LEVELS equal slices of probability, times `factor`,
    rounded to `dtype` as the host holds it: drawing among them uniformly is drawing from the normal, to within
    the dtype's own rounding (its tails cut at 4.3 sigma)."""
    return round_to_host(_standard_levels() * np.float32(factor), dtype)


@lru_cache(maxsize=1)
def _standard_levels() -> np.ndarray:
    quantile = NormalDist().inv_cdf
    return np.array([quantile((i + 0.5) / NORMAL_LEVELS) for i in range(NORMAL_LEVELS)], np.float32)


def _integers(rng: np.random.Generator, n: int, low: int, high: int) -> np.ndarray:
    return rng.integers(low, high, n, dtype=np.int32)


def _bools(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.random(n) < 0.5


def _uniform(rng: np.random.Generator, n: int, bound: float, dtype: DType) -> np.ndarray:
    values = rng.random(n, dtype=np.float32)
    values *= np.float32(2 * bound)
    values -= np.float32(bound)
    return round_to_host(values, dtype)


def relative_l2(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref|| / ||ref|| in float64 (absolute error where the reference is all zero); NaN stays NaN."""
    out64, ref64 = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    if out64.shape != ref64.shape:
        return float("inf")
    if np.isfinite(ref64).all():   # the common case, without masks (outputs of 64M elements: 0.4 s, not 1.1)
        if not np.isfinite(out64).all():
            return float("nan")
        diff = out64 - ref64 if out64 is out or out64 is ref else np.subtract(out64, ref64, out=out64)
        norm = np.linalg.norm(ref64.ravel())
        diff_norm = np.linalg.norm(diff.ravel())
        return float(diff_norm / norm) if norm > 0 else float(diff_norm)
    if not np.all(np.isfinite(out64) == np.isfinite(ref64)):
        return float("nan")
    finite = np.isfinite(ref64)
    diff_norm = np.linalg.norm(out64[finite] - ref64[finite])
    norm = np.linalg.norm(ref64[finite])
    return float(diff_norm / norm) if norm > 0 else float(diff_norm)


def compare(graph: Graph, outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
            inputs: Mapping[str, np.ndarray] | None = None, max_allowance: float = math.inf) -> list[Check]:
    """Each output's error against the reference, with the tolerance of its dtype. Given the `inputs`, an output that
    fails it may instead lie within ROUNDING_NOISE times what the graph's own rounding moves it (`rounding_noise`),
    or within the bound on what rounding may move it (`error_bound.relative_error_bounds`), at most `max_allowance`
    unless the output is all noise (`_allowance`); one that fails where the graph at its own dtypes overflows (its
    noise is NaN) is marked inconclusive: that draw cannot judge it."""
    checks = [Check(name, relative_l2(outputs[name], reference[name]), tolerance(node))
              for name, node in graph.outputs.items()]
    if inputs is None or all(check.ok for check in checks):
        return checks
    noise = rounding_noise(graph, inputs, reference)
    bounds = relative_error_bounds(graph, inputs, reference)
    return [c if c.ok else _judged(c, noise[c.output], bounds[c.output], max_allowance) for c in checks]


def _judged(check: Check, noise: float, bound: float, max_allowance: float) -> Check:
    """A failed check given the graph's own rounding noise on its draw, and the bound on what rounding may move it
    (error_bound.py, where finite): allowed the larger, or inconclusive where the graph overflows its dtypes."""
    if not np.isfinite(noise):
        return Check(check.output, check.error, check.tolerance, inconclusive=True)
    rounding = max(ROUNDING_NOISE * noise, bound if np.isfinite(bound) else 0.0)
    return Check(check.output, check.error, max(check.tolerance, _allowance(rounding, max_allowance)))


def _allowance(rounding: float, max_allowance: float) -> float:
    """What rounding may move the output, at most `max_allowance`, except for an output that is all noise (rounding
    may move it 100% or more from the float64 reference, as a mean of normalised values): no float comparison can
    judge it, so it is allowed that, and the exact check is what shows its program right."""
    return rounding if rounding >= 1.0 else min(rounding, max_allowance)


ROUNDING_NOISE = 4.0   # a faithful program rounds elsewhere than the graph evaluated at its own precision does: a few
                       # times that evaluation's distance from the float64 reference is what such a program may differ


def rounding_noise(graph: Graph, inputs: Mapping[str, np.ndarray],
                   reference: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Per output, how far the graph evaluated at its own precision (each value rounded to its dtype) lies from the
    float64 reference: large only where an output cancels what it sums (a bfloat16 mean of terms summing to nearly
    zero), where no program that stores the graph's dtypes can be closer. NaN where that evaluation overflows."""
    values = evaluate_nodes(graph.outputs.values(), check_inputs(graph, inputs, narrow=True), rounded=True,
                            roots_only=True)
    return {name: relative_l2(values[id(node)], reference[name]) for name, node in graph.outputs.items()}


def overflow_site(graph: Graph, inputs: Mapping[str, np.ndarray]) -> str:
    """Where the graph evaluated at its own precision first gives inf or NaN from finite operands on `inputs`, said
    as ", first at <op> (<dtype>, <shape>) from <the user's line>", or "" where it does not."""
    found: list[Node] = []
    finite: dict[int, bool] = {}   # whether each value the evaluation computed is finite (or not a float)

    def operands_finite(node: Node) -> bool:
        """Whether every value `node` is computed from is finite: its sources, or, for a source the evaluation never
        computed (a matrix product's broadcast operands, a lookup's one-hot), what that source is computed from."""
        stack = list(node.srcs)
        while stack:
            src = stack.pop()
            if id(src) not in finite:
                stack.extend(src.srcs)
            elif not finite[id(src)]:
                return False
        return True

    def watch(node: Node, value: np.ndarray) -> None:
        finite[id(node)] = not node.dtype.is_float or bool(np.all(np.isfinite(value)))
        if not finite[id(node)] and operands_finite(node):
            found.append(node)
            raise _OutOfRange(node)
    try:
        evaluate_nodes(graph.outputs.values(), check_inputs(graph, inputs, narrow=True), rounded=True,
                       roots_only=True, watch=watch)
    except _OutOfRange:
        node = found[0]
        origin = f" from {node.where}" if node.where else ""
        return f", first at {node.op.name.lower()} ({node.dtype.value}, shape {node.shape}){origin}"
    return ""


def tolerance(output: Node) -> float:
    """The loosest tolerance of any dtype on the way to `output`: a float16 temporary rounds like a float16 output."""
    return max(TOLERANCE[node.dtype] for node in toposort([output]) if node.dtype.is_float or node is output)


SHORT_MAX = 4            # a max over this many elements or fewer is elementwise in disguise
MEMO_SHARE = 0.25         # of this machine's memory: what the remembered draws may hold together (inputs and reference
                          # outputs; a 16-layer Llama-3.2-1B's two draws hold about 6 GB, regenerated 10 s a candidate)
MEMO_FLOOR = 1 << 30      # bytes they may hold wherever the machine's memory cannot be read
EXECUTION_SHARE = 0.25    # of those bytes: what one draw's memo of kernel outputs may hold
LARGE_MAGNITUDE = 80.0   # softmax and log-sum-exp inputs up to +-80: exp overflows float32 unless the max is taken


Draw = tuple[dict[str, np.ndarray], dict[str, np.ndarray]]   # inputs, and the reference's outputs on them


MAX_SKIPPED = 2          # inconclusive draws made up for by as many more, at most


LARGE_DRAW = -1          # the memo's key of the large-magnitude draw (drawn with seed + LARGE_SEED_OFFSET)
LARGE_SEED_OFFSET = 1000


def verify_program(graph: Graph, program: KernelProgram, seed: int, draws: int = 2,
                   large: bool = False, memo: dict[int, Draw | None] | None = None,
                   max_draws: int | None = None, executions: dict[int, ExecutionMemo] | None = None) -> list[Check]:
    """Execute the KernelProgram in numpy on `draws` fresh input sets (more, up to `max_draws`, while none has met
    the dtypes' own tolerances); raise VerificationError on a mismatch, else return the last of those draws' checks.
    A draw on which the graph overflows its own dtypes is inconclusive and made up for by another (MAX_SKIPPED at
    most); InconclusiveError where no draw was conclusive.

    With `large`, a softmax-like graph (a max reduction and an exponential) also gets a draw uniform in
    +-LARGE_MAGNITUDE, where its dtypes allow it (`large_draw` returns None where they do not).
    `memo` keeps each draw's inputs and reference outputs between calls for the same graph and seed, so
    that verifying many candidate programs of one graph evaluates the reference once per draw; `executions` keeps,
    per draw, the outputs of the kernels run on it (KernelProgram.execute), so that a program runs only the kernels
    no program before it ran.
    """
    limit = max(draws, max_draws or draws)
    checks: list[Check] = []
    strict = False   # some draw met the dtypes' own tolerances, not only an allowance for rounding noise
    draw = skipped = 0   # skipped: inconclusive draws (the graph overflows its dtypes), made up for by more draws
    while draw < limit + min(skipped, MAX_SKIPPED) and (draw - skipped < draws or not strict):
        found = reference_draw(graph, seed, draw, memo=memo)
        assert found is not None   # an ordinary draw always exists
        compared = _checked(graph, program, found, seed + draw, _execution_memo(executions, draw))
        draw += 1
        if any(c.inconclusive for c in compared):
            skipped += 1
            continue
        checks = compared
        strict = strict or meets_tolerance(graph, checks)
    found = reference_draw(graph, seed, LARGE_DRAW, memo=memo) if large else None
    if found is not None:
        _checked(graph, program, found, seed + LARGE_SEED_OFFSET,     # its checks are not the ones returned
                 _execution_memo(executions, LARGE_DRAW))
    if not checks:
        last = reference_draw(graph, seed, draw - 1, memo=memo)
        assert last is not None
        site = overflow_site(graph, last[0])
        raise InconclusiveError(f"graph {graph.name!r} overflows its own dtypes on every random draw made ({draw},"
                                f" seeds from {seed}) where the float64 reference does not{site}: the graph as"
                                f" written gives inf there, so random tests cannot judge its program (pass example"
                                f" inputs at the scale it is used at)", [])
    if not strict:
        raise NoiseOnlyError(f"kernel program for graph {graph.name!r} matched the reference only within the"
                             f" graph's own rounding noise on every draw (seeds from {seed}); nothing shows it"
                             f" right", checks)
    return checks


def _execution_memo(executions: dict[int, ExecutionMemo] | None, draw: int) -> ExecutionMemo | None:
    """Draw `draw`'s memo of kernel outputs in `executions` (made at the first use), each up to EXECUTION_SHARE of
    what draws may be remembered in."""
    if executions is None:
        return None
    if draw not in executions:
        executions[draw] = ExecutionMemo(int(EXECUTION_SHARE * memo_bytes()))
    return executions[draw]


def _checked(graph: Graph, program: KernelProgram, draw: Draw, seed: int,
             memo: ExecutionMemo | None = None) -> list[Check]:
    """The program's outputs on one draw compared with the reference's; VerificationError where one disagrees on a
    draw that can judge it (not `inconclusive`)."""
    inputs, reference = draw
    compared = compare(graph, program.execute(inputs, memo), reference, inputs)
    failed = [c for c in compared if not c.ok and not c.inconclusive]
    if failed:
        worst = failed[0]
        raise VerificationError(f"kernel program for graph {graph.name!r} disagrees with the reference on"
                                f" output {worst.output!r}: relative L2 error {worst.error:.3g} >"
                                f" {worst.tolerance:g} (seed {seed})" + _ill_conditioned(worst))
    return compared


def _ill_conditioned(check: Check) -> str:
    """Why a check allowed 100% or more failed: the output is set by rounding, and the user is told so."""
    if check.tolerance < 1.0:
        return ""
    return (f"; output {check.output!r} is dominated by rounding: the graph itself, evaluated in its own dtypes,"
            f" is off the exact value by {check.tolerance / ROUNDING_NOISE:.0%} (relative L2) on these inputs,"
            f" so rounding sets its value (as in a normalisation of nearly equal values, or a difference of nearly"
            f" equal terms) and no program can be checked against it: compute that part in float32, or pass"
            f" example inputs at the scale the graph is used at")


def reference_draw(graph: Graph, seed: int, draw: int,
                   memo: dict[int, Draw | None] | None = None) -> Draw | None:
    """Draw number `draw`'s inputs (seed + draw; LARGE_DRAW: large_draw's, seed + LARGE_SEED_OFFSET) and the
    reference's outputs on them, from `memo` where it holds them (else remembered there, while the memo's draws
    together hold at most `memo_bytes()`); None where no large draw applies."""
    if memo is not None and draw in memo:
        return memo[draw]
    found = large_draw(graph, seed + LARGE_SEED_OFFSET) if draw == LARGE_DRAW else _ordinary_draw(graph, seed + draw)
    if memo is not None and (found is None or _nbytes(found) + sum(map(_nbytes, filter(None, memo.values())))
                             <= memo_bytes()):
        memo[draw] = found
    return found


def memo_bytes() -> int:
    """What the remembered draws of one search may hold together: MEMO_SHARE of this machine's memory."""
    try:
        return max(MEMO_FLOOR, int(MEMO_SHARE * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")))
    except (ValueError, OSError, AttributeError):    # no sysconf (not POSIX), or no such name
        return MEMO_FLOOR


def example_draw(graph: Graph, inputs: Mapping[str, object]) -> Draw:
    """The user's example inputs as a draw (rounded to the inputs' dtypes as random ones are) and the reference's
    outputs on them: what verification tests first, at the scale the program is used at. InputError where a name,
    shape or dtype does not fit the graph."""
    arrays = check_inputs(graph, inputs)
    held = {name: round_to_host(arrays[name].astype(np.float32), node.dtype) if node.dtype.is_float else arrays[name]
            for name, node in graph.inputs.items()}
    return held, evaluate(graph, held)


def example_digest(inputs: Mapping[str, object] | None) -> str | None:
    """A short hash of example inputs' names, shapes and values (None for none): part of a compile's cache key, so
    that a program is taken from the cache only where it was verified on the same examples."""
    if inputs is None:
        return None
    digest = hashlib.sha256()
    for name in sorted(inputs):
        array = np.ascontiguousarray(np.asarray(to_numpy(inputs[name])))
        digest.update(f"{name}:{array.shape}:{array.dtype};".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()[:16]


def _ordinary_draw(graph: Graph, seed: int) -> Draw:
    inputs = random_inputs(graph, seed)
    return inputs, evaluate(graph, inputs)


def _nbytes(draw: Draw) -> int:
    return sum(array.nbytes for values in draw for array in values.values())


def softmax_like(graph: Graph) -> bool:
    """A max reduction over more than a few elements and an exponential: the graphs whose stability
    large inputs test (a max of two, as in `maximum` or `abs`, does not count)."""
    nodes = graph.nodes()
    return (any(n.op == Op.EXP2 for n in nodes)
            and any(n.op == Op.MAX and n.srcs[0].shape[n.arg] > SHORT_MAX for n in nodes))


class _OutOfRange(Exception):
    """A value of the large draw's evaluation does not fit its dtype: the draw cannot judge the graph."""


def _within_range(node: Node, value: np.ndarray) -> None:
    """Raises _OutOfRange where a float16 or bfloat16 value computed does not fit its dtype (a view holds its
    source's values, an input was drawn within range, a matrix product's broadcast operands are never computed)."""
    if node.dtype.is_float and node.dtype != DType.FLOAT32 and node.op not in VIEWS and node.op != Op.INPUT:
        limit = float(np.finfo(np.float16).max) if node.dtype == DType.FLOAT16 else 3.0e38
        with np.errstate(invalid="ignore"):
            if np.nanmax(np.abs(value), initial=0.0) > limit:
                raise _OutOfRange(node)


def large_draw(graph: Graph, seed: int) -> Draw | None:
    """Float inputs uniform in +-LARGE_MAGNITUDE for a softmax-like graph, and the reference's outputs on them (the
    one evaluation that also checks their range), or None where that does not apply: the graph is not softmax-like,
    or some value on the way would not fit its dtype (a float16 temporary that overflows would make the reference,
    not the candidate, meaningless)."""
    if not softmax_like(graph):
        return None
    inputs = {name: drawn(node.shape, seed, key, partial(_uniform, bound=LARGE_MAGNITUDE, dtype=node.dtype),
                          host_float_dtype(node.dtype))
              for key, (name, node) in enumerate(graph.inputs.items()) if node.dtype.is_float}
    inputs = {**random_inputs(graph, seed, only=[n for n in graph.inputs if n not in inputs]), **inputs}
    try:
        values = evaluate_nodes(graph.outputs.values(), check_inputs(graph, inputs), roots_only=True,
                                watch=_within_range)
    except _OutOfRange:
        return None
    return {name: inputs[name] for name in graph.inputs}, {name: np.array(values[id(node)])
                                                           for name, node in graph.outputs.items()}
