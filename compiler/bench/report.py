"""The results of `tensorsmith bench`: one Row per case, printed as a table, written as Markdown and as JSON."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tensorsmith.ir.errors import TensorsmithError
from tensorsmith.ir.files import write_atomic

SECTION_BEGIN = "<!-- tensorsmith bench: begin (written by `tensorsmith bench -o`; edits inside are replaced) -->"
SECTION_END = "<!-- tensorsmith bench: end -->"
RESULTS_FORMAT = 1
NOT_RUN = "not run"


@dataclass
class Measured:
    """One way of running a case: its median time as its caller sees it (`ms`) and, where measured, the GPU's time
    alone (`gpu_ms`, the runs queued behind a sleeping kernel); its first call's compile time; its error against
    float32 PyTorch; and, where there is no time, why (`wrong`: the output was checked and is wrong)."""

    ms: float | None = None
    compile_s: float | None = None
    error: float | None = None
    failure: str | None = None     # one line: why there is no time
    wrong: bool = False
    gpu_ms: float | None = None


@dataclass
class KernelTime:
    """One of tensorsmith's kernels as the compile measured it alone."""

    name: str
    archetype: str
    ms: float | None
    schedule: dict[str, int] = field(default_factory=dict)


@dataclass
class Row:
    """One case of the suite, measured: tensorsmith's kernels and call, and each baseline."""

    case: str
    family: str
    floor_ms: float
    floor_bound: str                      # "memory" or "matmul": which term of the floor is larger
    kernels: Measured = field(default_factory=Measured)
    call: Measured = field(default_factory=Measured)
    kernel_count: int | None = None
    compile_warm_s: float | None = None
    compile_stages: dict[str, float] = field(default_factory=dict)   # the cold compile's seconds per stage
    kernel_times: list[KernelTime] = field(default_factory=list)
    baselines: dict[str, Measured] = field(default_factory=dict)
    note: str = ""
    commit: str | None = None             # what ran, where rows of several runs are joined
    budget_s: float | None = None
    forms: list[dict[str, Any]] = field(default_factory=list)   # the program report's algebraic forms searched
    written: Measured | None = None       # the graph as written compiled with rewrites off, where the form differs

    def best_baseline(self, gpu_time: bool = False) -> tuple[str, float] | None:
        """The fastest baseline that ran and was right, with its ms (as called, or with `gpu_time` the GPU's alone
        where the run measured that)."""
        timed: list[tuple[str, float]] = []
        for name, m in self.baselines.items():
            ms = _time(m, gpu_time)
            if m.failure is None and ms:
                timed.append((name, ms))
        return min(timed, key=lambda t: t[1]) if timed else None

    def speedup(self, ours: Measured) -> float | None:
        """The best baseline's time over `ours` (above 1: tensorsmith is faster): our kernels' GPU time against the
        baselines' GPU time (their time as called, in runs that did not measure it), our call against theirs."""
        best = self.best_baseline(gpu_time=ours is self.kernels)
        if best is None or not ours.ms or ours.failure is not None:
            return None
        return best[1] / ours.ms

    def of_floor(self) -> float | None:
        """The floor over tensorsmith's kernel time: 1.0 would be a program at the hardware's limit."""
        return self.floor_ms / self.kernels.ms if self.kernels.ms and self.kernels.failure is None else None

    def why_slower(self) -> str:
        """Where tensorsmith's kernels lose to the best baseline, from its own measurements: the kernel that takes
        the most time, and how far the program is from its floor."""
        speedup = self.speedup(self.kernels)
        if speedup is None or speedup >= 1.0:
            return ""
        floor = f"{self.of_floor():.0%} of its {self.floor_bound} floor"
        timed = [k for k in self.kernel_times if k.ms is not None]
        if not timed:
            return f"{self.kernel_count or 'its'} kernels, none timed alone; {floor}"
        slowest = max(timed, key=lambda k: k.ms or 0.0)
        if len(timed) == 1:
            return f"its one kernel ({slowest.archetype}) runs at {floor}"
        share = (slowest.ms or 0.0) / sum(k.ms or 0.0 for k in timed)
        return (f"{len(timed)} kernels at {floor}; {slowest.name} ({slowest.archetype}) takes {_us(slowest.ms)}, "
                f"{share:.0%} of their sum")


def unmeasured_row(case: str, family: str, baselines: list[str], why: str, **row: Any) -> Row:
    """The row of a case that was not measured (not run, or not built): `why` in every column."""
    return Row(case, family, 0.0, "-", Measured(failure=why), Measured(failure=why),
               baselines={name: Measured(failure=why) for name in baselines}, **row)


def _time(m: Measured, gpu_time: bool) -> float | None:
    return (m.gpu_ms or m.ms) if gpu_time else m.ms


def geomean(values: list[float]) -> float | None:
    """The geometric mean, None for no values."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _us(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms * 1000:.1f} us" if ms < 1 else f"{ms:.2f} ms"


def ratio(value: float | None) -> str:
    """A speedup as printed: two decimals and an x, '-' for none."""
    return f"{value:.2f}x" if value is not None else "-"


def _cell(m: Measured) -> str:
    if m.failure is not None and m.failure.startswith(NOT_RUN):
        return NOT_RUN
    if m.failure is not None:
        return f"WRONG ({m.error:.2g})" if m.wrong and m.error is not None else "FAILED"
    return _us(m.ms)


HEADER = ("case", "kernels", "call", "BASELINES", "x best (kernels)", "x best (call)", "of floor", "n",
          "compile cold / warm", "error")


def table_rows(rows: list[Row], baselines: list[str]) -> list[list[str]]:
    """The table as cells: a header, then one row per case."""
    header = [h for name in HEADER for h in (baselines if name == "BASELINES" else [name])]
    out = [header]
    for row in rows:
        floor = row.of_floor()
        compile_s = (f"{row.kernels.compile_s:.1f} s / {row.compile_warm_s:.2f} s"
                     if row.kernels.compile_s is not None and row.compile_warm_s is not None else "-")
        out.append([row.case, _cell(row.kernels), _cell(row.call),
                    *(_cell(row.baselines.get(name, Measured(failure=NOT_RUN))) for name in baselines),
                    ratio(row.speedup(row.kernels)), ratio(row.speedup(row.call)),
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


def markdown(meta: dict[str, Any], rows: list[Row]) -> str:
    """The run as a Markdown section: what ran where, the table, the geometric means, each failure and slow row."""
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
        change = won.get("change", "")
        ours = row.kernels.ms
        theirs = row.written.ms if row.written is not None and row.written.failure is None else None
        faster = f"{theirs / ours:.2f}x" if ours and theirs else "-"
        shown = _us(theirs) if theirs else (row.written.failure or "-") if row.written is not None else "-"
        lines.append(f"| {row.case} | `{change}` | {_us(ours)} | {shown} | {faster} |")
    if not lines:
        return []
    return ["Cases whose winning algebraic form is not the written one (the rewrite is the e-graph's choice, written ->"
            " chosen; *written*: the graph compiled with rewrites off, the same budget; GPU time of the kernels, timed"
            " in turns with the columns above):", "",
            "| case | rewrite | kernels | written | x written |", "| --- | --- | --- | --- | --- |", *lines, ""]


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
        row = Row(**r)
        row.commit = row.commit or meta["commit"]
        row.budget_s = row.budget_s if row.budget_s is not None else meta["budget_s"]
        parsed.append(row)
    return meta, parsed


def write_results(markdown_path: Path, meta: dict[str, Any], rows: list[Row]) -> Path:
    """BENCHMARKS.md's section and, beside it, the JSON of every number (<stem>.json); returns the JSON's path."""
    json_path = markdown_path.with_suffix(".json")
    write_atomic(json_path, to_json(meta, rows).encode())
    write_markdown(markdown_path, markdown(meta, rows))
    return json_path
