"""Random testing: a candidate counts only once it matches the reference interpreter on fresh inputs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from tensorsmith.ir.dtypes import DType, round_to
from tensorsmith.ir.errors import TensorsmithError
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.interpreter import evaluate
from tensorsmith.ir.kernel_program import KernelProgram
from tensorsmith.ir.node import Node, toposort

# Relative L2 error allowed for an output stored in this dtype (METHOD.md's figures).
TOLERANCE = {DType.FLOAT32: 1e-5, DType.FLOAT16: 1e-2, DType.BFLOAT16: 1e-2, DType.INT32: 0.0, DType.BOOL: 0.0}


class VerificationError(TensorsmithError, AssertionError):
    """A candidate program disagrees with the reference interpreter."""


@dataclass(frozen=True)
class Check:
    """One output compared with the reference: its relative L2 error and the tolerance it had to meet."""

    output: str
    error: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return bool(np.isfinite(self.error)) and self.error <= self.tolerance


def random_inputs(graph: Graph, seed: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    """Fresh inputs for `graph`: standard normal floats (never zeros), small ints, random bools."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, node in graph.inputs.items():
        if node.dtype.is_float:
            values = rng.standard_normal(node.shape) * scale
            arrays[name] = round_to(values, node.dtype).astype(np.float32 if node.dtype != DType.FLOAT16
                                                                 else np.float16)
        elif node.dtype == DType.INT32:
            arrays[name] = rng.integers(-100, 100, node.shape, dtype=np.int32)
        else:
            arrays[name] = rng.random(node.shape) < 0.5
    return arrays


def relative_l2(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref|| / ||ref|| in float64 (absolute error where the reference is all zero); NaN stays NaN."""
    out64, ref64 = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    if out64.shape != ref64.shape:
        return float("inf")
    if not np.all(np.isfinite(out64) == np.isfinite(ref64)):
        return float("nan")
    finite = np.isfinite(ref64)
    diff = np.linalg.norm((out64 - ref64)[finite])
    norm = np.linalg.norm(ref64[finite])
    return float(diff / norm) if norm > 0 else float(diff)


def compare(graph: Graph, outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> list[Check]:
    """Each output's error against the reference, with the tolerance of its dtype."""
    return [Check(name, relative_l2(outputs[name], reference[name]), tolerance(node))
            for name, node in graph.outputs.items()]


def tolerance(output: Node) -> float:
    """The loosest tolerance of any dtype on the way to `output`: a float16 temporary rounds like a float16 output."""
    return max(TOLERANCE[node.dtype] for node in toposort([output]) if node.dtype.is_float or node is output)


def verify_program(graph: Graph, program: KernelProgram, seed: int, draws: int = 2) -> list[Check]:
    """Execute the KernelProgram in numpy on `draws` fresh input sets; raise VerificationError on a mismatch."""
    checks: list[Check] = []
    for draw in range(draws):
        inputs = random_inputs(graph, seed + draw, scale=1.0 + 2.0 * draw)  # a wider second draw
        checks = compare(graph, program.execute(inputs), evaluate(graph, inputs))
        failed = [c for c in checks if not c.ok]
        if failed:
            worst = failed[0]
            raise VerificationError(f"kernel program for graph {graph.name!r} disagrees with the reference on"
                                    f" output {worst.output!r}: relative L2 error {worst.error:.3g} >"
                                    f" {worst.tolerance:g} (seed {seed + draw})")
    return checks
