"""Files for the caches: written whole (a reader sees the old file or the new one, never a part), and the digest of
the code whose results a cache keeps (caches, reports, results)."""
from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

CODE_SUFFIXES = (".py", ".j2")   # what decides what the compiler makes: its modules and its kernel templates


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file beside it, replaced into place once complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def code_digest(folders: Iterable[Path], salt: bytes = b"", skip: tuple[str, ...] = ()) -> str:
    """A digest of the modules and templates in `folders` and their subfolders but those named in `skip` (and
    `salt`), each file once: a cache keyed by it forgets what other code made."""
    digest = hashlib.sha256(salt)
    roots = sorted({Path(folder).resolve() for folder in folders})
    roots = [root for root in roots if not any(other in root.parents for other in roots)]   # inside another: read
    for folder in roots:
        for path in sorted(folder.rglob("*")):
            parts = path.relative_to(folder).parts
            if path.suffix in CODE_SUFFIXES and "__pycache__" not in parts and not set(parts[:-1]) & set(skip):
                digest.update(f"{folder.name}/{path.relative_to(folder)}".encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]
