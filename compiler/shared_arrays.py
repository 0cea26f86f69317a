"""Inputs handed to the measurement worker through files in shared memory, where they are large: pickled through the
worker's pipe, a real-size model's weights (650 MB for one Llama-3.2-1B layer and its vocabulary) took 6 s."""
from __future__ import annotations

import shutil
import tempfile
import weakref
from pathlib import Path

import numpy as np

SHARED_MEMORY = Path("/dev/shm")
PIPE_BYTES = 64 << 20    # inputs that hold less than this together travel through the pipe
ROOM = 2                 # times their size that shared memory must have free for them to go there


class SharedArrays:
    """`arrays` as the worker is to receive them (`payload`): each array's name mapped to the array itself, or,
    where they are large and shared memory has room, to a file holding it there, removed by `close` (or when this
    object is collected)."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        self.arrays = arrays
        self.payload: dict[str, np.ndarray | str] = dict(arrays)
        size = sum(np.asarray(a).nbytes for a in arrays.values())
        if size < PIPE_BYTES or not SHARED_MEMORY.is_dir() or shutil.disk_usage(SHARED_MEMORY).free < ROOM * size:
            self._finalizer = None
            return
        directory = tempfile.mkdtemp(prefix="tensorsmith-inputs-", dir=SHARED_MEMORY)
        self._finalizer = weakref.finalize(self, shutil.rmtree, directory, True)
        for position, (name, array) in enumerate(arrays.items()):
            path = f"{directory}/{position}.npy"
            np.save(path, np.ascontiguousarray(array), allow_pickle=False)
            self.payload[name] = path

    def close(self) -> None:
        """Remove the files (a worker that mapped them keeps its mapping)."""
        if self._finalizer is not None:
            self._finalizer()


def received(payload: dict[str, np.ndarray | str]) -> dict[str, np.ndarray]:
    """In the worker: the arrays of a payload, those in files mapped read-only, not copied."""
    return {name: np.load(item, mmap_mode="r") if isinstance(item, str) else item for name, item in payload.items()}
