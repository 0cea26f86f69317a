"""A process's descendants as /proc shows them, for the tests that SIGKILL a compile and look for what outlived it."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

POLL_S = 0.1
PROC = Path("/proc")


@dataclass(frozen=True)
class Proc:
    """One process, with its start time so that a pid reused by a new process is not taken for the old one."""

    pid: int
    start: str
    command: str

    def alive(self) -> bool:
        """Whether this process still runs (a zombie has exited: only its entry waits for a parent to reap it)."""
        fields = _stat(self.pid)
        return fields is not None and fields[0] != "Z" and fields[19] == self.start


def descendants(pid: int) -> list[Proc]:
    """Every process below `pid` now, each before its own children; read before `pid` dies, as its orphans then
    belong to init."""
    found = []
    for child in _children(pid):
        fields = _stat(child)
        if fields is not None:
            found.append(Proc(child, fields[19], _command(child)))
            found += descendants(child)
    return found


def cpu_seconds(procs: list[Proc]) -> float:
    """The CPU time (user and system) that `procs` have used so far."""
    ticks = 0
    for proc in procs:
        fields = _stat(proc.pid)
        if fields is not None:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def survivors(procs: list[Proc], within_s: float) -> list[Proc]:
    """The processes of `procs` still alive after `within_s` seconds (fewer seconds once none is)."""
    deadline = time.monotonic() + within_s
    while True:
        alive = [proc for proc in procs if proc.alive()]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(POLL_S)


def assert_none_outlives(parent: subprocess.Popen[bytes], children: list[Proc], within_s: float = 10) -> None:
    """SIGKILL `parent`, then fail unless every one of `children` has exited within `within_s` seconds."""
    parent.kill()
    parent.wait()
    left = survivors(children, within_s)
    assert left == [], f"alive {within_s:g} s after their parent was killed:\n" + "\n".join(map(str, left))


def kill(procs: list[Proc]) -> None:
    """SIGKILL whichever of `procs` are still alive: a failed test must not leave them to the next."""
    for proc in procs:
        if proc.alive():
            os.kill(proc.pid, signal.SIGKILL)


def start(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`args` running, their output unbuffered here, so that `read_line` sees each line as it comes."""
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0, cwd=cwd, env=env)


def read_line(process: subprocess.Popen[bytes], timeout_s: float) -> str:
    """The next line `process` prints, or what it printed to stderr if it ends first, or "" after `timeout_s`."""
    assert process.stdout is not None and process.stderr is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout_s)
    line = process.stdout.readline() if ready else b""    # unbuffered: reads up to the newline and no further
    if not line and process.poll() is not None:
        line = process.stderr.read()
    return line.decode(errors="replace")


def _children(pid: int) -> list[int]:
    """The children of `pid`, over all its threads (a child belongs to the thread that started it)."""
    pids = []
    for task in (PROC / str(pid) / "task").glob("*"):
        try:
            pids += [int(child) for child in (task / "children").read_text().split()]
        except OSError:   # the thread or the process has gone
            pass
    return pids


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (the state first), or None once it has gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def _command(pid: int) -> str:
    """The command line of `pid`, for the failure message."""
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\x00", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"
