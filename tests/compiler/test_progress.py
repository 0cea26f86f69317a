"""What ts.compile says while it runs: a progress line on a terminal, INFO records of the "tensorsmith" logger
elsewhere, nothing with progress=False."""
from __future__ import annotations

import io
import logging
import sys

import tensorsmith as ts
from graph_cases import CASES
from tensorsmith.pipeline import STAGES


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_compile_logs_each_stage_and_the_search_where_stderr_is_no_terminal(caplog) -> None:
    caplog.set_level(logging.INFO, logger="tensorsmith")
    ts.compile(CASES["views"](), profile=False, cache=False)
    messages = [r.getMessage() for r in caplog.records if r.name == "tensorsmith"]
    assert [m.split(": ", 1)[1] for m in messages if not m.startswith("views: search: ")] == [s.name for s in STAGES]
    assert any(m.startswith("views: search: ") and "candidates tried" in m for m in messages)


def test_info_logging_shows_tensorsmith_without_the_e_graph_librarys_records(caplog) -> None:
    """`logging.basicConfig(level=logging.INFO)`, as the README suggests: egglog logs every command it runs at INFO,
    hundreds per compile, and none of them reach the user's handlers."""
    caplog.set_level(logging.INFO)
    ts.compile(CASES["norms"](), profile=False, cache=False)
    names = {record.name for record in caplog.records}
    assert "tensorsmith" in names and not any(name.startswith("egglog") for name in names)


def test_compile_draws_a_progress_line_on_a_terminal(monkeypatch) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    ts.compile(CASES["views"](), profile=False, cache=False)
    text = terminal.getvalue()
    assert f"\r[{'#' * len(STAGES)}] {len(STAGES)}/{len(STAGES)} profile" in text and text.endswith("\n")


def test_progress_false_says_nothing(caplog, monkeypatch) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    caplog.set_level(logging.INFO, logger="tensorsmith")
    ts.compile(CASES["views"](), profile=False, cache=False, progress=False)
    assert terminal.getvalue() == "" and not [r for r in caplog.records if r.name == "tensorsmith"]
