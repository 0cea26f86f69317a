"""KernelProgram: the lower IR that search produces, codegen renders and the numpy executor runs.

A program is an ordered list of kernels over named buffers. Each kernel is a fused subgraph: a DAG of
Nodes whose INPUT leaves name the buffers it reads, with an archetype (which template renders it)
and a schedule (that template's parameters).
"""
from __future__ import annotations

import hashlib
import math

from functools import lru_cache
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from . import primitives as P
from .dtypes import DType, numpy_dtype, round_to_register
from .interpreter import evaluate_nodes
from .node import Node, structure_rows, toposort
from .ops import ELEMENTWISE, Op


@dataclass(frozen=True)
class Buffer:
    """A tensor in device memory: a program input, a program output, or a temporary between kernels."""

    name: str
    shape: tuple[int, ...]
    dtype: DType
    role: str  # "input" | "output" | "temp"

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class Schedule:
    """An archetype's parameters for one kernel, e.g. {"block": 256}; hashable and ordered."""

    params: tuple[tuple[str, int], ...] = ()

    @staticmethod
    def of(**params: int) -> "Schedule":
        return Schedule(tuple(sorted(params.items())))

    def __getitem__(self, key: str) -> int:
        return dict(self.params)[key]

    def as_dict(self) -> dict[str, int]:
        return dict(self.params)

    def __str__(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.params) or "default"


@lru_cache(maxsize=8192)
def _body(outputs: tuple[tuple[str, Node], ...]) -> tuple[Node, ...]:
    """The nodes of a kernel in topological order (nodes hash by identity, so this is cheap to look up)."""
    return tuple(toposort(node for _, node in outputs))


@dataclass(frozen=True)
class Kernel:
    """One launch: computes `outputs` (buffer name -> node of the body) from the buffers it reads."""

    name: str
    archetype: str
    outputs: tuple[tuple[str, Node], ...]
    schedule: Schedule = field(default_factory=Schedule)

    @property
    def body(self) -> list[Node]:
        return list(_body(self.outputs))

    @property
    def reads(self) -> tuple[str, ...]:
        """Names of the buffers this kernel reads, in first-use order."""
        return tuple(dict.fromkeys(n.arg for n in self.body if n.op == Op.INPUT))

    @property
    def writes(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.outputs)

    def ops_summary(self) -> str:
        """The compute ops this kernel performs, e.g. 'max, add, exp2, sum, recip, mul'."""
        ops = [n.op.value for n in self.body if n.op not in (Op.INPUT, Op.CONSTANT)]
        return ", ".join(dict.fromkeys(ops))


@dataclass
class KernelProgram:
    """Ordered kernels over buffers; `outputs` maps each graph output name to its buffer."""

    name: str
    buffers: dict[str, Buffer]
    kernels: list[Kernel]
    inputs: tuple[str, ...]
    outputs: dict[str, str]

    def execute(self, inputs: Mapping[str, np.ndarray], memo: ExecutionMemo | None = None) -> dict[str, np.ndarray]:
        """Run the kernels in numpy as the GPU runs them: float32 arithmetic in registers, every buffer rounded to
        its dtype where a kernel stores it (so a float32 intermediate that overflows is inf here too); float
        outputs come back as float32 arrays of the stored values.

        `memo`, kept by the caller for one set of `inputs`, holds what each kernel stored by what it computes
        from what: a kernel whose body, and whose buffers' provenance, match one run before is not run again (the
        search tests many programs that share most kernels)."""
        memo = memo if memo is not None else ExecutionMemo(0)
        memory: dict[str, np.ndarray] = {}
        origin: dict[str, int] = {name: memo.origin(("input", name)) for name in self.inputs}

        def held(name: str) -> np.ndarray:     # an input is rounded where a kernel (or an output) first reads it
            if name not in memory:   # (float16 values held as float16 are widened where a kernel reads them)
                value, dtype = np.asarray(inputs[name]), self.buffers[name].dtype
                narrow = value.dtype == np.float16 and dtype == DType.FLOAT16
                memory[name] = value if narrow else round_to_register(value, dtype)
            return memory[name]

        memory.update((name, np.empty(buf.shape, numpy_dtype(buf.dtype))) for name, buf in self.buffers.items()
                      if buf.role == "output" and buf.nbytes == 0)   # no kernel writes an empty output
        for kernel in self.kernels:
            key = (kernel_structure(kernel), tuple(self.buffers[w].dtype for w in kernel.writes),
                   tuple(origin[name] for name in kernel.reads))
            stored = memo.get(key)
            if stored is None:
                leaves = {name: held(name) for name in kernel.reads}
                values = evaluate_nodes([node for _, node in kernel.outputs], leaves, roots_only=True, registers=True)
                stored = tuple(np.asarray(round_to_register(np.asarray(values[id(node)]), self.buffers[name].dtype))
                               for name, node in kernel.outputs)
                memo.put(key, stored)
            for position, (name, value) in enumerate(zip(kernel.writes, stored)):
                memory[name], origin[name] = value, memo.origin((key, position))
        return {out: _float32(held(buf)) for out, buf in self.outputs.items()}

    def written_in_place(self) -> dict[str, str]:
        """{output buffer: input buffer} where the output may be written over the input, the two of one shape and
        dtype sharing memory (a KV cache updated at a few positions, in the caller's tensor): the one kernel that
        reads the input is pointwise and reads it only for that output, through elementwise ops, so each element is
        read by the thread that writes it, before it writes it, and by nothing after."""
        readers: dict[str, list[Kernel]] = {}
        for kernel in self.kernels:
            for name in kernel.reads:
                readers.setdefault(name, []).append(kernel)
        pairs: dict[str, str] = {}
        for name in self.inputs:
            if len(readers.get(name, ())) != 1 or readers[name][0].archetype != "pointwise":
                continue
            out = _sole_elementwise_reader(readers[name][0], name)
            source, target = self.buffers[name], self.buffers.get(out or "")
            if (target is not None and target.role == "output" and out not in pairs
                    and (target.shape, target.dtype) == (source.shape, source.dtype)):
                pairs[out] = name
        return pairs


def _float32(value: np.ndarray) -> np.ndarray:
    return value.astype(np.float32) if value.dtype == np.float16 else value


class ExecutionMemo:
    """Kernel outputs of `KernelProgram.execute` on one set of inputs, by (kernel structure, output dtypes, where
    each buffer read came from), up to `max_bytes` (the oldest dropped first); provenance is numbered, so that a key
    stays small at any depth."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.held = 0
        self.hits = 0
        self._stored: dict[tuple, tuple[np.ndarray, ...]] = {}
        self._origins: dict[tuple, int] = {}

    def origin(self, what: tuple) -> int:
        """The number of a buffer's provenance: an input's name, or (the key of the kernel that stored it, which
        of its outputs)."""
        return self._origins.setdefault(what, len(self._origins))

    def get(self, key: tuple) -> tuple[np.ndarray, ...] | None:
        found = self._stored.get(key)
        self.hits += found is not None
        return found

    def put(self, key: tuple, stored: tuple[np.ndarray, ...]) -> None:
        size = sum(array.nbytes for array in stored)
        if size > self.max_bytes:
            return
        for array in stored:     # shared by every program that runs this kernel: none may write into it
            array.flags.writeable = False
        self._stored[key] = stored
        self.held += size
        while self.held > self.max_bytes:
            self.held -= sum(array.nbytes for array in self._stored.pop(next(iter(self._stored))))


def merged_pointwise(kernels: list[Kernel]) -> list[Kernel]:
    """`kernels` (in an order that runs) with each pointwise kernel joined into the first pointwise kernel of its
    output shape that runs after everything it reads is written: one launch, with several outputs, where there were
    many (a decode step's per-layer cache counters, read from inputs alone, and each layer's key and value cache
    writes). Every buffer is written once, so a kernel run earlier, after its inputs, computes the same."""
    merged: list[Kernel] = []
    written_at: dict[str, int] = {}   # buffer -> the position in `merged` of the kernel that writes it
    for kernel in kernels:
        position = None
        if kernel.archetype == "pointwise":
            ready = max((written_at[name] for name in kernel.reads if name in written_at), default=-1)
            position = next((i for i in range(ready + 1, len(merged)) if _joinable(merged[i], kernel)), None)
        if position is None:
            merged.append(kernel)
            position = len(merged) - 1
        else:
            merged[position] = Kernel(merged[position].name, "pointwise",
                                      merged[position].outputs + kernel.outputs, merged[position].schedule)
        written_at.update((name, position) for name in kernel.writes)
    return merged


def _joinable(first: Kernel, other: Kernel) -> bool:
    """Pointwise kernels of one output shape, dtype and schedule (a vector width chosen for one dtype may not suit
    another's)."""
    (_, node), (_, other_node) = first.outputs[0], other.outputs[0]
    return (first.archetype == "pointwise" and node.shape == other_node.shape and first.schedule == other.schedule
            and {n.dtype for _, n in first.outputs} == {n.dtype for _, n in other.outputs})


def output_copies(graph: str, outputs: Mapping[str, Node], buffer_of: Mapping[int, str],
                  buffers: dict[str, Buffer]) -> list[Kernel]:
    """A copy kernel for each output whose value is in a buffer of another name (a second name for one value, or an
    input passed straight out), its buffer added to `buffers`."""
    kernels = []
    for name, node in outputs.items():
        if buffer_of[id(node)] != name:
            source = buffers[buffer_of[id(node)]]
            buffers[name] = Buffer(name, node.shape, node.dtype, "output")
            copy = P.contiguous(P.input_(source.name, source.shape, source.dtype))
            kernels.append(Kernel(f"{graph}_{name}", "pointwise", ((name, copy),)))
    return kernels


def kernel_structure(kernel: Kernel, lines: bool = False) -> tuple:
    """A kernel's structure with its buffers named by first use: equal keys render and cost alike (with `lines`,
    the user's line of each node too, which a rendering names in its header). A buffer's shape and dtype are those
    of the node that reads or writes it whole."""
    return (kernel.archetype,) + _structure(kernel.outputs, lines)


@lru_cache(maxsize=8192)
def _structure(outputs: tuple[tuple[str, Node], ...], lines: bool) -> tuple:
    names: dict[str, int] = {}
    body = _body(outputs)
    rows, index = structure_rows(body, lambda node: ("buffer", names.setdefault(node.arg, len(names)))
                                 if node.op == Op.INPUT else node.arg)
    if lines:
        rows = [row + (node.where,) for row, node in zip(rows, body)]
    return tuple(rows), tuple((node.dtype.value, node.shape, index[id(node)]) for _, node in outputs)


def program_structure(program: KernelProgram) -> str:
    """A digest of a program's kernels and the buffers between them; equal for structurally identical programs."""
    digest = hashlib.sha256()
    for kernel in program.kernels:
        digest.update(repr((kernel_structure(kernel), kernel.reads, kernel.writes)).encode())
    digest.update(repr(sorted(program.outputs.items())).encode())
    return digest.hexdigest()


def _sole_elementwise_reader(kernel: Kernel, buffer: str) -> str | None:
    """The one output of `kernel` that depends on `buffer`, where it does so only through elementwise ops from reads
    of the whole buffer (so at the output's own index); else None."""
    tainted: set[int] = set()
    for node in kernel.body:
        if node.op == Op.INPUT and node.arg == buffer:
            tainted.add(id(node))
        elif any(id(src) in tainted for src in node.srcs):
            if node.op not in ELEMENTWISE:
                return None
            tainted.add(id(node))
    readers = [name for name, node in kernel.outputs if id(node) in tainted]
    return readers[0] if len(readers) == 1 else None
