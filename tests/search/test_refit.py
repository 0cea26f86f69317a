"""The cost model refitted to measured kernels (search/refit.py): records keep their kernels' features, a fit per
archetype corrects a biased model, and is judged on records it was not fitted on."""
from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path

from graph_cases import decoder_block

from tensorsmith.codegen.schedules import default_schedule
from tensorsmith.ir.targets import get_target
from tensorsmith.search import refit
from tensorsmith.search.cost import kernel_features, kernel_seconds
from tensorsmith.search.kernel_times import KernelTimes
from tensorsmith.search.partition import partition

TARGET = get_target("sm90")


def _records(archetype: str, bias: float, count: int, noise: float = 0.1, seed: int = 1) -> list[dict]:
    """A GPU on which `archetype`'s kernels run `bias` times the model's time, give or take `noise` (log-normal)."""
    draw = random.Random(seed)
    records = []
    for _ in range(count):
        predicted = 10 ** draw.uniform(-6, -3)
        measured = bias * predicted * math.exp(draw.gauss(0, noise))
        records.append({"seconds": measured, "features": {"archetype": archetype, "predicted_s": predicted}})
    return records


def test_a_biased_archetype_is_corrected_and_judged_on_held_out_records() -> None:
    fits = {fit.archetype: fit for fit in refit.fit(_records("matmul", 2.0, 40) + _records("pointwise", 1.0, 40))}
    matmul = fits["matmul"]
    assert abs(matmul.scale * 1e-4 ** matmul.power / 1e-4 - 2.0) < 0.2   # twice the model's time, at 100 us
    assert matmul.fitted_on + matmul.held_out == 40 and matmul.held_out == 10
    assert matmul.error_before > 1.8 and matmul.error_after < 1.15      # off by 2x before, by the noise after
    assert "pointwise" not in fits or fits["pointwise"].error_after < fits["pointwise"].error_before


def test_too_few_records_or_a_fit_no_better_leave_the_model_as_it_is() -> None:
    assert refit.fit(_records("matmul", 2.0, refit.MIN_RECORDS - 1)) == []
    assert refit.fit(_records("row_reduce", 1.0, 40, noise=0.0)) == []   # exact already: nothing to gain


def test_a_correction_changes_only_its_archetypes_prices() -> None:
    program = partition(decoder_block(64))
    shapes = {name: buffer.shape for name, buffer in program.buffers.items()}
    kernels = [dataclasses.replace(k, schedule=default_schedule(k, shapes)) for k in program.kernels]
    program = dataclasses.replace(program, kernels=kernels)
    corrected = dataclasses.replace(TARGET, corrections=(("matmul", 2.0, 1.0),))
    launch = TARGET.launch_s    # measured kernel times hold no launch: the fit corrects the rest
    for kernel in kernels:
        ratio = (kernel_seconds(kernel, program, corrected) - launch) / (kernel_seconds(kernel, program, TARGET)
                                                                         - launch)
        assert math.isclose(ratio, 2.0 if kernel.archetype == "matmul" else 1.0)
    features = kernel_features(kernels[0], program, corrected)
    assert math.isclose(features["predicted_s"], kernel_seconds(kernels[0], program, TARGET) - launch)


def test_records_keep_their_kernels_features_and_are_read_back(tmp_path: Path) -> None:
    program = partition(decoder_block(64))
    shapes = {name: buffer.shape for name, buffer in program.buffers.items()}
    program = dataclasses.replace(program, kernels=[dataclasses.replace(k, schedule=default_schedule(k, shapes))
                                                    for k in program.kernels])
    path = tmp_path / "kernel_times.jsonl"
    features = lambda kernel, owner: kernel_features(kernel, owner, TARGET)   # noqa: E731
    times = KernelTimes(path, "GPU", features=features)
    times.program_seconds(program, lambda p: [1e-5] * len(p.kernels), lambda p: None, 1e-6)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == len(times.records) == len(times.seconds) > 1   # one a distinct kernel
    first = lines[0]["features"]
    kernel = program.kernels[0]
    assert first["archetype"] == kernel.archetype and first["schedule"] == kernel.schedule.as_dict()
    assert first["reads"][0][0] == list(program.buffers[kernel.reads[0]].shape)
    assert first["predicted_s"] > 0 and first["bound"] in ("dram", "cache", "compute", "latency")
    again = KernelTimes(path, "GPU")
    assert [r["signature"] for r in again.records] == [r["signature"] for r in lines]
    assert KernelTimes(path, "another GPU").records == []
