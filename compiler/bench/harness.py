"""The harness of `tensorsmith bench`: each case compiled, checked and timed against PyTorch, in one process.

For each case: fresh inputs at realistic scales on the GPU; tensorsmith compiled cold (an empty cache made for
this run) and again warm (from that cache); the PyTorch reference run in float32 as the truth; tensorsmith's
output and every baseline's compared with it (a wrong one is reported and not timed); then all of them timed in
turns (timing.time_runs). Whatever fails is reported on its row and the run goes on.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import subprocess
import time
import types
import zlib
from collections.abc import Callable, Iterator
from functools import partial
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from tensorsmith.ir.dtypes import DType
from tensorsmith.ir.knobs import CACHE_DIR_ENV
from tensorsmith.search.verify import tolerance

from .. import torch_backend
from ..device_call import bind_device_arrays
from ..executor import Session
from ..pipeline import VERSION
from ..pipeline import compile as ts_compile
from ..program import Program
from . import profile, timing
from .case import AnyCase, Case, built, half_precision_contractions
from .results import KernelTime, Measured, Row, unmeasured_row

# The ways a PyTorch user runs a model: as written (cuBLAS, SDPA's fused kernels), and through torch.compile's modes;
# reduce-overhead replays CUDA graphs, which is what a user who minds launch overhead picks (the call column).
BASELINES = ("eager", "compile", "max-autotune-no-cudagraphs", "reduce-overhead", "max-autotune")
DEFAULT_BASELINES = ("eager", "compile", "max-autotune-no-cudagraphs", "reduce-overhead")
INDUCTOR_CACHE_ENV, TRITON_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"
BACKEND = "backend"     # torch.compile(model, backend="tensorsmith"), where a case has a module to compile
FAILURE_CHARS = 200     # a failure is one line on its row
GPU_TIME = "@gpu"       # a baseline's runs queued behind a sleeping kernel: the GPU's time alone


def one_line(err: BaseException) -> str:
    """An error as one line of at most FAILURE_CHARS characters, for its row."""
    text = " ".join(f"{type(err).__name__}: {err}".split())
    return text if len(text) <= FAILURE_CHARS else text[:FAILURE_CHARS - 3] + "..."


def make_baseline(torch: Any, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` as the baseline `name` runs it: as written (eager: cuBLAS, SDPA), or through torch.compile's modes."""
    if name == "eager":
        return fn
    mode = None if name == "compile" else name
    return torch.compile(_own_code(fn), mode=mode, dynamic=False)


def _own_code(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with a code object of its own: dynamo keeps compiled code per code object, so that two modes compiling
    one reference would otherwise share a cache."""
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return copy


def draw_inputs(torch: Any, case: Case, seed: int) -> dict[str, Any]:
    """Fresh inputs on the GPU: floats N(0, std^2) in the input's dtype (never zeros), small ints, random bools;
    or the case's own values where it gives them."""
    if case.values is not None:
        return case.values(torch, seed)
    generator = torch.Generator(device="cuda").manual_seed(seed)
    tensors = {}
    for name, node in case.graph.inputs.items():
        if node.dtype.is_float:
            values = torch.randn(node.shape, generator=generator, device="cuda", dtype=torch.float32)
            tensors[name] = (values * case.input_std(name)).to(getattr(torch, node.dtype.value))
        elif node.dtype == DType.INT32:
            tensors[name] = torch.randint(-100, 100, node.shape, generator=generator, device="cuda", dtype=torch.int32)
        else:
            tensors[name] = torch.rand(node.shape, generator=generator, device="cuda") < 0.5
    return tensors


def as_outputs(case: Case, value: Any) -> dict[str, Any]:
    """A reference's result as {output name: tensor}: a lone tensor is the graph's one output."""
    if isinstance(value, dict):
        return value
    (name,) = case.graph.outputs
    return {name: value}


def relative_error(torch: Any, outputs: dict[str, Any], truth: dict[str, Any]) -> float:
    """The worst output's ||out - truth|| / ||truth||, in float32; NaN or inf anywhere gives NaN."""
    worst = 0.0
    for name, expected in truth.items():
        got = outputs[name].float()
        if got.shape != expected.shape or not bool(torch.isfinite(got).all()):
            return float("nan")
        worst = max(worst, float((got - expected).norm() / expected.norm().clamp_min(1e-30)))
    return worst


def case_tolerance(case: Case) -> float:
    """The relative L2 error a case's outputs may have: verification's tolerance for their dtypes."""
    return max(tolerance(node) for node in case.graph.outputs.values())


class Harness:
    """Runs cases one by one; holds the run's torch module, baselines and budget."""

    def __init__(self, torch: Any, baselines: list[str], budget_s: float, seed: int = 0, commit: str = "unknown",
                 cache_root: Path | None = None, backend: bool = True):
        self.torch, self.baselines, self.budget_s, self.seed, self.commit = torch, baselines, budget_s, seed, commit
        self.backend = backend            # whether model cases also run through torch.compile(backend="tensorsmith")
        self.cache_root = cache_root      # where each case gets a cache of its own, so that its compile is cold
        self.copy_rate = timing.copy_bytes_per_s(torch)
        self.matmul_rate = timing.matmul_flops_per_s(torch)

    def meta(self, command: str) -> dict[str, Any]:
        """What ran where: the date, GPU, driver, versions, commit, the measured ceilings and the options."""
        torch = self.torch
        return {"date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(),
                "driver": _driver_version(), "torch": torch.__version__, "tensorsmith": VERSION,
                "commit": self.commit, "copy_tb_s": self.copy_rate / 1e12, "matmul_tflop_s": self.matmul_rate / 1e12,
                "budget_s": self.budget_s, "baselines": list(self.baselines), "backend": self.backend, "seed": self.seed,
                "command": command}

    def run(self, deferred: AnyCase) -> Row:
        """The case measured; whatever fails (even the reference, or building the case) is said on its row."""
        try:
            case = built(deferred)
        except Exception as err:
            return unmeasured_row(deferred.name, deferred.family, self.baselines,
                                  f"the case could not be built: {one_line(err)}", note=deferred.note,
                                  commit=self.commit, budget_s=self.budget_s)
        floor_memory, floor_matmul = case.bytes_moved() / self.copy_rate, case.matmul_flops() / self.matmul_rate
        row = Row(case.name, case.family, max(floor_memory, floor_matmul) * 1e3,
                  "memory" if floor_memory >= floor_matmul else "matmul", note=case.note, commit=self.commit,
                  budget_s=self.budget_s)
        try:
            self._measure(case, row)
        except Exception as err:
            failure = f"the harness failed: {one_line(err)}"
            for measured in (row.kernels, row.call, *row.baselines.values(), *([row.written] if row.written else [])):
                if measured.ms is None and measured.failure is None:
                    measured.failure = failure
        self.torch.cuda.empty_cache()
        return row

    def _measure(self, case: Case, row: Row) -> None:
        torch = self.torch
        torch._dynamo.reset()      # each case compiles afresh, with static shapes
        tensors = draw_inputs(torch, case, self.seed + zlib.crc32(case.name.encode()))   # the same in any selection
        truth = as_outputs(case, case.reference(**{k: v.float() if v.is_floating_point() else v
                                                   for k, v in tensors.items()}))
        limit = case_tolerance(case)
        runs: dict[str, Callable[[], object]] = {}
        with ExitStack() as stack:
            program = self._compile(case, row)
            if program is not None:
                self._check_ours(program, tensors, truth, limit, row, runs, stack)
                if _rewritten(program) and "kernels" in runs:
                    self._check_written(case, tensors, truth, limit, row, runs, stack)
            calls_sdpa = self._calls_sdpa(case, tensors)
            for name in self.baselines:
                self._check_baseline(name, case, tensors, truth, limit, row, runs, calls_sdpa)
            if case.backend is not None and self.backend:
                self._check_backend(case, tensors, truth, limit, row, runs)
            if runs:
                queued = {f"{name}{GPU_TIME}": run for name, run in runs.items() if name in self.baselines}
                times = timing.time_runs(torch, {**runs, **queued}, queued=frozenset({"kernels", WRITTEN, *queued}))
                for name, ms in times.items():
                    if name.endswith(GPU_TIME):
                        row.baselines[name.removesuffix(GPU_TIME)].gpu_ms = ms
                    else:
                        self._measured(row, name).ms = ms

    def _measured(self, row: Row, name: str) -> Measured:
        return ({"kernels": row.kernels, "call": row.call, WRITTEN: row.written, BACKEND: row.backend}.get(name)
                or row.baselines[name])

    def _calls_sdpa(self, case: Case, tensors: dict[str, Any]) -> bool:
        """Whether the reference, run as written, calls scaled_dot_product_attention (its profile's ops say)."""
        try:
            ops = profile.record(self.torch, lambda: case.reference(**tensors)).ops
        except Exception:      # the eager baseline's own check reports a reference that fails
            return False
        return any("scaled_dot_product" in op for op in ops)

    def _compile(self, case: Case, row: Row) -> Program | None:
        """tensorsmith's program, compiled cold and then warm (from the cache), or None with the failure on the row."""
        cache = None if self.cache_root is None else self.cache_root / case.name
        try:
            with _cache_at(cache):
                start = time.perf_counter()
                ts_compile(case.graph, budget_s=self.budget_s, seed=self.seed, progress=False)
                row.kernels.compile_s = time.perf_counter() - start
                start = time.perf_counter()
                program = ts_compile(case.graph, budget_s=self.budget_s, seed=self.seed, progress=False)
                row.compile_warm_s = time.perf_counter() - start
        except Exception as err:    # a case tensorsmith cannot compile is a row of the table, not the end of it
            row.kernels.failure = row.call.failure = one_line(err)
            return None
        row.kernel_count = len(program.kernels)
        row.forms = list(program.report.get("forms", []))
        row.compile_stages = {name: round(seconds, 2) for name, seconds in
                              program.report.get("stage_seconds", {}).items()}
        row.kernel_times = [KernelTime(k.name, k.archetype, k.measured_ms, dict(k.schedule)) for k in program.kernels]
        return program

    def _check_ours(self, program: Program, tensors: dict[str, Any], truth: dict[str, Any], limit: float, row: Row,
                    runs: dict[str, Callable[[], object]], stack: ExitStack) -> None:
        try:
            row.call.error = relative_error(self.torch, program(**tensors), truth)
            session, outputs = _poisoned(program, tensors, stack)
            session.run_all()
            row.kernels.error = relative_error(self.torch, outputs, truth)
        except Exception as err:
            row.kernels.failure = row.call.failure = one_line(err)
            return
        if not all([_right(row.kernels, limit, "PyTorch's"), _right(row.call, limit, "PyTorch's")]):
            return
        runs["kernels"], runs["call"] = partial(_run_into, session, outputs), lambda: program(**tensors)

    def _check_written(self, case: Case, tensors: dict[str, Any], truth: dict[str, Any], limit: float, row: Row,
                       runs: dict[str, Callable[[], object]], stack: ExitStack) -> None:
        """Where the program's algebraic form is not the one written: the graph as written compiled too (rewrites
        off, the same budget), checked, and its kernels timed like ours, so that the form's gain is measured."""
        row.written = measured = Measured()
        try:
            start = time.perf_counter()
            with _cache_at(None if self.cache_root is None else self.cache_root / case.name):
                program = ts_compile(case.graph, budget_s=self.budget_s, seed=self.seed, progress=False,
                                     rewrites=False)
            measured.compile_s = time.perf_counter() - start
            session, outputs = _poisoned(program, tensors, stack)
            session.run_all()
            measured.error = relative_error(self.torch, outputs, truth)
        except Exception as err:
            measured.failure = one_line(err)
            return
        if _right(measured, limit, "PyTorch's"):
            runs[WRITTEN] = partial(_run_into, session, outputs)

    def _check_baseline(self, name: str, case: Case, tensors: dict[str, Any], truth: dict[str, Any], limit: float,
                        row: Row, runs: dict[str, Callable[[], object]], calls_sdpa: bool) -> None:
        """A baseline compiled, checked against the truth, and profiled: one on a slow path (SDPA's math, 16-bit
        matmuls without tensor cores) fails with the reason, as a wrong one does, and is not timed."""
        measured = row.baselines[name] = Measured()
        try:
            fn = make_baseline(self.torch, name, case.reference)
            with _torch_caches_at(None if self.cache_root is None else self.cache_root / case.name / name):
                measured.compile_s, outputs = self._first_call(case, fn, tensors)
            measured.error = relative_error(self.torch, outputs, truth)
            if measured.error <= limit:
                ran = profile.record(self.torch, lambda: fn(**tensors))
                measured.gpu_kernels = ran.kernels
                slow = profile.slow_path(ran, calls_sdpa, half_precision_contractions(case.graph))
                if slow is not None:
                    measured.failure, measured.slow_path = f"{profile.SLOW_PATH}: {slow}", True
                    return
        except Exception as err:   # a baseline that fails is reported on its row; the run goes on
            measured.failure = one_line(err)
            return
        if _right(measured, limit, "float32"):
            runs[name] = lambda: fn(**tensors)

    def _check_backend(self, case: Case, tensors: dict[str, Any], truth: dict[str, Any], limit: float, row: Row,
                       runs: dict[str, Callable[[], object]]) -> None:
        """The case's module through torch.compile(backend="tensorsmith"), checked and then timed as called: the
        other way a PyTorch user brings a model to tensorsmith."""
        assert case.backend is not None
        row.backend = measured = Measured()
        options = dict(torch_backend.OPTIONS)
        try:
            with _cache_at(None if self.cache_root is None else self.cache_root / case.name):
                torch_backend.OPTIONS.update(budget_s=self.budget_s, seed=self.seed, progress=False)   # as ours
                fn = case.backend(self.torch)
                measured.compile_s, outputs = self._first_call(case, fn, tensors)
            measured.error = relative_error(self.torch, outputs, truth)
        except Exception as err:
            measured.failure = one_line(err)
            return
        finally:
            torch_backend.OPTIONS.clear()
            torch_backend.OPTIONS.update(options)
        if _right(measured, limit, "PyTorch's"):
            runs[BACKEND] = lambda: fn(**tensors)

    def _first_call(self, case: Case, fn: Callable[..., Any], tensors: dict[str, Any]) -> tuple[float, dict]:
        """The seconds of `fn`'s first call (its compile, for torch.compile's modes) and its outputs."""
        start = time.perf_counter()
        outputs = as_outputs(case, fn(**tensors))
        self.torch.cuda.synchronize()
        return time.perf_counter() - start, outputs


@contextlib.contextmanager
def _cache_at(root: Path | None) -> Iterator[None]:
    """tensorsmith's caches (programs and cubins) at `root` while the block runs (None: wherever they are)."""
    with _environment({} if root is None else {CACHE_DIR_ENV: str(root)}):
        yield


@contextlib.contextmanager
def _torch_caches_at(root: Path | None) -> Iterator[None]:
    """Inductor's and Triton's on-disk caches under `root` while the block runs, so that a baseline's first call is
    a cold compile as ours is, not a hit on the kernels an earlier case of the same shapes left (None: as they are)."""
    with _environment({} if root is None else {INDUCTOR_CACHE_ENV: str(root / "inductor"),
                                               TRITON_CACHE_ENV: str(root / "triton")}):
        yield


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """The environment variables `values` set while the block runs, then put back as they were."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _run_into(session: Session, outputs: dict[str, Any]) -> None:
    """The session's launches; holding `outputs` here keeps the arrays it writes alive as long as it is timed."""
    session.run_all()


def _driver_version() -> str:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
        return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def commit() -> str:
    """The git commit of the tensorsmith source being run (its package folder's, else the working folder's), with
    '+changes' where tracked files differ from it; 'unknown' outside a checkout."""
    for folder in (Path(__file__).resolve().parent, Path.cwd()):
        try:
            head = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"], capture_output=True,
                                  text=True, timeout=10)
            if head.returncode != 0 or not head.stdout.strip():
                continue
            dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            continue
        return head.stdout.strip() + ("+changes" if dirty else "")
    return "unknown"


def _poisoned(program: Program, tensors: dict[str, Any], stack: ExitStack) -> tuple[Session, dict[str, Any]]:
    """The program bound to the caller's tensors, its outputs poisoned: an element the kernels do not write fails."""
    session, outputs = bind_device_arrays(program, tensors, stack)
    for output in outputs.values():
        output.fill_(float("nan") if output.is_floating_point() else -1)  # type: ignore[attr-defined]
    return session, outputs


def _right(measured: Measured, limit: float, against: str) -> bool:
    """Whether a run's output error is within `limit`; if not, it is marked wrong, with why, and is not timed."""
    if measured.error is not None and measured.error <= limit:
        return True
    measured.wrong = True
    error = f"{measured.error:.3g}" if measured.error is not None else "not measured"
    measured.failure = f"output differs from {against}: relative L2 error {error} > {limit:g}"
    return False


WRITTEN = "written"   # the run of the graph as written (rewrites off), beside a program of another algebraic form


def _rewritten(program: Program) -> bool:
    """Whether the program's winning algebraic form is not the graph as written (its report's forms say)."""
    return any(form.get("won") and not form.get("as_written") for form in program.report.get("forms", []))
