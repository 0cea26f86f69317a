"""On the GPU: every case graph and every example, compiled and run, matches the reference interpreter."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tensorsmith as ts
from graph_cases import CASES
from kernel_launch import assert_cpu_predicts
from tensorsmith.codegen import runtime
from tensorsmith.model_loader import load_graph
from tensorsmith.search.verify import compare, random_inputs

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.py"))
pytestmark = pytest.mark.gpu




def _check_on_gpu(graph: ts.Graph, seed: int) -> None:
    program = ts.compile(graph, profile=False, seed=seed)
    for draw in range(2):  # fresh inputs each time: the kernels must compute the function, not one answer
        inputs = random_inputs(graph, seed=1234 + draw)
        outputs = program(device="cuda", **inputs)
        for check in compare(graph, outputs, ts.evaluate(graph, inputs)):
            assert check.ok, f"{graph.name}.{check.output}: relative L2 {check.error:.3g} > {check.tolerance:g}"
        assert_cpu_predicts(program.kernel_program, inputs, outputs, label=graph.name)


@pytest.mark.parametrize("case", sorted(CASES))
def test_case_matches_reference_on_gpu(case: str) -> None:
    _check_on_gpu(CASES[case](), seed=0)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_matches_reference_on_gpu(path: Path) -> None:
    _check_on_gpu(load_graph(path), seed=0)


def test_persistent_kernel_on_fewer_sms_matches_reference(monkeypatch) -> None:
    """A GPU with 5 SMs, as far as the launches know: the persistent TMA matmul, rendered for 128 blocks (its
    output tiles), runs on 5, each walking about 26 tiles, and still computes the product."""
    graph = ts.Graph("persistent_matmul")
    graph.output("c", graph.input("a", (4096, 256), "float16") @ graph.input("b", (256, 512), "float16"))
    program = ts.compile(graph, profile=False, seed=0)
    assert [(kernel.persistent, kernel.grid) for kernel in program.kernels] == [(True, (128, 1, 1))]
    monkeypatch.setattr(runtime, "sm_count", lambda: 5)
    grids, launch = [], runtime.launch

    def recording_launch(function, grid, *args, **options):
        grids.append(grid)
        return launch(function, grid, *args, **options)
    monkeypatch.setattr(runtime, "launch", recording_launch)
    inputs = random_inputs(graph, seed=99)
    for check in compare(graph, program(device="cuda", **inputs), ts.evaluate(graph, inputs)):
        assert check.ok, f"{graph.name}.{check.output}: relative L2 {check.error:.3g} > {check.tolerance:g}"
    assert grids == [(5, 1, 1)]


def test_profiled_compile_records_times_in_headers_and_report() -> None:
    program = ts.compile(CASES["norms"](), profile=True)
    assert program.report["total_ms"] > 0
    assert program.report["launch_basis"] == "measured on this GPU" and 0.1 < program.report["launch_us"] < 20
    for kernel in program.kernels:
        assert kernel.measured_ms is not None and kernel.measured_ms > 0
        assert "measured: " in kernel.source and " us (median, L2 flushed)" in kernel.source


def test_unwritten_output_is_caught_by_poisoning() -> None:
    graph = CASES["pointwise_math"]()
    program = ts.compile(graph, profile=False)
    broken = program.kernels[0]
    program.kernels[0] = type(broken)(**{**broken.__dict__, "grid": (1, 1, 1)})  # launch too few blocks
    inputs = random_inputs(graph, seed=5)
    outputs = program(device="cuda", **inputs)
    assert np.isnan(outputs["out"]).any()
    assert not all(c.ok for c in compare(graph, outputs, ts.evaluate(graph, inputs)))


@pytest.mark.parametrize("framework", ["torch", "cupy"])
def test_gpu_arrays_in_give_gpu_arrays_out_without_copies(framework: str) -> None:
    lib = pytest.importorskip(framework)
    graph = CASES["norms"]()
    program = ts.compile(graph, profile=False)
    inputs = random_inputs(graph, seed=21)
    on_gpu = {k: (lib.from_numpy(v).cuda() if framework == "torch" else lib.asarray(v)) for k, v in inputs.items()}
    outputs = program(**on_gpu)
    first = outputs["soft"]
    assert type(first).__module__.startswith(framework)
    assert (first.is_cuda if framework == "torch" else True)
    host = {k: (v.cpu().float().numpy() if framework == "torch" else lib.asnumpy(v)) for k, v in outputs.items()}
    for check in compare(graph, host, ts.evaluate(graph, inputs)):
        assert check.ok, check


def test_gpu_array_of_the_wrong_dtype_is_named() -> None:
    torch = pytest.importorskip("torch")
    graph = CASES["views"]()
    program = ts.compile(graph, profile=False)
    with pytest.raises(ts.InputError, match="input 'x': expected a contiguous float16 array of shape"):
        program(x=torch.zeros((6, 10, 7), dtype=torch.float32, device="cuda"))


def test_a_torch_view_at_an_odd_offset_is_copied_before_16_byte_loads_read_it() -> None:
    torch = pytest.importorskip("torch")
    graph = CASES["norms"]()
    program = ts.compile(graph, profile=False)
    inputs = random_inputs(graph, seed=22)
    on_gpu = {}
    for name, array in inputs.items():
        flat = torch.from_numpy(array).cuda().flatten()
        padded = torch.empty(flat.numel() + 1, dtype=flat.dtype, device="cuda")
        padded[1:] = flat
        on_gpu[name] = padded[1:].view(array.shape)      # starts one element past an aligned address
        assert on_gpu[name].data_ptr() % 16 != 0
    outputs = program(**on_gpu)
    host = {k: v.cpu().float().numpy() for k, v in outputs.items()}
    for check in compare(graph, host, ts.evaluate(graph, inputs)):
        assert check.ok, check



@pytest.mark.parametrize("position, length", [(0, 16), (13, 16), (-1, 16), (1500, 2048)])
def test_a_cache_written_in_place_keeps_every_other_element_and_feeds_its_readers(position: int, length: int) -> None:
    """A KV cache written at one position with out= its own tensor (the program says it may be): the position's
    values land in the caller's tensor, every other element is left as it was (the kernel touches only that slice),
    and the kernel reading the written cache sees the new values; written out of place (an output of its own) every
    element is the reference's (at 2048 positions, the copy's threads stride over the cache several times); an
    output that may not be written over its input is refused."""
    torch = pytest.importorskip("torch")
    g = ts.Graph("cache_write")
    cache = g.input("cache", (4, length, 64), "float16")
    at, values = g.input("at", (1,), "int32"), g.input("values", (4, 1, 64), "float16")
    written = ts.nn.put(cache, at, values, axis=1, wrap=True)   # -1: the last position, as index_copy takes it
    g.output("written", written)
    g.output("total", written.cast("float32").sum(1))
    program = ts.compile(g, profile=False)
    assert program.written_in_place == {"written": "cache"}
    inputs = {**random_inputs(g, seed=5), "at": np.array([position], np.int32)}
    expected = ts.evaluate(g, inputs)
    on_gpu = {name: torch.from_numpy(array).cuda() for name, array in inputs.items()}
    apart = program(**on_gpu)
    for check in compare(g, {k: v.cpu().float().numpy() for k, v in apart.items()}, expected):
        assert check.ok, check
    before = on_gpu["cache"].clone()
    outputs = program(**on_gpu, out={"written": on_gpu["cache"]})
    torch.cuda.synchronize()
    assert outputs["written"].data_ptr() == on_gpu["cache"].data_ptr()
    assert torch.equal(on_gpu["cache"][:, position], on_gpu["values"][:, 0])
    others = [p for p in range(length) if p != position % length]
    assert torch.equal(on_gpu["cache"][:, others], before[:, others])
    np.testing.assert_allclose(outputs["total"].cpu().numpy(), expected["total"], rtol=1e-3, atol=1e-2)
    with pytest.raises(ts.InputError, match="overlaps"):
        program(**on_gpu, out={"total": on_gpu["cache"].view(-1)[:512].view(torch.float32).view(4, 64)})


def test_nan_propagates_through_max_as_in_the_reference() -> None:
    """A row max and relu (an elementwise max) over rows holding a NaN give NaN where the reference does: fmaxf
    would return the other operand."""
    graph = ts.Graph("nan_max")
    x = graph.input("x", (64, 1000), "float32")
    graph.output("row_max", x.max(axis=1))
    graph.output("relu", ts.nn.relu(x))
    program = ts.compile(graph, profile=False, seed=0)
    inputs = random_inputs(graph, seed=3)
    inputs["x"][::7, 123] = np.nan
    outputs, reference = program(device="cuda", **inputs), ts.evaluate(graph, inputs)
    for name in graph.outputs:
        assert np.array_equal(np.isnan(outputs[name]), np.isnan(reference[name])), name
    assert_cpu_predicts(program.kernel_program, inputs, outputs, label=graph.name)


def test_float32_overflow_on_the_gpu_is_what_the_cpu_executor_predicts() -> None:
    """log(sum(exp(x))) over float32 logits up to 150: exp overflows float32 registers on the GPU (inf), and the
    CPU executor, computing in float32 as the kernels do, gives the same inf where the float64 reference does not;
    the stable form (max subtracted) is finite on both."""
    graph = ts.Graph("log_sum_exp")
    x = graph.input("x", (64, 512), "float32")
    graph.output("naive", x.exp().sum(axis=1).log())
    row_max = x.max(axis=1)
    graph.output("stable", (x - row_max[:, None]).exp().sum(axis=1).log() + row_max)
    program = ts.compile(graph, profile=False, seed=0)
    inputs = {"x": np.random.default_rng(5).uniform(-150, 150, (64, 512)).astype(np.float32)}
    outputs, reference = program(device="cuda", **inputs), ts.evaluate(graph, inputs)
    assert np.isfinite(reference["naive"]).all() and np.isinf(outputs["naive"]).all()
    assert np.isfinite(outputs["stable"]).all()
    assert_cpu_predicts(program.kernel_program, inputs, outputs, label=graph.name)


def test_a_second_compile_reuses_the_kernel_times_the_first_measured(tmp_path: Path) -> None:
    """The search's kernel times are kept beside the program cache: compiling the same graph again (another budget,
    so not from the program cache) reuses them, and its program is still checked and right."""
    graph = CASES["tensor_core_mlp"]()
    first = ts.compile(graph, budget_s=20, cache_dir=tmp_path, progress=False)
    second = ts.compile(graph, budget_s=21, cache_dir=tmp_path, progress=False)
    before, after = first.report["kernel_times"], second.report["kernel_times"]
    assert before["measured_programs"] >= 1 and (tmp_path / "kernel_times.jsonl").exists()
    assert after["reused_programs"] >= 1   # candidates the first compile timed are only checked, not timed again
    inputs = random_inputs(graph, seed=77)
    for check in compare(graph, second(device="cuda", **inputs), ts.evaluate(graph, inputs)):
        assert check.ok, f"{check.output}: relative L2 {check.error:.3g}"


def test_a_layered_model_measures_one_layer_and_runs_every_layer_on_its_own_weights(tmp_path: Path) -> None:
    """Issue 41 on the GPU: identical layers are searched and measured once; the stitched program is random-tested
    end to end on the GPU (its outputs within the dtypes' tolerance, so no numpy run) before it is returned, and
    each layer computes with its own weights."""
    from graph_cases import residual_layers
    graph = residual_layers(6)
    program = ts.compile(graph, budget_s=10.0, seed=0, cache_dir=tmp_path, progress=False)
    layers = program.report["layers"]
    assert layers["identical"] == 6 and layers["pieces"][0]["measured_us"] is not None
    assert "gpu check" in layers["whole_model_seconds"] and layers["end_to_end"] == "gpu"
    assert "random test" not in layers["whole_model_seconds"]
    assert program.report["total_ms"] is not None and program.report["search"]["measured_us"] is not None
    inputs = random_inputs(graph, seed=77)
    outputs = program(device="cuda", **inputs)
    for check in compare(graph, outputs, ts.evaluate(graph, inputs)):
        assert check.ok, f"{check.output}: relative L2 {check.error:.3g} > {check.tolerance:g}"


def test_a_wrongly_stitched_program_is_caught_on_a_gpu_and_the_model_searched_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU too, were the stitching wrong (each layer bound to the next layer's weights), the end-to-end test
    rejects it and the model is searched whole. The GPU's run of draw 0 is far outside the dtypes' tolerance (64%
    in numpy), though within what its check allows for rounding where the graph's output is all noise, so the
    numpy test runs, and the exact check catches it (at 8fbf8fd the GPU's check alone let it through)."""
    from graph_cases import residual_layers
    from stitching import cross_the_stitching
    cross_the_stitching(monkeypatch)
    graph = residual_layers(3)
    program = ts.compile(graph, budget_s=8.0, seed=0, cache_dir=tmp_path, progress=False)
    assert "searched whole" in program.report["left_out"]["layers"] and not program.report["layers"]
    inputs = random_inputs(graph, seed=5)
    for check in compare(graph, program(device="cuda", **inputs), ts.evaluate(graph, inputs)):
        assert check.ok, f"{check.output}: relative L2 {check.error:.3g} > {check.tolerance:g}"
