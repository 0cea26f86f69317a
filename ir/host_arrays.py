"""Large host arrays cast and drawn on all of the machine's cores: numpy casts (float16 above all) and random
draws run on one, and a real-size model's inputs (a Llama-3.2-1B's 1.2 billion weights) made verification's draws
cost more than the search they check."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

CHUNK = 1 << 22        # elements one thread casts or draws at a time; arrays up to this size are done in this thread


def _workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _over_chunks(size: int, work: Callable[[int, slice], None], unit: int = 1) -> None:
    """work(i, span) for each run of about CHUNK elements of `size` units of `unit` elements each, across the
    machine's cores (numpy's casts and fills release the GIL)."""
    step = max(1, CHUNK // max(unit, 1))
    spans = [(i, slice(start, min(start + step, size))) for i, start in enumerate(range(0, size, step))]
    if len(spans) == 1 or _workers() == 1:
        for i, span in spans:
            work(i, span)
        return
    with ThreadPoolExecutor(min(_workers(), len(spans))) as pool:
        for done in [pool.submit(work, i, span) for i, span in spans]:
            done.result()


def cast(values: np.ndarray, dtype: np.dtype | type) -> np.ndarray:
    """`values.astype(dtype, copy=False)` (in the same memory order), on every core where the array is large (a
    strided one in runs of its first axis)."""
    values = np.asarray(values)
    if values.dtype == np.dtype(dtype):
        return values
    if values.size <= CHUNK:
        return values.astype(dtype)
    if values.flags.f_contiguous and not values.flags.c_contiguous:   # a transposed matrix: cast its transpose
        return cast(values.T, dtype).T
    contiguous = values.flags.c_contiguous
    source = values.reshape(-1) if contiguous else values
    out = np.empty(values.shape, dtype)
    cast_into(out.reshape(-1) if contiguous else out, source)
    return out


def cast_into(target: np.ndarray, source: np.ndarray) -> np.ndarray:
    """`target[...] = source` (a cast), on every core where it is large, in runs of `target`'s first axis; returns
    `target`."""
    if target.size <= CHUNK or target.ndim == 0:
        target[...] = source
        return target

    def work(_: int, span: slice) -> None:
        with np.errstate(over="ignore"):   # (per thread) a value past float16's range is inf, as the GPU stores it
            target[span] = source[span]
    _over_chunks(len(target), work, target.size // len(target))
    return target


Request = tuple[tuple[int, ...], int, Callable[[np.random.Generator, int], np.ndarray], "np.dtype | type"]


def drawn(shape: tuple[int, ...], seed: int, key: int, values: Callable[[np.random.Generator, int], np.ndarray],
          dtype: np.dtype | type) -> np.ndarray:
    """An array of `dtype` filled chunk by chunk with `values(rng, n)` on every core, chunk i's `rng` seeded by
    (seed, key, i): the values depend on the seed and key alone, not on the number of cores."""
    return drawn_many(seed, [(shape, key, values, dtype)])[0]


def drawn_many(seed: int, requests: list[Request]) -> list[np.ndarray]:
    """`drawn(shape, seed, key, values, dtype)` for each request, the chunks of all of them on every core at once: a
    model's weights, most no larger than a chunk, are drawn side by side, not one after another."""
    arrays = [np.empty(shape, dtype) for shape, _, _, dtype in requests]
    chunks = [(flat[start:start + CHUNK], key, i, values)
              for array, (_, key, values, _) in zip(arrays, requests) for flat in [array.reshape(-1)]
              for i, start in enumerate(range(0, flat.size, CHUNK))]

    def work(chunk: tuple[np.ndarray, int, int, Callable[[np.random.Generator, int], np.ndarray]]) -> None:
        span, key, i, values = chunk
        span[...] = values(np.random.default_rng([seed, key, i]), span.size)
    if len(chunks) <= 1 or _workers() == 1:
        for chunk in chunks:
            work(chunk)
    else:
        with ThreadPoolExecutor(min(_workers(), len(chunks))) as pool:
            list(pool.map(work, chunks))
    return arrays
