"""The harness's parts that need no GPU: the caches each compile is pointed at, so that compiles are cold."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tensorsmith.bench.harness import INDUCTOR_CACHE_ENV, TRITON_CACHE_ENV, _torch_caches_at


def test_a_baselines_torch_caches_are_its_own_while_it_compiles_and_put_back_after(tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch
                                                                                   ) -> None:
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, "/users/own/inductor")
    monkeypatch.delenv(TRITON_CACHE_ENV, raising=False)
    with _torch_caches_at(tmp_path / "case" / "compile"):
        assert os.environ[INDUCTOR_CACHE_ENV] == str(tmp_path / "case" / "compile" / "inductor")
        assert os.environ[TRITON_CACHE_ENV] == str(tmp_path / "case" / "compile" / "triton")
    assert os.environ[INDUCTOR_CACHE_ENV] == "/users/own/inductor"
    assert TRITON_CACHE_ENV not in os.environ


def test_with_the_users_cache_the_torch_caches_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, "/users/own/inductor")
    with _torch_caches_at(None):
        assert os.environ[INDUCTOR_CACHE_ENV] == "/users/own/inductor"
