"""The report's program diagram draws every box, label and edge inside its frame, whatever the graph's size."""
from __future__ import annotations

import itertools
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest

import tensorsmith as ts
from tensorsmith import report
from tensorsmith.model_loader import load_graph

ROOT = Path(__file__).parents[2]
SVG = "{http://www.w3.org/2000/svg}"
BUDGET_S = 4.0


def one_input() -> ts.Graph:
    """The smallest program: one input, one kernel, one output."""
    g = ts.Graph("one_input")
    g.output("y", g.input("x", (64, 64), "float32") * 2.0)
    return g


def twenty_inputs() -> ts.Graph:
    """Twenty inputs summed pairwise, the sums multiplied together: one kernel reads eighteen of them."""
    g = ts.Graph("twenty_inputs")
    xs = [g.input(f"x{i}", (64, 64), "float32") for i in range(20)]
    terms = [a + b for a, b in zip(xs[0::2], xs[1::2])]
    g.output("s0", terms[0])
    product = terms[0]
    for term in terms[1:]:
        product = product * term
    g.output("y", product)
    return g


def frame_and_boxes(svg: str) -> tuple[tuple[float, float, float, float], list[tuple[float, ...]], list, list]:
    """The drawing's frame (its viewBox, else 0 0 width height), its boxes, its labels and its edges' points."""
    root = ET.fromstring(svg)
    if root.get("viewBox"):
        frame = tuple(float(v) for v in root.get("viewBox", "").split())
    else:
        frame = (0.0, 0.0, float(root.get("width", 0)), float(root.get("height", 0)))
    rects = [tuple(float(r.get(k, 0)) for k in ("x", "y", "width", "height")) for r in root.iter(f"{SVG}rect")]
    texts = [(float(t.get("x", 0)), float(t.get("y", 0)), t.text or "") for t in root.iter(f"{SVG}text")]
    points = []
    for path in root.iter(f"{SVG}path"):
        if path.get("marker-end"):                   # an edge, not the arrowhead's own shape in <defs>
            numbers = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", path.get("d", ""))]
            points.append(list(zip(numbers[0::2], numbers[1::2])))
    return frame, rects, texts, points  # type: ignore[return-value]


def assert_inside_its_frame(svg: str, boxes: int) -> None:
    """Every box, label and edge point lies in the frame; labels fit their boxes; no two boxes overlap."""
    (fx, fy, fw, fh), rects, texts, edges = frame_and_boxes(svg)
    assert len(rects) == boxes and len(texts) == boxes
    outside = [r for r in rects if r[0] < fx or r[1] < fy or r[0] + r[2] > fx + fw or r[1] + r[3] > fy + fh]
    assert not outside, f"{len(outside)} of {len(rects)} boxes lie outside the frame {fw} x {fh}: {outside[:3]}"
    stray = [p for edge in edges for p in edge if not (fx <= p[0] <= fx + fw and fy <= p[1] <= fy + fh)]
    assert not stray, f"edges reach outside the frame {fw} x {fh} at {stray[:3]}"
    for (x, y, w, h), (tx, ty, label) in zip(rects, texts):
        half = report.text_width(label) / 2
        assert x <= tx - half and tx + half <= x + w and y < ty < y + h, f"label {label!r} spills out of its box"
    for a, b in itertools.combinations(rects, 2):
        apart = a[0] + a[2] <= b[0] or b[0] + b[2] <= a[0] or a[1] + a[3] <= b[1] or b[1] + b[3] <= a[1]
        assert apart, f"boxes {a} and {b} overlap"


def program_diagram(page: str) -> str:
    """The program's SVG out of a report page."""
    match = re.search(r"<h2>The program</h2>\s*(<svg.*?</svg>)", page, re.S)
    assert match, "the report has no program diagram"
    return match.group(1)


@pytest.mark.parametrize("build", [one_input, twenty_inputs,
                                   lambda: load_graph(ROOT / "examples" / "transformer_block.py")],
                         ids=["one_input", "twenty_inputs", "transformer_block"])
def test_the_reports_diagram_lies_inside_its_frame(build) -> None:
    program = ts.compile(build(), budget_s=BUDGET_S, profile=False, progress=False)
    boxes = len(program.inputs) + sum(1 + len(kernel.writes) for kernel in program.kernels)
    assert_inside_its_frame(program_diagram(report.render_report(program)), boxes)


def many_kernels(count: int) -> SimpleNamespace:
    """A program of `count` kernels, as far as the diagram reads one: long names, a kernel now and then writing six
    buffers, one input read by every kernel, and reads reaching back ten kernels."""
    inputs = ("x",) + tuple(f"weight_{i}" for i in range(count // 3))
    buffers = {name: SimpleNamespace(role="input") for name in inputs}
    kernels = []
    for k in range(count):
        writes = tuple(f"t{k}_{j}" for j in range(6 if k % 7 == 3 else 1))
        reads = ["x", inputs[1 + k // 3]] + [kernels[k - back].writes[0] for back in (1, 10) if k >= back]
        buffers.update({name: SimpleNamespace(role="output" if k == count - 1 else "temp") for name in writes})
        name = f"a_graph_with_a_long_name_{k}" + ("_and_a_kernel_name_longer_than_any_box" if k == 5 else "")
        kernels.append(SimpleNamespace(name=name, archetype="row_reduce", params=writes + tuple(reads), writes=writes))
    return SimpleNamespace(inputs=inputs, kernels=kernels, buffers=buffers)


def test_a_sixty_kernel_diagram_lies_inside_its_frame() -> None:
    program = many_kernels(60)
    boxes = len(program.inputs) + sum(1 + len(kernel.writes) for kernel in program.kernels)
    assert_inside_its_frame(report.render_diagram(report.diagram(program)), boxes)  # type: ignore[arg-type]
