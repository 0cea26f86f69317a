"""Extraction: programs out of a saturated e-graph, the graph as written first, then others priced by their work.

The first form is the graph as written, tidied (`TIDY_COSTS`, an op count: constants folded, redundant views gone,
every contraction in the order and with the operands written; of terms with as many ops, the one the user wrote). The others are priced by the time their arithmetic
takes on the target (ir/targets.py) at their shapes: an elementwise op one FP32 operation per element (a
transcendental TRANSCENDENTAL_FLOPS), a reduction one per element it reads, a MatMul 2 m k n operations at the
tensor cores' rate where its operands are 16-bit (else at the FP32 rate), views and leaves nothing but a
tie-breaking VIEW_S. So a contraction is priced as a MatMul (built as the primitive contraction, which partition
and codegen recognise) rather than as a broadcast product, and of two orders of a chain the one with fewer FLOPs
is the cheapest.

A program is priced as a DAG (search/dag.py): each e-class it uses once, its arithmetic plus its output's bytes
written once and read by each consumer at the target's memory bandwidth, so a product two consumers share is paid
once (a tree cost, counting it per use, would compute smaller products apart instead); a contraction the written
form holds as its broadcast product is priced as the MatMul it runs as (`as_matmuls`).

That estimate cannot see fusion, schedules or the prologue that a matmul with a computed operand runs on
mma.sync; the search's cost model and the GPU can. So `extract_forms` returns the written form, the cheapest by the
DAG price (local search from the tree-cheapest and the written choices), the cheapest by arithmetic as a tree, each
where it differs in a contraction or a reduction; then programs one e-class choice away from the DAG-cheapest, the
tree-cheapest or the written (where the choice moves work across a contraction or a reduction, the estimate's
least growth first) and SAMPLES drawn at random around the DAG-cheapest (seeded, weighted by price): distinct in
their hash and in the contractions and reductions they run, at most `MAX_FORMS` in all, the forms after the first
cheapest first. The search prices each form's kernels and chooses among them (search/engine.py). A graph
whose extraction fails raises `ExtractionError` (rewrites/eclasses.py); there is no fallback to the input graph,
which would hide an unsound rule. (Where saturation itself caught a rule merging two shapes, its report says
"conflict" and its e-graph is already the input graph's.)
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import random
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from tensorsmith.ir.graph import Graph
from tensorsmith.ir.node import Node
from tensorsmith.ir.targets import Target, get_target
from tensorsmith.ir.ops import COMMUTATIVE, LEAVES as LEAF_OPS, REDUCE, UNARY, VIEWS as VIEW_OPS, Op
from tensorsmith.rewrites.eclasses import (OPS, EClasses, ENode, ExtractionError, build_graph, cheapest, classes_of,
                                           enode_classes, enode_of, read_eclasses)
from tensorsmith.rewrites.saturate import Saturated
from tensorsmith.rewrites.term import LEAVES, VIEWS

from .cost import TRANSCENDENTAL_FLOPS
from .dag import DagPrice, dag_cheapest, sample, tree_prices

VIEW_S = 1e-15            # a view or a leaf: free, but fewer of them is the tidier program
TRANSCENDENTAL = frozenset(name for name, op in OPS.items() if op in UNARY)   # the special-function unit's ops
TENSOR_CORE_DTYPES = frozenset({"float16", "bfloat16"})
REDUCING = frozenset({"MatMul"} | {name for name, op in OPS.items() if op in REDUCE})
# The op-count cost the first form is extracted by (the program as written, tidied: constants folded, redundant
# views gone): views and leaves 0.1, elementwise 1, reductions 2, MatMul infinite so that every contraction keeps
# the order and operands it was written with. Only the forms after it come from rewriting contractions.
TIDY_COSTS: dict[str, float] = {**{op: 0.1 for op in LEAVES | VIEWS}, "Sum": 2.0, "Max": 2.0, "MatMul": math.inf,
                                "OnlineSoftmax": math.inf}
WRITTEN_DISCOUNT = 0.01   # of an e-node the user wrote, in the tidy extraction: of two terms with as many ops (a
                          # product reassociated, a scale moved), the one written; far less than any op a rule saves
MAX_FORMS = 5             # programs the search is given: the written form and up to four more
MAX_ALTERNATIVES = 64     # one-choice alternatives built (and deduplicated) to find them
FORMS_SECONDS = 2.0       # at most this long spent in the DAG's local search, and as long building alternatives


@dataclass(frozen=True)
class Form:
    """One program of the e-graph: its graph, its estimate (seconds of arithmetic and memory traffic on the target,
    each shared term once: `dag.DagPrice`; None where it was not extracted), and how it differs from the form it was
    derived from ("" for the first, the graph as written)."""

    graph: Graph
    seconds: float | None
    change: str = ""


def term_cost(classes: EClasses, target: Target) -> Callable[[ENode], float]:
    """The seconds of arithmetic one e-node costs on `target` at the shapes the analysis gave its e-classes."""
    def elements(c: int) -> int:
        return math.prod(classes.shapes.get(c, ()))

    def cost(enode: ENode) -> float:
        if enode.op in LEAVES or enode.op in VIEWS:
            return VIEW_S
        if enode.op == "OnlineSoftmax":
            return math.inf   # no primitive Node yet: never chosen
        if enode.op == "MatMul":
            tensor_cores = classes.dtypes.get(enode.children[0]) in TENSOR_CORE_DTYPES
            rate = max(target.wgmma_flops, target.mma_sync_flops) if tensor_cores else target.fp32_flops
            return 2 * math.prod(_ints(enode.lits[0])) / rate
        ops = TRANSCENDENTAL_FLOPS if enode.op in TRANSCENDENTAL else 1
        return ops * elements(enode.children[0]) / target.fp32_flops
    return cost


def as_matmuls(classes: EClasses, choice: dict[int, ENode]) -> dict[int, ENode]:
    """`choice` with each contraction chosen as its broadcast product, sum(expand(a) * expand(b)), chosen as the
    MatMul e-node of its e-class over the same operands: one program, priced as partition and codegen run it (a
    matmul on the tensor cores, its product never stored), not as an elementwise product and a reduction."""
    priced = dict(choice)
    for c, enode in choice.items():
        product = choice.get(enode.children[0]) if enode.op == "Sum" else None
        if product is None or product.op != "Mul" or not all(choice[k].op == "Expand" for k in product.children):
            continue
        operands = sorted(choice[k].children[0] for k in product.children)
        matmul = next((e for e in classes.nodes[c] if e.op == "MatMul" and e.lits[1:] == enode.lits
                       and sorted(e.children) == operands), None)
        if matmul is not None:
            priced[c] = matmul
    return priced


def extract(saturated: Saturated, target: Target | str = "sm90") -> Graph:
    """The graph as written, tidied, out of the saturated e-graph: a new Graph with the original's inputs and
    outputs (the first of `extract_forms`)."""
    return extract_forms(saturated, target, max_forms=1)[0].graph


def extract_forms(saturated: Saturated, target: Target | str = "sm90", max_forms: int = MAX_FORMS,
                  seconds: float = FORMS_SECONDS, seed: int = 0) -> list[Form]:
    """Distinct programs of the e-graph (`Form`): first the program as written, tidied (`TIDY_COSTS`); then, where
    they differ from it in a contraction or a reduction, the cheapest by the DAG price (search/dag.py: arithmetic and
    bytes moved, each shared term once) and the cheapest by arithmetic as a tree (each use counted); then those one
    e-class choice away from either or from the written (the estimate's least growth first), and up to `SAMPLES`
    choices drawn at random around the DAG-cheapest (seeded by `seed`); the forms after the first ordered by their
    DAG price."""
    target = get_target(target) if isinstance(target, str) else target
    classes = read_eclasses(saturated.egraph, saturated.roots)
    cost = term_cost(classes, target)
    price = DagPrice(classes, cost, target)
    owner = enode_classes(classes)
    written = written_enodes(classes, saturated.graph)
    tidy = cheapest(classes, lambda enode: TIDY_COSTS.get(enode.op, 1.0) * (1 - WRITTEN_DISCOUNT * (enode in written)))
    forms: list[Form] = []
    seen: set[object] = set()      # the forms' hashes and their work (`_work`)
    mates = originals_by_class(classes, saturated.graph)

    def add(choice: dict[int, ENode], change: Callable[[], str]) -> None:
        """The choice's program as a form, unless it is cyclic or seen; its label made only then (a cyclic choice
        has no text)."""
        try:
            built: dict[int, Node] = {}
            graph = build_graph(classes, choice, saturated.graph, built)
            graph = carry_locations(saturated.graph, graph, mates, built)
        except ExtractionError:  # an ill-formed term: an unsound rule, never hidden
            raise
        except ValueError:       # an alternative's cheapest children lead back to its own e-class
            if not forms:
                raise
            return
        priced = as_matmuls(classes, choice)
        key, work = canonical_hash(graph), _work(classes, priced)
        if key not in seen and work not in seen:
            seen.update((key, work) if forms else (key,))   # the first's work unseen: its tidy form may differ
            forms.append(Form(graph, price.seconds(priced), change()))

    add(tidy, lambda: "")
    if max_forms == 1:
        return forms
    tree = cheapest(classes, cost)
    starts = [cheapest(classes, lambda enode: price.written_seconds(owner[enode], enode)), tree, tidy]
    best = dag_cheapest(classes, starts, price, time.monotonic() + seconds)
    end = time.monotonic() + seconds     # the alternatives' own time, however long the DAG's search took
    if _moves_work(classes, tidy, best):   # a pointwise difference would give the same kernels
        add(best, functools.partial(_difference, classes, tidy, best))
    if _moves_work(classes, tidy, tree) and _moves_work(classes, best, tree):
        add(tree, functools.partial(_difference, classes, tidy, tree))
    bases = (best, tree, tidy)
    options = sorted(((growth, c, enode, k) for k, base in enumerate(bases)
                      for growth, c, enode in _alternatives(classes, base, cost)[:MAX_ALTERNATIVES]),
                     key=lambda item: (item[0], item[1], item[2].op, item[3]))
    sampled = 0
    for _, c, enode, k in options:
        if len(forms) >= max_forms - SAMPLES or time.monotonic() > end:
            break
        base = bases[k]
        choice = {**base, c: enode}
        add(choice, functools.partial(_change, classes, base, choice, c))
    rng = random.Random(seed)
    tree_of_best = tree_prices(classes, best, price)
    for _ in range(SAMPLE_DRAWS):
        if len(forms) >= max_forms or sampled >= SAMPLES or time.monotonic() > end:
            break
        drawn = sample(classes, best, price, rng, moves_across, tree_of_best)
        if _moves_work(classes, best, drawn):
            count = len(forms)
            add(drawn, functools.partial(_difference, classes, best, drawn))
            sampled += len(forms) - count
    for _, c, enode, k in options:      # the slots samples left
        if len(forms) >= max_forms or time.monotonic() > end:
            break
        base = bases[k]
        choice = {**base, c: enode}
        add(choice, functools.partial(_change, classes, base, choice, c))
    ranked = forms[:1] + sorted(forms[1:], key=lambda form: form.seconds if form.seconds is not None else math.inf)
    return ranked[:max_forms]


SAMPLES = 1          # of the forms: at most this many drawn at random around the DAG-cheapest (`dag.sample`)
SAMPLE_DRAWS = 8     # draws tried to find them (a draw may repeat a form or change nothing that moves work)


def moves_across(chosen: ENode, other: ENode) -> bool:
    """Whether choosing `other` instead of `chosen` in an e-class may change kernels: another e-node, not the same
    operation reordered, where either is a contraction or a reduction (a pointwise choice fuses alike)."""
    return (other != chosen and not (other.op == chosen.op and other.lits == chosen.lits
                                     and sorted(other.children) == sorted(chosen.children))
            and bool({other.op, chosen.op} & REDUCING))


def _work(classes: EClasses, choice: dict[int, ENode]) -> frozenset[tuple[object, ...]]:
    """The contractions and reductions a choice's program runs, by e-class (operands in either order): two choices
    with the same differ only in pointwise terms, which fusion makes the same kernels, so the search is given one."""
    return frozenset((c, choice[c].op, choice[c].lits, tuple(sorted(choice[c].children)))
                     for c in _reachable(classes, choice) if choice[c].op in REDUCING)


def _moves_work(classes: EClasses, before: dict[int, ENode], after: dict[int, ENode]) -> bool:
    """Whether `after` chooses otherwise than `before` in an e-class where a contraction or a reduction is chosen."""
    return any(before.get(c) != after[c] and {after[c].op, before[c].op if c in before else ""} & REDUCING
               for c in _reachable(classes, after))


def _change(classes: EClasses, before: dict[int, ENode], after: dict[int, ENode], c: int) -> str:
    """One e-class's term before and after a choice, as a person reads them: as deep as they first differ (up to
    CHANGE_DEPTH), or, where they differ only in views (which the text leaves out), saying so."""
    for depth in range(TEXT_DEPTH, CHANGE_DEPTH + 1):
        old, new = term_text(classes, before, c, depth), term_text(classes, after, c, depth)
        if old != new:
            return f"{old} -> {new}"
    return f"{term_text(classes, before, c)}, its views rearranged"


CHANGE_DEPTH = 8   # the deepest text a form's change is shown at


def _difference(classes: EClasses, before: dict[int, ENode], after: dict[int, ENode]) -> str:
    """Where two choices differ as a person reads them: the e-class nearest the outputs whose chosen constructors
    differ (below one that only reads differently operands), before -> after."""
    order, seen = list(classes.roots.values()), set()
    while order:
        c = order.pop(0)
        if c in seen or c not in before or c not in after:
            continue
        seen.add(c)
        old, new = term_text(classes, before, c), term_text(classes, after, c)
        if old != new and before[c].op != after[c].op:
            return _change(classes, before, after, c)
        if old != new:
            order.extend(before[c].children)
    return " ; ".join(_change(classes, before, after, r) for r in classes.roots.values())


def canonical_hash(graph: Graph) -> str:
    """A hash of what the graph computes, equal for graphs that differ only in the order of commutative operands
    (a * b and b * a are one program to partition and to run)."""
    digests: dict[int, str] = {}
    for node in graph.nodes():
        kids = [digests[id(src)] for src in node.srcs]
        if node.op in COMMUTATIVE:
            kids.sort()
        text = repr((node.op.value, repr(node.arg), node.shape, node.dtype.value, kids))
        digests[id(node)] = hashlib.sha256(text.encode()).hexdigest()
    return hashlib.sha256(repr(sorted((name, digests[id(node)]) for name, node in graph.outputs.items()))
                          .encode()).hexdigest()


def _reachable(classes: EClasses, choice: dict[int, ENode]) -> list[int]:
    """The e-classes the chosen program uses, each once, roots first."""
    order: list[int] = []
    seen: set[int] = set()
    stack = list(classes.roots.values())
    while stack:
        c = stack.pop()
        if c in seen or c not in choice:
            continue
        seen.add(c)
        order.append(c)
        stack.extend(choice[c].children)
    return order


def _alternatives(classes: EClasses, best: dict[int, ENode],
                  cost: Callable[[ENode], float]) -> list[tuple[float, int, ENode]]:
    """(growth of the estimate, e-class, e-node) for each other e-node of an e-class the program `best` uses that
    moves work across a contraction or a reduction (what changes kernels): not a reordering of the same operands, not
    a pointwise choice, which fusion makes the same kernels either way."""
    totals: dict[int, float] = {}
    for c in _reachable(classes, best):
        _tree(classes, best, c, cost, totals)
    found = []
    for c in _reachable(classes, best):
        chosen = best[c]
        for enode in classes.nodes[c]:
            if enode == chosen or not all(child in best for child in enode.children):
                continue
            if enode.op == chosen.op and enode.lits == chosen.lits and sorted(enode.children) == sorted(
                    chosen.children):
                continue
            if not {enode.op, chosen.op} & REDUCING:
                continue    # a pointwise choice: fused into the same kernels either way
            tree = cost(enode) + sum(_tree(classes, best, child, cost, totals) for child in enode.children)
            if math.isfinite(tree):
                found.append((tree - totals[c], c, enode))
    found.sort(key=lambda item: (item[0], item[1], item[2].op))
    return found


def _tree(classes: EClasses, best: dict[int, ENode], c: int, cost: Callable[[ENode], float],
          totals: dict[int, float]) -> float:
    """The tree cost of e-class c's cheapest term (memoised in `totals`; iterative, for deep graphs)."""
    stack = [c]
    while stack:
        top = stack[-1]
        if top in totals:
            stack.pop()
            continue
        pending = [child for child in best[top].children if child not in totals]
        if pending:
            stack.extend(pending)
            continue
        totals[top] = cost(best[top]) + sum(totals[child] for child in best[top].children)
        stack.pop()
    return totals[c]


def _operand_side(choice: dict[int, ENode], c: int) -> str:
    """Which operand of `a @ b` a MatMul operand is by its view: a reshaped to (m, k, 1), b to (1, k, n)."""
    enode = choice[c]
    if enode.op == "Expand":
        enode = choice[enode.children[0]]
    shape = _ints(enode.lits[0]) if enode.op == "Reshape" else ()
    if len(shape) == 3 and shape[-1] == 1:
        return "left"
    return "right" if len(shape) == 3 and shape[0] == 1 else ""


def _ints(value: object) -> tuple[int, ...]:
    """An e-node's shape literal (a tuple of ints, as eclasses decodes a Vec[i64])."""
    assert isinstance(value, tuple)
    return value


INFIX = {"MatMul": "@", "Add": "+", "Mul": "*"}
TEXT_DEPTH = 4            # a term shown deeper than this is "..."


def term_text(classes: EClasses, choice: dict[int, ENode], c: int, depth: int = TEXT_DEPTH) -> str:
    """The chosen term of e-class c as a person reads it: inputs by name, views left out, products as @."""
    enode, transposed = choice[c], False
    while enode.op in VIEWS:
        transposed ^= enode.op == "Permute" and _ints(enode.lits[0])[-2:] == (1, 0)
        enode = choice[enode.children[0]]
    product = choice.get(enode.children[0]) if enode.op == "Sum" else None
    if product is not None and product.op == "Mul" and all(choice[k].op in VIEWS for k in product.children):
        enode = ENode("MatMul", product.children, enode.lits)   # sum(expand(a) * expand(b)): a @ b
    if enode.op == "Input":
        return f"{enode.lits[0]}.T" if transposed else str(enode.lits[0])
    if enode.op == "Const":
        return "const"
    if depth == 0:
        return "..."
    children = list(enode.children)
    if enode.op == "MatMul" and (_operand_side(choice, children[1]) == "left"
                                 or _operand_side(choice, children[0]) == "right"):
        children.reverse()    # the product is elementwise, so either order is the same MatMul: show a @ b
    parts = [term_text(classes, choice, child, depth - 1) for child in children]
    if enode.op in INFIX:
        return f"({f' {INFIX[enode.op]} '.join(parts)})"
    return f"{enode.op.lower()}({', '.join(parts)})"


REWRITTEN = "(rewritten)"   # marks a node that only a rewrite made, after the line of the code it serves


def written_enodes(classes: EClasses, graph: Graph) -> set[ENode]:
    """The e-nodes the graph's own nodes entered the e-graph as, where it still holds them."""
    nodes = graph.nodes()
    found = classes_of(classes, nodes)
    return {enode_of(node, tuple(found[id(src)] for src in node.srcs)) for node in nodes if id(node) in found}


def originals_by_class(classes: EClasses, graph: Graph) -> dict[int, Node]:
    """An original node (not an input) of each e-class that holds one: what `carry_locations` takes lines from."""
    nodes = graph.nodes()
    by_id = {id(node): node for node in nodes}
    mates: dict[int, Node] = {}
    for node_id, c in classes_of(classes, nodes).items():
        if by_id[node_id].op != Op.INPUT:
            mates.setdefault(c, by_id[node_id])
    return mates


LAYOUT_OPS = LEAF_OPS | VIEW_OPS | {Op.CONTIGUOUS}   # the data, written again: never marked REWRITTEN by its e-class


def carry_locations(original: Graph, chosen: Graph, mates: Mapping[int, Node] | None = None,
                    built: Mapping[int, Node] | None = None) -> Graph:
    """`chosen` with each node's `where` (the user's file:line) and `api` taken from the original node of the same
    structure, so that errors, kernel names and kernel headers still point at the model. A node that a rewrite made
    takes them from the original node of its e-class (`mates` by e-class, `built`: the Node made for each e-class),
    which computes the same value, marked REWRITTEN where its op is another (a constant or a view is not:
    LAYOUT_OPS); failing that, marked, from the node that consumes it (an output: the original output's)."""
    interned: dict[tuple, int] = {}      # structure -> a small int, so keys stay flat however deep the graph

    def key(node: Node, keys: dict[int, int]) -> int:
        shape = (node.op, repr(node.arg), node.shape, node.dtype, tuple(keys[id(src)] for src in node.srcs))
        return interned.setdefault(shape, len(interned))

    keys: dict[int, int] = {}
    known: dict[int, Node] = {}
    for node in original.nodes():
        keys[id(node)] = key(node, keys)
        known.setdefault(keys[id(node)], node)
    order = chosen.nodes()
    new_keys: dict[int, int] = {}
    source: dict[int, tuple[str, str]] = {}
    for node in order:
        new_keys[id(node)] = key(node, new_keys)
        if new_keys[id(node)] in known:
            mate = known[new_keys[id(node)]]
            source[id(node)] = mate.where, mate.api
    for c, node in (built or {}).items():
        kin = (mates or {}).get(c)
        if id(node) not in source and kin is not None:
            same = kin.op == node.op or node.op in LAYOUT_OPS
            source[id(node)] = kin.where if same else _marked(kin.where), kin.api
    unchanged = {node_id for node_id, (where, _) in source.items() if not where.endswith(REWRITTEN)}
    _pass_down(order, source, unchanged)      # from a consumer as written, then one rewritten, then farther ones,
    _pass_down(order, source, set(source))    # then the outputs
    _pass_down(order, source, None)
    for name, node in chosen.outputs.items():
        mate = original.outputs[name]
        source.setdefault(id(node), (_marked(mate.where), mate.api))
    _pass_down(order, source, None)
    copies: dict[int, Node] = {}
    for node in order:
        where, api = source.get(id(node), (REWRITTEN, ""))
        copies[id(node)] = node if node.op == Op.INPUT else dataclasses.replace(
            node, srcs=tuple(copies[id(src)] for src in node.srcs), where=where, api=api)
    located = Graph(chosen.name)
    located.inputs = dict(chosen.inputs)
    located.outputs = {name: copies[id(node)] for name, node in chosen.outputs.items()}
    return located


def _pass_down(order: list[Node], source: dict[int, tuple[str, str]], givers: set[int] | None) -> None:
    """Give each node without a source its consumer's, marked REWRITTEN (consumers come later in `order`): only the
    consumers in `givers` give (None: any consumer with a source, one given in this pass too)."""
    for node in reversed(order):
        if id(node) in source and (givers is None or id(node) in givers):
            where, api = source[id(node)]
            for src in node.srcs:
                source.setdefault(id(src), (_marked(where), api))


def _marked(where: str) -> str:
    """A node's `where` marked REWRITTEN once (a path may hold spaces: only the mark is taken off first)."""
    line = where.removesuffix(f" {REWRITTEN}").removesuffix(REWRITTEN)
    return f"{line} {REWRITTEN}" if line else REWRITTEN
