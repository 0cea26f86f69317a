"""A search that measures on the GPU compiles each kernel structure and schedule once: the candidates it measures
name each kernel's function by its structure, so one met again under other buffer names is the same source."""
from __future__ import annotations

from pathlib import Path

import pytest
from graph_cases import decoder_block

import tensorsmith as ts
from tensorsmith.codegen.render import RENDERS
from tensorsmith.ir.knobs import CACHE_DIR_ENV

pytestmark = pytest.mark.gpu
LAUNCH_COST_KERNELS = 1   # the empty kernel that measures what a launch costs (codegen/launch_cost.py)


def test_a_measured_search_compiles_each_structure_and_schedule_once(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    RENDERS.clear()
    program = ts.compile(decoder_block(64), target="sm90", budget_s=20)
    assert program.report["search"]["measured"] >= 2
    assert RENDERS and set(RENDERS.values()) == {1}
    cubins = list((tmp_path / "cubin").glob("*.cubin"))
    # each rendered (structure, schedule) compiled once as the search measured it, and the chosen program's
    # kernels once more under their own names
    assert len(cubins) <= len(RENDERS) + len(program.kernels) + LAUNCH_COST_KERNELS
