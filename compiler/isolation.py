"""One persistent worker process that runs tasks for this one, so that a task that crashes or hangs costs a worker.

    with Worker() as worker:
        worker.call(os.getpid, timeout_s=5)          # the same pid call after call, while the worker lives
        worker.call(time.sleep, 60, timeout_s=1)     # raises WorkerTimedOut; the worker is killed
        worker.call(os.getpid, timeout_s=5)          # a new worker

A task is a module-level function and picklable arguments; its return value comes back pickled, and an
exception it raises is raised here with the same type and message (the worker's traceback as a note). The
worker is spawned, never forked: a forked child would share this process's CUDA context, and the point
of the worker is that a kernel fault poisons its context, not ours. It exits with this process, even one killed
by SIGKILL in the middle of a task (`ir/orphans.py`). Spawning imports the caller's main script in the worker,
as multiprocessing always does, so a script that compiles must do so under `if __name__ == "__main__":`.
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Final, TypeVar

from tensorsmith.ir.errors import TensorsmithError
from tensorsmith.ir.orphans import ParentLink, follow_parent

START_METHOD: Final = "spawn"
START_TIMEOUT_S = 120.0      # a new worker imports tensorsmith (egglog, z3, cuda-python) before it says ready
STOP_TIMEOUT_S = 30.0        # a killed worker whose GPU context is being torn down may take a while to go

T = TypeVar("T")


class WorkerCrashed(TensorsmithError, RuntimeError):
    """The worker process died while running a task (a signal, os._exit, a driver abort)."""


class WorkerTimedOut(TensorsmithError, TimeoutError):
    """A task ran past its deadline; the worker was killed."""


class WorkerStartFailed(WorkerCrashed):
    """A new worker died or hung before it was ready (e.g. importing an unguarded main script failed)."""


class Worker:
    """A child process that runs one task at a time; started on first use, replaced after a crash or timeout."""

    def __init__(self, start_timeout_s: float = START_TIMEOUT_S):
        self.start_timeout_s = start_timeout_s
        self.starts = 0              # how many worker processes have been started: changes when one is replaced
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None

    @property
    def pid(self) -> int | None:
        """The running worker's process id, or None while there is none."""
        return self._process.pid if self._process is not None else None

    def call(self, task: Callable[..., T], *args: Any, timeout_s: float) -> T:
        """`task(*args)` in the worker, waiting at most `timeout_s` seconds for it."""
        conn = self.start()
        try:
            conn.send((task, args))
        except OSError:   # it has died: _receive says so
            pass
        status, value = self._receive(timeout_s, f"task {getattr(task, '__name__', task)!s}")
        if status == "error":
            raise value
        return value

    def stop(self) -> None:
        """Kill the worker now (the next call starts another): for a worker whose state can no longer be trusted."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if process is None:
            return
        process.kill()
        process.join(STOP_TIMEOUT_S)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Ask the worker to finish and wait for it; kill it if it does not."""
        if self._conn is not None and self._process is not None:
            try:
                self._conn.send(None)
                self._process.join(STOP_TIMEOUT_S)
            except OSError:
                pass
        self.stop()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> Connection:
        """The connection to the running worker, starting one (and waiting until it is ready) if there is none."""
        if self._process is not None and self._conn is not None:
            if self._process.is_alive():
                return self._conn
            self.stop()
        context = multiprocessing.get_context(START_METHOD)
        ours, theirs = context.Pipe()
        process = context.Process(target=_serve, args=(theirs, ParentLink()), name="tensorsmith-worker", daemon=True)
        process.start()
        theirs.close()
        self._process, self._conn = process, ours
        self.starts += 1
        try:
            self._receive(self.start_timeout_s, "its start")
        except (WorkerCrashed, WorkerTimedOut) as err:
            raise WorkerStartFailed(f"{err}; a script that compiles must do so under `if __name__ == '__main__':`"
                                    f", as the worker imports it") from None
        return ours

    def _receive(self, timeout_s: float, what: str) -> tuple[str, Any]:
        """The worker's reply within `timeout_s`; WorkerTimedOut or WorkerCrashed (the worker gone) otherwise."""
        assert self._process is not None and self._conn is not None
        ready = wait([self._conn, self._process.sentinel], timeout_s)
        if self._conn in ready:
            try:
                return self._conn.recv()
            except (EOFError, OSError):
                pass   # it died without replying
        if not ready:
            self.stop()
            raise WorkerTimedOut(f"the worker did not finish {what} in {timeout_s:.1f} s and was killed")
        self._process.join(STOP_TIMEOUT_S)
        code = self._process.exitcode
        self.stop()
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit status {code}"
        raise WorkerCrashed(f"the worker process died during {what} ({how})")


def _serve(conn: Connection, parent: ParentLink) -> None:
    """The worker's loop: run each task sent, send back ("ok", value) or ("error", exception); None ends it."""
    follow_parent(parent)                           # a task may run long after a SIGKILL of the parent
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # Ctrl-C is the parent's to handle; it stops us
    conn.send(("ready", os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):       # the parent has gone
            return
        if message is None:
            return
        task, args = message
        try:
            reply: tuple[str, Any] = ("ok", task(*args))
        except BaseException as err:  # everything goes back to the parent, which decides
            reply = ("error", _portable(err))
        try:
            conn.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError) as err:
            conn.send(("error", RuntimeError(f"the worker's reply could not be sent back: {err}")))


def _portable(err: BaseException) -> BaseException:
    """`err` with the worker's traceback as a note, or a RuntimeError saying the same where `err` cannot be pickled."""
    note = "in the worker process:\n" + "".join(traceback.format_exception(err)).rstrip()
    try:
        err.add_note(note)
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:
        copy = RuntimeError(f"{type(err).__name__}: {err}")
        copy.add_note(note)
        return copy
