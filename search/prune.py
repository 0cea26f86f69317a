"""Z3 pruning: schedules that cannot run, and programs that cannot compute what the graph computes.

Two checks, each counted by the search:

- `feasible_schedules`: each archetype's space (declared by codegen, `ARCHETYPES`) under the constraints
  that a launch must meet: row threads divide the block, at most `max_threads_per_block` threads, a vector
  width that divides the row and keeps 16-byte accesses aligned, registers and static shared memory under
  the target's limits. The constraints are Z3 formulas over the schedule's parameters and the kernel's
  facts; each point of the space is substituted and simplified by Z3, so no infeasible schedule reaches
  codegen.
- `AbstractChecker`: as in Mirage, each output of a candidate program as a term over the input symbols, with the
  ops as uninterpreted functions (add and mul as real arithmetic), but keeping index detail: each element of an
  output is a term over the elements of the inputs it reads, views composed into one index map per read and
  reductions binding a variable at their axis (the normal form: search/abstract.py, its index maps:
  search/index.py). So x.T + y and x + y, a sum over the wrong axis, an off-by-one slice give terms Z3 shows differ.
  Every candidate program is checked against its form's graph: partitions of one graph give the same hash-consed
  term, so no Z3 is needed for a right one, and a wrong construction (a buffer read through the wrong view, a
  dropped term) is pruned. Each form is checked once against the user's graph (`form_equivalent`): since the
  rewrite rules use laws the abstraction does not know (exp2's, a folded constant's rounding), a form is refuted
  only where the terms with index detail erased agree, Z3 shows the terms differ and the exact check over a prime
  field agrees that they do; a check Z3 cannot decide in time is left to random testing.
"""
from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import z3

from tensorsmith.codegen import attention
from tensorsmith.codegen.emit import NotFusable
from tensorsmith.codegen.matmul import WGMMA_ALIGN
from tensorsmith.codegen.row_reduce import row_plan, vector_width
from tensorsmith.codegen.spaces import ARCHETYPES, MAX_ACCUMULATORS, VECTOR_BYTES
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.kernel_program import Kernel, KernelProgram, Schedule
from tensorsmith.ir.node import Node
from tensorsmith.ir.ops import Op
from tensorsmith.ir.targets import Target

from .abstract import MAX_TERMS, Builder, Term, Terms, TooLarge, Z3Terms, buffer_read, coordinates
from .cost import BASE_REGISTERS, MMA_BYTES, MMA_PAD, WARP, kernel_work
from .exact import MAX_WORK as EXACT_MAX_WORK
from .exact import draw_inputs, evaluate_exact, evaluation_size

STATIC_SHARED_BYTES = 48 * 1024   # a block's statically declared __shared__ arrays may not exceed 48 KiB
Z3_TIMEOUT_MS = 2000


# ---------------------------------------------------------------------------------------------------------------
# (b) schedule constraints

@dataclass(frozen=True)
class KernelFacts:
    """What the schedule constraints need to know about one kernel."""

    archetype: str
    row_length: int = 1        # elements each row loop walks (pointwise: the last axis)
    itemsize: int = 4          # widest element the kernel loads
    vectorisable: bool = False  # codegen can cache the row in registers (vec > 1) for this body
    preloaded: int = 0         # buffers a vec > 1 kernel would cache
    head_dims: tuple[int, int] = (0, 0)   # attention: the q.k and the v head dims


def kernel_facts(kernel: Kernel, shapes: dict[str, tuple[int, ...]]) -> KernelFacts:
    """The facts of `kernel` (raises NotFusable where its archetype cannot take the body at all)."""
    itemsize = max((n.dtype.itemsize for n in kernel.body if n.op == Op.INPUT), default=4)
    if kernel.archetype == "attention":
        match = attention.kernel_attention(kernel.outputs[0][1])
        if match is None:
            raise NotFusable(kernel.outputs[0][1], "the output is not elementwise over one attention")
        return KernelFacts("attention", itemsize=itemsize, head_dims=(match.dims[2], match.dims[3]))
    if kernel.archetype == "pointwise":   # VEC consecutive elements of the last axis per thread
        shape = shapes[kernel.writes[0]]
        return KernelFacts("pointwise", shape[-1] if shape else 1, itemsize)
    if kernel.archetype != "row_reduce":
        return KernelFacts(kernel.archetype, itemsize=itemsize)
    plan = row_plan(kernel)
    length = max((r.srcs[0].shape[r.arg] for r in plan.reduces), default=1)
    vectorisable = vector_width(kernel, shapes) > 1
    preloaded = kernel_work(kernel, 2).preloaded if vectorisable else 0
    return KernelFacts("row_reduce", length, itemsize, vectorisable, preloaded)


Constraint = tuple[str, z3.BoolRef]


def schedule_constraints(facts: KernelFacts, target: Target) -> tuple[dict[str, z3.ArithRef], list[Constraint]]:
    """Z3 variables for the archetype's parameters and the named constraints a launchable schedule meets."""
    space = ARCHETYPES[facts.archetype]
    var = {name: z3.Int(name) for name in space}
    rules: list[Constraint] = [(f"{name} in {values}", z3.Or([var[name] == v for v in values]))
                               for name, values in space.items()]
    if facts.archetype == "pointwise":
        rules += [("block <= max threads", var["block"] <= target.max_threads_per_block),
                  ("vec divides the last axis", facts.row_length % var["vec"] == 0)]
    elif facts.archetype == "row_reduce":
        rules += _row_constraints(facts, target, var["row_threads"], var["block"], var["vec"])
    elif facts.archetype == "matmul":
        threads = WARP * var["warps_m"] * var["warps_n"]
        # the pipeline's tiles, bounded over both layouts of each operand (the template pads rows by MMA_PAD)
        tiles = (var["bm"] + MMA_PAD) * (var["bk"] + MMA_PAD) + (var["bk"] + MMA_PAD) * (var["bn"] + MMA_PAD)
        accumulators = var["bm"] * var["bn"] / threads
        warps = var["warps_m"] * var["warps_n"]
        rules += [("4 or 8 warps", z3.Or(warps == 4, warps == 8)),
                  ("warp tiles of whole 16x16 fragments",
                   z3.And(var["bm"] % (16 * var["warps_m"]) == 0, var["bn"] % (16 * var["warps_n"]) == 0)),
                  ("block <= max threads", threads <= target.max_threads_per_block),
                  # mma.sync's padded tiles; wgmma's are unpadded (where wgmma falls back to mma.sync, codegen
                  # renders as many of the stages as fit)
                  ("dynamic shared memory", z3.If(var["wgmma"] == 1, MMA_BYTES * var["stages"] * (var["bm"] + var["bn"])
                                                  * var["bk"] + WGMMA_ALIGN, MMA_BYTES * var["stages"] * tiles)
                   <= target.shared_bytes_per_block),
                  ("accumulators per thread", accumulators <= MAX_ACCUMULATORS),
                  ("split-K partial sums fit in shared memory",
                   z3.Or(var["split_k"] == 1, 4 * var["bm"] * (var["bn"] + 4) <= target.shared_bytes_per_block)),
                  # wgmma (codegen/schedules.py wgmma_schedule_ok); its shared memory is under the padded bound above
                  ("wgmma: a warpgroup per 64 rows, BK 64, 3+ stages",
                   z3.Implies(var["wgmma"] == 1, z3.And(var["bk"] == 64, var["warps_n"] == 4,
                                                        var["bm"] == 64 * var["warps_m"], var["stages"] >= 3))),
                  ("wgmma only on Hopper (sm_90a)", z3.Or(var["wgmma"] == 0, z3.BoolVal(target.arch == "sm_90"))),
                  ("K split across a thread-block cluster only on Hopper (sm_90)",
                   z3.Or(var["split_k"] == 1, z3.BoolVal(target.arch == "sm_90")))]
    elif facts.archetype == "attention":
        rules += _attention_constraints(facts, target, var["bq"], var["bkv"])
        rules += _attention_wgmma_constraints(facts, target, var["bq"], var["bkv"], var["wgmma"])
    return var, rules


def _attention_constraints(facts: KernelFacts, target: Target, bq: z3.ArithRef, bkv: z3.ArithRef) -> list[Constraint]:
    """Threads, dynamic shared memory (as codegen.attention.shared_bytes counts it: above 48 KiB up to the
    target's per-block limit) and registers (its estimate) of the attention template."""
    dqk, dv = facts.head_dims
    decode = bq == attention.DECODE_BQ
    split = z3.If(decode, attention.DECODE_WARPS, 1)
    threads = WARP * z3.If(decode, attention.DECODE_WARPS, bq / 16)
    tiles = attention.MMA_BYTES * (bq * (dqk + attention.PAD) + 2 * split * bkv * (dqk + dv + 2 * attention.PAD))
    staged = 4 * split * bq * (dv + attention.OUT_PAD + 2)
    registers = dqk // 4 + dv // 2 + bkv / 2 + attention.OTHER_REGISTERS   # attention.registers_per_thread
    return [("block <= max threads", threads <= target.max_threads_per_block),
            ("dynamic shared memory", z3.And(tiles <= target.shared_bytes_per_block,
                                             staged <= target.shared_bytes_per_block)),
            ("registers per thread", registers <= target.max_registers_per_thread)]


def _attention_wgmma_constraints(facts: KernelFacts, target: Target, bq: z3.ArithRef, bkv: z3.ArithRef,
                                 wgmma: z3.ArithRef) -> list[Constraint]:
    """attention_tma.cu.j2 (codegen.attention.takes_wgmma): Hopper only, two warpgroups of 64 query rows, key tiles
    in whole 64-row boxes, and the Q tile plus a ring of at least two K and V tiles in shared memory."""
    dqk, dv = facts.head_dims
    ring = attention.MMA_BYTES * (bq * dqk + attention.TMA_STAGES[-1] * bkv * (dqk + dv)) + attention.WGMMA_ALIGN
    return [("wgmma attention only on Hopper (sm_90a)", z3.Or(wgmma == 0, z3.BoolVal(target.arch == "sm_90"))),
            ("wgmma attention: 128 queries per block, key tiles of 64 or 128",
             z3.Implies(wgmma == 1, z3.And(bq == attention.TMA_BQ, bkv >= 64))),
            ("wgmma attention: Q and two K and V tiles in shared memory",
             z3.Implies(wgmma == 1, ring <= target.shared_bytes_per_block))]


def _row_constraints(facts: KernelFacts, target: Target, row_threads: z3.ArithRef, block: z3.ArithRef,
                     vec: z3.ArithRef) -> list[Constraint]:
    length, size = facts.row_length, facts.itemsize
    chunk = z3.If(vec * size <= VECTOR_BYTES, vec, VECTOR_BYTES // size)   # elements per 16-byte access
    items = (length + row_threads * vec - 1) / (row_threads * vec)          # vector loads per thread per row
    registers = BASE_REGISTERS + z3.If(vec > 1, items * vec * max(1, facts.preloaded) + vec, 0)
    scratch = 2 * 2 * 4 * z3.If(row_threads > WARP, row_threads / WARP, 1)   # float and int scratch, two of each
    return [
        ("row threads divide the block", block % row_threads == 0),
        ("block <= max threads", block <= target.max_threads_per_block),
        ("vec > 1 only where codegen caches the row", z3.Or(vec == 1, z3.BoolVal(facts.vectorisable))),
        ("vec divides the row length", length % vec == 0),
        ("16-byte aligned vector accesses", z3.And((length * size) % (chunk * size) == 0,
                                                    chunk * size <= VECTOR_BYTES)),
        ("registers per thread", registers <= target.max_registers_per_thread),
        ("registers per block", registers * block <= target.registers_per_sm),
        ("static shared memory", scratch <= min(STATIC_SHARED_BYTES, target.shared_bytes_per_block)),
    ]


@dataclass(frozen=True)
class ScheduleVerdict:
    schedule: Schedule
    violated: str | None      # the first constraint it breaks, or None


@lru_cache(maxsize=1024)
def feasible_schedules(facts: KernelFacts, target: Target) -> tuple[ScheduleVerdict, ...]:
    """Every point of the archetype's space, each checked by Z3 against the constraints (in space order).

    Cached by facts: kernels that share them (most do) share the answer. Each rule mentions a few of the
    parameters, so Z3 decides it once per assignment of those (memoised), not once per point of the space."""
    var, rules = schedule_constraints(facts, target)
    space = ARCHETYPES[facts.archetype]
    names = list(space)
    mentioned = [[name for name in names if _mentions(rule, var[name])] for _, rule in rules]
    decided: list[dict[tuple[int, ...], bool]] = [{} for _ in rules]
    verdicts = []
    for values in itertools.product(*(space[name] for name in names)):
        point = dict(zip(names, values))
        violated = None
        for (label, rule), own, memo in zip(rules, mentioned, decided):
            key = tuple(point[name] for name in own)
            if key not in memo:
                binding = [(var[name], z3.IntVal(point[name])) for name in own]
                memo[key] = z3.is_true(z3.simplify(z3.substitute(rule, *binding) if binding else rule))
            if not memo[key]:
                violated = label
                break
        verdicts.append(ScheduleVerdict(Schedule.of(**point), violated))
    return tuple(verdicts)


def _mentions(term: z3.ExprRef, variable: z3.ArithRef) -> bool:
    """Whether `variable` occurs in `term`."""
    if term.eq(variable):
        return True
    return any(_mentions(child, variable) for child in term.children())


# ---------------------------------------------------------------------------------------------------------------
# (a) abstract expressions

@dataclass(frozen=True)
class Expression:
    """One output as a term (search/abstract.py) at the free coordinates of its shape."""

    term: Term
    shape: tuple[int, ...]


Expressions = dict[str, Expression]


class AbstractChecker:
    """Abstract expressions of graphs and kernel programs (search/abstract.py), and a Z3 equivalence check."""

    def __init__(self, timeout_ms: int = Z3_TIMEOUT_MS, max_terms: int = MAX_TERMS):
        self.timeout_ms, self.max_terms = timeout_ms, max_terms
        self.terms = Terms()
        self.z3_terms = Z3Terms(self.terms)

    def graph_terms(self, graph: Graph) -> Expressions | None:
        """Each output of `graph` as a term over its inputs' elements (None where that is too large a check)."""
        builder = Builder(self.terms, lambda node, index: self.terms.read(node.arg, index))
        with self._bounded():
            return {name: Expression(builder.output(node), node.shape) for name, node in graph.outputs.items()}
        return None

    def program_terms(self, program: KernelProgram) -> Expressions | None:
        """Each output of `program`: its kernels' bodies composed through the buffers between them, each buffer read
        as the element its writer computes at the same row-major offset (None where that is too large a check)."""
        with self._bounded():
            return self._program_terms(program)
        return None

    def _program_terms(self, program: KernelProgram) -> Expressions:
        reads: dict[str, Callable] = {}

        def leaf(node: Node, index: tuple) -> Term:
            if node.arg in reads:
                return reads[node.arg](index)
            return self.terms.read(node.arg, index)

        builder = Builder(self.terms, leaf)
        for kernel in program.kernels:
            for name, node in kernel.outputs:
                reads[name] = buffer_read(builder, node, program.buffers[name].shape)
        return {out: Expression(reads[buffer](coordinates(program.buffers[buffer].shape)),
                                program.buffers[buffer].shape) for out, buffer in program.outputs.items()}

    def equivalent(self, reference: Expressions | None, candidate: Expressions | None) -> bool | None:
        """True if every output is the same term or Z3 proves it equal, False if Z3 finds an interpretation where one
        differs, else None (Z3 could not decide in time, or either side was too large to build)."""
        if reference is None or candidate is None:
            return None
        if set(reference) != set(candidate) or any(reference[n].shape != candidate[n].shape for n in reference):
            return False
        differing = None
        with self._bounded():
            differing = [(self.z3_terms.expr(reference[n].term), self.z3_terms.expr(candidate[n].term))
                         for n in reference if reference[n].term != candidate[n].term]
        return None if differing is None else self._decide(differing, tuple(self.z3_terms.ranges()))

    @contextmanager
    def _bounded(self) -> Iterator[None]:
        """Bounds the work of what runs inside: `max_terms` new terms and the Z3 timeout's time to build expressions.
        A check past them (or deeper than Python's recursion limit) is abandoned, and the caller returns None."""
        self.terms.limit = len(self.terms.nodes) + self.max_terms
        self.z3_terms.deadline = time.monotonic() + self.timeout_ms / 1000
        try:
            yield
        except (TooLarge, RecursionError):
            pass
        finally:
            self.terms.limit, self.z3_terms.deadline = math.inf, math.inf

    def _decide(self, pairs: list[tuple[z3.ExprRef, z3.ExprRef]], premises: tuple[z3.BoolRef, ...] = ()) -> bool | None:
        """True if Z3 proves every pair equal under `premises`, False if it finds an interpretation where one
        differs, else None."""
        differing = [a != b for a, b in pairs if not a.eq(b)]
        if not differing:
            return True
        solver = z3.Solver()
        solver.set("timeout", self.timeout_ms)
        solver.add(z3.Or(differing), *premises)
        answer = solver.check()
        if answer == z3.unsat:
            return True
        return False if answer == z3.sat else None

    def form_equivalent(self, reference: Graph, form: Graph, seed: int = 0) -> bool | None:
        """Whether `form`, a graph rewritten from `reference` (extracted from the e-graph), computes it. False only
        where the index-blind terms agree (the forms differ in views and axes alone, not by a law of the uninterpreted
        ops that the rules may use: exp2's, a folded constant's rounding), Z3 shows the terms differ, and the exact
        check over a prime field (search/exact.py: sums exact, so it also knows the reindexings this abstraction
        does not) finds an element that differs; True where the terms are one or Z3 proves them equal; else None."""
        ref, other = self.graph_terms(reference), self.graph_terms(form)
        if ref is None or other is None:
            return None
        if ref == other:
            return True
        if {n: e.shape for n, e in ref.items()} != {n: e.shape for n, e in other.items()}:
            return False
        blind = None
        with self._bounded():
            blind = [(self.z3_terms.blind(ref[n].term), self.z3_terms.blind(other[n].term)) for n in ref]
        if blind is None or self._decide(blind) is not True:
            return None          # a rewrite by laws this abstraction does not know: left to random testing
        verdict = self.equivalent(ref, other)
        if verdict is not False:
            return verdict
        return False if exact_differs(reference, form, seed) else None


def exact_differs(reference: Graph, form: Graph, seed: int) -> bool:
    """Whether the two graphs differ on some element over the prime field (False where the check is too large)."""
    if max(evaluation_size(reference), evaluation_size(form)) > EXACT_MAX_WORK:
        return False
    inputs = draw_inputs(reference, seed)
    expected, actual = evaluate_exact(reference, inputs, seed), evaluate_exact(form, inputs, seed)
    return any(not np.array_equal(expected[name], actual[name]) for name in reference.outputs)


def schedule_space_size(archetype: str) -> int:
    return math.prod(len(values) for values in ARCHETYPES[archetype].values())


__all__ = ["AbstractChecker", "Expression", "KernelFacts", "NotFusable", "ScheduleVerdict", "feasible_schedules",
           "kernel_facts", "schedule_constraints", "schedule_space_size"]
