"""The index a kernel reads a reshape's source at, evaluated for every element: it is the element numpy's reshape
takes from the source, for reshapes that split, merge, keep and add size-1 axes, and a copy's contiguous axis stays
a plain index where the reshape keeps it."""
from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from tensorsmith.codegen.emit import _reshape_index

RESHAPES = [
    ((24, 64, 32), (1536, 32)),          # rows of a tile: one row axis split in two, the last axis kept
    ((24, 64, 32, 1), (1536, 32)),       # ... with the unit axis a matmul's operand adds
    ((1536, 32), (24, 64, 32)),          # the rows merged
    ((4, 6, 10), (4, 60)),               # the leading axis kept, the last one split
    ((2, 3, 4, 5), (6, 20)),             # nothing kept
    ((2, 1, 12, 1), (2, 12)),            # only unit axes come
    ((5, 7), (35,)),
    ((35,), (5, 7)),
    ((3, 4, 5), (3, 4, 5)),
]


def _value(expr: str, names: dict[str, int]) -> int:
    """A C index expression of non-negative integers, evaluated (C's / truncates as // does for them)."""
    return eval(re.sub(r"(?<![/])/(?![/])", "//", expr), {}, names)   # noqa: S307: our own emitted arithmetic


@pytest.mark.parametrize("shape,src_shape", RESHAPES)
def test_every_element_of_a_reshape_reads_the_source_element_numpy_gives(shape: tuple[int, ...],
                                                                         src_shape: tuple[int, ...]) -> None:
    names = tuple(f"i{axis}" for axis in range(len(shape)))
    where = _reshape_index(tuple("0" if d == 1 else n for n, d in zip(names, shape)), shape, src_shape)
    source = np.arange(int(np.prod(src_shape))).reshape(src_shape)
    view = source.reshape(shape)
    for at in itertools.product(*(range(d) for d in shape)):
        got = tuple(_value(expr, dict(zip(names, at))) for expr in where)
        assert source[got] == view[at], (at, where)


def test_a_kept_last_axis_is_read_at_its_own_index() -> None:
    """Rows of tiles viewed as one row axis keep k a plain index: a 16-byte copy along it is then possible."""
    assert _reshape_index(("b", "m", "k", "0"), (24, 64, 32, 1), (1536, 32)) == ("(b) * 64 + (m)", "k")
