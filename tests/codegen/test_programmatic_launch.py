"""Programmatic dependent launch on sm90: every kernel waits (griddepcontrol.wait) before it reads memory, sm90
programs mark their kernels programmatic and keep the mark through save and load, and the runtime launches such
kernels with cuLaunchKernelEx and the programmatic attribute (checked without a GPU by stand-ins for the driver);
on a GPU, a chain of dependent kernels launched so computes what the reference does."""
from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from cuda.bindings import driver, nvrtc

import tensorsmith as ts
from attention_cases import ATTENTION_CASES, WGMMA_SCHEDULES, attention_graph, attention_program
from captured_graphs import replayed_in_a_captured_graph
from graph_cases import CASES, residual_layers
from matmul_cases import MATMUL_CASES, matmul_program
from tensorsmith.codegen import render, runtime
from tensorsmith.codegen.nvrtc import BASE_OPTIONS, include_flags
from tensorsmith.codegen.render import RenderedKernel, render_program
from tensorsmith.compiled import CompiledKernel
from tensorsmith.executor import kernel_launch
from tensorsmith.ir.targets import TARGETS
from tensorsmith.search.partition import partition
from tensorsmith.search.verify import compare, random_inputs

TEMPLATES = Path(render.__file__).parent / "templates"
WAIT = 'asm volatile("griddepcontrol.wait;" ::: "memory");'
TRIGGER = 'asm volatile("griddepcontrol.launch_dependents;" ::: "memory");'
GUARD = "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900"
WGMMA = {"bm": 128, "bn": 128, "bk": 64, "stages": 4, "warps_m": 2, "warps_n": 4, "split_k": 1, "wgmma": 1}
MMA_SYNC = {**WGMMA, "stages": 3, "wgmma": 0}
# PTX instructions that read memory another kernel may have written: loads from any space but a kernel's own
# (parameters, shared, local, constant), and asynchronous copies (cp.async, TMA's cp.async.bulk.tensor)
GLOBAL_READ = re.compile(r"^\s*(@!?%\w+\s+)?((ld|ldu)\.(?!param|shared|local|const)|cp\.async|cp\.reduce|atom\.|red\.)",
                         re.MULTILINE)
CASE_NAMES = ["pointwise_math", "norms", "matmul", "tensor_core_mlp", "attention", "decoder_block"]


def kernel_begin() -> str:
    """What common.cu.j2's kernel_begin() renders: the text every kernel's body must start with."""
    return render._environment().get_template("common.cu.j2").module.kernel_begin()


def body(kernel: RenderedKernel) -> str:
    """The kernel's body: its source after the opening brace of its signature."""
    signature = kernel.source.index(f" {kernel.entry}(")
    return kernel.source[kernel.source.index(") {\n", signature) + len(") {\n"):]


PREFILL = "prefill_fp16_d64_128"
# a kernel of each template that defines one, rendered
VARIANTS: dict[str, Callable[[], RenderedKernel]] = {
    "pointwise": lambda: render_program(partition(CASES["pointwise_math"]()))[0],
    "row_reduce": lambda: render_program(partition(CASES["norms"]()))[0],
    "matmul": lambda: matmul_program(MATMUL_CASES["dividing"](), MMA_SYNC)[1],
    "matmul_tma": lambda: matmul_program(MATMUL_CASES["dividing"](), WGMMA)[1],
    "matmul_wgmma": lambda: matmul_program(MATMUL_CASES["row_sliced"](), WGMMA)[1],
    "attention": lambda: attention_program(attention_graph(PREFILL, ATTENTION_CASES[PREFILL]),
                                           {"bq": 64, "bkv": 64, "wgmma": 0})[1],
    "attention_tma": lambda: attention_program(attention_graph(PREFILL, ATTENTION_CASES[PREFILL]),
                                               WGMMA_SCHEDULES[0])[1],
}


def ptx(kernel: RenderedKernel, arch: str) -> str:
    """NVRTC's PTX of the kernel for virtual architecture `arch` (compute_90, compute_90a, compute_80)."""
    flags = [opt.encode() for opt in (f"--gpu-architecture={arch}", *BASE_OPTIONS, *include_flags())]
    err, prog = nvrtc.nvrtcCreateProgram(kernel.build_source.encode(), b"kernel.cu", 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(flags), flags)
        assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, f"NVRTC failed for {kernel.name} at {arch}"
        err, size = nvrtc.nvrtcGetPTXSize(prog)
        text = b" " * size
        (err,) = nvrtc.nvrtcGetPTX(prog, text)
        return text.rstrip(b"\x00").decode()
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


# ---- the templates ----------------------------------------------------------------------------------------------

def test_kernel_begin_triggers_the_next_kernel_then_waits_only_on_sm90() -> None:
    text = kernel_begin()
    assert text.startswith(GUARD) and text.rstrip().endswith("#endif")
    assert text.index(TRIGGER) < text.index(WAIT)


def test_every_template_begins_its_kernels_with_kernel_begin() -> None:
    """Every kernel is declared through common.signature, and its body's first line is common.kernel_begin()."""
    kernels = 0
    for template in sorted(TEMPLATES.glob("*.cu.j2")):
        text = template.read_text()
        if template.name != "common.cu.j2":
            assert "__global__" not in text, f"{template.name} declares a kernel without common.signature"
        opened = text.count("{{ common.signature(k) }} {\n")
        assert opened == text.count("{{ common.signature(k) }} {\n{{ common.kernel_begin() }}\n"), template.name
        kernels += opened
    assert kernels >= 7


def test_the_empty_kernel_that_prices_a_launch_begins_as_every_kernel_does() -> None:
    """launch_cost measures one more kernel with a kernel that begins as the program's do, and compiles for sm90."""
    from tensorsmith.codegen.launch_cost import ENTRY, empty_kernel_source
    from tensorsmith.codegen.nvrtc import compile_cubin
    source = empty_kernel_source()
    assert source[source.index(") {\n") + len(") {\n"):].startswith(kernel_begin())
    assert compile_cubin(source, ENTRY)


@pytest.mark.parametrize("case", CASE_NAMES)
def test_every_rendered_kernel_waits_first(case: str) -> None:
    begin = kernel_begin()
    for kernel in render_program(partition(CASES[case]())):
        assert body(kernel).startswith(begin), f"{kernel.name} does not begin with griddepcontrol.wait"


def test_the_variants_are_one_kernel_of_each_template() -> None:
    """VARIANTS renders what it says: wgmma where asked (TMA where the operands allow), mma.sync elsewhere."""
    kernels = {template: make() for template, make in VARIANTS.items()}
    assert [kernels[t].archetype for t in ("pointwise", "row_reduce", "matmul", "attention")] == [
        "pointwise", "row_reduce", "matmul", "attention"]
    assert kernels["matmul"].arch is None and kernels["attention"].arch is None
    assert kernels["matmul_tma"].arch == "sm_90a" and kernels["matmul_tma"].tensor_maps
    assert kernels["matmul_wgmma"].arch == "sm_90a" and not kernels["matmul_wgmma"].tensor_maps
    assert kernels["attention_tma"].arch == "sm_90a" and kernels["attention_tma"].tensor_maps


@pytest.mark.parametrize("template", sorted(VARIANTS))
def test_each_template_waits_before_its_first_global_read_in_ptx(template: str) -> None:
    """In NVRTC's PTX for sm_90 the wait comes before any load or copy from global memory (TMA's included); for
    sm_80, which has no griddepcontrol, the guard leaves both instructions out."""
    kernel = VARIANTS[template]()
    assert body(kernel).startswith(kernel_begin())
    hopper = ptx(kernel, "compute_90a" if kernel.arch == "sm_90a" else "compute_90")
    entry = hopper[hopper.index(f".entry {kernel.entry}("):]
    first_read = GLOBAL_READ.search(entry)
    assert first_read is not None, f"{template}: no global read found in its PTX"
    assert entry.index("griddepcontrol.launch_dependents;") < entry.index("griddepcontrol.wait;") < first_read.start()
    if kernel.arch is None:    # wgmma kernels are Hopper's alone
        assert "griddepcontrol" not in ptx(kernel, "compute_80")


# ---- the program's flag -----------------------------------------------------------------------------------------

def test_targets_launch_programmatically_on_hopper_only() -> None:
    assert TARGETS["sm90"].programmatic_launch and not TARGETS["sm80"].programmatic_launch


def test_sm90_kernels_are_programmatic_through_save_and_load(tmp_path: Path) -> None:
    program = ts.compile(CASES["norms"](), profile=False, seed=0)
    assert len(program.kernels) > 1 and all(kernel.programmatic for kernel in program.kernels)
    assert all(entry["programmatic"] is True for entry in program.describe()["kernels"])
    program.save(tmp_path / "out")
    loaded = ts.load(tmp_path / "out")
    assert [kernel.programmatic for kernel in loaded.kernels] == [True] * len(program.kernels)


def test_a_program_json_without_the_field_loads_as_not_programmatic(tmp_path: Path) -> None:
    """Programs saved before programmatic launch have kernels without the wait: they load as launched before."""
    program = ts.compile(CASES["pointwise_math"](), profile=False, seed=0)
    path = program.save(tmp_path / "out") / "program.json"
    doc = json.loads(path.read_text())
    for entry in doc["kernels"]:
        del entry["programmatic"]
    path.write_text(json.dumps(doc))
    assert [kernel.programmatic for kernel in ts.load(tmp_path / "out").kernels] == [False]


def test_sm80_kernels_are_not_programmatic() -> None:
    program = ts.compile(CASES["pointwise_math"](), target="sm80", profile=False, seed=0)
    assert not any(kernel.programmatic for kernel in program.kernels)


# ---- the launch -------------------------------------------------------------------------------------------------

def test_programmatic_config_holds_the_launch_and_the_attribute() -> None:
    try:
        config = runtime._programmatic_config((3, 2, 1), (128, 1, 1), 4096, 0xABC)
    except Exception as err:      # no cuda-python type can be made here
        pytest.skip(f"cuda-python's launch types need a driver here: {err}")
    assert (config.gridDimX, config.gridDimY, config.gridDimZ) == (3, 2, 1)
    assert (config.blockDimX, config.blockDimY, config.blockDimZ) == (128, 1, 1)
    assert config.sharedMemBytes == 4096 and int(config.hStream) == 0xABC
    assert config.numAttrs == 1 and len(config.attrs) == 1
    (attribute,) = config.attrs
    assert attribute.id == driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert attribute.value.programmaticStreamSerializationAllowed == 1
    assert int(runtime._programmatic_config((1, 1, 1), (32, 1, 1), 0, None).hStream) == 0   # the legacy stream


def _recorded_launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple]]:
    """Stand-ins for the driver's launch calls (and no context to make), recording each call."""
    calls: list[tuple[str, tuple]] = []

    def recorder(name: str):
        def call(*args):
            calls.append((name, args))
            return (driver.CUresult.CUDA_SUCCESS,)
        call.__name__ = name
        return call
    monkeypatch.setattr(runtime, "_ensure_context", lambda: None)
    monkeypatch.setattr(runtime.driver, "cuLaunchKernel", recorder("cuLaunchKernel"))
    monkeypatch.setattr(runtime.driver, "cuLaunchKernelEx", recorder("cuLaunchKernelEx"))
    return calls


def test_a_programmatic_launch_goes_through_cuLaunchKernelEx(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _recorded_launches(monkeypatch)
    function = runtime.Function(None, "k", driver.CUfunction())
    runtime.launch(function, (4, 1, 1), (64, 1, 1), [np.int32(7)], 128, stream=0x55, programmatic=True)
    runtime.launch(function, (4, 1, 1), (64, 1, 1), [np.int32(7)], 128, stream=0x55)
    (name, (config, handle, params, extra)), (plain, plain_args) = calls
    assert name == "cuLaunchKernelEx" and handle is function.handle and params != 0 and extra == 0
    assert (config.gridDimX, config.blockDimX, config.sharedMemBytes, int(config.hStream)) == (4, 64, 128, 0x55)
    assert config.attrs[0].value.programmaticStreamSerializationAllowed == 1
    assert plain == "cuLaunchKernel" and plain_args[1:8] == (4, 1, 1, 64, 1, 1, 128)


def test_a_kernels_flag_reaches_its_launch_and_the_graph_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    """kernel_launch carries CompiledKernel.programmatic into runtime.Launch, and capturing launches into a CUDA
    graph launches each with its own flag."""
    monkeypatch.setattr(runtime, "sm_count", lambda: 132)
    function = runtime.Function(None, "k", driver.CUfunction())
    kernel = CompiledKernel("k", "00_k", "pointwise", {}, "", b"", (1, 1, 1), (32, 1, 1), ("x",), ("x",),
                            programmatic=True)
    launches = [kernel_launch(kernel, function, {"x": 0x1000}),
                kernel_launch(dataclasses.replace(kernel, programmatic=False), function, {"x": 0x1000})]
    assert [item.programmatic for item in launches] == [True, False]
    flags: list[bool] = []
    monkeypatch.setattr(runtime, "launch", lambda *args, programmatic=False, **options: flags.append(programmatic))
    monkeypatch.setattr(runtime, "_cu", lambda call, *args: None)     # no stream or capture to make
    monkeypatch.setattr(runtime._capture_stream, "handle", 1, raising=False)
    runtime._captured(launches)
    assert flags == [True, False]


# ---- on the GPU -------------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_a_chain_of_programmatic_kernels_computes_the_reference() -> None:
    """Norms, products and residual adds, each kernel reading what the one before it wrote: launched
    programmatically, with numpy arrays (outputs and temporaries poisoned before each run, so a kernel that read
    before its producer finished would read NaN), torch tensors (one CUDA graph, temporaries holding the previous
    call's values) and inside the caller's own CUDA graph, on several draws."""
    torch = pytest.importorskip("torch")
    graph = residual_layers(4, tokens=256, width=256)
    program = ts.compile(graph, profile=False, seed=0)
    assert len(program.kernels) >= 3 and all(kernel.programmatic for kernel in program.kernels)

    def assert_right(inputs: dict[str, np.ndarray], outputs: dict) -> None:
        host = {name: np.asarray(value.float().cpu().numpy() if hasattr(value, "cpu") else value, np.float64)
                for name, value in outputs.items()}
        for check in compare(graph, host, ts.evaluate(graph, inputs)):
            assert check.ok, f"{check.output}: relative L2 {check.error:.3g} > {check.tolerance:g}"

    for seed in range(3):
        inputs = random_inputs(graph, seed=seed)
        assert_right(inputs, program(**inputs))
    for seed in range(3, 6):
        inputs = random_inputs(graph, seed=seed)
        outputs = program(**{name: torch.from_numpy(array).cuda() for name, array in inputs.items()})
        torch.cuda.synchronize()
        assert_right(inputs, outputs)
    first, second = random_inputs(graph, seed=6), random_inputs(graph, seed=7)
    on_gpu = [{name: torch.from_numpy(array).cuda() for name, array in draw.items()} for draw in (first, second)]
    assert_right(second, replayed_in_a_captured_graph(program, *on_gpu))
