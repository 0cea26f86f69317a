"""The bench's report: speedups over the best baseline that ran right, the floor, the reasons for slow rows,
the Markdown section written between its markers without touching the rest, and the JSON read back."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from tensorsmith.bench.report import (SECTION_BEGIN, SECTION_END, from_json, markdown, summary, table_rows, to_json,
                                      write_markdown, write_results)
from tensorsmith.bench.results import KernelTime, Measured, Row
from tensorsmith.ir.errors import TensorsmithError

META = {"date": "2026-12-01", "commit": "abc1234", "gpu": "NVIDIA H200", "driver": "580", "torch": "2.11",
        "tensorsmith": "0.1.0", "copy_tb_s": 4.2, "matmul_tflop_s": 760.0, "budget_s": 5.0,
        "baselines": ["eager", "compile"], "command": "tensorsmith bench"}


def _rows() -> list[Row]:
    fast = Row("fast", "memory-bound", 0.06, "memory", Measured(0.07, 30.0, 2e-4), Measured(0.13, None, 2e-4), 1,
               0.01, {"search": 20.0}, [KernelTime("fast_y", "row_reduce", 0.07)],
               {"eager": Measured(0.26, 0.0, 1e-4), "compile": Measured(0.14, 3.0, 1e-4)})
    slow = Row("slow", "fused", 0.01, "matmul", Measured(0.8, 15.0, 4e-4), Measured(1.4, None, 4e-4), 2, 0.01, {},
               [KernelTime("slow_up", "matmul", 0.06), KernelTime("slow_y", "matmul", 0.74)],
               {"eager": Measured(0.08, 0.0, 1e-4), "compile": Measured(None, None, 0.5, "output differs", wrong=True)})
    failed = Row("failed", "block", 0.5, "matmul", Measured(failure="VerificationError: no candidate passed"),
                 Measured(failure="VerificationError: no candidate passed"),
                 baselines={"eager": Measured(2.3, 0.0, 1e-4), "compile": Measured(failure="RuntimeError: boom")})
    return [fast, slow, failed]


def test_speedup_is_over_the_best_baseline_that_ran_right() -> None:
    fast, slow, failed = _rows()
    assert fast.best_baseline() == ("compile", 0.14)
    assert fast.speedup(fast.kernels) == pytest.approx(2.0)
    assert slow.best_baseline() == ("eager", 0.08)         # the wrong compile output does not count
    assert slow.speedup(slow.kernels) == pytest.approx(0.1)
    assert failed.speedup(failed.kernels) is None
    assert fast.of_floor() == pytest.approx(0.06 / 0.07)


def test_a_slow_row_is_explained_by_its_slowest_kernel_and_a_fast_one_is_not() -> None:
    fast, slow, _ = _rows()
    assert fast.why_slower() == ""
    reason = slow.why_slower()
    assert "slow_y (matmul)" in reason and "92% of their sum" in reason and "1% of its matmul floor" in reason


def test_geometric_means_cover_only_the_cases_where_both_sides_ran() -> None:
    s = summary(_rows())
    assert s["geomean_kernels"] == pytest.approx(math.sqrt(2.0 * 0.1))
    assert s["cases_compared"] == 2 and s["cases_faster"] == 1 and s["tensorsmith_failures"] == ["failed"]


def test_the_table_marks_failures_wrong_outputs_and_missing_baselines() -> None:
    cells = table_rows(_rows(), ["eager", "compile", "max-autotune"])
    header = cells[0]
    slow = dict(zip(header, cells[2]))
    failed = dict(zip(header, cells[3]))
    assert slow["compile"] == "WRONG (0.5)" and slow["max-autotune"] == "not run"
    assert failed["kernels"] == "FAILED" and failed["eager"] == "2.30 ms"
    assert slow["x best (kernels)"] == "0.10x" and slow["n"] == "2"


def test_markdown_names_the_run_and_says_each_failure_and_slow_row() -> None:
    text = markdown(META, _rows())
    assert "commit abc1234" in text and "NVIDIA H200" in text and "torch 2.11" in text
    assert "- **failed**, tensorsmith: VerificationError: no candidate passed" in text
    assert "- **failed**, compile: RuntimeError: boom" in text
    assert "- **slow** slower than eager:" in text
    assert "call: VerificationError" not in text       # the call's failure is the compile's: said once
    assert "**fast** slower" not in text


def test_the_section_replaces_only_its_own_lines(tmp_path: Path) -> None:
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("# Benchmarks\n\nKernel notes written by hand.\n\n\n\nMore notes.\n")
    write_markdown(path, "first run")
    after_first = path.read_text()
    write_markdown(path, "second run")
    text = path.read_text()
    assert text.count(SECTION_BEGIN) == 1 and text.count(SECTION_END) == 1
    assert "second run" in text and "first run" not in text
    assert text == after_first.replace("first run", "second run")        # nothing outside the markers moved
    assert text.startswith("# Benchmarks\n") and text.endswith("Kernel notes written by hand.\n\n\n\nMore notes.\n")


def test_a_file_without_a_title_gets_the_section_at_its_end_and_a_lone_marker_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.md"
    path.write_text("intro line one\nline two\n")
    write_markdown(path, "run")
    assert path.read_text().startswith("intro line one\nline two\n\n" + SECTION_BEGIN)
    path.write_text(f"{SECTION_END}\ntext\n")
    with pytest.raises(TensorsmithError, match="one bench marker without the other"):
        write_markdown(path, "run")


def test_the_kernels_speedup_compares_gpu_times_where_the_baselines_have_them() -> None:
    fast = _rows()[0]
    fast.baselines["compile"].gpu_ms = 0.1           # queued like our kernels: no launch overhead
    assert fast.speedup(fast.kernels) == pytest.approx(0.1 / 0.07)
    assert fast.speedup(fast.call) == pytest.approx(0.14 / 0.13)      # the call against their time as called


def test_results_files_that_are_not_ours_are_refused_by_name() -> None:
    for text in ("[]", '{"format": 1, "meta": {}, "rows": []}', json.dumps({"format": 1, "meta": META})):
        with pytest.raises(ValueError):
            from_json(text)


def test_results_round_trip_through_json(tmp_path: Path) -> None:
    rows = _rows()
    meta, back = from_json(to_json(META, rows))
    assert meta == META and [dataclasses.replace(r, commit=None, budget_s=None) for r in back] == rows
    assert {(r.commit, r.budget_s) for r in back} == {("abc1234", 5.0)}   # each row says what it ran under
    json_path = write_results(tmp_path / "BENCHMARKS.md", META, rows)
    assert json.loads(json_path.read_text())["summary"]["cases"] == 3
    assert (tmp_path / "BENCHMARKS.md").exists()


def _rewritten_row() -> Row:
    forms = [{"change": "as written", "as_written": True, "won": False},
             {"change": "((q @ k.T) @ v) -> (q @ (k.T @ v))", "as_written": False, "won": True,
              "derivation": {"rules": ["matmul", "matmul_assoc"], "stopped": "minimal", "trials": 8, "seconds": 0.2}}]
    return Row("linear_attention", "algebra", 0.005, "matmul", Measured(0.0137, 5.0, 3e-4), Measured(0.03, None, 3e-4),
               forms=forms, written=Measured(0.0413, 5.0, 3e-4))


def test_a_row_whose_form_is_not_the_written_one_is_listed_with_the_written_graphs_time() -> None:
    text = markdown(META, [*_rows(), _rewritten_row()])
    line = next(line for line in text.splitlines() if line.startswith("| linear_attention | `"))
    assert "((q @ k.T) @ v) -> (q @ (k.T @ v))" in line and "13.7 us" in line and "41.3 us" in line
    assert "` by matmul -> matmul_assoc |" in line      # the rewrites the form depends on, in order
    assert line.rstrip(" |").endswith("3.01x")
    assert "| fast | `" not in text          # a row of the written form has no such line


def test_the_written_graphs_time_round_trips_through_json() -> None:
    _, back = from_json(to_json(META, [_rewritten_row()]))
    assert back[0].written == _rewritten_row().written and back[0].forms == _rewritten_row().forms


def test_a_baseline_on_a_slow_path_is_shown_so_and_is_never_the_best() -> None:
    row = _rows()[1]
    row.baselines["eager"] = Measured(failure="not at its best: SDPA's math path", slow_path=True)
    row.baselines["compile"] = Measured(0.5, 3.0, 1e-4, gpu_ms=0.4)
    cells = dict(zip(*table_rows([row], ["eager", "compile"])))
    assert cells["eager"] == "SLOW PATH"
    assert cells["best (kernels / call)"] == "compile"
    assert row.speedup(row.kernels) == pytest.approx(0.4 / 0.8)


def test_the_best_column_names_both_modes_where_kernels_and_call_differ() -> None:
    row = _rows()[0]
    row.baselines = {"compile": Measured(0.30, 3.0, 1e-4, gpu_ms=0.10), "reduce-overhead": Measured(0.12, 4.0, 1e-4,
                                                                                                  gpu_ms=0.11)}
    assert row.best_modes() == "compile / reduce-overhead"
    row.baselines["compile"].gpu_ms = 0.2
    assert row.best_modes() == "reduce-overhead"


def test_where_the_time_goes_in_a_slower_row() -> None:
    slow = _rows()[1]
    slow.baselines["eager"].gpu_kernels = {"nvjet_sm90_hsh_256x128": 60.0, "triton_poi_fused_add_0": 5.0}
    text = markdown(META, [slow])
    line = next(l for l in text.splitlines() if l.startswith("| slow | 0.10x eager"))
    assert "matmul 800.0 us" in line              # our two matmul kernels, 0.06 + 0.74 ms
    assert "matmul 60.0 us, elementwise 5.0 us" in line


def test_a_backend_column_appears_where_a_row_measured_it() -> None:
    rows = _rows()
    assert "backend" not in table_rows(rows, ["eager", "compile"])[0]
    rows[0].backend = Measured(0.5, 20.0, 2e-4)
    cells = table_rows(rows, ["eager", "compile"])
    assert cells[1][cells[0].index("backend")] == "500.0 us" and cells[2][cells[0].index("backend")] == "-"
    meta, back = from_json(to_json(META, rows))
    assert back[0].backend == rows[0].backend and back[1].backend is None


def _depth_rows() -> list[Row]:
    rows = []
    for layers in (1, 2, 4):
        rows.append(Row(f"llama1b_{layers}layers", "depth", 0.1, "matmul", Measured(0.2 * layers, 10.0 * layers, 1e-3),
                        Measured(0.25 * layers, None, 1e-3),
                        baselines={"compile": Measured(0.3 * layers, 20.0 + layers, 1e-3, gpu_ms=0.25 * layers)}))
    return rows


def test_the_depth_series_is_drawn_beside_the_markdown(tmp_path: Path) -> None:
    import xml.etree.ElementTree as ET

    target = tmp_path / "BENCHMARKS.md"
    write_results(target, META, [*_rows(), *_depth_rows()])
    plot = tmp_path / "BENCHMARKS-depth.svg"
    assert "![depth series](BENCHMARKS-depth.svg)" in target.read_text()
    lines = {(line.get("data-series"), index // 2): line.get("points")
             for index, line in enumerate(ET.parse(plot).getroot().iter("{http://www.w3.org/2000/svg}polyline"))}
    assert len(lines) == 4          # compile time and GPU time, ours and torch.compile's
    ours_compile = [tuple(map(float, p.split(","))) for p in lines[("tensorsmith", 0)].split()]
    assert len(ours_compile) == 3
    assert [x for x, _ in ours_compile] == sorted(x for x, _ in ours_compile)      # layers left to right
    assert [y for _, y in ours_compile] == sorted((y for _, y in ours_compile), reverse=True)   # more time, higher


def test_no_plot_without_depth_cases(tmp_path: Path) -> None:
    write_results(tmp_path / "BENCHMARKS.md", META, _rows())
    assert not (tmp_path / "BENCHMARKS-depth.svg").exists()
    assert "depth series" not in (tmp_path / "BENCHMARKS.md").read_text()
