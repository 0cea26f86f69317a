"""Exact equivalence testing: a kernel program and a graph evaluated over the integers modulo a prime.

The float check (verify.py) compares at a tolerance, so a bug that moves a small share of the result (a K - 1 term
sum over K = 16384, one row of many read from the wrong place) can pass it. Here both sides are evaluated on the
same random residues mod PRIME, rounding-free: add, mul and sums are the field's own, views move residues as they
move numbers, and every other op (exp2, log2, sin, sqrt, recip, mod, less_than, casts, max) is the same random
function on both sides (a random polynomial per op, Schwartz-Zippel style), so equal compositions give equal
residues and a wrong fusion, index, view or axis gives different ones except with probability at most the degree of
the difference over PRIME per draw (Schwartz-Zippel; each random function is a cubic, so the degree grows with the
depth of non-polynomial ops: the bound is loose for deep graphs, and the check makes two draws). Constants are random residues keyed by their value; iota is its indices.

What this cannot see is a rewrite the real numbers prove but the field does not (exp(x) written as exp2(x log2 e),
a reassociated max): a program built from a rewritten graph is checked exactly against that graph, and the
rewrites themselves against the user's by their Z3 proofs and the float check.
"""
from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from tensorsmith.ir.errors import TensorsmithError
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.kernel_program import KernelProgram
from tensorsmith.ir.node import Node, toposort
from tensorsmith.ir.ops import VIEWS, Op
from tensorsmith.ir.patterns import match_matmul

from .verify import VerificationError, computed_sizes

PRIME = 1_048_573         # the largest prime below 2**20: a product of two residues fits in 40 bits
MATMUL_CHUNK = 1 << 13    # products a float64 matmul (BLAS) sums exactly: 2**13 * 2**40 = 2**53
# Residues are held as float64 integers, exact below 2**53: float arithmetic vectorises (and matmuls run on BLAS)
# where numpy's int64 `%` divides element by element.
UNARY = (Op.EXP2, Op.LOG2, Op.SIN, Op.SQRT, Op.RECIP, Op.CAST)
BINARY = (Op.MOD, Op.LESS_THAN)
MAX_WORK = 1 << 27        # elements computed (evaluation_size) beyond which the check is left out: a few seconds


class ExactMismatch(VerificationError):
    """A kernel program computes another function than its graph: some output differs over the prime field."""


@dataclass(frozen=True)
class ExactCheck:
    """One output of one draw compared over the field: how many of its elements differ."""

    output: str
    differing: int
    size: int

    @property
    def ok(self) -> bool:
        return self.differing == 0


def _residues(seed: bytes, count: int) -> np.ndarray:
    """`count` residues mod PRIME drawn from a generator seeded by `seed` (so both sides draw the same)."""
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(seed).digest()[:8], "little"))
    return rng.integers(0, PRIME, count, dtype=np.int64).astype(np.float64)


def _mod(x: np.ndarray) -> np.ndarray:
    """x mod PRIME for float64 integers below 2**53 (the quotient's rounding corrected by one step either way)."""
    r = np.asarray(x - np.floor(x * (1.0 / PRIME)) * PRIME)
    r[r < 0] += PRIME
    r[r >= PRIME] -= PRIME
    return r


def _key(*parts: object) -> bytes:
    return repr(parts).encode()


class _Field:
    """The random functions of one draw: each op's polynomial, each constant's residue."""

    def __init__(self, seed: int):
        self.seed = seed

    def coefficients(self, *tag: object) -> np.ndarray:
        return _residues(_key("function", self.seed, *tag), 6)

    def unary(self, tag: tuple, x: np.ndarray) -> np.ndarray:
        a, b, c, d = self.coefficients(*tag)[:4]
        return _mod(_mod(_mod(a * x + b) * x + c) * x + d)          # a x^3 + b x^2 + c x + d

    def binary(self, tag: tuple, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        a, b, c, d, e, f = self.coefficients(*tag)
        return _mod(_mod(_mod(a * x + c * y + d) * x) + _mod(_mod(b * y + e) * y) + f)   # a x^2 + c xy + b y^2 + ...

    def constant(self, value: object) -> float:
        packed = struct.pack("<d", float(value)) if isinstance(value, (int, float, np.number)) else repr(value).encode()
        return float(_residues(_key("constant", self.seed, packed), 1)[0])


def _reduce_max(field: _Field, node: Node, x: np.ndarray) -> np.ndarray:
    """A max as a random function of the multiset reduced: f(sum of g(x)), which no order of reduction changes."""
    spread = field.unary(("max-in",), x)
    return field.unary(("max-out",), _mod(np.sum(spread, axis=node.arg)))


def _matmul(lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """(..., M, K) @ (..., K, N) mod PRIME on BLAS, in chunks of K whose sums are exact integers (numpy's integer
    matmul has no BLAS and takes minutes at model sizes)."""
    k = lhs.shape[-1]
    total = np.zeros(np.broadcast_shapes(lhs.shape[:-2], rhs.shape[:-2]) + (lhs.shape[-2], rhs.shape[-1]))
    for start in range(0, k, MATMUL_CHUNK):
        stop = min(k, start + MATMUL_CHUNK)
        total = _mod(total + _mod(np.matmul(lhs[..., start:stop], rhs[..., start:stop, :])))
    return total


def _evaluate(field: _Field, roots: Iterable[Node], leaves: Mapping[str, np.ndarray]) -> dict[int, np.ndarray]:
    """Residues of every node the roots need; INPUT nodes read `leaves[name]`. A matrix product written as
    sum(expand(a) * expand(b)) is a matmul of its two expands' (broadcast) values: its (..., M, K, N) product is
    made only where something else reads it."""
    order = toposort(list(roots))
    matmuls = {id(n): m for n in order if (m := match_matmul(n)) is not None}
    needed: set[int] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if id(node) not in needed:
            needed.add(id(node))
            match = matmuls.get(id(node))
            stack += [match.lhs, match.rhs] if match else list(node.srcs)
    values: dict[int, np.ndarray] = {}
    for node in order:
        if id(node) not in needed:
            continue
        if id(node) in matmuls:
            match = matmuls[id(node)]
            values[id(node)] = _matmul(values[id(match.lhs)][..., 0], values[id(match.rhs)][..., 0, :, :])
        elif node.op == Op.INPUT:
            values[id(node)] = np.asarray(leaves[node.arg], np.float64)
        else:
            values[id(node)] = _apply(field, node, [values[id(src)] for src in node.srcs])
    return values


def _apply(field: _Field, node: Node, args: list[np.ndarray]) -> np.ndarray:
    op = node.op
    if op == Op.ADD:
        return _mod(np.asarray(args[0] + args[1]))
    if op == Op.MUL:
        return _mod(np.asarray(args[0] * args[1]))
    if op == Op.SUM:
        return _mod(np.asarray(np.sum(args[0], axis=node.arg)))
    if op == Op.MAX:
        return np.asarray(_reduce_max(field, node, args[0]))
    if op in UNARY:
        tag = (op.value, node.dtype.value) if op == Op.CAST else (op.value,)
        return field.unary(tag, args[0])
    if op in BINARY:
        return field.binary((op.value,), args[0], args[1])
    if op == Op.CONSTANT:
        return np.full(node.shape, field.constant(node.arg))
    if op == Op.IOTA:
        line = np.arange(node.shape[node.arg], dtype=np.float64) % PRIME
        line = line.reshape([-1 if a == node.arg else 1 for a in range(node.ndim)])
        return np.asarray(np.broadcast_to(line, node.shape))
    if op == Op.RESHAPE:
        return args[0].reshape(node.arg)
    if op == Op.PERMUTE:
        return np.transpose(args[0], node.arg)
    if op == Op.EXPAND:
        return np.broadcast_to(args[0], node.arg)
    if op == Op.SLICE:
        return args[0][tuple(slice(lo, hi) for lo, hi in node.arg)]
    if op == Op.PAD:
        return np.pad(args[0], node.arg)
    if op == Op.CONTIGUOUS:
        return np.asarray(args[0], order="C")
    raise TensorsmithError(f"the exact check has no meaning for op {op.value!r}")   # every op is listed above


def draw_inputs(graph: Graph, seed: int) -> dict[str, np.ndarray]:
    """Random residues for every input of `graph` (bools and ints alike: their ops are random functions too)."""
    return {name: _residues(_key("input", seed, name), int(np.prod(node.shape, dtype=np.int64))).reshape(node.shape)
            for name, node in graph.inputs.items()}


def evaluate_exact(graph: Graph, inputs: Mapping[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """`graph`'s outputs over the field, on residues `inputs`, with draw `seed`'s random functions."""
    values = _evaluate(_Field(seed), graph.outputs.values(), inputs)
    return {name: values[id(node)] for name, node in graph.outputs.items()}


def execute_exact(program: KernelProgram, inputs: Mapping[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """The kernel program's outputs over the field: each kernel in order, its buffers holding residues."""
    field, memory = _Field(seed), {name: np.asarray(inputs[name], np.float64) for name in program.inputs}
    for kernel in program.kernels:
        values = _evaluate(field, [node for _, node in kernel.outputs], memory)
        for name, node in kernel.outputs:
            memory[name] = np.ascontiguousarray(values[id(node)]).reshape(program.buffers[name].shape)
    return {out: memory[buf] for out, buf in program.outputs.items()}


# What one element of each op costs here, over the field and in the float64 reference, in units of a float64 add
# (measured with numpy on 8M elements: an add and its reduction 4.5x, a random cubic 14x, a random quadratic of two
# arguments 51x a float comparison); a matrix product's multiply-adds run on BLAS on both sides.
EXACT_COST = {"polynomial": 4.5, "unary": 13.0, "binary": 23.0, "max": 27.0}
REFERENCE_COST = {"polynomial": 1.0, "unary": 1.0, "binary": 0.45, "max": 1.0}
BLAS_COST = 0.02          # one multiply-add of a matrix product, in the same units


def relative_cost(graph: Graph) -> float:
    """How many float64 reference evaluations one side of one exact draw of `graph` takes, from its ops' sizes: near
    1 for a graph of matrix products, ten to fifty for one of comparisons (a one-hot of targets) or exponentials."""
    exact = reference = 0.0
    nodes = toposort(graph.outputs.values())
    products = {id(m.reduce.srcs[0]) for n in nodes if (m := match_matmul(n)) is not None}
    for node in nodes:
        if node.op in VIEWS or node.op in (Op.INPUT, Op.CONSTANT, Op.IOTA) or id(node) in products:
            continue
        match = match_matmul(node)
        if match is not None:
            work = BLAS_COST * float(np.prod(node.shape, dtype=np.float64)) * match.dims[2]
            exact, reference = exact + work, reference + work
            continue
        kind = "unary" if node.op in UNARY else "binary" if node.op in BINARY else \
            "max" if node.op == Op.MAX else "polynomial"
        elements = float(np.prod(node.srcs[0].shape if node.op in (Op.SUM, Op.MAX) else node.shape, dtype=np.float64))
        exact += EXACT_COST[kind] * elements
        reference += REFERENCE_COST[kind] * elements
    return exact / reference if reference > 0 else 1.0


def evaluation_size(graph: Graph) -> int:
    """Elements of all the arrays evaluating `graph` computes: about 10 ns each on a CPU, one such pass per side."""
    return sum(computed_sizes(graph))


def check_exact(graph: Graph, program: KernelProgram, seed: int, draws: int = 2) -> list[ExactCheck]:
    """Compare `program` with `graph` over the field on `draws` draws; raise ExactMismatch where they differ."""
    checks: list[ExactCheck] = []
    for draw in range(draws):
        inputs = draw_inputs(graph, seed + draw)
        expected = evaluate_exact(graph, inputs, seed + draw)
        actual = execute_exact(program, inputs, seed + draw)
        drawn = [ExactCheck(name, int(np.count_nonzero(actual[name] != expected[name])), expected[name].size)
                 for name in graph.outputs]
        checks += drawn
        wrong = [c for c in drawn if not c.ok]
        if wrong:
            raise ExactMismatch(f"kernel program for graph {graph.name!r} computes another function than the graph:"
                                f" {wrong[0].differing} of the {wrong[0].size} elements of output {wrong[0].output!r}"
                                f" differ over the integers mod {PRIME} (draw {seed + draw})")
    return checks
