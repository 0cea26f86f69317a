"""benchmarks/decode.py runs end to end on a narrow model (--tiny) on the CPU, so that the GPU's run of it is not
its first, and its greedy tokens agree with transformers' generate."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "decode.py"


def test_the_decode_benchmark_runs_on_a_narrow_model_and_its_tokens_agree(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="PyTorch is not installed")
    pytest.importorskip("transformers", reason="transformers is not installed")
    done = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--layers", "2", "--prompt", "8", "--new", "6",
                           "--cache", "32", "--budget", "3", "--device", "cpu"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "TENSORSMITH_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the first 6 of 6 tokens agree" in done.stdout
    assert "tokens/s" in done.stdout
