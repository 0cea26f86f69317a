"""One cache shared by processes and threads, and a cache that cannot be written: nothing raises, nothing partial
is served, and the compile goes on."""
from __future__ import annotations

import gc
import logging
import multiprocessing
import sys
import threading
from pathlib import Path

import tensorsmith as ts
from graph_cases import CASES
from tensorsmith.cache import ProgramCache, is_intact

ROUNDS = 12
KEY = "0" * 32


def _hammer(cache_root: str, program_folder: str, rounds: int) -> list[str]:
    """Store and read one entry `rounds` times; the problems seen, as text (a process's return value)."""
    program, cache, problems = ts.load(program_folder), ProgramCache(Path(cache_root)), []
    for _ in range(rounds):
        try:
            cache.put(KEY, program)
            hit = cache.get(KEY, program.graph)
            if hit is not None and [k.cubin for k in hit.kernels] != [k.cubin for k in program.kernels]:
                problems.append("served an entry that differs from what was stored")
        except Exception as err:   # the behaviour under test: nothing may escape
            problems.append(f"{type(err).__name__}: {err}")
    return problems


def _saved(tmp_path: Path) -> Path:
    return ts.compile(CASES["views"](), profile=False, cache=False).save(tmp_path / "saved")


def test_threads_sharing_one_entry_never_raise_or_see_a_part(tmp_path: Path) -> None:
    folder, problems = _saved(tmp_path), []
    threads = [threading.Thread(target=lambda: problems.extend(_hammer(str(tmp_path / "cache"), str(folder), ROUNDS)))
               for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert problems == []
    assert is_intact(tmp_path / "cache" / KEY)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [KEY]   # no staging or removed folders left


def test_processes_sharing_one_fresh_cache_never_raise(tmp_path: Path) -> None:
    folder = _saved(tmp_path)
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        results = pool.starmap(_hammer, [(str(tmp_path / "cache"), str(folder), ROUNDS)] * 4)
    assert [problem for result in results for problem in result] == []
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [KEY]


def test_a_cache_that_cannot_be_written_is_skipped_and_said_once(tmp_path: Path, caplog) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    caplog.set_level(logging.WARNING)
    for graph in (CASES["views"](), CASES["pointwise_math"]()):
        program = ts.compile(graph, profile=False, cache_dir=blocker / "cache")   # a folder inside a file
        assert program.kernels and not program.report.get("from_cache")
    warnings = [r.getMessage() for r in caplog.records if "compiled-program cache" in r.getMessage()]
    assert len(warnings) == 1 and "not cached" in warnings[0] and blocker.read_text() == "not a folder"


def test_a_cache_folder_deleted_under_a_running_process_is_made_again(tmp_path: Path) -> None:
    """The cubins, the programs and (with NVRTC 13.1 or later) NVRTC's unpacked headers live under the cache root;
    a process that compiled once and then finds the root gone compiles again from nothing."""
    import os
    import subprocess
    import sys
    script = ("import shutil, sys; sys.path.insert(0, sys.argv[2]); import tensorsmith as ts\n"
              "from graph_cases import CASES\n"
              "ts.compile(CASES['views'](), profile=False); shutil.rmtree(sys.argv[1])\n"
              "print(len(ts.compile(CASES['pointwise_math'](), profile=False).kernels))\n")
    root = tmp_path / "cache"
    done = subprocess.run([sys.executable, "-c", script, str(root), str(Path(__file__).parents[1])],
                          env={**os.environ, "TENSORSMITH_CACHE_DIR": str(root)}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "1" and (root / "programs").is_dir()


def test_a_compiles_e_graph_is_freed_on_its_own_thread() -> None:
    """egglog's EGraph may be dropped only on the thread that made it; left to a collection that another thread runs
    (a web server's, a data loader's), it raised `EGraph is unsendable` there."""
    raised: list[object] = []
    hooks = threading.excepthook, sys.unraisablehook
    threading.excepthook = sys.unraisablehook = lambda args: raised.append(args.exc_value)
    gc.disable()
    try:
        ts.compile(CASES["views"](), profile=False, cache=False, progress=False)
        collector = threading.Thread(target=gc.collect)
        collector.start()
        collector.join()
    finally:
        gc.enable()
        threading.excepthook, sys.unraisablehook = hooks
    assert raised == []
