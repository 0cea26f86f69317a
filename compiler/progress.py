"""What a long compile says while it runs: a progress line on a terminal, log records elsewhere.

`compile()` reports each stage's name as it starts and the search's counts (`SearchProgress`) as they change, to
a callable. The command line passes `Progress`; `ts.compile` from Python uses `Progress` too where standard
error is a terminal, and otherwise `LoggedProgress`, which writes INFO records to the "tensorsmith" logger (shown
once the caller configures logging, e.g. `logging.basicConfig(level=logging.INFO)`).
"""
from __future__ import annotations

import logging
import sys
from typing import cast

from tensorsmith.search.engine import SearchProgress

log = logging.getLogger("tensorsmith")


def search_summary(search: SearchProgress) -> str:
    """The search's counts so far, as one clause."""
    best = f"{search.best_us:.1f} us" if search.best_us is not None else "-"
    rejected = f", {search.rejected} faulted or wrong on the GPU" if search.rejected else ""
    piece = f"{search.piece}: " if search.piece else ""
    return (f"{piece}{search.tried} candidates tried, {search.pruned_schedules} schedules ruled out, {search.pruned_by_z3} "
            f"pruned by Z3, {search.verified} verified{rejected}, best {best}")


class Progress:
    """Stage progress on stderr: one line rewritten in place on a terminal, a line per stage otherwise."""

    def __init__(self, stages: int, quiet: bool):
        self.stages, self.quiet, self.step = stages, quiet, 0
        self.stage, self.detail = "", ""
        self.tty = sys.stderr.isatty()

    def __call__(self, event: object) -> None:
        """A stage's name as it starts, or the search's SearchProgress (its counts and best time)."""
        if self.quiet:
            return
        if event == "cache":
            print("found in the cache: nothing to recompile", file=sys.stderr, flush=True)
            return
        if isinstance(event, str):
            if self.detail and not self.tty:
                print(f"    {self.stage}{self.detail}", file=sys.stderr, flush=True)
            self.step += 1
            self.stage, self.detail = event, ""
        else:   # the search reports often: rewrite the line on a terminal, otherwise say it at the end
            self.detail = f": {search_summary(cast('SearchProgress', event))}"
            if not self.tty:
                return
        bar = "#" * self.step + "." * (self.stages - self.step)
        line = f"[{bar}] {self.step}/{self.stages} {self.stage}{self.detail}"
        print(f"\r{line:100s}" if self.tty else line, end="" if self.tty else "\n", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.tty and not self.quiet and self.step:
            print(file=sys.stderr)


class LoggedProgress:
    """Stage progress as INFO records of the "tensorsmith" logger: a record per stage, the search's at its end."""

    def __init__(self, graph: str):
        self.graph, self.search = graph, ""

    def __call__(self, event: object) -> None:
        if event == "cache":
            log.info("%s: found in the cache", self.graph)
        elif isinstance(event, str):
            if self.search:
                log.info("%s: search: %s", self.graph, self.search)
                self.search = ""
            log.info("%s: %s", self.graph, event)
        else:
            self.search = search_summary(cast("SearchProgress", event))

    def done(self) -> None:
        pass


def default_progress(graph: str, stages: int) -> Progress | LoggedProgress:
    """What `ts.compile` reports to when the caller passes nothing: a terminal's line, else the logger."""
    return Progress(stages, quiet=False) if sys.stderr.isatty() else LoggedProgress(graph)

