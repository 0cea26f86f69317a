"""The bench's reading of a baseline's profile: kernel classes, and the checks that a baseline ran the path its users
get. The profiles in data/ were recorded on the H200 by benchmarks/baseline_profiles.py (the Llama block at 2048
tokens, q, k and v given to SDPA as 3-D and as 4-D tensors, eager and through torch.compile)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tensorsmith.bench.case import half_precision_contractions
from tensorsmith.bench.profile import Profile, kernel_class, slow_path
from tensorsmith.suite.algebra import linear_attention
from tensorsmith.suite.blocks import llama_block
from tensorsmith.suite.memory_bound import softmax

RECORDED = json.loads((Path(__file__).parent / "data" / "llama_block_profiles.json").read_text())["profiles"]


def recorded(name: str) -> Profile:
    return Profile(**RECORDED[name])


@pytest.mark.parametrize("name", ["3d_eager", "3d_compile"])
def test_attention_on_sdpas_slow_path_is_flagged(name: str) -> None:
    reason = slow_path(recorded(name), calls_sdpa=True, half_precision_matmuls=True)
    assert reason is not None and ("math path" in reason or "no fused attention kernel" in reason)


@pytest.mark.parametrize("name", ["4d_eager", "4d_compile"])
def test_the_fused_attention_users_get_is_not_flagged(name: str) -> None:
    assert slow_path(recorded(name), calls_sdpa=True, half_precision_matmuls=True) is None
    assert "attention" in recorded(name).by_class()


def test_eager_math_path_is_named_by_its_op() -> None:
    """The eager 3-D profile shows SDPA's math op; the compiled one only lacks a fused kernel."""
    assert "math path" in slow_path(recorded("3d_eager"), calls_sdpa=True, half_precision_matmuls=True)
    assert "no fused attention" in slow_path(recorded("3d_compile"), calls_sdpa=True, half_precision_matmuls=True)


def test_without_sdpa_in_the_reference_missing_attention_is_not_a_fault() -> None:
    """A model that computes attention's math itself (BERT's import path, say) is not asked for a fused kernel;
    its float32 FFMA products are still caught by the tensor-core check."""
    math_path = recorded("3d_compile")
    assert slow_path(math_path, calls_sdpa=False, half_precision_matmuls=False) is None
    assert "without tensor cores" in slow_path(math_path, calls_sdpa=False, half_precision_matmuls=True)


def test_kernel_classes_of_recorded_kernels() -> None:
    classes = {name: kernel_class(name) for profile in RECORDED.values() for name in profile["kernels"]}
    assert classes["nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_TNT"] == "matmul"
    cudnn = next(n for n in classes if n.startswith("cudnn_generated_fort_native_sdpa"))
    assert classes[cudnn] == "attention"
    # Inductor names a kernel after every op it fused: a pointwise one that prepares cuDNN's attention is pointwise
    prepare = next(n for n in classes if n.startswith("triton_poi_fused__scaled_dot_product_cudnn_attention"))
    assert classes[prepare] == "elementwise"
    assert classes["triton_red_fused__fused_rms_norm_0"] == "normalisation"
    assert kernel_class("Memcpy DtoD (Device -> Device)") == "copy"
    assert kernel_class("some_kernel_nobody_named") == "other"


def test_by_class_sums_each_class() -> None:
    profile = Profile({"nvjet_sm90_a": 10.0, "nvjet_sm90_b": 5.0, "triton_poi_fused_add_0": 2.0})
    assert profile.by_class() == {"matmul": 15.0, "elementwise": 2.0}


def test_a_16_bit_matmul_on_matrix_vector_kernels_is_flagged_and_a_small_float32_one_is_not() -> None:
    gemv = Profile({"void gemv2T_kernel_val<int, int, __half, __half, float, 128, 16, 4, 4>": 40.0})
    assert "without tensor cores" in slow_path(gemv, calls_sdpa=False, half_precision_matmuls=True)
    assert slow_path(gemv, calls_sdpa=False, half_precision_matmuls=False) is None   # a float32 product may
    rope = Profile({"nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_TNT": 300.0, "gemmk1_kernel<float>": 3.0})
    assert slow_path(rope, calls_sdpa=False, half_precision_matmuls=True) is None    # RoPE's float32 outer product


def test_which_graphs_multiply_16_bit_matrices() -> None:
    assert half_precision_contractions(llama_block(16, width=64, heads=2, ffn=96))
    assert half_precision_contractions(linear_attention())
    assert not half_precision_contractions(softmax())
