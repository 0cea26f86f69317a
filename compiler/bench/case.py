"""A benchmark case: a graph written as users write models, its PyTorch reference, and what bounds its speed."""
from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tensorsmith.ir.errors import TensorsmithError
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.node import Node, toposort
from tensorsmith.ir.ops import Op
from tensorsmith.ir.patterns import lookup_reads, match_gather
from tensorsmith.search.verify import weight_scales

SUITE_PACKAGE = "tensorsmith.suite"    # benchmarks/models/, installed with tensorsmith
FAMILIES = ("memory-bound", "matmul", "fused", "algebra", "attention", "block", "imported", "model", "depth",
            "vision")


class CaseError(TensorsmithError):
    """A case named on the command line does not exist, or a case file is malformed."""


@dataclass(frozen=True)
class Case:
    """One row of the suite.

    `reference(**tensors)` computes the graph's single output (or a dict of outputs) with idiomatic PyTorch.
    Inputs are drawn as verification draws them (weight matrices N(0, 1/fan_in), as initialisers draw them; the
    rest N(0, 1)) except where `std` gives an input's standard deviation (a bias's, say), or `values(torch, seed)`
    gives them all (an imported model's token ids and its own weights, which random draws would not stand for);
    `flops` overrides the FLOPs of contractions read off the graph where that count misleads (a causal mask halves
    the work to do). `backend(torch)`, where given, is the model as `torch.compile(model, backend="tensorsmith")`
    makes it, called like `reference`: a user's other way in from PyTorch, measured as called beside ours.
    """

    graph: Graph
    reference: Callable[..., Any]
    family: str
    std: dict[str, float] = field(default_factory=dict)
    flops: float | None = None
    note: str = ""
    values: Callable[[Any, int], dict[str, Any]] | None = None
    backend: Callable[[Any], Callable[..., Any]] | None = None

    def __post_init__(self) -> None:
        _check_family(self.graph.name, self.family)
        unknown = set(self.std) - set(self.graph.inputs)
        if unknown:
            raise CaseError(f"case {self.graph.name!r}: std given for unknown inputs {sorted(unknown)}")
        if self.values is not None and self.std:
            raise CaseError(f"case {self.graph.name!r}: gives its own values, so std says nothing")

    @property
    def name(self) -> str:
        return self.graph.name

    def input_std(self, name: str) -> float:
        """The standard deviation `name` is drawn with."""
        return self.std[name] if name in self.std else self._weight_scales.get(name, 1.0)

    @functools.cached_property
    def _weight_scales(self) -> dict[str, float]:
        return weight_scales(self.graph)      # a walk of the whole graph: once per case, not once per input

    def bytes_moved(self) -> int:
        """The fewest bytes any program must move: every input read once (of a table only looked up in, the rows
        its lookups read), every output written once."""
        tables = lookup_reads(list(self.graph.outputs.values()))
        inputs = sum(tables.get(name, node.size) * node.dtype.itemsize for name, node in self.graph.inputs.items())
        return inputs + sum(node.size * node.dtype.itemsize for node in self.graph.outputs.values())

    def matmul_flops(self) -> float:
        """Floating-point operations of the graph's contractions (2 per multiply-add of a sum over products)."""
        if self.flops is not None:
            return self.flops
        return float(sum(2 * node.srcs[0].size for node in toposort(self.graph.outputs.values())
                         if _is_contraction(node)))

    def floor_s(self, copy_bytes_per_s: float, matmul_flops_per_s: float) -> float:
        """The larger of the bytes at the copy rate and the FLOPs at the matmul rate: no program runs much faster."""
        return max(self.bytes_moved() / copy_bytes_per_s, self.matmul_flops() / matmul_flops_per_s)


@dataclass(frozen=True)
class DeferredCase:
    """A case whose graph takes seconds to build (an imported model: torch.export runs), built the first time it
    is run, so that listing and selecting the suite stays instant."""

    name: str
    family: str
    build: Callable[[], Case]
    note: str = ""
    parameters: Callable[[], int] | None = None   # the model's parameter count, without building it (for --list)

    def __post_init__(self) -> None:
        _check_family(self.name, self.family)

    @functools.cached_property
    def case(self) -> Case:
        built = self.build()
        if built.name != self.name or built.family != self.family:
            raise CaseError(f"case {self.name!r} ({self.family}) built as {built.name!r} ({built.family})")
        return built


AnyCase = Case | DeferredCase


def built(case: AnyCase) -> Case:
    """The case itself, its graph built where it was deferred (raises what building it raises)."""
    return case.case if isinstance(case, DeferredCase) else case


def _check_family(name: str, family: str) -> None:
    if family not in FAMILIES:
        raise CaseError(f"case {name!r}: family {family!r} is not one of {', '.join(FAMILIES)}")


def _is_contraction(node: Node) -> bool:
    """sum(expand(a) * expand(b)) is a contraction (a matmul, attention's scores, a batched product); sum(x * x)
    is not, nor is a lookup (a one-hot sum reads one row)."""
    return (node.op == Op.SUM and node.srcs[0].op == Op.MUL and any(src.op == Op.EXPAND for src in node.srcs[0].srcs)
            and match_gather(node) is None)


def half_precision_contractions(graph: Graph) -> bool:
    """Whether the graph multiplies float16 or bfloat16 matrices: products a baseline should run on tensor cores."""
    return any(_is_contraction(node) and node.srcs[0].dtype.itemsize == 2 and node.srcs[0].dtype.is_float
               for node in toposort(graph.outputs.values()))


def causal_attention_flops(batch: int, heads: int, tokens: int, head_dim: int) -> float:
    """The FLOPs left to do in causal attention: the unmasked half (with the diagonal) of the scores and of P V."""
    return 2.0 * batch * heads * tokens * (tokens + 1) * head_dim


def load_suite() -> list[AnyCase]:
    """Every case of every file in benchmarks/models/ (the package tensorsmith.suite), family by family."""
    package = importlib.import_module(SUITE_PACKAGE)
    cases: list[AnyCase] = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{SUITE_PACKAGE}.{info.name}")
        found = getattr(module, "CASES", None)
        if not isinstance(found, list) or not all(isinstance(c, (Case, DeferredCase)) for c in found):
            raise CaseError(f"{module.__file__} must define CASES, a list of tensorsmith.bench.Case (or DeferredCase)")
        cases.extend(found)
    cases.sort(key=lambda c: FAMILIES.index(c.family))
    names = [c.name for c in cases]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise CaseError(f"case names must be unique; repeated: {', '.join(repeated)}")
    return cases


def select(cases: list[AnyCase], patterns: list[str]) -> list[AnyCase]:
    """The cases named by `patterns` (a case name, a family, or a prefix ending in '*'), in suite order."""
    if not patterns:
        return cases
    chosen = set()
    for pattern in patterns:
        hits = {c.name for c in cases if c.name == pattern or c.family == pattern
                or (pattern.endswith("*") and c.name.startswith(pattern[:-1]))}
        if not hits:
            raise CaseError(f"no benchmark case or family matches {pattern!r}; `tensorsmith bench --list` lists them")
        chosen |= hits
    return [c for c in cases if c.name in chosen]
