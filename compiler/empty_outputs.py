"""Outputs with a size-0 axis: buffers of the program that no kernel writes.

Once `ir.empty.empties_folded` has made constants of what a graph computes out of empty tensors, an empty output
depends only on empty values: there is nothing to compute. The compile searches the graph's other outputs alone
and gives each empty one a buffer (of no bytes: the runtimes allocate at least one) and no kernel; a graph whose
outputs are all empty is a program of no kernels.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from tensorsmith.ir.empty import is_empty
from tensorsmith.ir.errors import CompileError
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.kernel_program import Buffer, KernelProgram

from .program import Program


def without_empty_outputs(graph: Graph) -> Graph | None:
    """`graph` with its non-empty outputs alone; None where all are empty."""
    kept = {name: node for name, node in graph.outputs.items() if not is_empty(node)}
    if not kept:
        return None
    rest = Graph(graph.name)
    rest.inputs.update(graph.inputs)
    rest.outputs.update(kept)
    return rest


def with_empty_outputs(graph: Graph, target: str, version: str, seed: int,
                       compile_rest: Callable[[Graph], Program]) -> Program:
    """The program of `graph`, some of whose outputs are empty: its non-empty outputs compiled by `compile_rest`, its
    empty ones given buffers."""
    rest = without_empty_outputs(graph)
    if rest is None:
        buffers = {name: Buffer(name, node.shape, node.dtype, "input") for name, node in graph.inputs.items()}
        empty = KernelProgram(graph.name, buffers, [], tuple(graph.inputs), {})
        program = Program(graph.name, target, dict(buffers), tuple(graph.inputs), (), [], graph, empty, seed, version,
                          {})
    else:
        program = compile_rest(rest)
    taken = sorted(name for name in graph.outputs if name in program.buffers and name not in program.outputs)
    if taken:
        raise CompileError(f"graph {graph.name!r}: the compile named a buffer of its own {taken[0]!r}, the name of an"
                           f" empty output; rename that output")
    added = {name: Buffer(name, node.shape, node.dtype, "output") for name, node in graph.outputs.items()
             if is_empty(node)}
    kernel_program = replace(program.kernel_program, buffers={**program.kernel_program.buffers, **added},
                             outputs={name: program.kernel_program.outputs.get(name, name) for name in graph.outputs})
    return replace(program, buffers={**program.buffers, **added}, outputs=tuple(graph.outputs), graph=graph,
                   kernel_program=kernel_program)
