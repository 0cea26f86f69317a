"""The depth series drawn: compile time and run time against a model's layer count, tensorsmith's beside
torch.compile's, as one SVG that BENCHMARKS.md links (no plotting library needed)."""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from xml.sax.saxutils import escape

from .results import Measured, Row

DEPTH_CASE = re.compile(r"^(?P<model>.+)_(?P<layers>\d+)layers$")   # the depth cases' names: <model>_<N>layers
PANEL_W, PANEL_H, MARGIN = 360, 240, 56
COLOURS = {"tensorsmith": "#c0392b", "torch.compile": "#2c3e80"}


@dataclass(frozen=True)
class Series:
    """One line of a panel: (layers, value) points."""

    label: str
    points: tuple[tuple[int, float], ...]


def depth_rows(rows: list[Row]) -> dict[str, list[tuple[int, Row]]]:
    """The depth cases by model, each model's rows ordered by layer count."""
    found: dict[str, list[tuple[int, Row]]] = {}
    for row in rows:
        if (match := DEPTH_CASE.match(row.case)) is not None:
            found.setdefault(match["model"], []).append((int(match["layers"]), row))
    return {model: sorted(series, key=lambda item: item[0]) for model, series in found.items()}


def depth_panels(series: list[tuple[int, Row]]) -> dict[str, list[Series]]:
    """The two panels of one model: cold compile seconds, and GPU milliseconds of a call (ours: our kernels; torch's:
    torch.compile's default mode), over the rows that measured them."""
    def points(value: Callable[[Row], float | None]) -> tuple[tuple[int, float], ...]:
        return tuple((layers, v) for layers, row in series if (v := value(row)) is not None)

    def torch_compile(row: Row) -> Measured | None:
        measured = row.baselines.get("compile")
        return measured if measured is not None and measured.failure is None else None

    return {
        "compile time (s)": [
            Series("tensorsmith", points(lambda r: r.kernels.compile_s if r.kernels.failure is None else None)),
            Series("torch.compile", points(lambda r: m.compile_s if (m := torch_compile(r)) else None))],
        "GPU time of a call (ms)": [
            Series("tensorsmith", points(lambda r: r.kernels.ms if r.kernels.failure is None else None)),
            Series("torch.compile", points(lambda r: (m.gpu_ms or m.ms) if (m := torch_compile(r)) else None))],
    }


def depth_svg(rows: list[Row]) -> str | None:
    """The depth series of `rows` as an SVG, one pair of panels per model; None where there is none."""
    models = depth_rows(rows)
    if not models:
        return None
    parts = []
    for index, (model, series) in enumerate(sorted(models.items())):
        for column, (title, lines) in enumerate(depth_panels(series).items()):
            parts.append(_panel(f"{model}: {title}", lines, column * (PANEL_W + MARGIN),
                                index * (PANEL_H + 2 * MARGIN)))
    width, height = 2 * (PANEL_W + MARGIN) + MARGIN, len(models) * (PANEL_H + 2 * MARGIN)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'font-family="sans-serif" font-size="11">\n<rect width="100%" height="100%" fill="white"/>\n'
            + "\n".join(parts) + "\n</svg>\n")


def _panel(title: str, lines: list[Series], left: float, top: float) -> str:
    """One panel: axes (layers on a log2 scale, the value from 0), a polyline and dots per series, a legend."""
    x0, y0 = left + MARGIN, top + MARGIN
    layers = sorted({x for s in lines for x, _ in s.points}) or [1]
    top_value = max((v for s in lines for _, v in s.points), default=1.0) * 1.1 or 1.0
    span = math.log2(max(layers)) - math.log2(min(layers)) or 1.0

    def at(x: int, v: float) -> tuple[float, float]:
        return x0 + PANEL_W * (math.log2(x) - math.log2(min(layers))) / span, y0 + PANEL_H * (1 - v / top_value)

    out = [f'<text x="{x0}" y="{y0 - 14}" font-size="13">{escape(title)}</text>',
           f'<line x1="{x0}" y1="{y0 + PANEL_H}" x2="{x0 + PANEL_W}" y2="{y0 + PANEL_H}" stroke="black"/>',
           f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 + PANEL_H}" stroke="black"/>',
           f'<text x="{x0 + PANEL_W / 2}" y="{y0 + PANEL_H + 30}" text-anchor="middle">layers</text>']
    for x in layers:
        px, _ = at(x, 0)
        out.append(f'<text x="{px:.1f}" y="{y0 + PANEL_H + 15}" text-anchor="middle">{x}</text>')
    for fraction in (0, 0.5, 1):
        value = top_value / 1.1 * fraction
        _, py = at(layers[0], value)
        out.append(f'<text x="{x0 - 6}" y="{py + 4:.1f}" text-anchor="end">{value:.3g}</text>')
    for rank, s in enumerate(lines):
        colour = COLOURS.get(s.label, "gray")
        drawn = [at(x, v) for x, v in s.points]
        if drawn:
            path = " ".join(f"{px:.1f},{py:.1f}" for px, py in drawn)
            out.append(f'<polyline data-series="{escape(s.label)}" points="{path}" fill="none" stroke="{colour}" '
                       f'stroke-width="2"/>')
            out += [f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{colour}"/>' for px, py in drawn]
        out.append(f'<text x="{x0 + 8}" y="{y0 + 14 + 14 * rank}" fill="{colour}">{escape(s.label)}</text>')
    return "\n".join(out)
