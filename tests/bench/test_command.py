"""`tensorsmith bench` from the shell where there is no GPU: the list works, a run says why it cannot, and a
report is written from saved results."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tensorsmith.bench.case import load_suite
from tensorsmith.bench.report import to_json

from test_report import META, _rows   # noqa: F401  (the same rows the report tests use)


def _bench(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tensorsmith.cli", "bench", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def test_list_names_every_case_from_any_folder(tmp_path: Path) -> None:
    done = _bench("--list", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    listed = [line.split()[0] for line in done.stdout.splitlines()]
    assert listed == [case.name for case in load_suite()]


def test_without_a_gpu_a_run_is_refused_in_one_line_with_status_2() -> None:
    done = _bench("softmax")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: tensorsmith bench needs an NVIDIA GPU and found none (`tensorsmith bench --list` works anywhere)"]


def test_an_unknown_case_or_baseline_is_the_users_mistake() -> None:
    done = _bench("no_such_case")
    assert done.returncode == 2 and "no benchmark case or family matches 'no_such_case'" in done.stderr
    done = _bench("softmax", "--baselines", "eager,tvm")
    assert done.returncode == 2 and "unknown baseline 'tvm'" in done.stderr
    assert "Traceback" not in done.stderr


def test_saved_results_are_joined_into_one_report(tmp_path: Path) -> None:
    rows = _rows()
    (tmp_path / "a.json").write_text(to_json(META, rows[:1]))
    (tmp_path / "b.json").write_text(to_json({**META, "commit": "def5678", "command": "tensorsmith bench fused"},
                                             rows[1:]))
    out = tmp_path / "BENCHMARKS.md"
    done = _bench("--from-json", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "-o", str(out))
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert "commit abc1234, def5678" in text
    assert all(f"| {name} |" in text for name in ("fast", "slow", "failed"))
    bad = tmp_path / "bad.json"
    for text in ("{}", "[]", '{"format": 1, "meta": {}, "rows": []}'):
        bad.write_text(text)
        done = _bench("--from-json", str(bad))
        assert done.returncode == 2 and "is not a results file" in done.stderr and "Traceback" not in done.stderr
    done = _bench("--from-json", str(tmp_path / "a.json"), "-o", str(tmp_path))
    assert done.returncode == 2 and "is a folder" in done.stderr


def test_joining_keeps_every_baseline_and_a_case_measured_again_replaces_its_row(tmp_path: Path) -> None:
    first, second = _rows(), _rows()
    second[1].kernels.ms = 0.04
    (tmp_path / "a.json").write_text(to_json(META, first))
    (tmp_path / "b.json").write_text(to_json({**META, "baselines": ["max-autotune"], "commit": "def5678"},
                                             second[1:2]))
    out = tmp_path / "joined.md"
    assert _bench("--from-json", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "-o", str(out)).returncode == 0
    doc = json.loads(out.with_suffix(".json").read_text())
    assert doc["meta"]["baselines"] == ["eager", "compile", "max-autotune"]
    assert [r["case"] for r in doc["rows"]] == ["fast", "slow", "failed"]
    assert doc["rows"][1]["kernels"]["ms"] == 0.04 and doc["rows"][1]["commit"] == "def5678"
