"""Child processes that exit when their parent dies, so that a SIGKILL of a compile leaves no process behind.

    ProcessPoolExecutor(n, mp_context=spawn, initializer=follow_parent, initargs=(ParentLink(),))

A SIGKILL runs none of the parent's cleanup, and its children need never notice on their own: a ProcessPoolExecutor
worker waits on a queue whose write end it holds itself, or blocks writing a result that no one will read, for
ever, and the measuring worker finishes its task first. multiprocessing's resource tracker, whose pipe every spawned
child inherits, lives as long as they do; once they have gone it exits by itself, unlinking what the parent left.

So a child follows its parent in two ways. On Linux the kernel SIGKILLs it when its parent goes (prctl
PR_SET_PDEATHSIG), at once, whatever it is doing; that signal follows the thread that started the child, not the
process, so it is asked for only where that was the main thread (a child started by a passing thread would die
with the thread). Everywhere, a daemon thread also polls os.getppid(): NVRTC and the driver release the GIL, so
it runs while they work.
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Final

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG: Final = 1      # <linux/prctl.h>: the signal this process gets when its parent thread ends
POLL_S: Final = 0.2              # how often a child looks for its parent
ORPHAN_EXIT_STATUS: Final = 1    # no one reads it: the parent that would have is gone


def _on_main_thread() -> bool:
    """Whether the calling thread is the interpreter's main thread."""
    return threading.current_thread() is threading.main_thread()


@dataclass(frozen=True)
class ParentLink:
    """A child's parent: its pid, and whether the thread that started the child is its main thread.

    Both are taken again when the link is pickled, which Process.start() does in the thread that starts the
    child; so a pool's one link, in its initializer's arguments, is right for each worker, whichever thread
    starts it.
    """

    pid: int = field(default_factory=os.getpid)
    main_thread: bool = field(default_factory=_on_main_thread)

    def __reduce__(self) -> tuple[type[ParentLink], tuple[int, bool]]:
        return ParentLink, (os.getpid(), _on_main_thread())


def follow_parent(parent: ParentLink) -> None:
    """In a child, first thing: exit as soon as `parent` is gone, so that a killed parent leaves no child behind."""
    if parent.main_thread:
        _ask_for_parent_death_signal()
    if os.getppid() != parent.pid:      # it died before the child got here
        os._exit(ORPHAN_EXIT_STATUS)
    threading.Thread(target=_exit_when_orphaned, args=(parent.pid,), name="tensorsmith-follow-parent",
                     daemon=True).start()


def _ask_for_parent_death_signal() -> None:
    """Have Linux SIGKILL this process when the thread that started it ends; elsewhere, or where it refuses, the
    watching thread is enough."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        done = libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0), ctypes.c_ulong(0),
                          ctypes.c_ulong(0))
    except (OSError, AttributeError) as err:    # no C library to load, or no prctl in it
        log.debug("no prctl (%s): a thread watches for the parent's death", err)
        return
    if done != 0:
        log.debug("prctl(PR_SET_PDEATHSIG) failed (%s): a thread watches for the parent's death",
                  os.strerror(ctypes.get_errno()))


def _exit_when_orphaned(parent_pid: int) -> None:
    """Exit this process once `parent_pid` is no longer its parent: it died, and init or a subreaper adopted us."""
    while os.getppid() == parent_pid:
        time.sleep(POLL_S)
    os._exit(ORPHAN_EXIT_STATUS)
