"""`tensorsmith run --check` and report.html, from a compiled folder."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tensorsmith.cli import main

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def softmax_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run") / "out"
    assert main(["compile", str(ROOT / "examples" / "softmax.py"), "-o", str(out), "--no-profile", "-q"]) == 0
    return out


def test_run_check_on_cpu_passes(softmax_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(softmax_folder), "--check", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"check y: relative L2 error \S+ \(tolerance 0.01\) ok", out)


def test_run_check_fails_with_status_1_on_a_wrong_program(softmax_folder: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in softmax_folder.iterdir():
        if path.is_file():
            (broken / path.name).write_bytes(path.read_bytes())
    (broken / "kernels").mkdir()
    for path in (softmax_folder / "kernels").iterdir():
        (broken / "kernels" / path.name).write_bytes(path.read_bytes())
    doc = json.loads((broken / "graph.json").read_text())
    for node in doc["kernel_program"]["nodes"]:       # plant a wrong kernel: exp2 becomes sin
        if node["op"] == "exp2":                      # (max -> sum would not do: softmax ignores the shift)
            node["op"] = "sin"
    (broken / "graph.json").write_text(json.dumps(doc))
    assert main(["run", str(broken), "--check", "--device", "cpu"]) == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_run_with_inputs_file(softmax_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x = np.random.default_rng(0).standard_normal((1024, 4096)).astype(np.float16)
    np.savez(tmp_path / "inputs.npz", x=x)
    assert main(["run", str(softmax_folder), "--inputs", str(tmp_path / "inputs.npz"), "--check", "--device", "cpu"]) == 0


def test_run_on_a_folder_that_is_not_a_program(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(tmp_path), "--check"]) == 2
    assert "is not a saved tensorsmith program" in capsys.readouterr().err


def test_report_is_self_contained_and_shows_each_part(softmax_folder: Path) -> None:
    page = (softmax_folder / "report.html").read_text()
    assert page.startswith("<!doctype html>")
    assert "softmax_y" in page and "row_reduce" in page
    assert page.count("<svg") == 2                          # the program diagram and the search plot
    assert '<span class="k">__global__</span>' in page      # highlighted source
    assert "not measured" in page and "No GPU was used" in page
    assert "speedup over unfused" in page and "relative L2 error" in page
    assert not re.search(r"(src|href)=\"(https?:)?//", page)   # nothing fetched from the network
