"""Every environment variable tensorsmith reads, declared once and typed (read nowhere else)."""
from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "TENSORSMITH_CACHE_DIR"      # root of the cubin cache and the compiled-program cache
DEFAULT_CACHE_ROOT = Path("~/.cache/tensorsmith")


def cache_root() -> Path:
    """The root of tensorsmith's on-disk caches: $TENSORSMITH_CACHE_DIR, else ~/.cache/tensorsmith."""
    value = os.environ.get(CACHE_DIR_ENV)
    return Path(value).expanduser() if value else DEFAULT_CACHE_ROOT.expanduser()
