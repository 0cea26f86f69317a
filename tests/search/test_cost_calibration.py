"""The cost model against matmul times measured on the H200: it must pick schedules that are nearly the fastest.

The data (`h200_matmul_sweep.json`) are the sweep of `benchmarks/matmul.py --sweep` on the lent H200: 7 shapes
(M = 16, 128, 4096; N, K = 4096, 11008) under 13 schedules each, mma.sync and wgmma, with and without split-K.
"""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path

import tensorsmith as ts
from tensorsmith.ir.kernel_program import Schedule
from tensorsmith.ir.targets import get_target
from tensorsmith.search.cost import kernel_seconds
from tensorsmith.search.partition import partition

SWEEP = json.loads((Path(__file__).parent / "h200_matmul_sweep.json").read_text())["rows"]


def _predicted_us(m: int, n: int, k: int, schedule: dict[str, int]) -> float:
    g = ts.Graph("matmul")
    g.output("c", g.input("a", (m, k), "float16") @ g.input("b", (k, n), "float16"))
    program = partition(g)
    kernel = dataclasses.replace(program.kernels[0], schedule=Schedule.of(**schedule))
    return kernel_seconds(kernel, dataclasses.replace(program, kernels=[kernel]), get_target("sm90")) * 1e6


def _by_shape() -> dict[tuple[int, int, int], list[tuple[float, float]]]:
    shapes: dict[tuple[int, int, int], list[tuple[float, float]]] = {}
    for row in SWEEP:
        shape = (row["m"], row["n"], row["k"])
        shapes.setdefault(shape, []).append((row["measured_us"], _predicted_us(*shape, row["schedule"])))
    return shapes


def test_the_models_choice_is_within_20_percent_of_the_fastest_measured_schedule() -> None:
    for shape, times in _by_shape().items():
        fastest = min(measured for measured, _ in times)
        chosen = min(times, key=lambda pair: pair[1])[0]
        assert chosen <= 1.2 * fastest, f"{shape}: the model's choice ran {chosen:.1f} us, the fastest {fastest:.1f} us"


def test_predictions_are_within_a_factor_of_about_1_2_in_the_median() -> None:
    errors = [abs(math.log(predicted / measured)) for times in _by_shape().values() for measured, predicted in times]
    assert len(errors) == len(SWEEP) == 91
    assert statistics.median(errors) < math.log(1.2)
