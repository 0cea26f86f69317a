"""The random tests' parts: inputs drawn per dtype, the relative L2 error, and the draws remembered between calls."""
from __future__ import annotations

import numpy as np
import pytest
from graph_cases import CASES, residual_layers

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.ir.dtypes import DType, bfloat16_to_float, float_to_bfloat16
from tensorsmith.ir.kernel_program import ExecutionMemo
from tensorsmith.search.partition import partition, unfused
from tensorsmith.search.verify import (LARGE_DRAW, ROUNDING_NOISE, InconclusiveError, VerificationError, compare,
                                       example_draw, random_inputs, reference_draw, relative_l2, rounding_noise,
                                       verify_program)


def test_inputs_are_rounded_to_their_dtype_and_never_zero() -> None:
    g = ts.Graph("dtypes")
    for dtype in ("float16", "bfloat16", "float32"):
        g.output(f"y_{dtype}", g.input(f"x_{dtype}", (64, 64), dtype) * 2.0)
    inputs = random_inputs(g, seed=3)
    assert inputs["x_float16"].dtype == np.float16 and inputs["x_float32"].dtype == np.float32
    bf16 = inputs["x_bfloat16"]     # held as float32 values that bfloat16 represents exactly
    assert bf16.dtype == np.float32 and np.array_equal(bfloat16_to_float(float_to_bfloat16(bf16)), bf16)
    assert all(np.count_nonzero(array) == array.size for array in inputs.values())
    assert not np.array_equal(inputs["x_float32"], random_inputs(g, seed=4)["x_float32"])   # fresh per seed


@pytest.mark.parametrize("narrow", ["float16", "bfloat16"])
def test_16_bit_inputs_are_drawn_from_the_normal_at_their_scale(narrow: str) -> None:
    g = ts.Graph("normal")
    x, w = g.input("x", (256, 512), narrow), g.input("w", (512, 1024), narrow)
    g.output("y", x @ w)
    inputs = random_inputs(g, seed=7)
    for name, scale in (("x", 1.0), ("w", 512 ** -0.5)):
        values = inputs[name].astype(np.float64).ravel() / scale
        assert abs(values.mean()) < 0.01 and values.std() == pytest.approx(1.0, abs=0.01)
        assert np.mean(np.abs(values) < 1) == pytest.approx(0.6827, abs=0.005)    # the normal's mass within 1 sigma
        assert np.mean(np.abs(values) < 2) == pytest.approx(0.9545, abs=0.005)
        assert len(np.unique(values)) > 2000   # (bfloat16 has about 2600 values within 4.3 sigma)
    assert not np.array_equal(inputs["x"][:, :256], inputs["w"][:256, :256])


def test_drawing_many_arrays_at_once_gives_each_the_values_its_own_generators_give() -> None:
    """Chunk i of the array keyed k is drawn from a generator seeded (seed, k, i), whatever else is drawn with it
    and on however many cores."""
    from functools import partial
    from tensorsmith.ir.host_arrays import CHUNK, drawn_many
    from tensorsmith.search.verify import _normal
    values = partial(_normal, factor=np.float32(0.5), dtype=DType.FLOAT16)
    requests = [((3, CHUNK // 2), 1, values, np.float16), ((7,), 2, values, np.float16), ((5, 5), 9, values, np.float16)]
    for together, (shape, key, made, _) in zip(drawn_many(11, requests), requests):
        size = int(np.prod(shape))
        alone = np.concatenate([made(np.random.default_rng([11, key, i]), min(CHUNK, size - start))
                                for i, start in enumerate(range(0, size, CHUNK))])
        np.testing.assert_array_equal(together.reshape(-1), alone)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_relative_l2_is_the_norm_of_the_difference_and_leaves_its_arguments(dtype) -> None:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((300, 7)).astype(dtype)
    out = (ref + 1e-3 * rng.standard_normal(ref.shape)).astype(dtype)
    kept_out, kept_ref = out.copy(), ref.copy()
    expected = np.linalg.norm(out.astype(np.float64) - ref.astype(np.float64)) / np.linalg.norm(ref.astype(np.float64))
    assert relative_l2(out, ref) == pytest.approx(expected, rel=1e-12)
    assert np.array_equal(out, kept_out) and np.array_equal(ref, kept_ref)


def test_relative_l2_of_non_finite_values() -> None:
    ref = np.array([1.0, np.inf, 2.0])
    assert relative_l2(np.array([1.0, np.inf, 2.5]), ref) == pytest.approx(0.5 / np.sqrt(5.0))  # infinities agree
    assert np.isnan(relative_l2(np.array([1.0, 3.0, 2.0]), ref))          # a finite value where inf is expected
    assert np.isnan(relative_l2(np.array([np.nan, 1.0]), np.array([1.0, 1.0])))
    assert relative_l2(np.zeros(3), np.ones(2)) == np.inf                 # shapes differ


def test_a_remembered_draw_is_not_evaluated_again() -> None:
    graph = CASES["many_short_rows"]()
    memo: dict = {}
    first = reference_draw(graph, seed=1, draw=0, memo=memo)
    assert first is not None and memo[0] is first and reference_draw(graph, 1, 0, memo=memo) is first
    inputs, reference = first
    assert set(inputs) == set(graph.inputs) and set(reference) == set(graph.outputs)


def _swiglu_mlp(tokens: int = 128, width: int = 4096, hidden: int = 11008) -> ts.Graph:
    """Llama-7B's MLP as users write it: weights (out, in), unscaled in the graph."""
    from tensorsmith import nn
    g = ts.Graph("swiglu_mlp")
    x = g.input("x", (tokens, width), "float16")
    w1, w3 = g.input("w1", (hidden, width), "float16"), g.input("w3", (hidden, width), "float16")
    w2 = g.input("w2", (width, hidden), "float16")
    g.output("y", nn.linear(nn.silu(nn.linear(x, w1)) * nn.linear(x, w3), w2))
    return g


def test_weight_matrices_are_drawn_at_fan_in_scale_and_activations_are_not() -> None:
    from tensorsmith import nn
    from tensorsmith.search.verify import weight_scales
    assert weight_scales(_swiglu_mlp(8, 64, 256)) == pytest.approx({"w1": 64**-0.5, "w3": 64**-0.5, "w2": 256**-0.5})
    g = ts.Graph("attention_and_two_products")
    q, k, v = (g.input(name, (2, 16, 32), "float16") for name in "qkv")
    x, w = g.input("x", (16, 32), "float16"), g.input("w", (32, 32), "float16")
    g.output("a", nn.attention(q, k, v))             # k and v are activations, not weight matrices
    g.output("y", (x @ w) @ w)
    scales = weight_scales(g)
    assert set(scales) == {"w"} and scales["w"] == pytest.approx(32**-0.5)
    inputs = random_inputs(g, seed=3)
    assert np.std(inputs["w"]) == pytest.approx(32**-0.5, rel=0.1) and np.std(inputs["x"]) == pytest.approx(1, rel=0.1)



def test_a_decode_steps_one_row_products_draw_their_weights_at_fan_in_scale_too() -> None:
    """A decode step multiplies one row by each weight: at scale 1 its Llama-3.2-1B-sized MLP (2048 x 8192) gave
    inf in float16 on every draw, and the compile gave up on random tests."""
    from tensorsmith.search.verify import weight_scales
    graph = _swiglu_mlp(1, 2048, 8192)
    assert weight_scales(graph) == pytest.approx({"w1": 2048**-0.5, "w3": 2048**-0.5, "w2": 8192**-0.5})
    assert np.isfinite(ts.evaluate(graph, random_inputs(graph, seed=0))["y"]).all()


def test_an_overflow_in_a_matrix_product_is_named_where_it_happens() -> None:
    """A product's broadcast operands are never computed by the evaluation; the product's overflow is still found
    at the product, not lost (it was: no site named)."""
    from tensorsmith.search.verify import overflow_site
    g = ts.Graph("overflowing_product")
    x, w = g.input("x", (4, 64), "float16"), g.input("w", (64, 8), "float16")
    g.output("y", (x @ w).exp())
    site = overflow_site(g, {"x": np.full((4, 64), 100, np.float16), "w": np.full((64, 8), 100, np.float16)})
    assert site.startswith(", first at sum (float16, shape (4, 8)) from") and "test_verify.py" in site

def test_a_realistic_float16_mlp_is_not_rejected_by_verification() -> None:
    """With every input N(0, 1), this MLP's float16 product reached about 3e5 (float16 stops at 65504) while the
    float64 reference did not, and every candidate failed verification (issue 17); at fan-in scale it compiles."""
    graph = _swiglu_mlp()
    inputs = random_inputs(graph, seed=0)
    unscaled = {name: np.random.default_rng(0).standard_normal(a.shape).astype(np.float16) for name, a in inputs.items()}
    assert np.abs(ts.evaluate(graph, unscaled)["y"]).max() > np.finfo(np.float16).max   # what used to be drawn
    assert np.abs(ts.evaluate(graph, inputs)["y"]).max() < 100
    program = ts.compile(graph, budget_s=5, profile=False, cache=False)
    assert program.report["checks"] and all(c["relative_l2"] <= c["tolerance"] for c in program.report["checks"])


def _cancelling_mean(scale: float = 1.0) -> ts.Graph:
    """The bfloat16 mean of 800 standard normal values (the fuzzer's seed 363), summed one axis at a time with each
    partial sum stored in bfloat16: the mean is near zero, the partial sums are not, so what the graph's own
    rounding leaves of it differs from the float64 reference by more than bfloat16's tolerance."""
    g = ts.Graph("cancelling_mean")
    g.output("out", g.input("x", (2, 16, 5, 5), "bfloat16").mean() * scale)
    return g


def test_an_output_that_cancels_is_judged_against_the_graphs_own_rounding_noise() -> None:
    graph = _cancelling_mean()
    program = partition(graph)
    noisy = []
    for draw in range(4):
        inputs = random_inputs(graph, draw)
        reference = ts.evaluate(graph, inputs)
        outputs = program.execute(inputs)
        plain, allowed = compare(graph, outputs, reference), compare(graph, outputs, reference, inputs)
        assert all(c.ok for c in allowed)
        noise = rounding_noise(graph, inputs, reference)["out"]
        if not all(c.ok for c in plain):   # rejected by the dtype's tolerance alone, within the noise
            noisy.append(noise)
            assert plain[0].error <= ROUNDING_NOISE * noise
    assert noisy, "no draw of this graph cancels: the test shows nothing"
    verify_program(graph, program, seed=0, draws=4)   # raises if the noise allowance were not applied


def test_a_wrong_program_is_not_excused_by_rounding_noise() -> None:
    graph = _cancelling_mean()
    wrong = partition(_cancelling_mean(scale=1.5))   # the same inputs and output, a different function
    with pytest.raises(VerificationError):
        verify_program(graph, wrong, seed=0, draws=4)


def test_a_well_conditioned_output_has_rounding_noise_near_its_dtypes_precision() -> None:
    g = ts.Graph("norm")
    x = g.input("x", (64, 256), "bfloat16")
    g.output("y", nn.rms_norm(x, g.input("w", (256,), "bfloat16")))
    inputs = random_inputs(g, 1)
    assert rounding_noise(g, inputs, ts.evaluate(g, inputs))["y"] < 2 ** -7   # bfloat16 keeps 8 bits


def test_a_draw_within_rounding_noise_only_is_followed_by_another_up_to_max_draws() -> None:
    """On one draw the cancelling mean matches only within its rounding noise, which alone shows nothing: with room for
    more draws, verification makes them until one meets the plain tolerance, as a search short of budget asks."""
    graph = _cancelling_mean()
    program = partition(graph)
    plain = [all(c.ok for c in compare(graph, program.execute(i), ts.evaluate(graph, i)))
             for i in (random_inputs(graph, seed) for seed in range(4))]
    first_noisy = plain.index(False)   # a draw that is within noise only
    strict_after = plain.index(True, first_noisy)
    with pytest.raises(VerificationError, match="rounding noise"):
        verify_program(graph, program, seed=first_noisy, draws=1)
    verify_program(graph, program, seed=first_noisy, draws=1, max_draws=strict_after - first_noisy + 1)


def test_the_large_draw_has_a_key_of_its_own_whatever_the_number_of_ordinary_draws() -> None:
    graph = ts.Graph("softmax_rows")
    graph.output("y", nn.softmax(graph.input("x", (8, 64), "float32")))
    program, memo = partition(graph), {}
    verify_program(graph, program, seed=0, draws=1, large=True, memo=memo)
    verify_program(graph, program, seed=0, draws=2, large=True, memo=memo)
    assert np.abs(memo[1][0]["x"]).max() < 10 < np.abs(memo[LARGE_DRAW][0]["x"]).max()   # normal, then +-80


def test_an_output_that_is_all_rounding_noise_is_not_held_to_the_gpu_checks_cap() -> None:
    """The mean of layer-normed rows is 0 in the reals: its float64 reference is about 1e-17, any float program's
    output about 1e-6, so its relative error is huge and its rounding noise as large; capping the allowance (as the
    GPU check does, at 0.1) would reject every right program of it."""
    g = ts.Graph("normed_mean")
    g.output("m", nn.layer_norm(g.input("x", (8, 16), "float32")).mean(-1))
    inputs = random_inputs(g, 0)
    reference = ts.evaluate(g, inputs)
    outputs = partition(g).execute(inputs)
    assert rounding_noise(g, inputs, reference)["m"] >= 1.0
    assert all(c.ok for c in compare(g, outputs, reference, inputs, max_allowance=0.1))


def _overflowing(scale: float) -> ts.Graph:
    """exp(scale * x) in float16: past exp(11.1) the output overflows float16 where the float64 reference does not."""
    g = ts.Graph(f"exp_{scale:g}x")
    g.output("y", (g.input("x", (64,), "float16") * scale).exp())
    return g


def test_a_draw_on_which_the_graph_overflows_its_own_dtypes_is_inconclusive_not_a_failure() -> None:
    """Standard normal x puts exp(30 x) past float16 on every draw: the graph as written gives inf, so the right
    program's inf is no evidence either way; verification says so (InconclusiveError) rather than rejecting it."""
    graph = _overflowing(30.0)
    with pytest.raises(InconclusiveError, match="overflows its own dtypes on every random draw") as raised:
        verify_program(graph, partition(graph), seed=0)
    assert "first at exp2 (float16, shape (64,)) from" in str(raised.value)   # where, in the user's code
    assert "test_verify.py" in str(raised.value)


def test_an_inconclusive_draw_is_made_up_for_by_another_that_still_catches_a_wrong_program() -> None:
    graph = _overflowing(2.0)
    memo = {0: example_draw(graph, {"x": np.full(64, 6.0, np.float16)})}   # exp(12) > 65504: inconclusive
    checks = verify_program(graph, partition(graph), seed=0, draws=1, memo=memo)
    assert len(memo) == 2 and checks[0].ok and not checks[0].inconclusive   # judged on draw 1
    wrong = ts.Graph(graph.name)
    wrong.output("y", (wrong.input("x", (64,), "float16") * 2.2).exp())
    with pytest.raises(VerificationError, match="disagrees"):
        verify_program(graph, partition(wrong), seed=0, draws=1, memo=memo)


def test_example_inputs_are_the_first_draw_every_candidate_is_tested_on() -> None:
    """On random draws exp(30 x) overflows float16 and only the exact check can show its program right (no float
    checks in the report); on the user's examples, at the scale it is used at, the float checks judge it."""
    graph = _overflowing(30.0)
    examples = {"x": np.random.default_rng(3).uniform(-0.3, 0.3, 64).astype(np.float16)}
    unaided = ts.compile(graph, profile=False, cache=False, budget_s=2)
    assert unaided.report["checks"] == [] and unaided.report["exact"]["draws"] >= 1
    assert "overflows its own dtypes" in unaided.report["left_out"]["random tests"]
    guided = ts.compile(graph, profile=False, cache=False, budget_s=2, example_inputs=examples)
    assert guided.report["checks"] and all(c["relative_l2"] <= c["tolerance"] for c in guided.report["checks"])
    assert guided.report["tested_on"].startswith("the example inputs")


def test_example_inputs_of_the_wrong_shape_are_named_before_the_search() -> None:
    graph = _overflowing(1.0)
    with pytest.raises(ts.InputError, match=r"input 'x' of graph 'exp_1x': expected shape \(64,\)"):
        ts.compile(graph, profile=False, cache=False, example_inputs={"x": np.zeros(3, np.float16)})


def test_a_program_verified_on_other_examples_is_not_taken_from_the_cache(tmp_path) -> None:
    graph = _overflowing(1.0)
    first = {"x": np.linspace(-1, 1, 64).astype(np.float16)}
    ts.compile(graph, profile=False, cache_dir=tmp_path, budget_s=1, example_inputs=first, progress=False)
    stages: list[object] = []
    ts.compile(graph, profile=False, cache_dir=tmp_path, budget_s=1, example_inputs=first, progress=stages.append)
    assert stages == ["cache"]
    stages.clear()
    ts.compile(graph, profile=False, cache_dir=tmp_path, budget_s=1, progress=stages.append,
               example_inputs={"x": np.linspace(-2, 2, 64).astype(np.float16)})
    assert "cache" not in stages and "search" in stages


def test_a_graph_no_program_can_match_says_which_output_and_by_how_much() -> None:
    """layer_norm of rows that log_softmax made all equal: the output is rounding noise amplified by 1/sqrt(var),
    which no program reproduces; the error names the output, the error against its tolerance, and why: the graph
    itself, in its own dtypes, is as far from the exact value as the value is large."""
    import pytest
    import tensorsmith as ts
    from tensorsmith import nn
    from tensorsmith.search.verify import VerificationError
    g = ts.Graph("noise")
    x0 = g.input("x0", (7, 32), "bfloat16")
    g.output("y", nn.layer_norm(nn.log_softmax(x0.reshape((7, 32, 1)).expand((7, 32, 31)), axis=-1)))
    with pytest.raises(VerificationError, match=r"the last: .*output 'y'.*relative L2 error.*output 'y' is "
                                                r"dominated by rounding.*compute that part in float32"):
        ts.compile(g, budget_s=5, cache=False, profile=False, progress=False)


def test_a_kernel_run_before_on_the_same_inputs_is_not_run_again_and_changes_nothing() -> None:
    """Programs of one graph share most kernels: with an execution memo, a kernel whose body and inputs' provenance
    were run before gives its stored outputs, and every program's outputs are the ones it gives alone. Identical
    layers with weights of their own compute alike from other buffers: none of them is taken for another."""
    graph = residual_layers(4)
    inputs = random_inputs(graph, 0)
    fused, split = partition(graph), unfused(graph)
    memo = ExecutionMemo(1 << 30)
    alone = {id(program): program.execute(inputs)["y"] for program in (fused, split)}
    assert np.array_equal(fused.execute(inputs, memo)["y"], alone[id(fused)]) and memo.hits == 0
    assert np.array_equal(split.execute(inputs, memo)["y"], alone[id(split)])
    shared = memo.hits      # the kernels the two partitions have in common: a norm's, perhaps, not every one
    assert shared < len(split.kernels)
    assert np.array_equal(fused.execute(inputs, memo)["y"], alone[id(fused)])
    assert memo.hits == shared + len(fused.kernels)
    assert not np.array_equal(alone[id(fused)], fused.execute(random_inputs(graph, 1), ExecutionMemo(1 << 30))["y"])


def test_the_execution_memo_holds_no_more_than_its_bytes() -> None:
    graph = residual_layers(4)
    inputs, program = random_inputs(graph, 0), partition(graph)
    small = ExecutionMemo(3 * 64 * 256 * 4)      # three of the layers' (64, 256) float32 values
    program.execute(inputs, small)
    assert 0 < small.held <= small.max_bytes
    assert np.array_equal(program.execute(inputs, small)["y"], program.execute(inputs)["y"])


def test_a_wrong_program_is_caught_after_right_ones_filled_the_memo() -> None:
    graph = _cancelling_mean()
    executions: dict[int, ExecutionMemo] = {}
    memo: dict = {}
    verify_program(graph, partition(graph), seed=0, draws=2, memo=memo, executions=executions)
    verify_program(graph, unfused(graph), seed=0, draws=2, memo=memo, executions=executions)
    with pytest.raises(VerificationError):
        verify_program(graph, partition(_cancelling_mean(scale=1.5)), seed=0, draws=2, memo=memo,
                       executions=executions)
