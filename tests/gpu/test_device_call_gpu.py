"""On the GPU: a program called on torch tensors runs on the caller's stream without synchronizing, replays its
launches as CUDA graphs keyed by addresses, writes `out=` in place, can be captured in the caller's own CUDA graph,
and allocates nothing on later calls."""
from __future__ import annotations

import numpy as np
import pytest

import tensorsmith as ts
from captured_graphs import replayed_in_a_captured_graph
from graph_cases import CASES
from tensorsmith import nn
from tensorsmith.codegen import runtime
from tensorsmith.device_call import GRAPHS_PER_STREAM
from tensorsmith.search.verify import compare, random_inputs

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

SLEEP_CYCLES = 200_000_000     # about 0.1 s of a spinning kernel: the inputs' writes come long after the call


@pytest.fixture(scope="module")
def mlp() -> ts.Program:
    """Two kernels and a temporary between them: the workspace and the graph's order both matter."""
    program = ts.compile(CASES["tensor_core_mlp"](), profile=False, seed=0)
    assert len(program.kernels) == 2 and any(b.role == "temp" for b in program.buffers.values())
    return program


def _on_gpu(inputs: dict[str, np.ndarray]) -> dict[str, object]:
    return {name: torch.from_numpy(array).cuda() for name, array in inputs.items()}


def _assert_right(program: ts.Program, inputs: dict[str, np.ndarray], outputs: dict[str, object]) -> None:
    host = {name: value.cpu().float().numpy() for name, value in outputs.items()}
    for check in compare(program.graph, host, ts.evaluate(program.graph, inputs)):
        assert check.ok, f"{check.output}: relative L2 {check.error:.3g} > {check.tolerance:g}"


def test_kernels_run_on_the_callers_stream_after_the_work_queued_there(mlp: ts.Program) -> None:
    first, second = random_inputs(mlp.graph, seed=1), random_inputs(mlp.graph, seed=2)
    tensors, later = _on_gpu(first), _on_gpu(second)
    mlp(**tensors)                              # warm: modules loaded, workspace and graph made
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(SLEEP_CYCLES)
        for name, value in later.items():       # queued behind the sleep: written long after the call returns
            tensors[name].copy_(value)
        outputs = mlp(**tensors)
        assert not stream.query(), "the call waited for the GPU"
    stream.synchronize()
    _assert_right(mlp, second, outputs)


def test_new_tensors_every_call_stay_right_past_the_graphs_kept(mlp: ts.Program) -> None:
    kept = []                                  # outputs held, so that every call has new output addresses
    for draw in range(2 * GRAPHS_PER_STREAM + 1):
        inputs = random_inputs(mlp.graph, seed=100 + draw)
        kept.append((inputs, mlp(**_on_gpu(inputs))))
    for inputs, outputs in kept:
        _assert_right(mlp, inputs, outputs)


def test_out_is_written_in_place(mlp: ts.Program) -> None:
    inputs = random_inputs(mlp.graph, seed=7)
    (name,) = mlp.outputs
    buf = mlp.buffers[name]
    target = torch.full(buf.shape, float("nan"), dtype=getattr(torch, buf.dtype.value), device="cuda")
    outputs = mlp(**_on_gpu(inputs), out={name: target})
    assert outputs[name] is target
    _assert_right(mlp, inputs, {name: target})
    with pytest.raises(ts.InputError, match="overlaps"):
        tensors = _on_gpu(inputs)
        mlp(**tensors, out={name: tensors["x"].view(-1)[: target.numel()].view(buf.shape)})


def test_a_program_captured_in_the_callers_cuda_graph_replays_right(mlp: ts.Program) -> None:
    first, second = random_inputs(mlp.graph, seed=11), random_inputs(mlp.graph, seed=12)
    _assert_right(mlp, second, replayed_in_a_captured_graph(mlp, _on_gpu(first), _on_gpu(second)))


def test_later_calls_allocate_no_device_memory(mlp: ts.Program) -> None:
    """After the first calls, a call on torch tensors asks PyTorch's allocator for its outputs alone (the next
    call's, allocated after the replay), and a call on numpy arrays allocates nothing at all."""
    tensors = _on_gpu(random_inputs(mlp.graph, seed=21))
    arrays = random_inputs(mlp.graph, seed=22)
    for _ in range(2):                           # the first calls make the workspace, the graphs and the spares
        mlp(**tensors)
        mlp(**arrays)
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    ours, cuda_mallocs, requests = (runtime.allocation_count(), stats["num_device_alloc"],
                                    stats["allocation.all.allocated"])
    calls = 5
    for _ in range(calls):
        mlp(**tensors)
        mlp(**arrays)
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    assert (runtime.allocation_count(), stats["num_device_alloc"]) == (ours, cuda_mallocs)
    assert stats["allocation.all.allocated"] - requests == calls * len(mlp.outputs)


def test_calls_on_two_streams_use_workspaces_of_their_own(mlp: ts.Program) -> None:
    """Two calls held back by one gate on a third stream, so that their kernels start together: each stream's
    temporaries are its own, or one call's would overwrite the other's."""
    draws = [random_inputs(mlp.graph, seed=31 + i) for i in range(2)]
    tensors = [_on_gpu(inputs) for inputs in draws]
    mlp(**tensors[0])                            # warm: modules loaded
    torch.cuda.synchronize()
    gate, streams, results = torch.cuda.Stream(), [torch.cuda.Stream() for _ in draws], []
    with torch.cuda.stream(gate):
        torch.cuda._sleep(SLEEP_CYCLES)
    for stream, inputs in zip(streams, tensors):
        with torch.cuda.stream(stream):
            stream.wait_stream(gate)
            results.append(mlp(**inputs))
    torch.cuda.synchronize()
    for inputs, outputs in zip(draws, results):
        _assert_right(mlp, inputs, outputs)


def test_mixed_host_and_gpu_inputs_are_named(mlp: ts.Program) -> None:
    inputs = random_inputs(mlp.graph, seed=41)
    tensors = _on_gpu(inputs)
    tensors["w2"] = inputs["w2"]
    with pytest.raises(ts.InputError, match=r"\['w2'\] are not GPU arrays"):
        mlp(**tensors)


def test_small_inputs_and_outputs_at_new_addresses_are_staged_and_replay_one_graph() -> None:
    """A generate loop passes a new token tensor at every step and keeps what it returns (so small outputs, a
    cache's counters, come at new addresses too): once met at a new address, the ids are copied into the workspace
    before each replay and the small output out of it after, so the same graph replays (not one re-pointed per
    step), and each call still reads its own ids, also when they are written on the stream after the call."""
    g = ts.Graph("step")
    ids, table = g.input("ids", (1, 4), "int32"), g.input("table", (1000, 256), "float16")
    rows = nn.embedding(table, ids)
    g.output("y", nn.rms_norm(rows, g.input("gain", (256,), "float16")))
    g.output("total", rows.cast("float32").sum(-1))
    program = ts.compile(g, profile=False, seed=0)
    weights = _on_gpu({name: array for name, array in random_inputs(g, seed=5).items() if name != "ids"})
    out = torch.empty((1, 4, 256), dtype=torch.float16, device="cuda")
    draws = [np.random.default_rng(i).integers(0, 1000, (1, 4)).astype(np.int32) for i in range(8)]
    kept = []
    for step, draw in enumerate(draws):
        tensor = torch.from_numpy(draw).cuda()
        if step == len(draws) - 1:                # the last ids written behind a sleeping kernel, after the call
            later, tensor = tensor, torch.zeros_like(tensor)
            torch.cuda._sleep(SLEEP_CYCLES)
            tensor.copy_(later)
        outputs = program(ids=tensor, **weights, out={"y": out})
        kept.append((tensor, outputs["total"]))   # every step's ids and totals at addresses of their own
        torch.cuda.synchronize()
        expected = ts.evaluate(g, {"ids": draw, **{n: w.cpu().numpy() for n, w in weights.items()}})
        assert np.abs(out.cpu().float().numpy() - expected["y"]).max() < 2e-2, f"step {step}"
        assert np.allclose(outputs["total"].cpu().numpy(), expected["total"], rtol=1e-3, atol=1e-2), f"step {step}"
    assert len({total.data_ptr() for _, total in kept}) == len(draws)
    caller = program.gpu_state["device_caller"]
    assert caller.graphs_made == 2     # the first call's addresses, then the staged ids' and totals' graph
