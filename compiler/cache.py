"""The compiled-program cache: a second compile of the same graph, target and options returns at once.

An entry is a saved Program folder under <cache root>/programs/<key>/ with a manifest of every file's
sha256, written last. An entry whose manifest is missing or whose files do not match it was damaged or
only partly written: it is removed and rebuilt, never used.

Any number of processes and threads may share a cache. An entry is written into a hidden staging folder and
renamed into place only where no entry is (a rename onto a folder that exists fails, so an intact entry is never
replaced and a reader never sees a part of one); the writer that loses the race to an intact entry drops its
own. A damaged entry is renamed aside before it is deleted. A cache that cannot be read or written (a read-only
folder, a disk that is full) only costs the time it would have saved: the compile goes on and says so once.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import uuid
from pathlib import Path

from tensorsmith.ir.errors import TensorsmithError
from tensorsmith.ir.files import code_digest
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.knobs import cache_root

from .program import MANIFEST, Program, load

log = logging.getLogger(__name__)
PACKAGES = ("tensorsmith", "tensorsmith.ir", "tensorsmith.rewrites", "tensorsmith.codegen", "tensorsmith.search")
_warned: set[tuple[str, str]] = set()   # (read or write, cache folder) failures reported (once a process)


def program_key(graph: Graph, target: str, options: dict, version: str) -> str:
    """The cache key: the graph's structure, the target, the options that change the result, the compiler (its
    version and its own code: a compiler that changed, even under the same version, compiles again)."""
    text = json.dumps({"graph": graph.structural_hash(), "target": target, "options": options,
                       "version": version, "code": compiler_digest()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@functools.cache
def compiler_digest() -> str:
    """A digest of tensorsmith's own modules and kernel templates, read once a process (the bench's and its suite's
    apart: they make no program)."""
    specs = [importlib.util.find_spec(package) for package in PACKAGES]
    return code_digest((Path(folder) for spec in specs if spec is not None
                        for folder in spec.submodule_search_locations or []), skip=("bench", "suite"))


class ProgramCache:
    """Saved Programs by key, in `root` (default: <cache root>/programs)."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else cache_root() / "programs"

    def get(self, key: str, graph: Graph) -> Program | None:
        """The cached Program for `key`, or None on a miss, a damaged entry (which is removed) or an unreadable cache."""
        folder = self.root / key
        try:
            if not folder.exists():
                return None
            if not is_intact(folder):
                _remove(folder)
                return None
            program = load(folder)
        except FileNotFoundError:                   # removed by another process meanwhile: a miss
            return None
        except (OSError, TensorsmithError) as err:   # unreadable
            self._warn("read", f"could not read the compiled-program cache at {self.root} ({err}); compiling")
            return None
        program.graph = graph                 # the caller's own graph object, structurally equal
        program.report = {**program.report, "from_cache": True}
        return program

    def put(self, key: str, program: Program) -> None:
        """Store `program` under `key`, unless an intact entry is there already (a reader sees no entry or a whole
        one); a cache that cannot be written is reported once and skipped."""
        target = self.root / key
        staging: Path | None = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            staging = program.write_staged(self.root, key)
            for _ in range(3):
                try:
                    staging.rename(target)      # fails where a folder is in place: an entry is never replaced
                    return
                except OSError:
                    if is_intact(target):       # another writer's entry won: it is the same program
                        return
                    _remove(target)             # a damaged or partial one: out of the way, then try again
            raise OSError(f"{target} stayed in the way of three attempts")
        except OSError as err:
            self._warn("write", f"could not write the compiled-program cache at {self.root} ({err}); the program is"
                                f" not cached")
        finally:
            if staging is not None and staging.exists():
                shutil.rmtree(staging, ignore_errors=True)

    def _warn(self, what: str, message: str) -> None:
        if (what, str(self.root)) not in _warned:
            _warned.add((what, str(self.root)))
            log.warning(message)


def _remove(folder: Path) -> None:
    """Delete `folder` after renaming it aside, so that no other process is left reading a half-deleted entry."""
    aside = folder.with_name(f".{folder.name}.removed.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    try:
        folder.rename(aside)
    except OSError:
        return                              # gone already, or not ours to move
    shutil.rmtree(aside, ignore_errors=True)


def is_intact(folder: Path) -> bool:
    """Whether every file the manifest lists exists with the recorded sha256."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        return bool(manifest) and all(hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest
                                      for name, digest in manifest.items())
    except (OSError, ValueError, AttributeError):
        return False
