"""CUDA C++ source -> cubin with NVRTC, cached on disk by content; works on a machine with no GPU.

    cubin = compile_cubin(source, "rmsnorm", arch="sm_90")

The cache key is the sha256 of (source, options, arch, NVRTC version), so an entry is valid on
any machine with the same NVRTC. The include flags for NVRTC's bundled headers are left out of
the key: the headers are fixed by the NVRTC version, which is in the key, while their path is
not the same on every machine.

A failed compile raises CompileError with the first error line, the path of the saved source
and a command that reproduces the failure:

    python -m tensorsmith.codegen.nvrtc ~/.cache/tensorsmith/failed/rmsnorm-1a2b3c4d5e6f.cu --arch sm_90

`compile_many` compiles several kernels at once in worker processes (spawned, never forked: the caller
may hold a CUDA context; each exits with its parent, even one killed by SIGKILL), through the same cache and with
the same errors:

    cubins = compile_many([(source_a, "rmsnorm"), (source_b, "matmul")], arch="sm_90")

`-default-device` is not among the default options: generated kernels mark their device
functions `__device__`, so that the saved `.cu` files also compile with nvcc as they are.
"""
from __future__ import annotations

import argparse
import atexit
import functools
import hashlib
import json
import logging
import multiprocessing
import os
import re
import shlex
import struct
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from cuda.bindings import nvrtc

from tensorsmith.ir.errors import CompileError, TargetError
from tensorsmith.ir.files import write_atomic
from tensorsmith.ir.knobs import cache_root, compile_workers
from tensorsmith.ir.orphans import ParentLink, follow_parent

log = logging.getLogger(__name__)

DEFAULT_ARCH = "sm_90"
BASE_OPTIONS: tuple[str, ...] = ("-std=c++17",)
ELF_MAGIC = b"\x7fELF"
SYSTEM_CUDA_INCLUDE = "/usr/local/cuda/include"  # the last place to look for cuda_fp16.h

IN_PROCESS_MAX = 2     # this many kernels to compile, or fewer, are compiled here: a pool would not pay off
WORKER_START_METHOD = "spawn"   # a forked child would inherit the parent's CUDA context, unusable there

_ARCH_PATTERN = re.compile(r"sm_\d+[af]?")
_ERROR_LINE = re.compile(r"\berror( #[\w-]+)?:")


@dataclass(frozen=True)
class _Job:
    """One kernel to compile into one cache entry; what a worker process needs, and nothing it must look up."""

    source: str
    name: str
    arch: str
    options: tuple[str, ...]      # the caller's options (the reproduce command repeats them)
    entry: Path                   # the cache file of this source, options, arch and NVRTC
    failed_dir: Path              # where a failed compile's source is saved


@dataclass(frozen=True)
class NvrtcResult:
    """What one NVRTC run gives back: the cubin (None on failure) and the compiler's log."""

    cubin: bytes | None
    log: str


def default_cubin_dir() -> Path:
    """Where compiled cubins are kept unless the caller names a folder."""
    return cache_root() / "cubin"


def failed_source_dir() -> Path:
    """Where the sources of failed compiles are saved, for reproducing them."""
    return cache_root() / "failed"


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    """The (major, minor) version of the loaded NVRTC library."""
    err, major, minor = nvrtc.nvrtcVersion()
    _check(err, "nvrtcVersion")
    return major, minor


def compile_cubin(
    source: str,
    name: str,
    arch: str = DEFAULT_ARCH,
    options: Sequence[str] = (),
    cache_dir: Path | None = None,
) -> bytes:
    """Compile CUDA C++ `source` to a cubin for `arch`, from the disk cache when it has it."""
    job = _job(source, name, arch, options, cache_dir)
    cached = _read_cached(job.entry)
    return cached if cached is not None else _compile_job(job)


def compile_many(
    kernels: Sequence[tuple[str, str] | tuple[str, str, str]],
    arch: str = DEFAULT_ARCH,
    options: Sequence[str] = (),
    cache_dir: Path | None = None,
    workers: int | None = None,
) -> list[bytes]:
    """The cubins of (source, name) pairs, in order: cache hits read here, misses compiled in worker processes.

    A triple (source, name, arch) compiles that kernel for its own arch (sm_90a for wgmma) instead of `arch`.
    The cubins are the bytes `compile_cubin` gives, and a failure raises the CompileError that compiling
    them one by one in this order would raise first. Two misses or fewer, or `workers=1`, compile here;
    `workers` defaults to `knobs.compile_workers()`.
    """
    jobs = _jobs(kernels, arch, options, cache_dir)
    for job in jobs:                    # those `prefetch` started: waited for, then read from the cache
        started = _prefetched.pop(job.entry, None)
        if started is not None:
            wait([started])
    cubins: dict[Path, bytes] = {}
    misses: dict[Path, _Job] = {}       # one job per cache entry: equal sources compile once
    for job in jobs:
        cached = cubins.get(job.entry) or _read_cached(job.entry)
        if cached is not None:
            cubins[job.entry] = cached
        else:
            misses.setdefault(job.entry, job)
    workers = min(workers or compile_workers(), len(misses))
    if len(misses) <= IN_PROCESS_MAX or workers <= 1:
        cubins.update({entry: _compile_job(job) for entry, job in misses.items()})
    else:
        cubins.update(_compile_in_pool(list(misses.values()), workers))
    return [cubins[job.entry] for job in jobs]


def prefetch(
    kernels: Sequence[tuple[str, str] | tuple[str, str, str]],
    arch: str = DEFAULT_ARCH,
    options: Sequence[str] = (),
    cache_dir: Path | None = None,
    workers: int | None = None,
) -> int:
    """Start compiling the cache misses among `kernels` (as compile_many takes them) in the worker pool, and return
    at once how many were started: a compile_many that needs one of them later waits for it instead of compiling it
    again. A failure is not raised here; it is compiled again, and raised, by that compile_many."""
    jobs = {job.entry: job for job in _jobs(kernels, arch, options, cache_dir)
            if job.entry not in _prefetched and not job.entry.exists()}
    if not jobs:
        return 0
    try:
        pool = _worker_pool(workers or compile_workers())
        _prefetched.update({entry: pool.submit(_compile_job, job) for entry, job in jobs.items()})
    except (BrokenProcessPool, RuntimeError):   # no pool: compile_many compiles them when they are needed
        return 0
    return len(jobs)


_prefetched: dict[Path, Future[bytes]] = {}   # compiles prefetch started, by cache entry


def _jobs(kernels: Sequence[tuple[str, str] | tuple[str, str, str]], arch: str, options: Sequence[str],
          cache_dir: Path | None) -> list[_Job]:
    """A job for each (source, name) or (source, name, its own arch) that compile_many and prefetch take."""
    return [_job(source, name, (own or [arch])[0], options, cache_dir) for source, name, *own in kernels]


def _job(source: str, name: str, arch: str, options: Sequence[str], cache_dir: Path | None) -> _Job:
    """The job that compiles `source` into its cache entry under `cache_dir` (default: the cubin cache)."""
    opts = build_options(arch, options)
    folder = Path(cache_dir if cache_dir is not None else default_cubin_dir())
    return _Job(source, name, arch, tuple(options), folder / f"{cache_key(source, opts, arch)}.cubin",
                failed_source_dir())


def _compile_job(job: _Job) -> bytes:
    """Run NVRTC on one job and store the cubin in its cache entry; the same in this process and in a worker."""
    result = run_nvrtc(job.source, job.name, build_options(job.arch, job.options))
    if result.cubin is None:
        raise _compile_error(job, result.log)
    try:
        write_atomic(job.entry, result.cubin)
    except OSError as err:      # a read-only or full cache costs only the time it would have saved
        if job.entry.parent not in _unwritable:
            _unwritable.add(job.entry.parent)
            log.warning("could not write the cubin cache at %s (%s); compiling without it", job.entry.parent, err)
    return result.cubin


_unwritable: set[Path] = set()   # cubin cache folders already reported unwritable (once a process)


def _compile_in_pool(jobs: list[_Job], workers: int) -> dict[Path, bytes]:
    """Each job's cubin by its cache entry, compiled in the worker pool; the first failure in order is raised."""
    try:
        pool = _worker_pool(workers)
        futures: list[Future[bytes]] = [pool.submit(_compile_job, job) for job in jobs]
    except (BrokenProcessPool, RuntimeError) as err:    # RuntimeError: the pool could not start a process
        return _compile_here_after(err, jobs)
    cubins: dict[Path, bytes] = {}
    try:
        for job, future in zip(jobs, futures):
            try:
                cubins[job.entry] = future.result()
            except CompileError as err:
                raise err from None    # the worker's traceback says nothing the message does not
    except BrokenProcessPool as err:   # a worker died (out of memory, or NVRTC crashed)
        return {**cubins, **_compile_here_after(err, [job for job in jobs if job.entry not in cubins])}
    finally:
        for future in futures:
            future.cancel()            # after a failure, do not start what is still queued
    return cubins


def _compile_here_after(err: BaseException, jobs: list[_Job]) -> dict[Path, bytes]:
    """Compile `jobs` in this process because the worker pool failed with `err` (which is logged)."""
    log.warning("NVRTC worker processes failed (%s: %s); compiling %d kernel(s) in this process. A script that "
                "compiles at module level must do so under `if __name__ == '__main__':`, as the workers import it.",
                type(err).__name__, err, len(jobs))
    _shutdown_pool()
    return {job.entry: _compile_job(job) for job in jobs}


_pool_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None
_pool_workers = 0


def _worker_pool(workers: int) -> ProcessPoolExecutor:
    """The compile pool, started on first use (its processes too) and kept for later calls; grown when asked."""
    global _pool, _pool_workers
    with _pool_lock:
        if _pool is None or _pool_workers < workers:
            if _pool is not None:
                _pool.shutdown(wait=False)
            # each worker exits with this process, even when a SIGKILL leaves it no time to stop them (ir/orphans.py)
            _pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(WORKER_START_METHOD),
                                        initializer=follow_parent, initargs=(ParentLink(),))
            _pool_workers = workers
        return _pool


@atexit.register
def _shutdown_pool() -> None:
    """Stop the compile pool's workers (a later compile_many starts new ones)."""
    global _pool, _pool_workers
    with _pool_lock:
        if _pool is not None:
            _pool.shutdown(wait=False, cancel_futures=True)
        _pool, _pool_workers = None, 0


def build_options(arch: str, options: Sequence[str]) -> tuple[str, ...]:
    """The NVRTC options for `arch` plus the caller's, without the include flags."""
    if not _ARCH_PATTERN.fullmatch(arch):
        raise TargetError(f"NVRTC arch must look like 'sm_90' or 'sm_90a' (a cubin target), got {arch!r}")
    return (f"--gpu-architecture={arch}", *BASE_OPTIONS, *options)


def cache_key(source: str, options: Sequence[str], arch: str) -> str:
    """The sha256 that names a cubin: of the source, options, arch and NVRTC version."""
    payload = json.dumps([source, list(options), arch, list(nvrtc_version())])
    return hashlib.sha256(payload.encode()).hexdigest()


def run_nvrtc(source: str, name: str, options: Sequence[str]) -> NvrtcResult:
    """Run NVRTC once, with the bundled-header include flags added; no cache."""
    flags = [opt.encode() for opt in (*options, *include_flags())]
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), _file_name(name).encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(flags), flags)
        text = _program_log(prog)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return NvrtcResult(None, text or _error_string(err))
        if text.strip():
            log.debug("NVRTC log for %s:\n%s", name, text)
        return NvrtcResult(_program_cubin(prog), text)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def include_flags() -> tuple[str, ...]:
    """The -I flags that put cuda_fp16.h, cuda_bf16.h, mma.h and cuda/std on NVRTC's path (looked for at every
    compile: the cache folder that holds NVRTC's unpacked headers may have been deleted since the last)."""
    try:
        return _install_bundled_headers()
    except CompileError:
        raise
    except Exception:  # an NVRTC older than 13.1 lacks the call (cuda-bindings raises FunctionNotFoundError)
        return _wheel_header_flags()


def is_cubin(data: bytes) -> bool:
    """Whether `data` is a whole ELF64 file: magic, and every header and section inside it."""
    if len(data) < 64 or not data.startswith(ELF_MAGIC) or data[4] != 2:
        return False
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
    if max(phoff + phentsize * phnum, shoff + shentsize * shnum) > len(data):
        return False
    return all(_section_fits(data, shoff + i * shentsize) for i in range(shnum))


def _section_fits(data: bytes, header: int) -> bool:
    """Whether the section described at offset `header` lies inside `data`."""
    SHT_NOBITS = 8  # .bss-like sections take no room in the file
    sh_type = struct.unpack_from("<I", data, header + 4)[0]
    offset, size = struct.unpack_from("<QQ", data, header + 0x18)
    return sh_type == SHT_NOBITS or offset + size <= len(data)


def _install_bundled_headers() -> tuple[str, ...]:
    """Unpack NVRTC's bundled headers once per NVRTC version (process-safe, NVRTC locks it)."""
    major, minor = nvrtc_version()
    folder = cache_root() / "nvrtc-headers" / f"{major}.{minor}"
    flags = (f"-I{folder}", f"-I{folder / 'cccl'}")
    if (folder / "cuda_fp16.h").is_file():
        return flags
    folder.mkdir(parents=True, exist_ok=True)
    err, error_log = nvrtc.nvrtcInstallBundledHeaders(str(folder).encode(), nvrtc.NVRTC_INSTALL_HEADERS_SKIP_IF_EXISTS)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        detail = error_log.decode(errors="replace") if error_log else _error_string(err)
        raise CompileError(f"could not unpack NVRTC's bundled headers into {folder}: {detail}")
    return flags


@functools.cache
def _wheel_header_flags() -> tuple[str, ...]:
    """-I flags for the CUDA headers shipped in NVIDIA's wheels, for NVRTCs without bundled headers."""
    from cuda import pathfinder

    folders = [pathfinder.find_nvidia_header_directory(lib) for lib in ("cudart", "cccl")]
    folders += [SYSTEM_CUDA_INCLUDE] if os.path.isfile(os.path.join(SYSTEM_CUDA_INCLUDE, "cuda_fp16.h")) else []
    return tuple(f"-I{folder}" for folder in folders if folder)


def _writable(size: int) -> bytes:
    """A new bytes object of at least `size` bytes for NVRTC to write into. Never `b" " * size`: for size 1 that
    is CPython's shared one-byte object, and NVRTC's NUL written into it turned every b" " of the process into
    b"\\x00" (torch's schema parser then read "str tag" as "strtag")."""
    return b"\x00" * max(size, 2)


def _program_log(prog: nvrtc.nvrtcProgram) -> str:
    """The compiler's log for `prog`, as text."""
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    _check(err, "nvrtcGetProgramLogSize")
    buffer = _writable(size)
    (err,) = nvrtc.nvrtcGetProgramLog(prog, buffer)
    _check(err, "nvrtcGetProgramLog")
    return buffer.rstrip(b"\x00").decode(errors="replace")


def _program_cubin(prog: nvrtc.nvrtcProgram) -> bytes:
    """The cubin of a compiled `prog`."""
    err, size = nvrtc.nvrtcGetCUBINSize(prog)
    _check(err, "nvrtcGetCUBINSize")
    buffer = _writable(size)
    (err,) = nvrtc.nvrtcGetCUBIN(prog, buffer)
    _check(err, "nvrtcGetCUBIN")
    return buffer


def _read_cached(path: Path) -> bytes | None:
    """The cubin stored at `path`, or None when it is missing or damaged."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if is_cubin(data):
        return data
    log.warning("ignoring damaged cubin cache entry %s; rebuilding it", path)
    return None


def _compile_error(job: _Job, text: str) -> CompileError:
    """A CompileError with the first error line, the saved source and a command that reproduces it."""
    stem = Path(_file_name(job.name)).stem
    saved = job.failed_dir / f"{stem}-{job.entry.stem[:12]}.cu"
    write_atomic(saved, job.source.encode())
    write_atomic(saved.with_suffix(".log"), text.encode())
    command = ["python", "-m", "tensorsmith.codegen.nvrtc", str(saved), "--arch", job.arch]
    if job.options:
        command += ["--", *job.options]
    return CompileError(
        f"NVRTC failed to compile {_file_name(job.name)}: {first_error_line(text)}\n"
        f"  source saved to {saved} (full log beside it: {saved.with_suffix('.log')})\n"
        f"  reproduce with: {shlex.join(command)}"
    )


def first_error_line(text: str) -> str:
    """The first line of an NVRTC log that reports an error (or its first line)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if _ERROR_LINE.search(line)]
    return (errors or lines or ["(empty log)"])[0]


def _file_name(name: str) -> str:
    """The file name NVRTC reports in its log: `name`, with `.cu` added when it has no suffix."""
    return name if Path(name).suffix else f"{name}.cu"


def _check(err: nvrtc.nvrtcResult, call: str) -> None:
    """Raise CompileError when an NVRTC call other than the compile itself fails."""
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"{call} failed: {_error_string(err)}")


def _error_string(err: nvrtc.nvrtcResult) -> str:
    """The name NVRTC gives to a result code."""
    _, text = nvrtc.nvrtcGetErrorString(err)
    return text.decode() if isinstance(text, bytes) else str(text)


def main(argv: Sequence[str] | None = None) -> int:
    """Compile one .cu file with the options tensorsmith uses and print NVRTC's log; no cache."""
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(
        prog="python -m tensorsmith.codegen.nvrtc", description=main.__doc__,
        epilog="extra NVRTC options go after `--`, e.g. -- -lineinfo --use_fast_math",
    )
    parser.add_argument("source", type=Path, help="the .cu file")
    parser.add_argument("--arch", default=DEFAULT_ARCH, help="cubin target, e.g. sm_90 or sm_90a")
    parser.add_argument("-o", "--output", type=Path, help="where to write the cubin")
    args = parser.parse_args(argv[:split])
    try:
        options = build_options(args.arch, argv[split + 1:])
    except TargetError as err:
        parser.error(str(err))
    result = run_nvrtc(args.source.read_text(), args.source.name, options)
    if result.log.strip():
        print(result.log, file=sys.stderr)
    if result.cubin is None:
        print(f"FAILED: {first_error_line(result.log)}", file=sys.stderr)
        return 1
    if args.output:
        args.output.write_bytes(result.cubin)
    print(f"ok: {args.source} -> {len(result.cubin)} bytes of cubin for {args.arch}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
