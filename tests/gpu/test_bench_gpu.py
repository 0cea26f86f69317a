"""`tensorsmith bench`'s harness on the GPU: a case is compiled, checked against PyTorch and timed in every
column; a reference that disagrees with the program fails the row instead of giving it a time."""
from __future__ import annotations

import pytest

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.bench import Case

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch", reason="the harness compares with PyTorch")


def _rmsnorm_case(reference) -> Case:
    g = ts.Graph("bench_rmsnorm_small")
    x, w = g.input("x", (512, 1024), "float16"), g.input("w", (1024,), "float16")
    g.output("y", nn.rms_norm(x, w, eps=1e-6))
    return Case(g, reference, "memory-bound")


def _harness():
    from tensorsmith.bench.harness import Harness
    return Harness(torch, ["eager", "compile"], budget_s=2.0)


def test_a_case_is_checked_and_timed_in_every_column(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TENSORSMITH_CACHE_DIR", str(tmp_path))
    case = _rmsnorm_case(lambda x, w: torch.nn.functional.rms_norm(x, (1024,), w, eps=1e-6))
    row = _harness().run(case)
    assert row.kernels.failure is None and row.call.failure is None, row.kernels.failure
    assert row.kernels.error is not None and row.kernels.error < 1e-2
    for measured in (row.kernels, row.call, row.baselines["eager"], row.baselines["compile"]):
        assert measured.ms is not None and measured.ms > 0
    assert row.kernel_count == 1 and row.compile_warm_s < row.kernels.compile_s   # the warm compile is a cache hit
    gpu_times = [row.baselines[name].gpu_ms for name in ("eager", "compile")]
    assert all(ms is not None and ms > 0 for ms in gpu_times)        # the baselines timed queued, like our kernels
    assert row.speedup(row.kernels) == pytest.approx(min(gpu_times) / row.kernels.ms)
    assert row.speedup(row.call) == pytest.approx(min(row.baselines[name].ms for name in ("eager", "compile"))
                                                  / row.call.ms)


def test_a_program_that_disagrees_with_its_reference_gets_no_time(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TENSORSMITH_CACHE_DIR", str(tmp_path))
    case = _rmsnorm_case(lambda x, w: 2 * torch.nn.functional.rms_norm(x, (1024,), w, eps=1e-6))
    row = _harness().run(case)
    assert row.kernels.ms is None and "differs from PyTorch's" in (row.kernels.failure or "")
    assert row.baselines["eager"].ms is not None    # the baselines agree with the reference and are still timed
