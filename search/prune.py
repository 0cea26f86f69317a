"""Z3 pruning: schedules that cannot run, and programs that cannot compute what the graph computes.

Two checks:

- Schedules. Each archetype declares its space and the rules a valid schedule meets (codegen/spaces.py), each rule
  one function over the schedule, the kernel's facts and the target. The search enumerates with those rules over
  integers (`schedule_violations`). Here the same rules build Z3 formulas (`schedule_constraints`), which decide
  what enumeration cannot: a schedule's validity for every row length at once (`valid_for_every_row_length`), for
  a length known only at run time. `feasible_schedules` decides each point with Z3, and a test shows it agrees
  with the plain check on every point of every archetype.
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

import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import z3

from tensorsmith.codegen import attention
from tensorsmith.codegen.emit import NotFusable
from tensorsmith.codegen.matmul import kernel_matmul
from tensorsmith.codegen.row_reduce import row_length, row_plan, vector_width
from tensorsmith.codegen.declare import KernelFacts, Point
from tensorsmith.codegen.spaces import ARCHETYPES
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.kernel_program import Kernel, KernelProgram, Schedule
from tensorsmith.ir.node import Node
from tensorsmith.ir.ops import Op
from tensorsmith.ir.targets import Target

from .abstract import MAX_TERMS, Builder, Term, Terms, TooLarge, Z3Terms, buffer_read, coordinates
from .cost import kernel_work
from .exact import MAX_WORK as EXACT_MAX_WORK
from .exact import draw_inputs, evaluate_exact, evaluation_size

Z3_TIMEOUT_MS = 2000
TERMS_SHARE = 0.02     # of a search's budget: the most one check may spend building terms (at least MIN_TERMS_S, at
MIN_TERMS_S = 0.25     # most Z3_TIMEOUT_MS); past it the check is left undecided. A 4-layer Llama's graph needed
                       # over 5 s, and a search builds its forms' and the user's graph's terms before anything else


# ---------------------------------------------------------------------------------------------------------------
# (b) schedule constraints

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
    if kernel.archetype == "matmul":
        match = kernel_matmul(kernel)
        if match is None:
            raise NotFusable(kernel.outputs[0][1], "the output is not elementwise over one matmul")
        return KernelFacts("matmul", itemsize=itemsize, operand_bytes=match.lhs.dtype.itemsize)
    if kernel.archetype != "row_reduce":
        return KernelFacts(kernel.archetype, itemsize=itemsize)
    plan = row_plan(kernel)
    length = row_length(plan)
    vectorisable = vector_width(kernel, shapes) > 1
    preloaded = kernel_work(kernel, 2).preloaded if vectorisable else 0
    return KernelFacts("row_reduce", length, itemsize, vectorisable, preloaded)


class Z3Logic:
    """The declarations' rules over Z3 integers (codegen/declare.py): the same functions, building formulas."""

    def If(self, condition: Any, then: Any, otherwise: Any) -> Any:
        return z3.If(condition, then, otherwise)

    def And(self, *conditions: Any) -> Any:
        return z3.And([_boolean(c) for c in conditions])

    def Or(self, *conditions: Any) -> Any:
        return z3.Or([_boolean(c) for c in conditions])

    def Implies(self, condition: Any, consequence: Any) -> Any:
        return z3.Implies(_boolean(condition), _boolean(consequence))

    def div(self, numerator: Any, denominator: Any) -> Any:
        if isinstance(numerator, int) and isinstance(denominator, int):
            return numerator // denominator
        return numerator / denominator   # Z3's integer division: the floor, for the non-negative sizes rules use

    def max(self, a: Any, b: Any) -> Any:
        return z3.If(a >= b, a, b)


def _boolean(value: Any) -> z3.BoolRef:
    return value if isinstance(value, z3.BoolRef) else z3.BoolVal(bool(value))


Z3 = Z3Logic()
Constraint = tuple[str, z3.BoolRef]


def schedule_constraints(facts: KernelFacts, target: Target) -> tuple[dict[str, z3.ArithRef], list[Constraint]]:
    """Z3 variables for the archetype's parameters and its declared rules over them, as named formulas: each
    parameter among its values first, then every rule of the declaration, in its order."""
    archetype = ARCHETYPES[facts.archetype]
    var = {name: z3.Int(name) for name in archetype.space}
    point = Point(Z3, var, facts, target)
    rules: list[Constraint] = [(f"{name} in {values}", z3.Or([var[name] == v for v in values]))
                               for name, values in archetype.space.items()]
    rules += [(rule.label, _boolean(rule.holds(point))) for rule in archetype.rules]
    return var, rules


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
    names = list(var)
    mentioned = [[name for name in names if _mentions(rule, var[name])] for _, rule in rules]
    decided: list[dict[tuple[int, ...], bool]] = [{} for _ in rules]
    verdicts = []
    for point in ARCHETYPES[facts.archetype].points():
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


@lru_cache(maxsize=1024)
def schedule_violations(facts: KernelFacts, target: Target) -> tuple[tuple[Schedule, str | None], ...]:
    """Every point of the archetype's space with the first rule it breaks (None: valid), by the plain check the
    search enumerates with: the same declaration as `feasible_schedules`, evaluated over integers."""
    archetype = ARCHETYPES[facts.archetype]
    return tuple((Schedule.of(**point), archetype.broken_rule(point, facts, target)) for point in archetype.points())


def valid_for_every_row_length(facts: KernelFacts, target: Target, multiple_of: int,
                               longest: int) -> dict[Schedule, int | None]:
    """For a row length not known until run time (any multiple of `multiple_of` up to `longest`), each schedule
    that is valid at `facts.row_length`, with a row length at which it breaks a rule (None: it is valid at all).

    What enumeration cannot do: Z3 decides the rules over the symbolic length, for every length at once."""
    length = z3.Int("row_length")
    var, rules = schedule_constraints(dataclasses.replace(facts, row_length=length), target)
    solver = z3.Solver()
    solver.set(timeout=Z3_TIMEOUT_MS)
    solver.add(length > 0, length <= longest, length % multiple_of == 0)
    answers: dict[Schedule, int | None] = {}
    for schedule, violated in schedule_violations(facts, target):
        if violated is not None:
            continue
        solver.push()
        solver.add(*(var[name] == value for name, value in schedule.as_dict().items()))
        solver.add(z3.Not(z3.And([rule for _, rule in rules])))
        verdict = solver.check()
        if verdict != z3.unknown:   # one Z3 could not decide in time is left out: not shown valid
            answers[schedule] = solver.model()[length].as_long() if verdict == z3.sat else None
        solver.pop()
    return answers


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

    def __init__(self, timeout_ms: int = Z3_TIMEOUT_MS, max_terms: int = MAX_TERMS, budget_s: float = math.inf):
        self.timeout_ms, self.max_terms = timeout_ms, max_terms
        self.build_s = min(Z3_TIMEOUT_MS / 1000, max(MIN_TERMS_S, TERMS_SHARE * budget_s))   # per check, building its terms
        self.terms = Terms()
        self.z3_terms = Z3Terms(self.terms)
        self._graphs: dict[int, tuple[Graph, Expressions | None]] = {}   # graph_terms' results, the graph kept alive

    def graph_terms(self, graph: Graph) -> Expressions | None:
        """Each output of `graph` as a term over its inputs' elements (None where that is too large a check), built
        once per graph."""
        if id(graph) not in self._graphs:
            self._graphs[id(graph)] = graph, self._graph_terms(graph)
        return self._graphs[id(graph)][1]

    def _graph_terms(self, graph: Graph) -> Expressions | None:
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
        self.terms.deadline = time.monotonic() + self.build_s
        self.z3_terms.deadline = time.monotonic() + self.timeout_ms / 1000
        try:
            yield
        except (TooLarge, RecursionError):
            pass
        finally:
            self.terms.limit, self.terms.deadline, self.z3_terms.deadline = math.inf, math.inf, math.inf

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


__all__ = ["AbstractChecker", "Expression", "KernelFacts", "NotFusable", "ScheduleVerdict", "feasible_schedules",
           "kernel_facts", "schedule_constraints", "schedule_violations", "valid_for_every_row_length"]
