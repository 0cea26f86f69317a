"""TMA tensor maps: how a kernel that copies tiles with Hopper's tensor memory accelerator sees a buffer.

A kernel rendered with TMA copies takes, after its buffer pointers, one `TensorMapSpec` per operand it
copies that way. The spec is plain data (it is saved in program.json); the 128-byte descriptor itself
holds the buffer's device address, so it is encoded at launch, through the driver, for the pointer
the buffer has then (and cached: search launches one kernel many times on the same buffers).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from . import runtime


@dataclass(frozen=True)
class TensorMapSpec:
    """One buffer as TMA sees it, every list innermost dimension first.

    dims: the buffer's extents (elements); strides: the byte distance between consecutive indices of
    dims[1:] (dims[0] is contiguous); box: the extents of one copy (its innermost extent spans the
    128-byte swizzle); element_bytes: 2 for fp16 and bf16.
    """

    buffer: str
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    element_bytes: int = 2

    @classmethod
    def of_buffer(cls, buffer: str, shape: Sequence[int], box: Sequence[int], element_bytes: int = 2) -> TensorMapSpec:
        """The spec of a contiguous buffer of `shape` (outermost first, as the buffer is declared)."""
        dims = tuple(reversed(shape))
        strides, stride = [], element_bytes
        for extent in dims[:-1]:
            stride *= extent
            strides.append(stride)
        return cls(buffer, dims, tuple(strides), tuple(box), element_bytes)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorMapSpec:
        return cls(data["buffer"], tuple(data["dims"]), tuple(data["strides"]), tuple(data["box"]),
                   data.get("element_bytes", 2))


def launch_arguments(params: Sequence[str], tensor_maps: Sequence[TensorMapSpec], pointers: Mapping[str, int]) -> list:
    """A kernel's arguments: its buffers' device pointers in `params` order, then its tensor maps."""
    args: list = [np.uint64(pointers[name]) for name in params]
    args += [runtime.tensor_map(spec, pointers[spec.buffer]) for spec in tensor_maps]
    return args
