"""The real-size Hugging Face cases (benchmarks/models/real.py) without a GPU: every model, shape and dtype is a row,
the depth series is named as reports expect, `bench --list` gives true parameter counts without building the models,
and a real-size case builds and runs on the CPU."""
from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest

from tensorsmith.bench import DeferredCase
from tensorsmith.bench.case import built, load_suite
from tensorsmith.cli import main

CASES = {case.name: case for case in load_suite()}
SHAPES = {"llama1b": ("d16", "p512", "p2048"), "qwen05b": ("d16", "p512", "p2048"), "gpt2": ("d16", "p512", "p1024"),
          "bert": ("d16", "p512")}
DEPTHS = ["llama1b_1layers", "llama1b_2layers", "llama1b_4layers", "llama1b_8layers", "llama1b_16layers",
          "llama1b_32layers"]
LLAMA_1B = 1_235_814_400          # Llama-3.2-1B's parameters, its embedding tied to its head
LLAMA_LAYER = (2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192 + 2 * 2048)   # q, o; k, v; the MLP; 2 norms


def _family(family: str) -> list[Any]:
    return [case for case in CASES.values() if case.family == family]


def _listed(capsys: pytest.CaptureFixture[str], *patterns: str) -> dict[str, str]:
    """`tensorsmith bench --list` run in-process: each row's size (a parameter count, or why there is none) by name."""
    assert main(["bench", "--list", *patterns]) == 0
    rows = {}
    for line in capsys.readouterr().out.splitlines():
        name, _, rest = line.split(maxsplit=2)
        rows[name] = rest if "GFLOP" in rest else rest.split("  ")[0]    # a size in params, or words: then the note
    return rows


def test_every_model_is_a_row_at_each_of_its_shapes_in_each_dtype() -> None:
    expected = {f"{model}_{shape}_{dtype}" for model, shapes in SHAPES.items() for shape in shapes
                for dtype in ("fp16", "bf16")} | {f"{model}_p512_fp32" for model in SHAPES} | {"mixtral_p512_fp16"}
    models = _family("model")
    assert {case.name for case in models} == expected and len(models) == len(expected) == 27
    assert all(isinstance(case, DeferredCase) and case.parameters is not None and "case" not in vars(case)
               for case in models)
    assert CASES["llama1b_p512_fp16"].note == "Llama-3.2-1B's shape, 2 of its 16 layers, prefill of 512 tokens, float16"
    assert CASES["gpt2_d16_bf16"].note.startswith("GPT-2 124M's shape, 2 of its 12 layers, decode-like 16 tokens")


def test_the_depth_series_is_llama_at_1_to_32_layers() -> None:
    depth = _family("depth")
    assert [case.name for case in depth] == DEPTHS
    assert all(isinstance(case, DeferredCase) and "512 tokens, float16" in case.note for case in depth)
    assert [case.note.split(",")[1].strip() for case in depth] == [
        f"{layers} of its 16 layers" for layers in (1, 2, 4, 8, 16)] + ["32 layers (its own are 16)"]


def test_no_row_runs_a_model_past_its_positions() -> None:
    pytest.importorskip("transformers", reason="transformers is not installed")
    from tensorsmith.suite.real import MODELS

    for case in _family("model"):
        model, shape, _ = case.name.split("_")
        assert int(shape[1:]) <= MODELS[model].config(2).max_position_embeddings, case.name


def test_list_gives_each_real_model_its_parameter_count(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch", reason="PyTorch is not installed")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    rows = _listed(capsys, "model", "depth", "imported")
    assert set(rows) == {case.name for case in [*_family("model"), *_family("depth"), *_family("imported")]}
    assert all(rows[case.name].endswith(" params") for case in [*_family("model"), *_family("depth")])
    assert rows["hf_gpt2"] == "(built when run)"          # the toy rows give no count
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2))       # built for real, on the CPU
    count = sum(p.numel() for p in gpt2.parameters())
    assert CASES["gpt2_d16_fp16"].parameters() == count == 53_561_088
    assert rows["gpt2_d16_fp16"] == rows["gpt2_p512_fp32"] == f"{count / 1e6:.1f} M params" == "53.6 M params"
    assert CASES["llama1b_16layers"].parameters() == pytest.approx(1.2358e9, rel=1e-3)
    mixtral_layer = 8 * 3 * 4096 * 14336 + 2 * 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 8 + 2 * 4096  # experts, router
    assert CASES["mixtral_p512_fp16"].parameters() == 2 * 32000 * 4096 + 4096 + 2 * mixtral_layer   # 46.7 B at 32
    assert CASES["llama1b_16layers"].parameters() == LLAMA_1B and rows["llama1b_16layers"] == "1.24 B params"
    counts = [CASES[name].parameters() for name in DEPTHS]
    assert [b - a for a, b in zip(counts, counts[1:])] == [LLAMA_LAYER, 2 * LLAMA_LAYER, 4 * LLAMA_LAYER,
                                                          8 * LLAMA_LAYER, 16 * LLAMA_LAYER]


def test_list_says_what_counting_needs_where_it_is_missing(capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorsmith.suite import real

    monkeypatch.setitem(sys.modules, "transformers", None)      # importing it now raises ImportError
    real.parameter_count.cache_clear()
    try:
        rows = _listed(capsys, "gpt2_d16_fp16", "llama1b_16layers", "softmax")
    finally:
        real.parameter_count.cache_clear()
    assert rows["gpt2_d16_fp16"] == rows["llama1b_16layers"] == "(needs torch and transformers)"
    assert "GFLOP" in rows["softmax"]


@pytest.fixture(scope="module")
def gpt2_case() -> Any:
    pytest.importorskip("torch", reason="PyTorch is not installed")
    pytest.importorskip("transformers", reason="transformers is not installed")
    return built(CASES["gpt2_d16_fp16"])


def test_a_real_size_case_builds_without_a_gpu(gpt2_case: Any) -> None:
    import torch

    inputs = gpt2_case.graph.inputs
    shapes = {(node.shape, node.dtype.value) for node in inputs.values()}
    assert {((1, 16), "int32"), ((50257, 768), "float16"), ((1024, 768), "float16"),
            ((768, 2304), "float16")} <= shapes            # the ids, the embeddings, a layer's attention
    assert sum(1 for node in inputs.values() if node.shape == (768, 2304)) == 2        # 2 layers, not 12
    tensors, other = gpt2_case.values(torch, 0), gpt2_case.values(torch, 1)
    assert set(tensors) == set(inputs)
    (ids,) = [name for name in tensors if not torch.equal(tensors[name], other[name])]   # the weights stay the model's
    drawn = tensors[ids]
    assert inputs[ids].shape == (1, 16) and drawn.dtype == torch.int32 and drawn.shape == (1, 16)
    assert 0 <= int(drawn.min()) and int(drawn.max()) < 50257 and len(set(drawn.tolist()[0])) > 8
    assert int(drawn.max()) >= 1000              # drawn from the whole vocabulary, not the toy cases' 1000 ids


def test_a_real_size_case_runs_its_reference_on_the_cpu(gpt2_case: Any) -> None:
    import torch

    tensors = gpt2_case.values(torch, 0)
    with torch.no_grad():
        widened = gpt2_case.reference(**{k: v.float() if v.is_floating_point() else v for k, v in tensors.items()})
        half = gpt2_case.reference(**tensors)
    assert widened.shape == half.shape == (1, 16, 50257)
    assert widened.dtype == torch.float32 and half.dtype == torch.float16      # the truth left the model in float16
    assert torch.isfinite(widened).all()
    error = (half.float() - widened).norm() / widened.norm()
    assert error < 1e-2, f"the float16 model and its float32 copy differ (relative L2 {error:.3g})"


def test_a_real_size_case_gives_the_model_to_torch_compile_with_our_backend(gpt2_case: Any) -> None:
    import torch

    calls: dict[str, Any] = {}

    def fake_compile(module: Any, backend: str) -> Any:
        calls.update(module=module, backend=backend)
        return lambda ids: calls.setdefault("ids", ids)
    run = gpt2_case.backend(SimpleNamespace(compile=fake_compile))
    tensors, other = gpt2_case.values(torch, 0), gpt2_case.values(torch, 1)
    (ids,) = [name for name in tensors if not torch.equal(tensors[name], other[name])]
    run(**tensors)
    assert calls["backend"] == "tensorsmith"
    assert {p.dtype for p in calls["module"].parameters()} == {torch.float16}     # the model in the case's dtype
    assert calls["ids"].dtype == torch.long and torch.equal(calls["ids"], tensors[ids].long())
