"""The project's errors: every error a user can cause is a TensorsmithError with one clear message."""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from types import FrameType

_PACKAGE_ROOTS = tuple(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep + name + os.sep
    for name in ("ir", "compiler", "rewrites", "search", "codegen")
)


class TensorsmithError(Exception):
    """Base of every error tensorsmith raises on purpose."""


class ShapeError(TensorsmithError, ValueError):
    """An op got operands whose shapes, axes or arity do not fit."""


class DTypeError(TensorsmithError, TypeError):
    """An op got operands whose dtypes do not fit."""


class GraphError(TensorsmithError, ValueError):
    """A graph is malformed: a duplicate name, a tensor from another graph, no outputs."""


class InputError(TensorsmithError, ValueError):
    """A call got inputs of the wrong name, shape or dtype."""


class TargetError(TensorsmithError, ValueError):
    """An unknown compilation target."""


class OutputError(TensorsmithError, ValueError):
    """A program cannot be saved where asked without destroying something that is not a tensorsmith output."""


class CompileError(TensorsmithError, RuntimeError):
    """Generated CUDA failed to compile: a compiler bug, reported with the source saved."""


class DeviceError(TensorsmithError, RuntimeError):
    """No usable GPU, or a CUDA call failed."""


class KernelFault(DeviceError):
    """A program measured in a worker process faulted (`verdict` "faulted") or hung ("timed out")."""

    def __init__(self, message: str, verdict: str = "faulted"):
        super().__init__(message, verdict)
        self.verdict = verdict

    def __str__(self) -> str:
        return str(self.args[0])


_LOCATED: ContextVar[tuple[str, str] | None] = ContextVar("tensorsmith_located", default=None)


@contextmanager
def located(where: str, api: str = "") -> Iterator[None]:
    """Nodes built (and errors raised) inside say `where` is the user's line and `api` what it called: an importer's
    line of the model it translates and the op there, not its own."""
    token = _LOCATED.set((where, api))
    try:
        yield
    finally:
        _LOCATED.reset(token)


def user_location() -> str:
    """The `file:line` of the innermost stack frame outside tensorsmith (or the `located` one), for error messages
    and nodes."""
    return user_call()[0]


def user_call() -> tuple[str, str]:
    """The user's `file:line` (as `user_location`) and the name of the tensorsmith function it called: the outermost
    frame inside tensorsmith (`rms_norm`, `__mul__`), or the `located` pair."""
    override = _LOCATED.get()
    if override is not None:
        return override
    frame: FrameType | None = sys._getframe(1)
    called = ""
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_PACKAGE_ROOTS) and "<frozen" not in path:
            return f"{frame.f_code.co_filename}:{frame.f_lineno}", called
        called = frame.f_code.co_name
        frame = frame.f_back
    return "<unknown>", called
