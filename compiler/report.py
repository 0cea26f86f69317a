"""report.html: one self-contained page per compiled program (inline CSS and SVG, no network)."""
from __future__ import annotations

import html
import re
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2

if TYPE_CHECKING:
    from .program import Program

CUDA_KEYWORDS = ("extern", "__global__", "__device__", "__shared__", "__restrict__", "__launch_bounds__",
                 "__forceinline__", "const", "constexpr", "for", "if", "return", "struct", "template", "class",
                 "typedef", "int", "float", "bool", "void", "if constexpr", "__half", "__nv_bfloat16", "idx_t")
_TOKEN = re.compile(r"(?P<comment>//[^\n]*)|(?P<pre>#\w+)|(?P<number>\b\d+(\.\d+)?(e[-+]?\d+)?f?\b)"
                    r"|(?P<word>\b[A-Za-z_]\w*\b)")


def highlight(source: str) -> str:
    """CUDA source as HTML with spans for comments, preprocessor lines, numbers and keywords."""
    keywords = set(CUDA_KEYWORDS)
    out, last = [], 0
    for match in _TOKEN.finditer(source):
        out.append(html.escape(source[last:match.start()]))
        text, kind = match.group(0), match.lastgroup
        if kind == "word" and text not in keywords:
            out.append(html.escape(text))
        else:
            css = {"comment": "c", "pre": "p", "number": "n", "word": "k"}.get(kind or "", "k")
            out.append(f'<span class="{css}">{html.escape(text)}</span>')
        last = match.end()
    out.append(html.escape(source[last:]))
    return "".join(out)


def diagram(program: "Program") -> dict:
    """A layered layout of the program: buffers and kernels as boxes, data flow as edges (for inline SVG)."""
    rows: list[list[dict]] = [[{"id": f"b:{n}", "label": n, "kind": "input"} for n in program.inputs]]
    for position, kernel in enumerate(program.kernels):
        rows.append([{"id": f"k:{position}", "label": kernel.name, "kind": kernel.archetype}])
        rows.append([{"id": f"b:{name}", "label": name, "kind": program.buffers[name].role}
                     for name in kernel.writes])
    width, box_w, box_h, gap = 760, 220, 30, 24
    nodes = {}
    for r, row in enumerate(rows):
        for c, node in enumerate(row):
            x = (width - len(row) * (box_w + 20)) / 2 + c * (box_w + 20) + 10
            nodes[node["id"]] = {**node, "x": x, "y": 10 + r * (box_h + gap), "w": box_w, "h": box_h}
    edges = []
    for position, kernel in enumerate(program.kernels):
        for name in kernel.params:
            if name in kernel.writes:
                edges.append((f"k:{position}", f"b:{name}"))
            elif f"b:{name}" in nodes:
                edges.append((f"b:{name}", f"k:{position}"))
    lines = []
    for i, (a, b) in enumerate(edges):
        x1, y1 = nodes[a]["x"] + box_w / 2, nodes[a]["y"] + box_h
        x2, y2 = nodes[b]["x"] + box_w / 2, nodes[b]["y"]
        bow = 0 if y2 - y1 <= gap + 1 else box_w / 2 + 30 + 12 * (i % 5)   # long edges bow round the boxes
        lines.append({"d": f"M {x1} {y1} C {x1 + bow} {y1 + gap}, {x2 + bow} {y2 - gap}, {x2} {y2}"})
    return {"nodes": list(nodes.values()), "edges": lines, "width": width,
            "height": 20 + len(rows) * (box_h + gap)}


def plot(history: list[dict]) -> dict:
    """Each candidate's time (dots) and the best found so far (a line) against candidates tried, for SVG."""
    empty = {"points": "", "dots": [], "labels": [], "width": 560, "height": 240, "count": 0}
    if not history:
        return empty
    width, height, pad = 560, 240, 44
    top = max(entry["us"] for entry in history) * 1.1 or 1.0

    def x(i: int) -> float:
        return round(pad + (width - 2 * pad) * (i / max(1, len(history) - 1)), 1)

    def y(us: float) -> float:
        return round(height - pad - (height - 2 * pad) * (us / top), 1)

    best, line, labels = float("inf"), [], []
    for i, entry in enumerate(history):
        if entry["us"] < best:
            best = entry["us"]
            labels.append({"x": x(i), "y": y(best), "label": f"{best:.1f} us"})
        line.append(f"{x(i)},{y(best)}")
    dots = [{"x": x(i), "y": y(e["us"]), "title": f"{e['name']}: {e['us']:.1f} us ({e['basis']})"}
            for i, e in enumerate(history)]
    return {"points": " ".join(line), "dots": dots, "labels": [labels[0], labels[-1]] if len(labels) > 1 else labels,
            "width": width, "height": height, "count": len(history), "top": round(top, 1)}


@lru_cache(maxsize=1)
def _template() -> jinja2.Template:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    return env.get_template("report.html.j2")


def render_report(program: "Program") -> str:
    """The whole page for `program`."""
    doc = program.describe()
    kernels = [{**k, "html": highlight(c.source)} for k, c in zip(doc["kernels"], program.kernels)]
    return _template().render(doc=doc, kernels=kernels, diagram=diagram(program),
                              plot=plot(doc["report"].get("search_history", [])))
