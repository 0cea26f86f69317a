"""The language an archetype's schedule is declared in: its parameters, and rules that hold over them.

A rule is written once, as a function of a `Point`: the schedule's parameters, the kernel's facts and the target,
with the logic it combines them in (`If`, `And`, `Or`, `Implies`, `div`, `max`). Evaluated over integers (the
`PYTHON` logic) it is the plain check codegen and search enumerate with; over Z3 integers (`search/prune.py`'s
logic) the same function builds the Z3 formula. So the two cannot disagree, and a test shows they do not.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tensorsmith.ir.kernel_program import Schedule
from tensorsmith.ir.targets import Target


class Logic(Protocol):
    """How a rule combines numbers and truths: over Python integers, or over Z3 terms."""

    def If(self, condition: Any, then: Any, otherwise: Any) -> Any: ...

    def And(self, *conditions: Any) -> Any: ...

    def Or(self, *conditions: Any) -> Any: ...

    def Implies(self, condition: Any, consequence: Any) -> Any: ...

    def div(self, numerator: Any, denominator: Any) -> Any: ...

    def max(self, a: Any, b: Any) -> Any: ...


class PythonLogic:
    """Rules over plain integers: what codegen and the search's enumeration evaluate."""

    def If(self, condition: Any, then: Any, otherwise: Any) -> Any:
        return then if condition else otherwise

    def And(self, *conditions: Any) -> bool:
        return all(conditions)

    def Or(self, *conditions: Any) -> bool:
        return any(conditions)

    def Implies(self, condition: Any, consequence: Any) -> bool:
        return not condition or bool(consequence)

    def div(self, numerator: Any, denominator: Any) -> Any:
        return numerator // denominator

    def max(self, a: Any, b: Any) -> Any:
        return max(a, b)


PYTHON = PythonLogic()


@dataclass(frozen=True)
class KernelFacts:
    """What an archetype's launch rules need to know about one kernel (search/prune.py's `kernel_facts`)."""

    archetype: str
    row_length: Any = 1        # elements each row loop walks (pointwise: the last axis); a Z3 term where symbolic
    itemsize: int = 4          # widest element the kernel loads
    vectorisable: bool = False  # codegen can cache the row in registers (vec > 1) for this body
    preloaded: int = 0         # buffers a vec > 1 kernel would cache
    head_dims: tuple[int, int] = (0, 0)   # attention: the q.k and the v head dims
    operand_bytes: int = 2     # matmul: an operand element's bytes in shared memory (float32's 3xTF32 takes 4)


@dataclass(frozen=True)
class Point:
    """One schedule as a rule sees it: `point.bm` is the parameter, `point.facts` and `point.target` the rest."""

    logic: Logic
    params: Mapping[str, Any]
    facts: KernelFacts | None = None
    target: Target | None = None

    def __getattr__(self, name: str) -> Any:
        try:
            return self.params[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def kernel(self) -> KernelFacts:
        assert self.facts is not None, "a launch rule needs the kernel's facts"
        return self.facts

    @property
    def gpu(self) -> Target:
        assert self.target is not None, "a launch rule needs the target"
        return self.target


@dataclass(frozen=True)
class Rule:
    """A named condition every valid schedule meets. A launch rule also reads the kernel's facts and the target;
    the others only the schedule, so codegen can check them with nothing else at hand."""

    label: str
    holds: Callable[[Point], Any]
    launch: bool = False


@dataclass(frozen=True)
class Archetype:
    """A kernel family's schedule: its parameters' candidate values, and the rules a valid schedule meets."""

    name: str
    space: Mapping[str, tuple[int, ...]]
    rules: tuple[Rule, ...] = field(default=())

    @property
    def size(self) -> int:
        """The points of the space."""
        count = 1
        for values in self.space.values():
            count *= len(values)
        return count

    def points(self) -> Iterator[dict[str, int]]:
        """Every point of the space, in declaration order (the last parameter varying fastest)."""
        names = list(self.space)
        for values in itertools.product(*(self.space[name] for name in names)):
            yield dict(zip(names, values))

    def membership(self, params: Mapping[str, int]) -> str | None:
        """The first parameter missing, extra or outside its values (as the rule `name in values`), or None."""
        if set(params) != set(self.space):
            return f"parameters {sorted(self.space)}"
        return next((f"{name} in {values}" for name, values in self.space.items() if params[name] not in values),
                    None)

    def violation(self, schedule: Schedule | Mapping[str, int], facts: KernelFacts | None = None,
                  target: Target | None = None) -> str | None:
        """The label of the first rule `schedule` breaks, or None. Without facts and target only the rules over
        the schedule alone are checked."""
        params = schedule.as_dict() if isinstance(schedule, Schedule) else dict(schedule)
        outside = self.membership(params)
        return outside if outside is not None else self.broken_rule(params, facts, target)

    def broken_rule(self, params: Mapping[str, int], facts: KernelFacts | None = None,
                    target: Target | None = None) -> str | None:
        """`violation` for a point known to lie in the space (as `points` yields them)."""
        point = Point(PYTHON, params, facts, target)
        launch = facts is not None and target is not None
        return next((rule.label for rule in self.rules if (launch or not rule.launch) and not rule.holds(point)),
                    None)
