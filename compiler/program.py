"""Program: what `compile` returns. It runs on the GPU, runs its kernel program in numpy, and saves itself."""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tensorsmith.codegen.runtime import gpu_available
from tensorsmith.codegen.tensor_map import TensorMapSpec
from tensorsmith.ir.dtypes import DType
from tensorsmith.ir.errors import DTypeError, InputError, OutputError, TensorsmithError
from tensorsmith.ir.interpreter import check_inputs
from tensorsmith.ir.kernel_program import Buffer
from tensorsmith.ir.serialize import (graph_from_data, graph_to_data, kernel_program_from_data,
                                       kernel_program_to_data)

from .compiled import PROGRAM_FORMAT, CompiledKernel, CompiledProgram
from .device_call import DeviceCaller, is_device_array
from .executor import run_on_gpu
from .report import render_report

FLOAT_NAMES = ("float16", "bfloat16", "float32", "float64")
MANIFEST = "manifest.json"
BOUND_FILE = "bound.npz"     # the inputs bound at import (an ONNX model's initializers, a module's weights)   # sha256 of every other file; written last, so its presence means complete


class Program(CompiledProgram):
    """A compiled graph: `program(**inputs)` returns {output name: numpy array}; it also runs its kernel program in
    numpy, and saves itself."""

    def __call__(self, *positional: object, device: str | None = None, out: dict[str, Any] | None = None,
                 **inputs: object) -> dict[str, Any]:
        """Run on `device` ("cuda" or "cpu"; default: the GPU where there is one, else the CPU).

        Inputs are given by name. numpy arrays in give numpy arrays out. Given torch tensors or cupy arrays that
        are already on the GPU, the kernels read them where they are, on the framework's current stream, and the
        call returns without waiting for them, as the framework's own ops do; the outputs come back in the same
        framework. `out` maps output names to arrays to write instead (of the same kind as the inputs).
        """
        inputs = {**self._bound_like(inputs), **inputs}
        if positional:
            raise InputError(f"program {self.name!r} takes its inputs by name: prog("
                             f"{', '.join(f'{name}=...' for name in self.inputs)})")
        unknown = sorted(set(out) - set(self.outputs)) if out else []
        if unknown:
            raise InputError(f"out names {unknown}, which are not outputs of program {self.name!r}; its outputs are"
                             f" {list(self.outputs)}")
        if device != "cpu" and inputs and is_device_array(next(iter(inputs.values()))):
            caller = self.gpu_state.get("device_caller")
            if caller is None or len(inputs) != len(self.inputs):
                self._check_gpu_call(inputs, out)
                caller = self.gpu_state.setdefault("device_caller", DeviceCaller(self))
            try:
                return caller(inputs, out)
            except (KeyError, AttributeError, TypeError):   # a name or an array of the wrong kind: say which
                self._check_gpu_call(inputs, out)
                raise
        device = device or ("cuda" if gpu_available() else "cpu")
        self._check_float_dtypes(inputs)
        arrays: dict[str, np.ndarray] = {name: np.asarray(value, dtype=_host(self.buffers[name].dtype))
                                         for name, value in check_inputs(self.graph, inputs).items()}
        results: dict[str, np.ndarray]
        if device == "cpu":
            results = {k: np.asarray(v, dtype=_host(self.buffers[k].dtype)) for k, v in
                       self.kernel_program.execute(arrays).items()}
        elif device == "cuda":
            results = run_on_gpu(self, arrays)
        else:
            raise InputError(f"unknown device {device!r}; use 'cuda' or 'cpu'")
        return _write_out(results, out or {})

    def _bound_like(self, inputs: dict[str, object]) -> dict[str, Any]:
        """The bound inputs the call does not give, where the given ones are: on the host, or on the GPU as torch
        tensors (uploaded once)."""
        missing = [name for name in self.bound if name not in inputs]
        if not missing:
            return {}
        sample: Any = next(iter(inputs.values()), None)
        if sample is None or not is_device_array(sample) or not type(sample).__module__.startswith("torch"):
            return {name: self.bound[name] for name in missing}
        import torch     # the call's arrays are torch's: so are the bound ones, on their device
        uploaded = self.gpu_state.setdefault("bound_on_device", {})
        for name in missing:
            if name not in uploaded:
                dtype = getattr(torch, self.buffers[name].dtype.value)
                uploaded[name] = torch.as_tensor(self.bound[name]).to(device=sample.device, dtype=dtype)
        return {name: uploaded[name] for name in missing}

    def _check_float_dtypes(self, inputs: dict[str, object]) -> None:
        """A DTypeError for a float array of another width than its input's: a float32 array to a float16 input
        would be rounded without a word (PyTorch refuses such a call too). A bfloat16 input takes float32 arrays,
        numpy having no bfloat16."""
        for name, value in inputs.items():
            given = str(getattr(value, "dtype", "")).removeprefix("torch.")     # numpy's or torch's name
            expected = self.buffers[name].dtype if name in self.buffers else None
            if expected is None or not expected.is_float or given not in FLOAT_NAMES or given == expected.value:
                continue     # (an int or bool array where a float is expected: check_inputs says so)
            if expected == DType.BFLOAT16 and given == "float32":
                continue
            raise DTypeError(f"input {name!r} of program {self.name!r} is {expected}; got {given} values: convert them"
                             f" first (for numpy, .astype(np.{_host(expected).__name__})), as a program does not"
                             f" round its inputs silently")

    def _check_gpu_call(self, inputs: dict[str, object], out: dict[str, Any] | None) -> None:
        """One clear InputError for a call on GPU arrays whose names or kinds do not fit the program."""
        if set(inputs) != set(self.inputs):
            raise InputError(f"program {self.name!r} takes inputs {list(self.inputs)}; got {list(inputs)}")
        on_host = [name for name, value in {**inputs, **(out or {})}.items() if not is_device_array(value)]
        if on_host:
            raise InputError(f"program {self.name!r} takes its inputs and outputs all on the GPU or all on the host;"
                             f" {on_host} are not GPU arrays while {list(inputs)[0]!r} is")

    def save(self, path: str | os.PathLike, force: bool = False) -> Path:
        """Write kernels/NN_name.cu and cubins, program.json, graph.json and report.html into `path`, atomically.

        `path` may be new, an empty folder or a folder tensorsmith wrote (it has the manifest); anything else
        raises OutputError, unless `force` lets a folder be replaced (a file never is)."""
        target = output_folder(path, force)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = self.write_staged(target.parent, target.name)
        try:
            _replace_dir(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return target

    def write_staged(self, parent: Path, name: str) -> Path:
        """Every file of the saved program, in a new hidden folder under `parent` (manifest written last), for the
        caller to move into place; nothing is left behind if writing fails."""
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=parent))
        try:
            files = self._files()
            for file, data in files.items():
                (staging / file).parent.mkdir(parents=True, exist_ok=True)
                (staging / file).write_bytes(data)
            manifest = {file: hashlib.sha256(data).hexdigest() for file, data in files.items()}
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")   # last: marks it complete
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return staging

    def _files(self) -> dict[str, bytes]:
        files: dict[str, bytes] = {}
        for kernel in self.kernels:
            files[f"kernels/{kernel.file_stem}.cu"] = kernel.source.encode()
            files[f"kernels/{kernel.file_stem}.cubin"] = kernel.cubin
        files["program.json"] = (json.dumps(self.describe(), indent=2) + "\n").encode()
        doc = {"graph": graph_to_data(self.graph), "kernel_program": kernel_program_to_data(self.kernel_program)}
        files["graph.json"] = json.dumps(doc).encode()
        files["report.html"] = render_report(self).encode()
        if self.bound:
            stream = io.BytesIO()
            np.savez(stream, **self.bound)
            files[BOUND_FILE] = stream.getvalue()
        return files


def load(path: str | os.PathLike) -> Program:
    """A Program saved by `Program.save`: it runs on the GPU or the CPU and can be checked against the reference."""
    folder = Path(path)
    try:
        doc = json.loads((folder / "program.json").read_text())
        if doc.get("format") != PROGRAM_FORMAT:
            raise ValueError(f"format {doc.get('format')!r}, expected {PROGRAM_FORMAT}")
        buffers = {b["name"]: Buffer(b["name"], tuple(b["shape"]), DType(b["dtype"]), b["role"])
                   for b in doc["buffers"]}
        kernels = [CompiledKernel(k["name"], Path(k["source"]).stem, k["archetype"], k["schedule"],
                                  (folder / k["source"]).read_text(), (folder / k["cubin"]).read_bytes(),
                                  tuple(k["grid"]), tuple(k["block"]), tuple(k["params"]), tuple(k["writes"]),
                                  k["measured_ms"], k.get("predicted_ms"), k.get("shared_bytes", 0),
                                  tuple(TensorMapSpec.from_dict(t) for t in k.get("tensor_maps", ())),
                                  k.get("persistent", False), k.get("entry", ""), k.get("programmatic", False))
                   for k in doc["kernels"]]
        extra = json.loads((folder / "graph.json").read_text())
        bound: dict[str, Any] = {}
        if (folder / BOUND_FILE).is_file():
            with np.load(folder / BOUND_FILE) as held:
                bound = {name: held[name] for name in held.files}
        graph = graph_from_data(extra["graph"])
        kernel_program = kernel_program_from_data(extra["kernel_program"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise TensorsmithError(f"{folder} is not a saved tensorsmith program: {err}") from None
    return Program(doc["graph"], doc["target"], buffers, tuple(t["name"] for t in doc["inputs"]),
                   tuple(t["name"] for t in doc["outputs"]), kernels, graph, kernel_program, doc["seed"],
                   doc["compiler_version"], doc.get("report", {}), bound)


def output_folder(path: str | os.PathLike, force: bool = False) -> Path:
    """`path`, resolved, if a program may be saved there (see `Program.save`); else OutputError saying what to do."""
    target = Path(path).expanduser().resolve()
    if not target.exists():
        return target
    if not target.is_dir():
        raise OutputError(f"{path} is a file, not a folder: a program is saved as a folder; choose another path")
    if force or not any(target.iterdir()):
        return target
    if (target / MANIFEST).is_file():
        others = _unlisted_files(target)
        if not others:
            return target
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise OutputError(f"{path} is a tensorsmith output folder, but it also holds files tensorsmith did not write"
                          f" ({shown}); saving there would delete them. Move them out, choose a new folder, or pass"
                          f" --force (force=True) to replace it all")
    raise OutputError(f"{path} exists and is not a tensorsmith output folder (it has no {MANIFEST}); saving there would"
                      f" delete what it holds. Choose a new folder, or pass --force (force=True) to replace it")


def _unlisted_files(folder: Path) -> list[str]:
    """The files under `folder` that its manifest does not list (nor is it), as relative paths, sorted."""
    try:
        listed = set(json.loads((folder / MANIFEST).read_text())) | {MANIFEST}
    except (OSError, ValueError):
        listed = {MANIFEST}
    return sorted(str(file.relative_to(folder)) for file in folder.rglob("*")
                  if not file.is_dir() and str(file.relative_to(folder)) not in listed)


def _replace_dir(staging: Path, target: Path) -> None:
    """Move `staging` to `target`, replacing a previous folder only once the new one is complete."""
    if target.exists():
        old = target.with_name(f".{target.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
        staging.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staging.rename(target)


def _write_out(results: dict[str, np.ndarray], out: dict[str, Any]) -> dict[str, Any]:
    """`results` with each output named in `out` copied into the caller's numpy array there instead."""
    for name, target in out.items():
        if not isinstance(target, np.ndarray) or target.shape != results[name].shape or \
                not np.can_cast(results[name].dtype, target.dtype, "same_kind"):
            raise InputError(f"out[{name!r}]: expected a numpy array of shape {results[name].shape} that holds "
                             f"{results[name].dtype}, got {type(target).__name__} {getattr(target, 'shape', '')}")
        np.copyto(target, results[name], casting="same_kind")
    return {**results, **out}


def _host(dtype: DType) -> type:
    return {DType.FLOAT16: np.float16, DType.INT32: np.int32, DType.BOOL: np.bool_}.get(dtype, np.float32)
