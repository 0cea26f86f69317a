"""Every environment variable tensorsmith reads, declared once and typed (read nowhere else)."""
from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "TENSORSMITH_CACHE_DIR"      # root of the cubin cache and the compiled-program cache
DEFAULT_CACHE_ROOT = Path("~/.cache/tensorsmith")
COMPILE_WORKERS_ENV = "TENSORSMITH_COMPILE_WORKERS"   # NVRTC worker processes; 1 compiles in-process only
MAX_COMPILE_WORKERS = 16     # beyond this, NVRTC runs contend for memory more than they gain


def cache_root() -> Path:
    """The root of tensorsmith's on-disk caches: $TENSORSMITH_CACHE_DIR, else ~/.cache/tensorsmith."""
    value = os.environ.get(CACHE_DIR_ENV)
    return Path(value).expanduser() if value else DEFAULT_CACHE_ROOT.expanduser()


def compile_workers() -> int:
    """How many processes compile kernels at once: $TENSORSMITH_COMPILE_WORKERS, else the CPUs, at most 16."""
    value = os.environ.get(COMPILE_WORKERS_ENV)
    if value:
        try:
            return max(1, int(value))
        except ValueError:
            raise ValueError(f"{COMPILE_WORKERS_ENV} must be a whole number, got {value!r}") from None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cpus, MAX_COMPILE_WORKERS))
