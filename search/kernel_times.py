"""Measured kernel times by signature, kept on disk beside the program cache.

A kernel's signature is what decides its speed on one GPU: its body's structure over buffers of given shapes and
dtypes (`kernel_program.kernel_structure`), its schedule, the code that renders and compiles it (`codegen_fingerprint`) and
the device's name. A candidate program whose kernels were all measured before (an identical layer, another
candidate sharing kernels, a second model with the same layers) is not timed again, only run once for its outputs
to be checked: its time is the sum of its kernels' plus one launch each, the basis every measured candidate is
compared on.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

from tensorsmith import codegen, ir
from tensorsmith.codegen.nvrtc import nvrtc_version
from tensorsmith.ir.files import code_digest
from tensorsmith.ir.kernel_program import Kernel, KernelProgram, kernel_structure


log = logging.getLogger(__name__)

KERNEL_TIMES_FILE = "kernel_times.jsonl"   # one JSON record a line: device, signature, seconds, kernel name, and
                                           # where given the kernel's features (`cost.kernel_features`)
Features = Callable[[Kernel, KernelProgram], dict]   # what a record says of its kernel, for refitting the cost model
MeasureKernels = Callable[[KernelProgram], list[float]]   # each kernel's seconds, in order, outputs checked first
CheckOutputs = Callable[[KernelProgram], object]           # one untimed run, outputs checked (raises if wrong)


@lru_cache(maxsize=1)
def codegen_fingerprint() -> str:
    """A digest of what renders and compiles a kernel: codegen's and the IR's Python sources, the templates, and
    NVRTC's version; a change to any voids the times measured before it."""
    return code_digest([Path(codegen.__file__).parent, Path(ir.__file__).parent], repr(nvrtc_version()).encode())


@lru_cache(maxsize=1)
def model_fingerprint() -> str:
    """A digest of the cost model's code and what it reads (search, codegen, the IR): a record's features are
    fitted only against the model that made them."""
    return code_digest([Path(__file__).parent, Path(codegen.__file__).parent, Path(ir.__file__).parent])


def kernel_signature(kernel: Kernel, program: KernelProgram, device: str) -> str:
    """What a measured time of `kernel` (as a kernel of `program`) is kept and looked up by."""
    schedule = sorted(kernel.schedule.as_dict().items())
    text = repr((device, codegen_fingerprint(), kernel_structure(kernel), schedule))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass
class KernelTimes:
    """The times measured on `device`, read from `path` (None: kept in memory only) and appended to it."""

    path: Path | None
    device: str
    seconds: dict[str, float] = field(default_factory=dict)
    measured_programs: int = 0    # candidates run on the GPU to time their kernels
    reused_programs: int = 0      # candidates timed from kernels measured before, not run
    features: Features | None = None   # each new record's kernel described, where given
    records: list[dict] = field(default_factory=list)   # this device's records that carry features, oldest first
    _unwritable: bool = False

    def __post_init__(self) -> None:
        if self.path is None:
            return
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return
        except OSError as err:
            log.warning("could not read the kernel times at %s (%s); kernels are measured afresh", self.path, err)
            return
        for line in lines:
            try:
                record = json.loads(line)
                if record["device"] == self.device:
                    self.seconds[str(record["signature"])] = float(record["seconds"])
                    features = record.get("features")
                    if isinstance(features, dict) and features.get("model") == model_fingerprint():
                        self.records.append(record)
            except (ValueError, KeyError, TypeError):   # a line cut short by a killed writer: ignored
                continue

    def program_seconds(self, program: KernelProgram, measure_kernels: MeasureKernels, check_outputs: CheckOutputs,
                        launch_s: float) -> float:
        """The sum of the program's kernel times plus `launch_s` a kernel, measuring them only where one is new. A
        program whose kernels are all known still runs once, untimed, for its outputs to be checked: each kernel was
        right where it was measured, but a new neighbour may read elements of it that the old one did not."""
        signatures = [kernel_signature(kernel, program, self.device) for kernel in program.kernels]
        if all(signature in self.seconds for signature in signatures):
            check_outputs(program)
            self.reused_programs += 1
        else:
            times = measure_kernels(program)
            if len(times) != len(signatures):
                raise ValueError(f"{len(times)} kernel times for a program of {len(signatures)} kernels")
            self.measured_programs += 1
            for kernel, signature, seconds in zip(program.kernels, signatures, times):
                self._record(signature, seconds, kernel, program)
        return sum(self.seconds[signature] for signature in signatures) + launch_s * len(signatures)

    def _record(self, signature: str, seconds: float, kernel: Kernel, program: KernelProgram) -> None:
        if signature in self.seconds:   # measured again within this program: the first time stands
            return
        self.seconds[signature] = seconds
        record = {"device": self.device, "signature": signature, "seconds": seconds, "kernel": kernel.name}
        if self.features is not None:
            record["features"] = {**self.features(kernel, program), "model": model_fingerprint()}
            self.records.append(record)
        if self.path is None or self._unwritable:
            return
        line = json.dumps(record)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # one short append a record: on a local file system concurrent writers do not interleave (one O_APPEND
            # write each); a line a killed writer cut short is ended first, so that this record stays whole
            with self.path.open("a+b") as file:
                end = file.seek(0, 2)
                cut = end > 0 and file.seek(end - 1) >= 0 and file.read(1) != b"\n"
                file.write((("\n" if cut else "") + line + "\n").encode())
        except OSError as err:
            self._unwritable = True
            log.warning("could not write the kernel times at %s (%s); they are kept for this compile only",
                        self.path, err)
