"""The pipeline's stages return typed results (issue 39): each stage's signature names the results it reads and the
frozen record it returns, the pipeline hands each one's result to the next, and the report is made from them."""
from __future__ import annotations

import dataclasses
import gc
import time
import typing

import pytest
from egglog import EGraph

import tensorsmith as ts
from tensorsmith import pipeline, stages
from tensorsmith.ir.kernel_program import KernelProgram
from tensorsmith.ir.targets import Target, get_target

REPORT_KEYS = ["stage_seconds", "checks", "tested_on", "exact", "left_out", "total_ms", "predicted_ms",
               "unfused_predicted_ms", "unfused_ms", "speedup", "speedup_basis", "launch_us", "launch_basis",
               "search_history", "search", "forms", "layers", "kernel_times", "cost_fit", "saturation"]


def _graph() -> ts.Graph:
    g = ts.Graph("typed_stages")
    x = g.input("x", (24, 40), "float32")
    w = g.input("w", (40, 16), "float32")
    g.output("y", (x.exp() @ w) * 0.5 + 1)
    return g


def _results() -> dict[str, type]:
    """Each stage's name -> the type its function returns, as its annotation says."""
    return {stage.name: typing.get_type_hints(stage.function)["return"] for stage in pipeline.STAGES}


def test_every_stage_returns_a_frozen_record_of_its_own_and_reads_only_typed_inputs() -> None:
    results = _results()
    assert list(results) == ["layers", "saturate", "extract", "search", "derive", "verify", "render", "nvrtc",
                             "profile"]
    for name, result in results.items():
        assert isinstance(result, type) and dataclasses.is_dataclass(result), (name, result)
        assert result.__dataclass_params__.frozen and result.__module__ == stages.__name__, (name, result)
    assert len(set(results.values())) == len(results)   # no two stages make the same thing
    made: set[type] = {stages.Context, KernelProgram, Target}   # the context; the searched program, its target
    for stage in pipeline.STAGES:      # each input is one of those or an earlier stage's result
        hints = typing.get_type_hints(stage.function)
        inputs = [hints[name] for name in list(hints) if name != "return"]
        assert inputs and set(inputs) <= made, (stage.name, inputs)
        made.add(results[stage.name])


def test_the_record_holds_each_stage_result_by_type_and_no_field_is_any() -> None:
    fields = typing.get_type_hints(stages.Compilation)
    assert set(_results().values()) - {stages.Saturation} <= set(fields.values())   # the e-graph is freed, not kept
    for record in [stages.Compilation, stages.Context, *_results().values()]:
        assert typing.Any not in typing.get_type_hints(record).values(), record


def test_a_compile_runs_every_stage_in_order_and_its_report_is_made_from_their_results() -> None:
    context = pipeline.Context(_graph(), pipeline.CompileOptions(budget_s=2.0, profile=False), get_target("sm90"),
                               deadline=time.monotonic() + 2.0)
    record = pipeline.run_stages(context)
    for field, kind in typing.get_type_hints(stages.Compilation).items():
        assert isinstance(getattr(record, field), kind), field
    assert list(context.seconds) == [stage.name for stage in pipeline.STAGES]
    searched = record.searched
    assert searched.program is searched.result.program and searched.forms.chosen in [
        form.graph for form in searched.forms.forms]
    assert len(record.rendered.kernels) == len(record.cubins.cubins) == len(searched.program.kernels) > 0
    assert record.verified.checks and record.verified.exact_checks and record.profiled == stages.Profiled()
    report = pipeline.to_program(record).report
    assert list(report) == REPORT_KEYS
    assert report["checks"] == [{"output": c.output, "relative_l2": c.error, "tolerance": c.tolerance}
                                for c in record.verified.checks]
    assert report["exact"]["draws"] == pipeline.EXACT_DRAWS and report["left_out"] == {}
    assert report["search"] == searched.result.summary() and len(report["forms"]) == len(searched.forms.forms)
    assert report["saturation"]["stopped"] == record.forms.saturation.stopped


def _egraphs() -> int:
    return sum(isinstance(o, EGraph) for o in gc.get_objects())


def test_the_e_graph_is_freed_as_extraction_ends_on_this_thread() -> None:
    """No result holds the e-graph past extraction, and none is left to the collector (which might free one on
    another thread, where freeing egglog's EGraph raises)."""
    context = pipeline.Context(_graph(), pipeline.CompileOptions(), get_target("sm90"))
    gc.collect()
    before = _egraphs()
    gc.disable()      # no collection but the pipeline's own
    try:
        forms = pipeline._extracted(context, pipeline.identical_layers(context))
        assert _egraphs() == before and forms.saturation is not None and list(context.seconds) == ["saturate",
                                                                                                 "extract"]
    finally:
        gc.enable()


@pytest.mark.parametrize("rewrites_on", [True, False])
def test_ts_compile_reports_the_same_keys_and_fills_the_stage_records(rewrites_on: bool) -> None:
    program = ts.compile(_graph(), budget_s=2, profile=False, cache=False, progress=False, rewrites=rewrites_on)
    report = program.report
    assert list(report) == REPORT_KEYS if rewrites_on else REPORT_KEYS[:-1]   # no e-graph, no saturation
    assert list(report["stage_seconds"]) == [stage.name for stage in pipeline.STAGES]
    assert report["checks"] and report["search_history"] and report["forms"][0]["won"] in (True, False)
    assert report["launch_basis"] == "assumed (the target's table)" and report["layers"] == {}
