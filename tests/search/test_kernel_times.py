"""Measured kernel times by signature (search/kernel_times.py): a kernel measured once is not measured again, in this
compile or, through the file beside the program cache, in a later one on the same GPU."""
from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from graph_cases import decoder_block

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.codegen.schedules import default_schedule
from tensorsmith.ir.kernel_program import KernelProgram, Schedule
from tensorsmith.search.beam import BeamConfig
from tensorsmith.search.engine import SearchConfig, search_program
from tensorsmith.search import kernel_times
from tensorsmith.search.kernel_times import KernelTimes, kernel_signature
from tensorsmith.search.mcts import MCTSConfig
from tensorsmith.search.partition import partition

LAUNCH_S = 0.5e-6


def _scheduled(graph: ts.Graph) -> KernelProgram:
    program = partition(graph)
    shapes = {name: buffer.shape for name, buffer in program.buffers.items()}
    return dataclasses.replace(program, kernels=[dataclasses.replace(k, schedule=default_schedule(k, shapes))
                                                 for k in program.kernels])


def _layers(name: str = "layers", depth: int = 4) -> ts.Graph:
    g = ts.Graph(name)   # the same layer `depth` times: the middle layers' kernels have one signature
    x = g.input("x", (64, 128), "float16")
    for layer in range(depth):
        x = nn.gelu(nn.linear(x, g.input(f"w{layer}", (128, 128), "float16"), g.input(f"b{layer}", (128,), "float16")))
    g.output("y", x)
    return g


class FakeGPU:
    """Each kernel takes 1 us more than the one before it; counts the programs it times and those it only checks."""

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.checked: list[str] = []

    def __call__(self, program: KernelProgram) -> list[float]:
        self.runs.append(program.name)
        return [1e-6 * (i + 1) for i in range(len(program.kernels))]

    def check(self, program: KernelProgram) -> None:
        self.checked.append(program.name)


def test_a_program_whose_kernels_were_measured_is_timed_without_running_it() -> None:
    gpu, times = FakeGPU(), KernelTimes(None, "NVIDIA H200")
    program = _scheduled(_layers())
    first = times.program_seconds(program, gpu, gpu.check, LAUNCH_S)
    assert gpu.runs == ["layers"] and times.measured_programs == 1
    assert times.program_seconds(program, gpu, gpu.check, LAUNCH_S) == first and gpu.runs == ["layers"]
    assert gpu.checked == ["layers"]   # not timed again, but its outputs checked again
    other = _scheduled(_layers("another_model"))     # the same layers in another model: nothing new to measure
    assert times.program_seconds(other, gpu, gpu.check, LAUNCH_S) == first and times.reused_programs == 2
    signatures = [kernel_signature(k, program, "NVIDIA H200") for k in program.kernels]
    assert len(set(signatures)) < len(signatures)          # the second layer's kernels are the first's
    assert first == sum(times.seconds[s] for s in signatures) + LAUNCH_S * len(signatures)


def test_a_deeper_model_of_the_same_layers_measures_nothing_new() -> None:
    """Two sizes of one family at one width (4 and 16 layers): every kernel of the deeper one was measured in the
    shallower one, so it is checked, not timed."""
    gpu, times = FakeGPU(), KernelTimes(None, "NVIDIA H200")
    times.program_seconds(_scheduled(_layers("small", 4)), gpu, gpu.check, LAUNCH_S)
    deeper = _scheduled(_layers("deep", 16))
    seconds = times.program_seconds(deeper, gpu, gpu.check, LAUNCH_S)
    assert gpu.runs == ["small"] and gpu.checked == ["deep"] and times.reused_programs == 1
    assert len(deeper.kernels) == 16 and seconds == sum(
        times.seconds[kernel_signature(k, deeper, "NVIDIA H200")] for k in deeper.kernels) + 16 * LAUNCH_S


def test_a_new_schedule_or_another_gpu_is_measured_again(tmp_path: Path) -> None:
    gpu, path = FakeGPU(), tmp_path / "kernel_times.jsonl"
    program = _scheduled(_layers())
    KernelTimes(path, "NVIDIA H200").program_seconds(program, gpu, gpu.check, LAUNCH_S)
    again = KernelTimes(path, "NVIDIA H200")                 # a later compile reads them back
    assert again.program_seconds(program, gpu, gpu.check, LAUNCH_S) and len(gpu.runs) == 1
    matmul = next(i for i, k in enumerate(program.kernels) if k.archetype == "matmul")
    retimed = dataclasses.replace(program.kernels[matmul], schedule=Schedule.of(
        bm=64, bn=64, bk=64, stages=4, warps_m=2, warps_n=2, split_k=1, wgmma=0))
    changed = dataclasses.replace(program, kernels=[retimed if i == matmul else k
                                                    for i, k in enumerate(program.kernels)])
    again.program_seconds(changed, gpu, gpu.check, LAUNCH_S)
    assert len(gpu.runs) == 2
    KernelTimes(path, "NVIDIA A100").program_seconds(program, gpu, gpu.check, LAUNCH_S)
    assert len(gpu.runs) == 3


def test_a_line_cut_short_is_ignored_and_an_unwritable_file_is_said_once(tmp_path: Path, caplog) -> None:
    path = tmp_path / "kernel_times.jsonl"
    gpu, program = FakeGPU(), _scheduled(_layers())
    KernelTimes(path, "NVIDIA H200").program_seconds(program, gpu, gpu.check, LAUNCH_S)
    path.write_text(path.read_text() + '{"device": "NVIDIA H200", "signa')   # a writer killed mid-line
    assert len(KernelTimes(path, "NVIDIA H200").seconds) == len(path.read_text().splitlines()) - 1
    blocked = tmp_path / "a_file" / "kernel_times.jsonl"
    (tmp_path / "a_file").write_text("not a folder")
    times = KernelTimes(blocked, "NVIDIA H200")
    with caplog.at_level(logging.WARNING):
        times.program_seconds(program, gpu, gpu.check, LAUNCH_S)
        times.program_seconds(_scheduled(decoder_block()), gpu, gpu.check, LAUNCH_S)
    assert sum("could not write the kernel times" in r.message for r in caplog.records) == 1
    assert all(json.loads(line)["device"] == "NVIDIA H200" for line in path.read_text().splitlines()[:-1])


def test_a_search_runs_fewer_programs_than_it_measures_candidates() -> None:
    """MCTS's candidates share most kernels (they differ in one kernel's schedule or one boundary)."""
    gpu, times = FakeGPU(), KernelTimes(None, "NVIDIA H200")
    result = search_program(decoder_block(), "sm90", budget_s=60,
                            measure=lambda program: times.program_seconds(program, gpu, gpu.check, LAUNCH_S),
                            config=SearchConfig(BeamConfig(width=2, rounds=1), MCTSConfig(iterations=12)))
    assert result.stats.measured == times.measured_programs + times.reused_programs
    assert len(gpu.runs) == times.measured_programs < result.stats.measured


def test_a_change_to_codegen_voids_the_times_measured_before_it(tmp_path: Path, monkeypatch) -> None:
    gpu, path = FakeGPU(), tmp_path / "kernel_times.jsonl"
    program = _scheduled(_layers())
    KernelTimes(path, "NVIDIA H200").program_seconds(program, gpu, gpu.check, LAUNCH_S)
    monkeypatch.setattr(kernel_times, "codegen_fingerprint", lambda: "another codegen")
    KernelTimes(path, "NVIDIA H200").program_seconds(program, gpu, gpu.check, LAUNCH_S)
    assert len(gpu.runs) == 2


def test_a_record_appended_after_a_cut_line_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "kernel_times.jsonl"
    path.write_text('{"device": "NVIDIA H200", "signa')   # a writer killed mid-line, before this compile
    gpu, times = FakeGPU(), KernelTimes(path, "NVIDIA H200")
    times.program_seconds(_scheduled(_layers()), gpu, gpu.check, LAUNCH_S)
    assert KernelTimes(path, "NVIDIA H200").seconds == times.seconds and times.seconds
