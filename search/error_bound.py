"""A first-order bound on how far rounding alone may move each output of a graph from the float64 reference.

Random tests compare a program with the float64 reference at a tolerance; a right program that stores the graph's
dtypes lies from it by its rounding, which grows with reduction length and with what the output cancels. Measured
on one evaluation (verify.rounding_noise) that is one sample of the error; here it is bounded instead, as a running
error analysis does (Higham, "Accuracy and Stability of Numerical Algorithms", ch. 3): every node gets an array of
absolute error bounds, each op adding its own rounding (unit roundoff of its dtype, float32 at least, as kernels
compute) to what it propagates from its sources:

  a + b:      e_a + e_b + u|a + b|               a * b:  |a| e_b + |b| e_a + e_a e_b + u|ab|
  sum over K: sum(e) + K u32 sum(|terms|) + u|s|  max:    max(e) + u|m|
  f(a):       max(|f(a +- e_a) - f(a)|) + u|f(a)| (exp2, log2, sin, sqrt, recip, fmod: their change over the bound)

A matrix product is bounded through matmuls of the magnitudes (its product is never materialised). Comparisons,
casts to int and bool, and iota carry no error: a comparison that rounding flips is beyond this bound (the exact
check sees through it). The bound is worst case: a program's real error is usually far smaller, so an output that
a bug moves by more than its bound is still caught, and one that only its rounding moves is never refused.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tensorsmith.ir.dtypes import DType
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.interpreter import (SEMANTICS, check_inputs, evaluate_nodes, evaluation_plan, looked_up,
                                       matmul_operands, operand_source)
from tensorsmith.ir.node import Node, toposort
from tensorsmith.ir.ops import VIEWS, Op
from tensorsmith.ir.patterns import match_loose_matmul

UNIT_ROUNDOFF = {DType.FLOAT32: 2.0**-24, DType.FLOAT16: 2.0**-11, DType.BFLOAT16: 2.0**-8}
FUNCTION_ULPS = 4   # CUDA's exp2f, log2f, sinf, sqrtf and division are within a few ulp of the rounded result
GENERIC = (Op.EXP2, Op.LOG2, Op.SIN, Op.SQRT, Op.RECIP, Op.MOD)


def relative_error_bounds(graph: Graph, inputs: Mapping[str, np.ndarray],
                          reference: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Per output, ||error bound|| / ||reference|| (relative L2, as verification measures error); inf where the bound
    is not finite or the reference is all zero."""
    bounds = error_bounds(graph, inputs)
    relative = {}
    for name, node in graph.outputs.items():
        bound, ref = np.asarray(bounds[id(node)], np.float64), np.asarray(reference[name], np.float64)
        finite = np.isfinite(ref)
        norm = np.linalg.norm(ref[finite])
        size = np.linalg.norm(np.broadcast_to(bound, ref.shape)[finite])
        relative[name] = float(size / norm) if norm > 0 and np.isfinite(size) else float("inf")
    return relative


def error_bounds(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[int, np.ndarray]:
    """Absolute error bounds, by id(node), of every value the graph's outputs need (float64 arrays)."""
    roots = list(graph.outputs.values())
    values = evaluate_nodes(roots, check_inputs(graph, inputs))
    plan = evaluation_plan(roots)
    bounds: dict[int, np.ndarray] = {}
    with np.errstate(all="ignore"):
        for node in toposort(roots):
            if id(node) in plan.streamed:   # its source's values were never held whole: no bound (the noise judges it)
                bounds[id(node)] = np.full(node.shape, np.inf)
            elif id(node) in plan.lookups:  # a one-hot sum picks rows: their bounds, no product rounding
                lookup = plan.lookups[id(node)]
                table = _like(bounds[id(lookup.values)], values[id(lookup.values)])
                bounds[id(node)] = looked_up(lookup, table, values[id(lookup.ids)]) + _unit(node) * np.abs(
                    np.asarray(values[id(node)], np.float64))
            elif id(node) in values:
                bounds[id(node)] = _bound(node, values, bounds)
    return bounds


def _unit(node: Node) -> float:
    return max(UNIT_ROUNDOFF.get(node.dtype, 0.0), UNIT_ROUNDOFF[DType.FLOAT32]) if node.dtype.is_float else 0.0


def _bound(node: Node, values: dict[int, np.ndarray], bounds: dict[int, np.ndarray]) -> np.ndarray:
    """The error bound of `node`, from its sources' values and bounds."""
    if not node.dtype.is_float or node.op in (Op.INPUT, Op.IOTA, Op.LESS_THAN):
        return np.zeros(())
    value = np.abs(np.asarray(values[id(node)], np.float64))
    own = _unit(node) * value
    match = match_loose_matmul(node)   # as evaluation_plan takes products, a single row's too
    if match is not None:
        left, right = operand_source(match.lhs), operand_source(match.rhs)
        a, b = matmul_operands(match, values[id(left)], values[id(right)])
        ea, eb = matmul_operands(match, _like(bounds[id(left)], values[id(left)]),
                                 _like(bounds[id(right)], values[id(right)]))
        k = match.dims[2]
        magnitude = np.abs(a) @ np.abs(b)
        return np.abs(a) @ eb + ea @ np.abs(b) + ea @ eb + k * UNIT_ROUNDOFF[DType.FLOAT32] * magnitude + own
    if node.op == Op.CONSTANT:
        return own
    sources = [np.asarray(values[id(s)], np.float64) for s in node.srcs]
    errors = [_like(bounds[id(s)], values[id(s)]) for s in node.srcs]
    if node.op in VIEWS or node.op == Op.CONTIGUOUS:
        return np.asarray(SEMANTICS[node.op](node, errors[0]), np.float64)
    if node.op == Op.CAST:
        return errors[0] + own if node.srcs[0].dtype.is_float else own
    if node.op == Op.ADD:
        return errors[0] + errors[1] + own
    if node.op == Op.MUL:
        return np.abs(sources[0]) * errors[1] + np.abs(sources[1]) * errors[0] + errors[0] * errors[1] + own
    if node.op == Op.SUM:
        k = node.srcs[0].shape[node.arg]
        return (np.sum(errors[0], axis=node.arg) + k * UNIT_ROUNDOFF[DType.FLOAT32]
                * np.sum(np.abs(sources[0]), axis=node.arg) + own)
    if node.op == Op.MAX:
        return np.max(errors[0], axis=node.arg) + own
    if node.op in GENERIC:
        return _change_over(node, sources, errors) + FUNCTION_ULPS * own
    raise AssertionError(f"no error bound for {node.op}")


def _change_over(node: Node, sources: list[np.ndarray], errors: list[np.ndarray]) -> np.ndarray:
    """The most the op's value moves as each source moves by up to its error bound (at the bound's ends)."""
    centre = np.asarray(SEMANTICS[node.op](node, *sources), np.float64)
    change = np.zeros(centre.shape)
    for signs in np.ndindex(*([2] * len(sources))):
        moved = [s + (e if sign else -e) for s, e, sign in zip(sources, errors, signs)]
        step = np.abs(np.asarray(SEMANTICS[node.op](node, *moved), np.float64) - centre)
        change = np.maximum(change, np.where(np.isnan(step) & ~np.isnan(centre), np.inf, step))
    return change


def _like(bound: np.ndarray, value: np.ndarray) -> np.ndarray:
    """A bound broadcast to its value's shape (an input's or a comparison's is a zero scalar)."""
    return np.broadcast_to(bound, np.shape(value))
