"""Benchmark: the suite's fused and block models in their two operand forms, kernel by kernel, predicted and measured.

The greedy partition computes a matmul operand (a norm, an activation, heads permuted back into rows) in the
matmul's tile loads; `CandidateSpace.operands_materialised` gives each such operand a kernel of its own so that the
matmuls copy plain buffers by TMA. Each form runs under codegen's default schedules and under the cost model's
first choice; every program's outputs are checked against the float64 reference before its times are printed.

    python benchmarks/operand_forms.py [CASE ...]     # on a GPU; default: the fused and block families
"""
from __future__ import annotations

import argparse
import dataclasses

import tensorsmith as ts
from tensorsmith import rewrites, search
from tensorsmith.codegen.schedules import default_schedule
from tensorsmith.executor import profile_on_gpu
from tensorsmith.ir.kernel_program import KernelProgram
from tensorsmith.ir.targets import get_target
from tensorsmith.pipeline import _check, built_program
from tensorsmith.search.cost import kernel_seconds
from tensorsmith.search.prune import AbstractChecker
from tensorsmith.search.space import CandidateSpace
from tensorsmith.search.verify import random_inputs
from tensorsmith.suite import blocks, fused

TARGET = get_target("sm90")
FORMS = ("greedy", "operands_materialised")


def _schedules(space: CandidateSpace, boundaries: frozenset[int], how: str) -> KernelProgram:
    program = space.program(boundaries)
    shapes = {name: buffer.shape for name, buffer in program.buffers.items()}
    chosen = [default_schedule(k, shapes, TARGET.arch) if how == "default"
              else space.options(boundaries, position).schedules[0] for position, k in enumerate(program.kernels)]
    return dataclasses.replace(program, kernels=[dataclasses.replace(k, schedule=s)
                                                 for k, s in zip(program.kernels, chosen)])


def run(graph: ts.Graph) -> None:
    chosen = search.extract(rewrites.saturate(graph))
    space = CandidateSpace(chosen, TARGET, AbstractChecker())
    inputs = random_inputs(graph, 7)
    reference = ts.evaluate(graph, inputs)
    for form in FORMS:
        for how in ("default", "model"):
            program = _schedules(space, getattr(space, form)(), how)
            outputs, kernel_ms, total_ms = profile_on_gpu(built_program(graph, TARGET, program), inputs, warmup=5,
                                                          repeat=20)
            _check(graph, outputs, reference, inputs)   # raises before any time is printed for a wrong program
            predicted = [kernel_seconds(k, program, TARGET) * 1e6 for k in program.kernels]
            print(f"{graph.name} {form}, {how} schedules: {total_ms * 1e3:.1f} us as one graph "
                  f"(predicted {sum(predicted):.1f})")
            for kernel, pred, ms in zip(program.kernels, predicted, kernel_ms):
                print(f"    {kernel.name.removeprefix(graph.name + '_'):14s} {kernel.archetype:10s} "
                      f"predicted {pred:8.1f} measured {ms * 1e3:8.1f} us  {kernel.schedule}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="*", help="case names (default: every fused and block case)")
    args = parser.parse_args()
    cases = [case for case in [*fused.CASES, *blocks.CASES] if not args.cases or case.name in args.cases]
    for case in cases:
        run(case.graph)


if __name__ == "__main__":   # compile workers import this module: the run belongs under this guard
    main()
