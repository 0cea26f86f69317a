"""NVRTC compilation to cubin and its disk cache; runs without a GPU."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import processes
import pytest

from tensorsmith.codegen import nvrtc
from tensorsmith.ir.knobs import CACHE_DIR_ENV
from tensorsmith.ir.errors import CompileError, TargetError

HALF_KERNEL = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>

extern "C" __global__ void axpb_half(const __half* __restrict__ g_x, __half* __restrict__ g_y, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float r_x = __half2float(g_x[i]) + __bfloat162float(__float2bfloat16(0.0f));
    g_y[i] = __float2half(2.0f * r_x + b);
  }
}
"""

# Line 2 lacks its semicolon; NVRTC reports it on line 3, where the next statement starts.
BROKEN_KERNEL = """extern "C" __global__ void broken(float* g_y) {
  int i = threadIdx.x
  g_y[i] = 1.0f;
}
"""


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh cache root for each test, so tests neither see nor leave entries in ~/.cache."""
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    return tmp_path


@pytest.fixture
def nvrtc_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names NVRTC is run on during a test (the cache spares it on a hit)."""
    calls: list[str] = []
    real = nvrtc.run_nvrtc

    def counting(source: str, name: str, options):
        calls.append(name)
        return real(source, name, options)

    monkeypatch.setattr(nvrtc, "run_nvrtc", counting)
    return calls


def test_nvrtc_version_is_13_or_later():
    major, minor = nvrtc.nvrtc_version()
    assert major >= 13 and minor >= 0


@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])
def test_fp16_kernel_compiles_to_cubin(cache_dir, arch):
    cubin = nvrtc.compile_cubin(HALF_KERNEL, "axpb_half", arch=arch)
    assert cubin.startswith(nvrtc.ELF_MAGIC)
    assert nvrtc.is_cubin(cubin)
    assert b"axpb_half" in cubin


def test_cache_hit_returns_same_bytes_without_nvrtc(cache_dir, nvrtc_calls):
    first = nvrtc.compile_cubin(HALF_KERNEL, "axpb_half")
    second = nvrtc.compile_cubin(HALF_KERNEL, "axpb_half")
    assert first == second
    assert nvrtc_calls == ["axpb_half"]
    assert len(list((cache_dir / "cubin").glob("*.cubin"))) == 1


def test_cache_key_depends_on_source_options_and_arch(cache_dir, nvrtc_calls):
    nvrtc.compile_cubin(HALF_KERNEL, "axpb_half")
    nvrtc.compile_cubin(HALF_KERNEL, "axpb_half", options=["-lineinfo"])
    nvrtc.compile_cubin(HALF_KERNEL, "axpb_half", arch="sm_90a")
    nvrtc.compile_cubin(HALF_KERNEL + "\n// changed\n", "axpb_half")
    assert len(nvrtc_calls) == 4


def test_explicit_cache_dir_is_used(tmp_path, cache_dir):
    folder = tmp_path / "elsewhere"
    nvrtc.compile_cubin(HALF_KERNEL, "axpb_half", cache_dir=folder)
    assert len(list(folder.glob("*.cubin"))) == 1
    assert not (cache_dir / "cubin").exists()


@pytest.mark.parametrize("damage", [lambda b: b[: len(b) // 2], lambda b: b"", lambda b: b"garbage" + b[7:]])
def test_damaged_cache_entry_is_rebuilt(cache_dir, nvrtc_calls, damage):
    good = nvrtc.compile_cubin(HALF_KERNEL, "axpb_half")
    (entry,) = (cache_dir / "cubin").glob("*.cubin")
    entry.write_bytes(damage(good))
    assert nvrtc.compile_cubin(HALF_KERNEL, "axpb_half") == good
    assert entry.read_bytes() == good
    assert len(nvrtc_calls) == 2


def test_cache_write_leaves_no_temporary_files(cache_dir):
    nvrtc.compile_cubin(HALF_KERNEL, "axpb_half")
    assert [p.suffix for p in (cache_dir / "cubin").iterdir()] == [".cubin"]


def test_syntax_error_names_file_line_saved_source_and_repro(cache_dir):
    with pytest.raises(CompileError) as info:
        nvrtc.compile_cubin(BROKEN_KERNEL, "broken")
    message = str(info.value)
    assert 'broken.cu(3): error: expected a ";"' in message
    saved = next((cache_dir / "failed").glob("broken-*.cu"))
    assert str(saved) in message
    assert saved.read_text() == BROKEN_KERNEL
    assert f"python -m tensorsmith.codegen.nvrtc {saved} --arch sm_90" in message
    assert not (cache_dir / "cubin").exists() or not list((cache_dir / "cubin").iterdir())


def test_repro_command_reproduces_the_error(cache_dir):
    with pytest.raises(CompileError) as info:
        nvrtc.compile_cubin(BROKEN_KERNEL, "broken", options=["-lineinfo"])
    command = str(info.value).split("reproduce with: ", 1)[1].split()
    assert command[:3] == ["python", "-m", "tensorsmith.codegen.nvrtc"] and command[-2:] == ["--", "-lineinfo"]
    done = subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert 'error: expected a ";"' in done.stderr


def test_main_compiles_a_file(tmp_path, cache_dir):
    source = tmp_path / "axpb_half.cu"
    source.write_text(HALF_KERNEL)
    out = tmp_path / "axpb_half.cubin"
    assert nvrtc.main([str(source), "--arch", "sm_90", "-o", str(out), "--", "-lineinfo"]) == 0
    assert nvrtc.is_cubin(out.read_bytes())


def test_undefined_identifier_is_the_first_error_line(cache_dir):
    source = 'extern "C" __global__ void k(float* y) { y[0] = not_declared; }\n'
    with pytest.raises(CompileError, match=r'k\.cu\(1\): error: identifier "not_declared" is undefined'):
        nvrtc.compile_cubin(source, "k")


def test_bad_option_raises_compile_error(cache_dir):
    with pytest.raises(CompileError, match="--not-an-option|invalid|unrecognized"):
        nvrtc.compile_cubin(HALF_KERNEL, "axpb_half", options=["--not-an-option"])


@pytest.mark.parametrize("arch", ["compute_90", "90", "sm90"])
def test_non_cubin_arch_is_rejected(cache_dir, arch):
    with pytest.raises(TargetError, match=arch):
        nvrtc.compile_cubin(HALF_KERNEL, "axpb_half", arch=arch)


def test_cache_root_reads_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    assert nvrtc.default_cubin_dir() == tmp_path / "cubin"
    monkeypatch.delenv(CACHE_DIR_ENV)
    assert nvrtc.default_cubin_dir() == Path.home() / ".cache" / "tensorsmith" / "cubin"


# ---- many kernels at once, in worker processes ----------------------------------------------------


def distinct_kernels(count: int) -> list[tuple[str, str]]:
    """`count` kernels that differ in their source, each (source, name)."""
    return [(HALF_KERNEL.replace("axpb_half", f"axpb_half_{i}").replace("2.0f", f"{i + 2}.0f"), f"axpb_half_{i}")
            for i in range(count)]


@pytest.fixture
def no_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if compile_many reaches for its worker pool."""
    def refuse(workers: int):
        raise AssertionError(f"the worker pool was asked for {workers} workers")
    monkeypatch.setattr(nvrtc, "_worker_pool", refuse)


def test_compile_many_in_workers_gives_the_serial_cubins(tmp_path, cache_dir, nvrtc_calls):
    kernels = distinct_kernels(5)
    parallel = nvrtc.compile_many(kernels, workers=2)
    assert nvrtc_calls == []          # NVRTC ran in the workers, not here (the counter lives in this process)
    serial = [nvrtc.compile_cubin(source, name, cache_dir=tmp_path / "serial") for source, name in kernels]
    assert parallel == serial
    assert len(set(parallel)) == 5 and all(nvrtc.is_cubin(cubin) for cubin in parallel)
    assert len(list((cache_dir / "cubin").glob("*.cubin"))) == 5


def test_compile_many_reads_hits_without_the_pool(cache_dir, nvrtc_calls, no_pool):
    kernels = distinct_kernels(4)
    first = [nvrtc.compile_cubin(source, name) for source, name in kernels]
    assert nvrtc.compile_many(kernels) == first
    assert len(nvrtc_calls) == 4      # the four compile_cubin calls; compile_many compiled nothing


def test_compile_many_compiles_two_or_fewer_misses_here(cache_dir, nvrtc_calls, no_pool):
    kernels = distinct_kernels(4)
    nvrtc.compile_many(kernels[:2])
    assert nvrtc.compile_many(kernels, workers=1) == [nvrtc.compile_cubin(s, n) for s, n in kernels]
    assert sorted(nvrtc_calls) == [name for _, name in kernels]


def test_compile_many_compiles_a_repeated_source_once(cache_dir, nvrtc_calls, no_pool):
    cubins = nvrtc.compile_many([(HALF_KERNEL, "axpb_half")] * 3)
    assert cubins[0] == cubins[1] == cubins[2] and nvrtc_calls == ["axpb_half"]


def test_compile_many_raises_the_first_error_in_order_with_the_serial_message(cache_dir):
    other_broken = ('extern "C" __global__ void k(float* y) { y[0] = not_declared; }\n', "k")
    kernels = [*distinct_kernels(2), (BROKEN_KERNEL, "broken"), other_broken, *distinct_kernels(4)[2:]]
    with pytest.raises(CompileError) as parallel:
        nvrtc.compile_many(kernels, workers=2)
    with pytest.raises(CompileError) as serial:
        nvrtc.compile_cubin(BROKEN_KERNEL, "broken")
    assert str(parallel.value) == str(serial.value)
    assert 'broken.cu(3): error: expected a ";"' in str(parallel.value)
    assert parallel.value.__cause__ is None
    saved = next((cache_dir / "failed").glob("broken-*.cu"))
    assert saved.read_text() == BROKEN_KERNEL


def test_compile_many_falls_back_to_this_process_when_the_pool_breaks(cache_dir, nvrtc_calls, monkeypatch, caplog):
    from concurrent.futures.process import BrokenProcessPool

    def broken(workers: int):
        raise BrokenProcessPool("a worker died")
    monkeypatch.setattr(nvrtc, "_worker_pool", broken)
    kernels = distinct_kernels(3)
    assert nvrtc.compile_many(kernels, workers=2) == [nvrtc.compile_cubin(s, n) for s, n in kernels]
    assert len(nvrtc_calls) == 3
    assert "compiling 3 kernel(s) in this process" in caplog.text


def test_compile_workers_reads_the_environment(monkeypatch):
    from tensorsmith.ir.knobs import COMPILE_WORKERS_ENV, MAX_COMPILE_WORKERS, compile_workers
    monkeypatch.setenv(COMPILE_WORKERS_ENV, "3")
    assert compile_workers() == 3
    monkeypatch.setenv(COMPILE_WORKERS_ENV, "0")
    assert compile_workers() == 1
    monkeypatch.delenv(COMPILE_WORKERS_ENV)
    assert 1 <= compile_workers() <= MAX_COMPILE_WORKERS


def test_compiling_in_process_leaves_the_interpreters_shared_bytes_alone(cache_dir: Path) -> None:
    """A successful compile has an empty log (one NUL): reading it into `b" " * 1`, CPython's shared one-byte
    object, made b" " equal b"\\x00" in the whole process (issue 18, item 2). Run in a fresh interpreter so that
    the check sees only this compile."""
    script = ("import sys; from tensorsmith.codegen import nvrtc; "
              f"nvrtc.compile_cubin({HALF_KERNEL!r}, 'axpb_half'); "
              "space = bytes([32]); sys.exit(0 if b' ' == space and b' ' != bytes(1) else 1)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr or "b' ' was overwritten by the compile"


# ---- a compile killed while NVRTC runs in the pool -------------------------------------------------

KILLED_COMPILE = '''
from tensorsmith.codegen import nvrtc


def kernel(i: int, steps: int) -> tuple[str, str]:
    """A kernel of `steps` dependent sinf steps: NVRTC takes seconds over a few hundred."""
    body = "\\n".join(f"  r = r * {s % 7 + 1}.5f + sinf(r + g_x[(i + {s}) % n]);" for s in range(steps))
    return (f'extern "C" __global__ void k{i}(const float* g_x, float* g_y, int n) {{\\n'
            f'  int i = threadIdx.x;\\n  float r = {i}.0f;\\n{body}\\n  g_y[i] = r;\\n}}\\n', f"k{i}")


if __name__ == "__main__":
    nvrtc.compile_many([kernel(i, 1) for i in range(3)], workers=2)     # both workers started, now idle
    print("pool started", flush=True)
    nvrtc.compile_many([kernel(i, 400) for i in range(3)], workers=2)   # both busy in NVRTC for many seconds
'''


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads processes from Linux's /proc")
def test_a_compile_killed_during_nvrtc_leaves_no_process_behind(tmp_path: Path) -> None:
    """Issue 18, item 8: a SIGKILL during NVRTC left the pool's workers alive for ever (blocked on queues whose
    other ends they hold themselves) and with them multiprocessing's resource tracker, whose pipe they inherit."""
    script = tmp_path / "killed_compile.py"
    script.write_text(KILLED_COMPILE)
    env = {**os.environ, CACHE_DIR_ENV: str(tmp_path / "cache")}
    compile_ = processes.start([sys.executable, str(script)], cwd=tmp_path, env=env)
    children: list[processes.Proc] = []
    try:
        assert processes.read_line(compile_, timeout_s=120) == "pool started\n"
        children = processes.descendants(compile_.pid)
        assert len(children) == 3, children          # two workers and the resource tracker
        busy_from = processes.cpu_seconds(children)
        deadline = time.monotonic() + 30
        while processes.cpu_seconds(children) < busy_from + 0.5 and time.monotonic() < deadline:
            time.sleep(0.1)                          # until NVRTC is at work in the workers
        processes.assert_none_outlives(compile_, children)
    finally:
        compile_.kill()
        processes.kill(children)


def test_prefetched_kernels_compile_in_the_pool_and_are_waited_for_not_compiled_again(cache_dir, nvrtc_calls):
    """The search starts NVRTC on its likely winner's kernels while it goes on; the nvrtc stage then waits for
    those compiles (or reads them from the cache) rather than running NVRTC again."""
    kernels = distinct_kernels(3)
    assert nvrtc.prefetch(kernels, workers=2) == 3
    assert nvrtc.prefetch(kernels, workers=2) == 0          # started already
    cubins = nvrtc.compile_many(kernels + [(HALF_KERNEL, "axpb_half")], workers=1)
    assert nvrtc_calls == ["axpb_half"]                      # the three came from the workers
    assert cubins[:3] == [nvrtc.compile_cubin(source, name, cache_dir=cache_dir / "other") for source, name in kernels]
    assert nvrtc.prefetch(kernels) == 0 and not nvrtc._prefetched   # cached now: nothing to start


def test_a_prefetched_kernel_that_fails_is_raised_by_the_compile_that_needs_it(cache_dir):
    assert nvrtc.prefetch([(BROKEN_KERNEL, "broken")], workers=2) == 1
    with pytest.raises(CompileError, match='broken.cu\\(3\\): error: expected a ";"'):
        nvrtc.compile_many([(BROKEN_KERNEL, "broken")])
