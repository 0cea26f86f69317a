"""Tensor element types, their numpy and CUDA spellings, and PyTorch-style promotion."""
from __future__ import annotations

from enum import Enum

import numpy as np

from .errors import DTypeError, user_location
from .host_arrays import cast


class DType(Enum):
    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    INT32 = "int32"
    BOOL = "bool"

    def __str__(self) -> str:
        return self.value

    @property
    def is_float(self) -> bool:
        return self in FLOATS

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self]

    @property
    def cuda_name(self) -> str:
        """The C type of this dtype in device memory."""
        return CUDA_STORAGE[self]


FLOATS = frozenset({DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16})
ITEMSIZE = {DType.FLOAT32: 4, DType.FLOAT16: 2, DType.BFLOAT16: 2, DType.INT32: 4, DType.BOOL: 1}
CUDA_STORAGE = {
    DType.FLOAT32: "float", DType.FLOAT16: "__half", DType.BFLOAT16: "__nv_bfloat16",
    DType.INT32: "int", DType.BOOL: "bool",
}
# Float width order for promotion; float16 and bfloat16 meet at float32, as in PyTorch.
_FLOAT_RANK = {DType.FLOAT16: 1, DType.BFLOAT16: 1, DType.FLOAT32: 2}

DTypeLike = "DType | str"


def as_dtype(value: "DType | str | np.dtype") -> DType:
    """Accept a DType, its name ("float16") or a numpy dtype."""
    if isinstance(value, DType):
        return value
    try:
        return DType(str(np.dtype(value)) if not isinstance(value, str) else value)
    except (TypeError, ValueError):
        known = ", ".join(d.value for d in DType)
        # a DTypeError is a TypeError too, so callers that caught TypeError still do
        raise DTypeError(f"unknown dtype {value!r}; known dtypes: {known} at {user_location()}") from None


def promote(a: DType, b: DType) -> DType | None:
    """The dtype of a binary op on a and b, or None where only an explicit cast may mix them."""
    if a == b:
        return a
    if a.is_float and b.is_float:
        if _FLOAT_RANK[a] == _FLOAT_RANK[b]:
            return DType.FLOAT32
        return a if _FLOAT_RANK[a] > _FLOAT_RANK[b] else b
    return None


LARGEST_FINITE = {DType.FLOAT32: 3.4028234663852886e38, DType.FLOAT16: 65504.0, DType.BFLOAT16: 3.3895313892515355e38}


def numpy_dtype(dtype: DType) -> np.dtype:
    """The numpy dtype that holds this dtype on the host (bfloat16 travels as its raw uint16 bits)."""
    table: dict[DType, np.dtype] = {
        DType.FLOAT32: np.dtype(np.float32), DType.FLOAT16: np.dtype(np.float16),
        DType.BFLOAT16: np.dtype(np.uint16), DType.INT32: np.dtype(np.int32), DType.BOOL: np.dtype(np.bool_),
    }
    return table[dtype]


def round_to(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Values as device memory of this dtype would hold them, returned in float64 (or int/bool)."""
    if dtype == DType.BFLOAT16:
        return bfloat16_to_float(float_to_bfloat16(values)).astype(np.float64)
    if dtype.is_float:
        return np.asarray(values).astype(numpy_dtype(dtype)).astype(np.float64)
    return np.asarray(values).astype(numpy_dtype(dtype))


def round_to_register(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Values as a kernel reads them from device memory of this dtype into registers: floats rounded to the dtype
    and held as float32 (every float16 and bfloat16 value is one), ints and bools as they are stored."""
    if dtype == DType.BFLOAT16:
        return bfloat16_to_float(float_to_bfloat16(values))
    if dtype.is_float:
        with np.errstate(over="ignore"):   # a value past float16's range is inf, as the GPU stores it
            return cast(cast(values, numpy_dtype(dtype)), np.float32)
    return cast(values, numpy_dtype(dtype))


def host_float_dtype(dtype: DType) -> np.dtype:
    """What `round_to_host` holds a float dtype's values in."""
    return np.dtype(np.float16 if dtype == DType.FLOAT16 else np.float32)


def round_to_host(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Float32 values rounded to a float dtype and held as the host holds it: float16 as float16, float32 and
    bfloat16 (its values, rounded) as float32."""
    if dtype == DType.FLOAT16:
        return cast(values, np.float16)
    if dtype == DType.BFLOAT16:
        return bfloat16_to_float(float_to_bfloat16(values))
    return values.astype(np.float32, copy=False)


def float_to_bfloat16(values: np.ndarray) -> np.ndarray:
    """Round float values to bfloat16 (nearest even), returned as raw uint16 bits."""
    bits = np.asarray(values, dtype=np.float32, order="C").view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(np.asarray(values, dtype=np.float32))
    return np.where(nan, 0x7FC0, rounded).astype(np.uint16)


def bfloat16_to_float(bits: np.ndarray) -> np.ndarray:
    """Widen raw bfloat16 bits to float32."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
