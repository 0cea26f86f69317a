"""report.html: one self-contained page per compiled program (inline CSS and SVG, no network)."""
from __future__ import annotations

import html
import math
import re
from functools import lru_cache
from pathlib import Path

import jinja2

from .compiled import CompiledProgram


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


# The program diagram: rows of boxes top to bottom, each kernel and then the buffers it writes in one column, every
# input in a grid beside the row above the first kernel that reads it. A row wraps into lines no wider than
# DIAGRAM_WIDTH; edges turn in the gaps between lines and run down gutters between a row's columns or lanes right of
# the boxes they pass, never through a box; the frame is sized to hold all that is drawn.
DIAGRAM_WIDTH = 960              # the page's column is 1000 px: a diagram up to this wide is drawn at its own size
BOX_H, BOX_PAD, BOX_MIN_W, BOX_MAX_W = 30, 10, 72, 320
TEXT_BASELINE = 19               # from a box's top, for the template's 12 px font
LINE_GAP, COLUMN_GAP, SIDE_GAP, MARGIN = 24, 20, 40, 12
CLEARANCE = 4                    # an edge passing a line keeps this far from its boxes
GUTTER_STEP, GUTTER_SLOTS = 3, 5  # edges down one gutter are spread over 5 positions 3 px apart, inside its 20 px
LANE_GAP, LANE_STEP = 16, 10     # one lane per source: its long edges share it and branch off to their targets
# advance widths in px of the 12 px font, rounded up from DejaVu Sans (among the widest sans faces), so labels fit
NARROW_PX, WIDE_PX, UPPER_PX, OTHER_PX = 4.9, 12.0, 8.4, 7.7
NARROW_CHARS, WIDE_CHARS = frozenset("fijlrt()[].,:;'!| "), frozenset("mwMW\u2026")
ELLIPSIS = "\u2026"


def text_width(text: str) -> float:
    """An upper estimate of `text`'s width in the diagram's font, so that boxes are sized to hold their labels."""
    def advance(char: str) -> float:
        if char in NARROW_CHARS:
            return NARROW_PX
        if char in WIDE_CHARS:
            return WIDE_PX
        return UPPER_PX if char.isupper() else OTHER_PX
    return sum(advance(char) for char in text)


def _fit(label: str, width: float) -> str:
    """`label`, cut short with an ellipsis where it is wider than `width` (the box's title keeps it whole)."""
    if text_width(label) <= width:
        return label
    while label and text_width(label + ELLIPSIS) > width:
        label = label[:-1]
    return label + ELLIPSIS


def _rows(program: CompiledProgram) -> list[tuple[list[dict], list[dict]]]:
    """The rows top to bottom as (the kernels' column, the inputs beside it): the inputs that kernel 0 reads, then
    each kernel and the buffers it writes, the inputs that the next kernel reads first beside those buffers."""
    first_reader: dict[str, int] = {}
    for position, kernel in enumerate(program.kernels):
        for name in kernel.params:
            first_reader.setdefault(name, position)

    def inputs(position: int) -> list[dict]:     # an input no kernel reads is drawn at the top
        return [{"id": f"b:{name}", "label": name, "kind": "input", "kernel": False} for name in program.inputs
                if first_reader.get(name, 0) == position]

    rows: list[tuple[list[dict], list[dict]]] = [([], inputs(0))]
    for position, kernel in enumerate(program.kernels):
        rows.append(([{"id": f"k:{position}", "label": f"{kernel.name} ({kernel.archetype})", "kind": kernel.archetype,
                       "kernel": True}], []))
        rows.append(([{"id": f"b:{name}", "label": name, "kind": program.buffers[name].role, "kernel": False}
                      for name in kernel.writes], inputs(position + 1)))
    return [row for row in rows if row[0] or row[1]]


def _box_width(boxes: list[dict]) -> float:
    """One width for `boxes`: their longest label's, within BOX_MIN_W and BOX_MAX_W."""
    widest = max((text_width(box["label"]) for box in boxes), default=0.0)
    return min(BOX_MAX_W, max(BOX_MIN_W, math.ceil(widest) + 2 * BOX_PAD))


def _grid(boxes: list[dict], w: float, span: float, right: float | None) -> list[tuple[dict, float, float, int]]:
    """(box, x, w, line) for `boxes` in balanced lines that fit in `span`: centred on x = 0, or ending at `right`
    with a short last line beside the right end. Boxes stand in columns, so the gutters between run clear."""
    most = max(1, int((span + COLUMN_GAP) // (w + COLUMN_GAP)))
    columns = math.ceil(len(boxes) / math.ceil(len(boxes) / most))     # as many lines as needed, evenly filled
    width = columns * (w + COLUMN_GAP) - COLUMN_GAP
    left = -width / 2 if right is None else right - width
    cells = []
    for i, box in enumerate(boxes):
        line, column = divmod(i, columns)
        if right is not None:
            column += columns - min(columns, len(boxes) - line * columns)
        cells.append((box, left + column * (w + COLUMN_GAP), w, line))
    return cells


def _place(rows: list[tuple[list[dict], list[dict]]]) -> tuple[dict[str, dict], list[dict]]:
    """Boxes by id and each line's boxes: a row's kernels' column centred on x = 0, its inputs in a grid left of it.
    Kernels, the buffers they write and the inputs each have one width, the longest label's of their kind."""
    nodes: dict[str, dict] = {}
    lines: list[dict] = []
    span = DIAGRAM_WIDTH - 2 * MARGIN
    kernels = [box for column, _ in rows for box in column if box["kernel"]]
    buffers = [box for column, _ in rows for box in column if not box["kernel"]]
    kernel_w, buffer_w = _box_width(kernels), _box_width(buffers)
    input_w = _box_width([box for _, beside in rows for box in beside])
    for r, (column, beside) in enumerate(rows):
        w = kernel_w if column and column[0]["kernel"] else buffer_w
        cells = _grid(column, w, span, None) if column else []
        if beside:
            right = min(x for _, x, _, _ in cells) - SIDE_GAP if cells else None
            cells += _grid(beside, input_w, span if right is None else span / 2 + right, right)
        first = len(lines)
        for line in range(max(line for *_, line in cells) + 1):
            top = MARGIN + len(lines) * (BOX_H + LINE_GAP)
            boxes = [(x, x + width) for _, x, width, at in cells if at == line]
            lines.append({"block": r, "top": top, "bottom": top + BOX_H, "boxes": boxes,
                          "right": max(end for _, end in boxes)})
        for box, x, w, line in cells:
            nodes[box["id"]] = {**box, "text": _fit(box["label"], w - 2 * BOX_PAD), "x": x, "w": w, "h": BOX_H,
                                "y": lines[first + line]["top"], "block": r, "line": first + line, "row_line": line,
                                "gutter": x + w + COLUMN_GAP / 2}
    return nodes, lines


def _edges(program: CompiledProgram, nodes: dict[str, dict]) -> list[tuple[str, str]]:
    """(from, to) ids of the data flow: each buffer a kernel reads into it, each buffer it writes out of it."""
    edges = []
    for position, kernel in enumerate(program.kernels):
        for name in kernel.params:
            if name in kernel.writes:
                edges.append((f"k:{position}", f"b:{name}"))
            elif f"b:{name}" in nodes:
                edges.append((f"b:{name}", f"k:{position}"))
    return edges


def _foreign(src: dict, dst: dict, lines: list[dict]) -> list[int]:
    """The lines an edge passes that belong to neither end's row: it must go round them in a lane."""
    return [i for i in range(src["line"] + 1, dst["line"]) if lines[i]["block"] not in (src["block"], dst["block"])]


def _lanes(edges: list[tuple[str, str]], nodes: dict[str, dict], lines: list[dict]) -> dict[str, float]:
    """The x of each source's lane, right of every line its long edges pass and apart from lanes beside it."""
    spans: dict[str, list[float]] = {}
    for a, b in edges:
        passed = _foreign(nodes[a], nodes[b], lines)
        if passed:
            first, last, base = spans.get(a, [passed[0], passed[-1], float("-inf")])
            spans[a] = [min(first, passed[0]), max(last, passed[-1]),
                        max([base] + [lines[i]["right"] for i in passed])]
    placed: list[tuple[float, float, float]] = []
    lanes = {}
    # the shortest spans nearest the boxes, so that a lane nested in a longer one crosses it least
    for source, (first, last, base) in sorted(spans.items(), key=lambda item: (item[1][1] - item[1][0], item[1][0])):
        x = base + LANE_GAP
        while any(abs(x - px) < LANE_STEP and first <= p_last + 1 and p_first <= last + 1   # beside it, or just above
                  for px, p_first, p_last in placed):
            x += LANE_STEP
        placed.append((x, first, last))
        lanes[source] = x
    return lanes


def _route(src: dict, dst: dict, lines: list[dict], lane: float | None) -> list[tuple[float, ...]]:
    """The edge as path commands: down a gutter or a lane through each line it passes, turning only between lines."""
    def gutter(node: dict) -> float:
        return node["gutter"] + (node["row_line"] % GUTTER_SLOTS - GUTTER_SLOTS // 2) * GUTTER_STEP

    def clear(x: float, line: dict) -> bool:
        return all(x < start - CLEARANCE or x > end + CLEARANCE for start, end in line["boxes"])

    x, y = src["x"] + src["w"] / 2, src["y"] + src["h"]
    path: list[tuple[float, ...]] = [(x, y)]
    for i in range(src["line"] + 1, dst["line"]):
        block = lines[i]["block"]
        if block in (src["block"], dst["block"]):     # within an end's own row: straight on where nothing is in the way
            run = x if clear(x, lines[i]) else gutter(src if block == src["block"] else dst)
        else:
            assert lane is not None, "an edge passes another row's line without a lane"
            run = lane
        path.append(_turn(x, y, run, lines[i]["top"]))
        path.append((run, lines[i]["bottom"]))
        x, y = run, lines[i]["bottom"]
    path.append(_turn(x, y, dst["x"] + dst["w"] / 2, dst["y"]))
    return path


def _turn(x1: float, y1: float, x2: float, y2: float) -> tuple[float, ...]:
    """From (x1, y1) down to (x2, y2) within the gap between two lines: a straight drop or an S-bend."""
    if x1 == x2:
        return (x2, y2)
    middle = (y1 + y2) / 2
    return (x1, middle, x2, middle, x2, y2)


def _svg_path(path: list[tuple[float, ...]], dx: float) -> str:
    """Path commands, shifted right by `dx`, as an SVG path's d attribute (M, then L for lines, C for bends)."""
    def point(x: float, y: float) -> str:
        return f"{round(x + dx, 1):g} {round(y, 1):g}"

    parts = [f"M {point(*path[0])}"]
    for step in path[1:]:
        if len(step) == 2:
            parts.append(f"L {point(*step)}")
        else:
            parts.append(f"C {point(*step[0:2])}, {point(*step[2:4])}, {point(*step[4:6])}")
    return " ".join(parts)


def diagram(program: CompiledProgram) -> dict:
    """The program laid out for inline SVG: buffers and kernels as boxes, data flow as edges, all inside the frame."""
    rows = _rows(program)
    nodes, lines = _place(rows)
    edges = _edges(program, nodes)
    lanes = _lanes(edges, nodes, lines)
    paths = [_route(nodes[a], nodes[b], lines, lanes.get(a)) for a, b in edges]
    xs = [x for node in nodes.values() for x in (node["x"], node["x"] + node["w"])]
    xs += [step[i] for path in paths for step in path for i in range(0, len(step), 2)]
    left, right = min(xs, default=0.0), max(xs, default=0.0)
    dx = MARGIN - left
    placed = [{"id": n["id"], "label": n["label"], "text": n["text"], "kind": n["kind"], "kernel": n["kernel"],
               "x": round(n["x"] + dx, 1), "y": n["y"], "w": n["w"], "h": n["h"],
               "text_x": round(n["x"] + dx + n["w"] / 2, 1), "text_y": n["y"] + TEXT_BASELINE} for n in nodes.values()]
    return {"nodes": placed, "edges": [{"d": _svg_path(path, dx)} for path in paths],
            "width": round(right - left + 2 * MARGIN, 1), "height": (lines[-1]["bottom"] if lines else 0) + MARGIN}


def render_diagram(layout: dict) -> str:
    """The diagram as inline SVG, as the report draws it (a layout from `diagram`)."""
    return _template("diagram.svg.j2").render(diagram=layout)


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


@lru_cache(maxsize=2)
def _template(name: str = "report.html.j2") -> jinja2.Template:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    return env.get_template(name)


def render_report(program: CompiledProgram) -> str:
    """The whole page for `program`."""
    doc = program.describe()
    kernels = [{**k, "html": highlight(c.source)} for k, c in zip(doc["kernels"], program.kernels)]
    return _template().render(doc=doc, kernels=kernels, diagram=diagram(program),
                              plot=plot(doc["report"].get("search_history", [])))
