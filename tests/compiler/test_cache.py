"""The compiled-program cache: a hit returns at once, a damaged or partial entry is rebuilt, never used."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

import tensorsmith as ts
from graph_cases import CASES
from tensorsmith import cache
from tensorsmith.cache import ProgramCache
from tensorsmith.cli import main
from tensorsmith.search.verify import compare, random_inputs

ROOT = Path(__file__).parents[2]


def _entries(cache_dir: Path) -> list[Path]:
    return [p for p in cache_dir.iterdir() if not p.name.startswith(".")] if cache_dir.exists() else []


def test_second_compile_is_a_hit_under_two_seconds(tmp_path: Path) -> None:
    graph = CASES["norms"]()
    first = ts.compile(graph, profile=False, cache_dir=tmp_path)
    assert not first.report.get("from_cache") and len(_entries(tmp_path)) == 1
    start = time.perf_counter()
    second = ts.compile(CASES["norms"](), profile=False, cache_dir=tmp_path)
    assert time.perf_counter() - start < 2.0
    assert second.report.get("from_cache") is True
    assert [k.cubin for k in second.kernels] == [k.cubin for k in first.kernels]
    inputs = random_inputs(graph, seed=3)
    assert all(c.ok for c in compare(graph, second(device="cpu", **inputs), ts.evaluate(graph, inputs)))


@pytest.mark.parametrize("change", ["seed", "target", "graph"])
def test_a_different_seed_target_or_graph_misses(change: str, tmp_path: Path) -> None:
    ts.compile(CASES["views"](), profile=False, cache_dir=tmp_path)
    kwargs = {"seed": {"seed": 1}, "target": {"target": "sm80"}, "graph": {}}[change]
    graph = CASES["pointwise_math"]() if change == "graph" else CASES["views"]()
    program = ts.compile(graph, profile=False, cache_dir=tmp_path, **kwargs)
    assert not program.report.get("from_cache") and len(_entries(tmp_path)) == 2


def test_a_changed_compiler_misses_under_the_same_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compiler whose code changed (a fix in codegen, a new archetype) compiles again: its cached programs were
    made by other code, though the version string is the same."""
    ts.compile(CASES["views"](), profile=False, cache_dir=tmp_path)
    monkeypatch.setattr(cache, "compiler_digest", lambda: "other code")
    program = ts.compile(CASES["views"](), profile=False, cache_dir=tmp_path)
    assert not program.report.get("from_cache") and len(_entries(tmp_path)) == 2


def test_the_compilers_digest_reads_its_modules_and_templates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "fake_compiler"
    (package / "templates").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    template = package / "templates" / "kernel.cu.j2"
    template.write_text("// one kernel")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cache, "PACKAGES", ("fake_compiler",))
    digests = []
    for text in ("// one kernel", "// one kernel", "// another kernel"):
        template.write_text(text)
        cache.compiler_digest.cache_clear()
        digests.append(cache.compiler_digest())
    cache.compiler_digest.cache_clear()
    assert digests[0] == digests[1] != digests[2]


@pytest.mark.parametrize("damage", ["truncate_cubin", "delete_source", "garble_json", "drop_manifest"])
def test_a_damaged_entry_is_detected_and_rebuilt(damage: str, tmp_path: Path) -> None:
    ts.compile(CASES["views"](), profile=False, cache_dir=tmp_path)
    (entry,) = _entries(tmp_path)
    cubin = next((entry / "kernels").glob("*.cubin"))
    if damage == "truncate_cubin":
        cubin.write_bytes(cubin.read_bytes()[:100])
    elif damage == "delete_source":
        next((entry / "kernels").glob("*.cu")).unlink()
    elif damage == "garble_json":
        (entry / "program.json").write_text("{not json")
    else:
        (entry / "manifest.json").unlink()   # what an interrupted write leaves: everything but the manifest
    assert ProgramCache(tmp_path).get(entry.name, CASES["views"]()) is None
    rebuilt = ts.compile(CASES["views"](), profile=False, cache_dir=tmp_path)
    assert not rebuilt.report.get("from_cache")
    again = ts.compile(CASES["views"](), profile=False, cache_dir=tmp_path)
    assert again.report.get("from_cache") and again.kernels[0].cubin[:4] == b"\x7fELF"


def test_no_cache_neither_reads_nor_writes(tmp_path: Path) -> None:
    ts.compile(CASES["views"](), profile=False, cache=False, cache_dir=tmp_path)
    assert _entries(tmp_path) == []


def test_cli_says_a_hit_came_from_the_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["compile", str(ROOT / "examples" / "softmax.py"), "-o", str(tmp_path / "out"), "--no-profile",
            "--cache-dir", str(tmp_path / "cache")]
    assert main(args) == 0
    capsys.readouterr()
    start = time.perf_counter()
    assert main(args) == 0
    assert time.perf_counter() - start < 2.0
    captured = capsys.readouterr()
    assert "found in the cache" in captured.err and "(from the cache)" in captured.out
