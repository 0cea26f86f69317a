"""The benchmark suite's case files: each builds, names are unique, floors are counted right, and (where PyTorch
is installed) each graph computes what its PyTorch reference computes, in the reference interpreter."""
from __future__ import annotations

import importlib
import math

import numpy as np
import pytest

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.bench import Case, DeferredCase
from tensorsmith.bench.case import FAMILIES, CaseError, built, load_suite, select

CASES = load_suite()


def test_the_suite_covers_every_family_the_issue_lists() -> None:
    names = {c.name for c in CASES}
    assert {c.family for c in CASES} == set(FAMILIES)
    assert {"softmax", "rmsnorm", "layernorm", "swiglu_gate", "rmsnorm_linear_16", "gated_mlp_128", "gated_mlp_2048",
            "lora_128", "gpt2_mlp_4096", "attention_prefill_causal", "attention_decode_gqa", "attention_decode_mha",
            "llama_block_2048", "llama_block_128", "llama_block_16", "gpt2_block"} <= names
    matmuls = [c for c in CASES if c.family == "matmul"]
    assert len(matmuls) == 18     # M in (16, 128, 4096) x three (N, K) x two dtypes
    assert {c.graph.inputs["w"].dtype.value for c in matmuls} == {"float16", "bfloat16"}


def test_a_lookups_floor_counts_the_rows_it_reads_and_no_contraction() -> None:
    g = ts.Graph("lookup")
    g.output("y", nn.embedding(g.input("table", (50257, 768), "float16"), g.input("ids", (512,), "int32")))
    case = Case(g, reference=lambda table, ids: table[ids], family="model")
    assert case.matmul_flops() == 0
    assert case.bytes_moved() == 2 * 512 * 768 + 4 * 512 + 2 * 512 * 768    # rows read, ids, output


def test_weights_are_in_pytorch_layout_and_drawn_at_fan_in_scale() -> None:
    case = next(c for c in CASES if c.name == "matmul_16x11008x4096_fp16")
    assert case.graph.inputs["w"].shape == (11008, 4096)          # (out, in), as nn.Linear holds it
    assert case.input_std("w") == pytest.approx(1 / math.sqrt(4096))
    assert case.input_std("x") == 1.0


def test_floors_count_contractions_and_bytes() -> None:
    matmul = next(c for c in CASES if c.name == "matmul_4096x4096x11008_fp16")
    assert matmul.matmul_flops() == 2 * 4096 * 4096 * 11008
    assert matmul.bytes_moved() == 2 * (4096 * 11008 + 4096 * 11008 + 4096 * 4096)
    rmsnorm = next(c for c in CASES if c.name == "rmsnorm")
    assert rmsnorm.matmul_flops() == 0          # its sum of x * x is no contraction
    # 1 PB/s of bandwidth and 1 PFLOP/s: the matmul term is the larger for a 4096 x 4096 x 11008 product
    assert matmul.floor_s(1e15, 1e15) == pytest.approx(2 * 4096 * 4096 * 11008 / 1e15)


def test_select_takes_names_families_and_prefixes_and_refuses_unknown_ones() -> None:
    assert [c.name for c in select(CASES, ["softmax"])] == ["softmax"]
    assert {c.family for c in select(CASES, ["attention"])} == {"attention"}
    assert {c.name for c in select(CASES, ["llama_block_*"])} == {"llama_block_2048", "llama_block_128",
                                                                   "llama_block_16"}
    with pytest.raises(CaseError, match="no benchmark case or family matches 'llama'"):
        select(CASES, ["llama"])


def test_a_case_with_a_std_for_an_unknown_input_is_refused() -> None:
    g = ts.Graph("tiny")
    g.output("y", nn.relu(g.input("x", (4,), "float32")))
    with pytest.raises(CaseError, match="unknown inputs"):
        Case(g, lambda x: x, "fused", std={"w": 0.1})
    with pytest.raises(CaseError, match="family"):
        Case(g, lambda x: x, "mlp")


def test_a_deferred_case_is_built_once_and_must_be_the_case_it_names() -> None:
    g = ts.Graph("tiny")
    g.output("y", nn.relu(g.input("x", (4,), "float32")))
    builds = []

    def build() -> Case:
        builds.append(1)
        return Case(g, lambda x: x, "fused")
    deferred = DeferredCase("tiny", "fused", build)
    assert built(deferred) is built(deferred) and len(builds) == 1
    with pytest.raises(CaseError, match="built as 'tiny'"):
        built(DeferredCase("other", "fused", build))
    with pytest.raises(CaseError, match="gives its own values"):
        Case(g, lambda x: x, "fused", std={"x": 0.1}, values=lambda torch, seed: {})


def test_the_imported_cases_are_listed_without_being_built() -> None:
    imported = [c for c in CASES if c.family == "imported"]
    assert [c.name for c in imported] == ["hf_llama", "hf_gpt2", "hf_bert"]
    assert all(isinstance(c, DeferredCase) and "case" not in vars(c) for c in imported)


def test_an_imported_case_computes_what_its_model_computes() -> None:
    """GPT-2 (the quickest to export) through the reference interpreter, on the case's own values: its token ids in
    the vocabulary and the module's float16 weights, against the module widened to float32."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    pytest.importorskip("transformers", reason="transformers is not installed")
    case = built(next(c for c in CASES if c.name == "hf_gpt2"))
    tensors, other = case.values(torch, 0), case.values(torch, 1)
    assert set(tensors) == set(case.graph.inputs)
    (ids,) = [name for name in tensors if not torch.equal(tensors[name], other[name])]   # the weights stay the model's
    assert 0 <= int(tensors[ids].min()) and int(tensors[ids].max()) < 1000 and len(set(tensors[ids].tolist()[0])) > 8
    ours = ts.evaluate(case.graph, {name: value.numpy() for name, value in tensors.items()})
    with torch.no_grad():
        widened = case.reference(**{k: v.float() if v.is_floating_point() else v for k, v in tensors.items()})
        half = case.reference(**tensors)
    assert half.dtype == torch.float16 and widened.dtype == torch.float32
    (name,) = case.graph.outputs
    error = np.linalg.norm(ours[name].astype(np.float64) - widened.double().numpy()) / widened.norm().item()
    assert error < 1e-2, f"the imported graph and its model differ (relative L2 {error:.3g})"


# ---- each graph against its PyTorch reference, in the reference interpreter, where torch is installed -----

# The reference interpreter computes in float64 on the CPU; the largest cases take minutes there, so they are
# checked through the same builders at smaller sizes where the builder takes one (same code, fewer rows).
SMALL = {"gated_mlp_2048": ("fused", "gated_mlp", 64), "gated_mlp_128": ("fused", "gated_mlp", 8),
         "scaled_gated_mlp_128": ("fused", "scaled_gated_mlp", 8),
         "lora_128": ("fused", "lora", 8), "gpt2_mlp_4096": ("fused", "gpt2_mlp", 64),
         "attention_prefill_causal": ("attention", "prefill_causal", (1, 2, 64)),
         "attention_prefill_gqa": ("attention", "prefill_gqa", (1, 8, 64)),
         "llama_block_2048": ("blocks", "llama_block", 24), "llama_block_128": ("blocks", "llama_block", 8),
         "gpt2_block": ("blocks", "gpt2_block", 16)}
FULL_SIZE_LIMIT = 3e9     # FLOPs + bytes above which a case is skipped here (its small twin stands for it)


def _cost(case: Case) -> float:
    return case.matmul_flops() + case.bytes_moved()


def _inputs(case: Case, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {name: (rng.standard_normal(node.shape) * case.input_std(name)).astype(np.float32)
            for name, node in case.graph.inputs.items()}


def _small(name: str) -> Case:
    module_name, builder, size = SMALL[name]
    module = importlib.import_module(f"tensorsmith.suite.{module_name}")
    full = next(c for c in CASES if c.name == name)
    return Case(getattr(module, builder)(size), full.reference, full.family, dict(full.std))


CHECKED = [c for c in CASES if isinstance(c, Case) and _cost(c) <= FULL_SIZE_LIMIT and c.name not in SMALL] + [
    _small(name) for name in SMALL]


@pytest.mark.parametrize("case", CHECKED, ids=[c.name for c in CHECKED])
def test_the_graph_computes_what_its_pytorch_reference_computes(case: Case) -> None:
    torch = pytest.importorskip("torch", reason="PyTorch is not installed: the references cannot run")
    inputs = _inputs(case, np.random.default_rng(0))
    ours = ts.evaluate(case.graph, inputs)
    with torch.no_grad():
        theirs = case.reference(**{k: torch.from_numpy(v).double() for k, v in inputs.items()})
    (name,) = case.graph.outputs
    expected = theirs.numpy()
    error = np.linalg.norm(ours[name] - expected) / np.linalg.norm(expected)
    assert error < 1e-4, f"{case.name}: the graph and its PyTorch reference differ (relative L2 {error:.3g})"
