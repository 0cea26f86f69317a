"""The compiled-program cache: a second compile of the same graph, target and options returns at once.

An entry is a saved Program folder under <cache root>/programs/<key>/ with a manifest of every file's
sha256, written last. An entry whose manifest is missing or whose files do not match it was damaged or
only partly written: it is removed and rebuilt, never used.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from tensorsmith.ir.graph import Graph
from tensorsmith.ir.knobs import cache_root

from .program import MANIFEST, Program, load


def program_key(graph: Graph, target: str, options: dict, version: str) -> str:
    """The cache key: the graph's structure, the target, the options that change the result, the compiler."""
    text = json.dumps({"graph": graph.structural_hash(), "target": target, "options": options,
                       "version": version}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class ProgramCache:
    """Saved Programs by key, in `root` (default: <cache root>/programs)."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else cache_root() / "programs"

    def get(self, key: str, graph: Graph) -> Program | None:
        """The cached Program for `key`, or None on a miss or a damaged entry (which is removed)."""
        folder = self.root / key
        if not folder.exists():
            return None
        if not is_intact(folder):
            shutil.rmtree(folder, ignore_errors=True)
            return None
        program = load(folder)
        program.graph = graph                 # the caller's own graph object, structurally equal
        program.report = {**program.report, "from_cache": True}
        return program

    def put(self, key: str, program: Program) -> None:
        """Store `program` under `key` (atomically: a reader sees the old entry or the whole new one)."""
        program.save(self.root / key, force=True)   # an entry is ours even when a damaged one is in the way


def is_intact(folder: Path) -> bool:
    """Whether every file the manifest lists exists with the recorded sha256."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        return bool(manifest) and all(hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest
                                      for name, digest in manifest.items())
    except (OSError, ValueError, AttributeError):
        return False
