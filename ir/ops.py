"""The primitive op set: eleven compute ops, the leaves, the views, and their families."""
from __future__ import annotations

from enum import Enum


class Op(Enum):
    # compute primitives, the eleven
    EXP2 = "exp2"
    LOG2 = "log2"
    SIN = "sin"
    SQRT = "sqrt"
    RECIP = "recip"
    ADD = "add"
    MUL = "mul"
    MOD = "mod"            # C fmod / truncated remainder
    LESS_THAN = "less_than"
    SUM = "sum"            # reduce one axis; arg = axis; the axis is removed
    MAX = "max"            # reduce one axis; arg = axis; the axis is removed
    # leaves and conversions
    INPUT = "input"        # arg = name
    CONSTANT = "constant"  # arg = value; any shape, every element the same
    IOTA = "iota"          # arg = axis; element = its index along that axis (int32)
    CAST = "cast"          # to the node's dtype
    # views: free until materialised
    RESHAPE = "reshape"    # arg = new shape (row-major order kept)
    PERMUTE = "permute"    # arg = axes order
    EXPAND = "expand"      # arg = new shape; only size-1 axes grow
    SLICE = "slice"        # arg = ((start, stop), ...) per axis, step 1
    PAD = "pad"            # arg = ((before, after), ...) per axis, zero fill
    CONTIGUOUS = "contiguous"  # materialise a view

    def __str__(self) -> str:
        return self.value


UNARY = frozenset({Op.EXP2, Op.LOG2, Op.SIN, Op.SQRT, Op.RECIP})
BINARY = frozenset({Op.ADD, Op.MUL, Op.MOD, Op.LESS_THAN})
REDUCE = frozenset({Op.SUM, Op.MAX})
COMPUTE = UNARY | BINARY | REDUCE
LEAVES = frozenset({Op.INPUT, Op.CONSTANT, Op.IOTA})
VIEWS = frozenset({Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.SLICE, Op.PAD})
ELEMENTWISE = UNARY | BINARY | frozenset({Op.CAST, Op.CONTIGUOUS})
COMMUTATIVE = frozenset({Op.ADD, Op.MUL})

assert len(COMPUTE) == 11, "the primitive compute set is exactly eleven ops"
