"""The results of `tensorsmith bench`: one Row per case, printed as a table, written as Markdown and as JSON."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tensorsmith.ir.errors import TensorsmithError
from tensorsmith.ir.files import write_atomic
from tensorsmith.rewrites.derivation import chain_text

from .plot import depth_svg
from .profile import Profile
from .results import NOT_RUN, KernelTime, Measured, Row, geomean, ratio, us

SECTION_BEGIN = "<!-- tensorsmith bench: begin (written by `tensorsmith bench -o`; edits inside are replaced) -->"
SECTION_END = "<!-- tensorsmith bench: end -->"
RESULTS_FORMAT = 1


def _cell(m: Measured) -> str:
    if m.failure is not None and m.failure.startswith(NOT_RUN):
        return NOT_RUN
    if m.slow_path:
        return "SLOW PATH"
    if m.failure is not None:
        return f"WRONG ({m.error:.2g})" if m.wrong and m.error is not None else "FAILED"
    return us(m.ms)


HEADER = ("case", "kernels", "call", "BACKEND", "BASELINES", "best (kernels / call)", "x best (kernels)", "x best (call)", "of floor",
          "n", "compile cold / warm", "error")


def table_rows(rows: list[Row], baselines: list[str]) -> list[list[str]]:
    """The table as cells: a header, then one row per case (a backend column where some row measured it)."""
    backend = ["backend"] if any(row.backend is not None for row in rows) else []
    columns = {"BASELINES": baselines, "BACKEND": backend}
    header = [h for name in HEADER for h in columns.get(name, [name])]
    out = [header]
    for row in rows:
        floor = row.of_floor()
        compile_s = (f"{row.kernels.compile_s:.1f} s / {row.compile_warm_s:.2f} s"
                     if row.kernels.compile_s is not None and row.compile_warm_s is not None else "-")
        out.append([row.case, _cell(row.kernels), _cell(row.call),
                    *([_cell(row.backend) if row.backend else "-"] if backend else []),
                    *(_cell(row.baselines.get(name, Measured(failure=NOT_RUN))) for name in baselines),
                    row.best_modes(), ratio(row.speedup(row.kernels)), ratio(row.speedup(row.call)),
                    f"{floor:.0%}" if floor is not None else "-", str(row.kernel_count or "-"), compile_s,
                    f"{row.kernels.error:.1e}" if row.kernels.error is not None else "-"])
    return out


def format_text(cells: list[list[str]]) -> str:
    """Cells as aligned columns of plain text."""
    widths = [max(len(r[c]) for r in cells) for c in range(len(cells[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in cells)


def summary(rows: list[Row]) -> dict[str, Any]:
    """Geometric means of the speedups over the best baseline, over the cases where both ran."""
    kernels = [s for r in rows if (s := r.speedup(r.kernels)) is not None]
    calls = [s for r in rows if (s := r.speedup(r.call)) is not None]
    return {"geomean_kernels": geomean(kernels), "geomean_call": geomean(calls), "cases": len(rows),
            "cases_compared": len(kernels), "cases_faster": sum(1 for s in kernels if s >= 1.0),
            "tensorsmith_failures": [r.case for r in rows if r.kernels.failure is not None]}


def markdown(meta: dict[str, Any], rows: list[Row], plot: str | None = None) -> str:
    """The run as a Markdown section: what ran where, the table, the geometric means, where the time goes in the rows
    that lose, the depth series' plot (`plot`, its file name beside the Markdown), each failure and slow row."""
    baselines = list(meta["baselines"])
    cells = table_rows(rows, baselines)
    s = summary(rows)
    lines = [f"## `tensorsmith bench` ({meta['date']}, commit {meta['commit']})", "",
             f"{meta['gpu']}, driver {meta['driver']}, torch {meta['torch']}, tensorsmith {meta['tensorsmith']}; "
             f"device copy {meta['copy_tb_s']:.2f} TB/s, float16 matmul {meta['matmul_tflop_s']:.0f} TFLOP/s "
             f"(each case's floor is its bytes at the one or its FLOPs at the other, at the rates its own run "
             f"measured); search budget {meta['budget_s']} s a case; command: `{meta['command']}`.", "",
             "Times are CUDA-event medians, L2 flushed before every run, all columns of a case timed in turns in one "
             "process on the same inputs (weights N(0, 1/fan_in), activations N(0, 1)). *kernels*: tensorsmith's "
             "launches queued behind a sleeping kernel, so the GPU's time alone; *call*: `prog(**torch_tensors)` as a "
             "PyTorch user calls it, the device idle when it starts; the baselines' cells: as their callers call "
             "them, likewise. *x best (kernels)*: the best baseline's GPU time (queued like our kernels; in rows of "
             "runs that did not measure it, its time as called, which favours tensorsmith where launch overhead "
             "shows) over our kernels'; *x best (call)*: the best baseline's time as called over our call's. *of "
             "floor*: the floor over our kernels' time. *error*: relative L2 error of our output against the PyTorch "
             "reference run in float32.", "",
             "| " + " | ".join(cells[0]) + " |", "|" + " --- |" * len(cells[0])]
    lines += ["| " + " | ".join(c) + " |" for c in cells[1:]]
    lines += ["", f"Geometric mean of the speedup over the best baseline: kernels {ratio(s['geomean_kernels'])}, "
                  f"call {ratio(s['geomean_call'])}, over the {s['cases_compared']} of {s['cases']} cases where "
                  f"both ran; tensorsmith faster on {s['cases_faster']}.", ""]
    lines += form_lines(rows)
    lines += time_split_lines(rows)
    if plot is not None:
        lines += [f"Compile time and GPU time against the number of layers (the depth cases, `<model>_<N>layers`; "
                  f"torch.compile's compile time is its first call's): ![depth series]({plot})", ""]
    problems = []
    for row in rows:
        failures = [(label, m) for label, m in [("tensorsmith", row.kernels), ("call", row.call),
                                                *row.baselines.items()]
                    if m.failure and not (label == "call" and m.failure == row.kernels.failure)]
        for label, m in failures:
            problems.append(f"- **{row.case}**, {label}: {m.failure}")
        if (reason := row.why_slower()):
            best = row.best_baseline(gpu_time=True)
            problems.append(f"- **{row.case}** slower than {best[0] if best else '-'}: {reason}")
    if problems:
        lines += ["Failures, and where tensorsmith is slower than its best baseline (from its own kernel times):", "",
                  *problems, ""]
    return "\n".join(lines)


def form_lines(rows: list[Row]) -> list[str]:
    """The rows whose winning algebraic form is not the one written: the rewrite, our kernels' time, and the kernels'
    time of the graph as written compiled with rewrites off (the same budget), timed in turns with the rest."""
    lines = []
    for row in rows:
        won = next((f for f in row.forms if f.get("won")), None)
        if won is None or won.get("as_written"):
            continue
        change = f"`{won.get('change', '')}`"
        if (derivation := won.get("derivation")):
            change += f" by {chain_text(derivation['rules'], derivation['stopped'], derivation['seconds'])}"
        ours = row.kernels.ms
        theirs = row.written.ms if row.written is not None and row.written.failure is None else None
        faster = f"{theirs / ours:.2f}x" if ours and theirs else "-"
        shown = us(theirs) if theirs else (row.written.failure or "-") if row.written is not None else "-"
        lines.append(f"| {row.case} | {change} | {us(ours)} | {shown} | {faster} |")
    if not lines:
        return []
    return ["Cases whose winning algebraic form is not the written one (the rewrite is the e-graph's choice, written ->"
            " chosen, by the rules it depends on, in order; *written*: the graph compiled with rewrites off, the same"
            " budget; GPU time of the kernels, timed in turns with the columns above):", "",
            "| case | rewrite | kernels | written | x written |", "| --- | --- | --- | --- | --- |", *lines, ""]


def time_split_lines(rows: list[Row]) -> list[str]:
    """Where the time goes in each row slower than its best baseline: our kernels' times (each measured alone, L2
    flushed) summed by archetype, beside the best baseline's kernels (one profiled call) summed by class."""
    lines = []
    for row in rows:
        speedup, best = row.speedup(row.kernels), row.best_baseline(gpu_time=True)
        if speedup is None or speedup >= 1.0 or best is None:
            continue
        ours: dict[str, float] = {}
        for kernel in row.kernel_times:
            ours[kernel.archetype] = ours.get(kernel.archetype, 0.0) + (kernel.ms or 0.0) * 1e3
        theirs = Profile(row.baselines[best[0]].gpu_kernels).by_class()
        lines.append(f"| {row.case} | {ratio(speedup)} {best[0]} | {_split(ours)} | {_split(theirs)} |")
    if not lines:
        return []
    return ["Where the time goes in the rows tensorsmith loses: our kernels by archetype (each timed alone, L2 flushed)"
            " beside the best baseline's kernels by class (from PyTorch's profiler, one call):", "",
            "| case | x best | tensorsmith | baseline |", "| --- | --- | --- | --- |", *lines, ""]


def _split(us_by_part: dict[str, float]) -> str:
    """Microseconds by part, largest first: 'matmul 80.1 us, attention 12.0 us'."""
    parts = sorted(us_by_part.items(), key=lambda item: -item[1])
    return ", ".join(f"{name} {us(value / 1e3)}" for name, value in parts if value > 0) or "-"


def write_markdown(path: Path, section: str) -> None:
    """Put `section` between the bench markers of `path` and change nothing else; without markers, the section goes
    after the file's title (a first line starting with '# ') or at its end; a new file gets a title."""
    block = f"{SECTION_BEGIN}\n{section.rstrip()}\n{SECTION_END}"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    begin = text.find(SECTION_BEGIN)
    end = text.find(SECTION_END, begin + 1) if begin >= 0 else -1
    if begin >= 0 and end >= 0:
        text = text[:begin] + block + text[end + len(SECTION_END):]
    elif begin >= 0 or SECTION_END in text:
        raise TensorsmithError(f"{path} has one bench marker without the other; mend or remove it by hand")
    elif text.startswith("# "):
        title, _, rest = text.partition("\n")
        text = f"{title}\n\n{block}\n" + (f"\n{rest.lstrip(chr(10))}" if rest.strip() else "")
    else:
        text = text.rstrip("\n") + f"\n\n{block}\n" if text.strip() else f"{block}\n"
    write_atomic(path, text.encode())


def to_json(meta: dict[str, Any], rows: list[Row]) -> str:
    """The run as JSON: its meta, its summary and every row, so that runs can be compared by a script."""
    return json.dumps({"format": RESULTS_FORMAT, "meta": meta, "summary": summary(rows),
                       "rows": [asdict(r) for r in rows]}, indent=1) + "\n"


META_KEYS = ("date", "commit", "gpu", "driver", "torch", "tensorsmith", "copy_tb_s", "matmul_tflop_s", "budget_s",
             "baselines", "command")


def from_json(text: str) -> tuple[dict[str, Any], list[Row]]:
    """The meta and rows of a results file written by `to_json`; ValueError naming what is wrong otherwise."""
    doc = json.loads(text)
    if not isinstance(doc, dict) or doc.get("format") != RESULTS_FORMAT:
        raise ValueError(f"not a results document of format {RESULTS_FORMAT}")
    meta, rows = doc.get("meta"), doc.get("rows")
    if not isinstance(meta, dict) or not isinstance(rows, list):
        raise ValueError("it has no meta or no list of rows")
    missing = [key for key in META_KEYS if key not in meta]
    if missing:
        raise ValueError(f"its meta lacks {', '.join(missing)}")
    parsed = []
    for r in rows:
        r = dict(r)
        r["kernels"], r["call"] = Measured(**r["kernels"]), Measured(**r["call"])
        r["kernel_times"] = [KernelTime(**k) for k in r["kernel_times"]]
        r["baselines"] = {name: Measured(**m) for name, m in r["baselines"].items()}
        r["written"] = Measured(**r["written"]) if r.get("written") else None
        r["backend"] = Measured(**r["backend"]) if r.get("backend") else None
        row = Row(**r)
        row.commit = row.commit or meta["commit"]
        row.budget_s = row.budget_s if row.budget_s is not None else meta["budget_s"]
        parsed.append(row)
    return meta, parsed


def write_results(markdown_path: Path, meta: dict[str, Any], rows: list[Row]) -> Path:
    """BENCHMARKS.md's section and, beside it, the JSON of every number (<stem>.json) and the depth series' plot
    (<stem>-depth.svg, where the rows hold depth cases); returns the JSON's path."""
    json_path = markdown_path.with_suffix(".json")
    write_atomic(json_path, to_json(meta, rows).encode())
    svg, plot = depth_svg(rows), markdown_path.with_name(f"{markdown_path.stem}-depth.svg")
    if svg is not None:
        write_atomic(plot, svg.encode())
    write_markdown(markdown_path, markdown(meta, rows, plot.name if svg is not None else None))
    return json_path
