"""What saturation did to a graph, for people: which rules fired and how often, the e-graph's size per stage, and
optionally the e-graph itself as a Graphviz file (`tensorsmith rewrites model.py` prints `describe`).

    >>> print(describe(graph, dot_path="egraph.dot"))     # then: dot -Tsvg egraph.dot -o egraph.svg
"""
from __future__ import annotations

from pathlib import Path

from tensorsmith.ir.graph import Graph

from .eclasses import EClasses, decode_value, read_eclasses
from .rules import RULES
from .saturate import Saturated, saturate

DOT_MAX_ECLASSES = 2000   # a larger e-graph is written truncated (Graphviz does not lay out much more)


def describe(graph: Graph, dot_path: str | Path | None = None, saturated: Saturated | None = None) -> str:
    """A report of saturating `graph` (or of `saturated`, when given); writes the e-graph to `dot_path`."""
    result = saturated if saturated is not None else saturate(graph)
    report = result.report
    lines = [f"{graph.name}: {len(graph.nodes())} nodes -> {report.summary()}", "",
             "stage         iterations  e-nodes  seconds  stopped"]
    stops = dict(report.stage_stops)
    for stage, iterations, enodes, seconds in report.per_stage():
        lines.append(f"{stage:<13} {iterations:>10} {enodes:>8} {seconds:>8.2f}  {stops.get(stage, '')}")
    fired = sorted(((count, name) for name, count in report.matches if count), reverse=True)
    models = {rule.name: (rule.model, rule.stage) for rule in RULES}
    lines += ["", "rule                  matches  model  stage"]
    for count, name in fired:
        model, stage = models.get(name, ("?", "?"))
        lines.append(f"{name:<21} {count:>8}  {model:<5}  {stage}")
    counted = dict(report.matches)
    idle = sorted(rule.name for rule in RULES if not counted.get(rule.name))
    if idle:
        lines.append(f"(no matches: {', '.join(idle)})")
    classes = read_eclasses(result.egraph, result.roots)
    patterns = sorted({enode.op for enodes in classes.nodes.values() for enode in enodes
                       if enode.op in ("MatMul", "OnlineSoftmax")})
    lines.append(f"pattern forms present: {', '.join(patterns) if patterns else 'none'}")
    if dot_path is not None:
        Path(dot_path).write_text(to_dot(classes, graph.name))
        lines.append(f"e-graph written to {dot_path}")
    return "\n".join(lines)


def _label(op: str, lits: tuple[object, ...]) -> str:
    if op == "Const":
        return f"Const {decode_value(lits[0])!r} {lits[2]}"  # type: ignore[arg-type]
    shown = [str(lit) for lit in lits if lit != ()]
    return " ".join([op, *shown]).replace('"', "'")


def to_dot(classes: EClasses, name: str = "egraph") -> str:
    """The e-graph in Graphviz: one cluster per e-class (its shape and dtype in the label), one box per e-node,
    an edge from an e-node to each child e-class; the roots are drawn bold."""
    roots = {c: out for out, c in classes.roots.items()}
    out = [f'digraph "{name}" {{', "  compound=true; node [shape=box, fontsize=10];"]
    kept = sorted(classes.nodes)[:DOT_MAX_ECLASSES]
    edges = []
    for c in kept:
        title = f"e{c} {classes.shapes.get(c, '?')} {classes.dtypes.get(c, '?')}"
        if c in roots:
            title = f"{roots[c]} = {title}"
        out.append(f'  subgraph cluster_{c} {{ label="{title}"; style={"bold" if c in roots else "dashed"};')
        out.append(f"    e{c}_anchor [shape=point, style=invis];")
        for k, enode in enumerate(classes.nodes[c]):
            out.append(f'    e{c}_{k} [label="{_label(enode.op, enode.lits)}"];')
            edges += [f"  e{c}_{k} -> e{child}_anchor [lhead=cluster_{child}];" for child in enode.children
                      if child in classes.nodes and child <= kept[-1]]
        out.append("  }")
    if len(classes.nodes) > len(kept):
        out.append(f'  truncated [label="{len(classes.nodes) - len(kept)} more e-classes not drawn", shape=note];')
    return "\n".join(out + edges + ["}"]) + "\n"
