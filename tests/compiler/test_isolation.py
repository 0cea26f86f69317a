"""The worker process that measures candidates: persistence, deadlines, crashes and errors, with real children.

The tasks are plain Python (sleep past the deadline, exit, abort), so these run without a GPU; the GPU
cases (a kernel that faults, one that spins for ever) are in tests/gpu/test_isolation_gpu.py.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from tensorsmith import shared_arrays
from tensorsmith.codegen import runtime
from tensorsmith.executor import InWorker, LaunchPlan, _profile_held
from tensorsmith.ir.dtypes import DType
from tensorsmith.ir.errors import KernelFault
from tensorsmith.ir.kernel_program import Buffer
from tensorsmith.isolation import Worker, WorkerCrashed, WorkerStartFailed, WorkerTimedOut
from tensorsmith.program import CompiledKernel


@pytest.fixture
def worker():
    with Worker() as w:
        yield w


def test_the_worker_is_another_process_and_persists_between_tasks(worker):
    first = worker.call(os.getpid, timeout_s=60)
    assert first != os.getpid()
    assert worker.call(os.getpid, timeout_s=60) == first == worker.pid
    assert worker.starts == 1


def test_a_task_past_its_deadline_is_killed_and_the_next_gets_a_new_worker(worker):
    before = worker.call(os.getpid, timeout_s=60)
    start = time.monotonic()
    with pytest.raises(WorkerTimedOut, match=r"task sleep in 0\.5 s and was killed"):
        worker.call(time.sleep, 60, timeout_s=0.5)
    assert time.monotonic() - start < 30
    assert worker.pid is None
    after = worker.call(os.getpid, timeout_s=60)
    assert after != before and worker.starts == 2


@pytest.mark.parametrize("task, args, how", [(os._exit, (3,), "exit status 3"), (os.abort, (), "signal 6")])
def test_a_task_that_kills_the_worker_is_reported_and_the_next_gets_a_new_worker(worker, task, args, how):
    before = worker.call(os.getpid, timeout_s=60)
    with pytest.raises(WorkerCrashed, match=how):
        worker.call(task, *args, timeout_s=60)
    assert worker.call(os.getpid, timeout_s=60) != before


def test_an_exception_comes_back_with_its_type_and_message_and_the_worker_lives_on(worker):
    before = worker.call(os.getpid, timeout_s=60)
    with pytest.raises(ValueError, match="invalid literal for int") as info:
        worker.call(int, "not a number", timeout_s=60)
    assert any("in the worker process" in note for note in info.value.__notes__)
    assert worker.call(os.getpid, timeout_s=60) == before


def test_a_worker_that_cannot_start_in_time_is_reported(worker):
    worker.start_timeout_s = 0.0
    with pytest.raises(WorkerStartFailed, match="__main__"):
        worker.call(os.getpid, timeout_s=60)


def test_close_ends_the_worker():
    worker = Worker()
    pid = worker.call(os.getpid, timeout_s=60)
    process = worker._process
    worker.close()
    assert worker.pid is None and not process.is_alive() and process.exitcode == 0 and pid


# ---- measuring in a worker -------------------------------------------------------------------------

def tiny_plan() -> LaunchPlan:
    """A one-kernel plan; its cubin is never loaded where there is no GPU."""
    kernel = CompiledKernel("copy", "00_copy", "pointwise", {}, "", b"\x7fELF-not-loaded", (1, 1, 1), (32, 1, 1),
                            ("x", "y"), ("y",))
    buffers = {"x": Buffer("x", (32,), DType.FLOAT32, "input"), "y": Buffer("y", (32,), DType.FLOAT32, "output")}
    return LaunchPlan((kernel,), buffers, ("y",))


INPUTS = {"x": np.arange(32, dtype=np.float32)}


@pytest.mark.skipif(runtime.gpu_available(), reason="the worker's DeviceError here is the missing GPU")
def test_a_device_error_in_the_worker_is_a_fault_and_the_worker_is_replaced():
    with InWorker() as gpu:
        with pytest.raises(KernelFault, match="kernels copy: .*no usable GPU") as info:
            gpu.profile(tiny_plan(), INPUTS)
        assert info.value.verdict == "faulted"
        assert gpu.worker.pid is None     # its context cannot be trusted after a fault


class SleepingWorker(Worker):
    """A worker whose measurements sleep for a minute: a hang, as the parent sees it."""

    def call(self, task, *args, timeout_s):
        if task is _profile_held:
            return super().call(time.sleep, 60, timeout_s=timeout_s)
        return super().call(task, *args, timeout_s=timeout_s)


class DyingWorker(Worker):
    """A worker that dies during measurements."""

    def call(self, task, *args, timeout_s):
        if task is _profile_held:
            return super().call(os._exit, 9, timeout_s=timeout_s)
        return super().call(task, *args, timeout_s=timeout_s)


def test_a_measurement_past_its_deadline_times_out_and_the_inputs_are_sent_again():
    with InWorker(timeout_floor_s=0.5, timeout_slack=0.0, worker=SleepingWorker()) as gpu:
        with pytest.raises(KernelFault, match=r"kernels copy did not finish in 0\.5 s") as info:
            gpu.profile(tiny_plan(), INPUTS, expected_s=1e-3)
        assert info.value.verdict == "timed out" and gpu.worker.pid is None
        with pytest.raises(KernelFault):
            gpu.profile(tiny_plan(), INPUTS)
        assert gpu.worker.starts == 2


def test_a_worker_that_dies_while_measuring_is_a_fault():
    with InWorker(worker=DyingWorker()) as gpu:
        with pytest.raises(KernelFault, match="exit status 9") as info:
            gpu.profile(tiny_plan(), INPUTS)
        assert info.value.verdict == "faulted"


def test_the_deadline_grows_with_the_predicted_time():
    with InWorker(timeout_floor_s=0.5, timeout_slack=1.0, worker=SleepingWorker()) as gpu:
        # 1 run + (1 warmup + 2 repeats) x (1 kernel + the whole program) = 7 runs of 0.1 s each, plus 0.5 s
        with pytest.raises(KernelFault, match=r"did not finish in 1\.2 s"):
            gpu.profile(tiny_plan(), INPUTS, warmup=1, repeat=2, expected_s=0.1)


def test_inputs_are_sent_once_per_worker():
    sent: list[int] = []

    class CountingWorker(Worker):
        def call(self, task, *args, timeout_s):
            if task is not _profile_held:
                sent.append(self.starts)
                return super().call(task, *args, timeout_s=timeout_s)
            return super().call(os.getpid, timeout_s=timeout_s)    # stands in for the measurement

    with InWorker(worker=CountingWorker()) as gpu:
        for _ in range(3):
            gpu.profile(tiny_plan(), INPUTS)
        assert sent == [1]
        gpu.profile(tiny_plan(), dict(INPUTS))      # other inputs are sent
        gpu.worker.stop()
        gpu.profile(tiny_plan(), dict(INPUTS))      # and a new worker gets them again
        assert sent == [1, 1, 2]


def _held_sums(key: int) -> dict[str, float]:
    """In the worker: what it holds under `key`, summed (and whether each array is a read-only file mapping)."""
    from tensorsmith.executor import _held_inputs
    return {name: (float(np.sum(array)), isinstance(array, np.memmap)) for name, array in _held_inputs[key].items()}


@pytest.mark.skipif(not shared_arrays.SHARED_MEMORY.is_dir(), reason="no /dev/shm here")
def test_large_inputs_reach_the_worker_through_shared_memory_and_are_removed_after(monkeypatch):
    monkeypatch.setattr(shared_arrays, "PIPE_BYTES", 1 << 16)     # a model's weights, in small
    inputs = {"w": np.random.default_rng(0).standard_normal((256, 128)).astype(np.float16),
              "ids": np.arange(8, dtype=np.int32)}
    with InWorker() as gpu:
        key = gpu._hold(inputs)
        files = [p for p in gpu._shared.payload.values() if isinstance(p, str)]
        assert len(files) == 2 and all(os.path.exists(f) and f.startswith("/dev/shm/") for f in files)
        held = gpu.worker.call(_held_sums, key, timeout_s=60)
        assert held == {"w": (float(np.sum(inputs["w"])), True), "ids": (28.0, True)}
    assert not any(os.path.exists(f) for f in files)


def test_small_inputs_go_through_the_pipe():
    shared = shared_arrays.SharedArrays(INPUTS)
    assert shared.payload["x"] is INPUTS["x"]
    assert shared_arrays.received(shared.payload)["x"] is INPUTS["x"]


# ---- a script that compiles without `if __name__ == "__main__":` -------------------------------------

UNGUARDED = """
import tensorsmith as ts
g = ts.Graph("unguarded")
x = g.input("x", (64, 96), "float32")
g.output("e", x.exp())
g.output("s", x.sum(-1))
g.output("m", x.max(0))
program = ts.compile(g, profile=False, budget_s=5)
print("compiled", len(program.kernels), "kernels")
"""


def test_an_unguarded_script_still_compiles_and_is_told_why_its_workers_failed(tmp_path):
    import subprocess
    import sys

    from tensorsmith.ir.knobs import CACHE_DIR_ENV, COMPILE_WORKERS_ENV
    script = tmp_path / "model_script.py"
    script.write_text(UNGUARDED)
    env = {**os.environ, CACHE_DIR_ENV: str(tmp_path / "cache"), COMPILE_WORKERS_ENV: "2"}   # 3 kernels: a pool
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("compiled") == 1 and "compiled 3 kernels" in done.stdout
    assert "if __name__ == '__main__':" in done.stderr


def test_compile_refuses_to_run_while_a_worker_imports_the_main_script(monkeypatch):
    import multiprocessing

    import tensorsmith as ts
    from graph_cases import CASES
    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(ts.TensorsmithError, match="__main__"):
        ts.compile(CASES["norms"](), profile=False, cache=False)


# ---- the worker of a process that is killed --------------------------------------------------------

KILLED_PARENT = """
import sys
import threading
import time

from tensorsmith.isolation import Worker


def busy() -> None:
    print("task running", flush=True)
    time.sleep(600)


if __name__ == "__main__":
    worker = Worker()
    if sys.argv[1] == "main thread":
        worker.start()
    else:                     # from a thread that then ends: the worker must outlive the thread
        starter = threading.Thread(target=worker.start)
        starter.start()
        starter.join()
        time.sleep(0.5)
    worker.call(time.sleep, 0, timeout_s=60)
    print("worker started", worker.starts, flush=True)
    worker.call(busy, timeout_s=900)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads processes from Linux's /proc")
@pytest.mark.parametrize("starter", ["main thread", "another thread"])
def test_the_worker_of_a_killed_process_exits_with_it(tmp_path, starter):
    """Issue 18, item 8: a worker busy in a task outlived its killed parent (here by ten minutes), and so did
    multiprocessing's resource tracker, whose pipe it inherits."""
    import sys

    import processes
    script = tmp_path / "killed_parent.py"
    script.write_text(KILLED_PARENT)
    parent = processes.start([sys.executable, str(script), starter], cwd=tmp_path)
    children: list[processes.Proc] = []
    try:
        assert processes.read_line(parent, timeout_s=120) == "worker started 1\n"
        assert processes.read_line(parent, timeout_s=60) == "task running\n"
        children = processes.descendants(parent.pid)
        assert len(children) == 2, children          # the worker and the resource tracker
        processes.assert_none_outlives(parent, children)
    finally:
        parent.kill()
        processes.kill(children)
