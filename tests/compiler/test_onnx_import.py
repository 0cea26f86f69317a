"""from_onnx: ONNX models (built here with onnx.helper, and exported by torch.onnx where PyTorch is installed) lowered,
compiled and matched against onnx's own reference implementation on the same inputs."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx package is not installed: from_onnx needs it")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from tensorsmith.onnx_import import OnnxImportError, from_onnx, import_onnx  # noqa: E402
from tensorsmith.suite.imported import SMALL_MODULES  # noqa: E402

QUICK = {"budget_s": 3.0, "profile": False, "cache": False, "progress": False}
HF_IDS = [f"{family}_{'layer' if layer else 'model'}" for family, layer in SMALL_MODULES]
RNG = np.random.default_rng(0)


def _model(nodes: list, inputs: list, outputs: list, initializers: dict[str, np.ndarray], opset: int = 20):
    graph = helper.make_graph(nodes, "model", inputs, outputs,
                              [numpy_helper.from_array(a, name) for name, a in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


def _mlp():
    """LayerNorm, a Gemm with bias, exact GELU, a MatMul, a Softmax: a transformer's MLP head."""
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["h"], axis=-1, epsilon=1e-5),
             helper.make_node("Gemm", ["h", "w1", "b1"], ["u"], transB=1),
             helper.make_node("Gelu", ["u"], ["a"]),
             helper.make_node("MatMul", ["a", "w2"], ["z"]),
             helper.make_node("Softmax", ["z"], ["y"], axis=-1)]
    weights = {"g": RNG.standard_normal(32).astype(np.float32), "b": RNG.standard_normal(32).astype(np.float32),
               "w1": (RNG.standard_normal((64, 32)) / 6).astype(np.float32),
               "b1": RNG.standard_normal(64).astype(np.float32),
               "w2": (RNG.standard_normal((64, 16)) / 8).astype(np.float32)}
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16])], weights)


def test_an_onnx_mlp_compiles_and_matches_the_onnx_reference() -> None:
    model = _mlp()
    program = from_onnx(model, **QUICK)
    assert program.imported.arguments == ["x"] and set(program.imported.bound) >= {"w1", "w2", "g", "b", "b1"}
    x = RNG.standard_normal((8, 32)).astype(np.float32)
    assert _relative(program(x), ReferenceEvaluator(model).run(None, {"x": x})[0]) < 1e-5


def _attention_pieces():
    """Token ids through an embedding (Gather), heads made by Reshape and Transpose, a fused QKV Split, a Concat,
    Unsqueeze, a Slice, Where on a comparison, and a Reshape whose shape comes from Shape at run time."""
    vocab, width = 50, 16
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], axis=0),
             helper.make_node("MatMul", ["e", "wqkv"], ["qkv"]),
             helper.make_node("Split", ["qkv", "sizes"], ["q", "k", "v"], axis=-1),
             helper.make_node("Reshape", ["q", "heads"], ["qh"]),
             helper.make_node("Transpose", ["qh"], ["qt"], perm=[0, 2, 1, 3]),
             helper.make_node("Shape", ["e"], ["shape"]),
             helper.make_node("Reshape", ["qt", "shape"], ["qflat"]),
             helper.make_node("Concat", ["qflat", "k"], ["joined"], axis=-1),
             helper.make_node("Slice", ["joined", "starts", "ends", "axes"], ["part"]),
             helper.make_node("Less", ["part", "zero"], ["negative"]),
             helper.make_node("Where", ["negative", "v", "part"], ["picked"]),
             helper.make_node("Unsqueeze", ["picked", "axis0"], ["out"])]
    known = {"table": RNG.standard_normal((vocab, width)).astype(np.float32),
             "wqkv": (RNG.standard_normal((width, 3 * width)) / 4).astype(np.float32),
             "sizes": np.array([width] * 3, np.int64), "heads": np.array([2, 5, 4, 4], np.int64),
             "starts": np.array([3], np.int64), "ends": np.array([19], np.int64), "axes": np.array([-1], np.int64),
             "zero": np.array(0.0, np.float32), "axis0": np.array([0], np.int64)}
    return _model(nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5])],
                  [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], known)


def test_views_splits_gathers_and_shapes_known_at_import() -> None:
    model = _attention_pieces()
    program = from_onnx(model, **QUICK)
    ids = RNG.integers(0, 50, (2, 5)).astype(np.int64)
    expected = ReferenceEvaluator(model).run(None, {"ids": ids})[0]
    assert program(ids).shape == expected.shape == (1, 2, 5, 16) and _relative(program(ids), expected) < 1e-6


def test_argmax_and_running_sums() -> None:
    nodes = [helper.make_node("CumSum", ["x", "axis"], ["c"]),
             helper.make_node("ArgMax", ["c"], ["y"], axis=1, keepdims=0)]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 9])],
                   [helper.make_tensor_value_info("y", TensorProto.INT64, None)], {"axis": np.array(1, np.int64)})
    program = from_onnx(model, **QUICK)
    x = RNG.standard_normal((4, 9)).astype(np.float32)
    assert np.array_equal(program(x), ReferenceEvaluator(model).run(None, {"x": x})[0])


def test_an_op_with_no_lowering_is_reported_by_type_and_node() -> None:
    nodes = [helper.make_node("Hardmax", ["x"], ["c"], name="hard"),
             helper.make_node("TopK", ["c", "k"], ["y", "i"], name="best")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                   {"axis": np.array(1, np.int64), "k": np.array([2], np.int64)})
    with pytest.raises(OnnxImportError, match=r"Hardmax \(node hard\)"):
        import_onnx(model)


def test_a_dynamic_input_needs_its_shape_given() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], {})
    with pytest.raises(OnnxImportError, match="dynamic shape.*--shape x="):
        import_onnx(model)
    assert import_onnx(model, shapes={"x": (3, 8)}).graph.inputs["x"].shape == (3, 8)
    with pytest.raises(OnnxImportError, match=r"shapes given for \['foo'\].*inputs are \['x'\]"):
        import_onnx(model, shapes={"x": (3, 8), "foo": (1, 16)})


def test_compile_takes_an_onnx_file_and_refuses_a_broken_one(tmp_path: Path) -> None:
    model_path = tmp_path / "mlp.onnx"
    onnx.save(_mlp(), str(model_path))
    done = subprocess.run([sys.executable, "-m", "tensorsmith.cli", "compile", str(model_path), "-o",
                           str(tmp_path / "out"), "--budget", "3", "--no-cache", "-q"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "program.json").is_file()
    broken = tmp_path / "broken.onnx"
    broken.write_text("not a model")
    refused = subprocess.run([sys.executable, "-m", "tensorsmith.cli", "compile", str(broken), "-o",
                              str(tmp_path / "out2")], capture_output=True, text=True)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "cannot read ONNX model" in refused.stderr


@pytest.mark.parametrize("family,layer", SMALL_MODULES, ids=HF_IDS)
def test_a_small_hugging_face_model_or_layer_exported_by_torch_onnx_matches_pytorch(family: str, layer: bool,
                                                                                     tmp_path: Path) -> None:
    """A small Llama, GPT-2 or BERT on token ids, or a Llama decoder layer or GPT-2 block alone on hidden states."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    pytest.importorskip("transformers", reason="transformers is not installed")
    pytest.importorskip("onnxscript", reason="torch.onnx's exporter needs onnxscript")
    from tensorsmith.suite.imported import small_input, small_layer, small_model   # these need torch
    torch.manual_seed(0)
    module = small_layer(family) if layer else small_model(family)
    path = tmp_path / f"{family}{'_layer' if layer else ''}.onnx"
    torch.onnx.export(module, (small_input(layer, 16),), str(path), dynamo=True)
    program = from_onnx(path, **QUICK)
    x = small_input(layer, 16)
    with torch.no_grad():
        assert _relative(program(x.numpy()), module(x).numpy().astype(np.float64)) < 1e-5


def test_reductions_with_empty_axes_bfloat16_weights_and_old_opsets() -> None:
    nodes = [helper.make_node("ReduceSum", ["x", "none"], ["s"], keepdims=0),        # empty axes: every axis
             helper.make_node("Mul", ["s", "w"], ["y"])]
    w = numpy_helper.from_array(np.array([0.5, 1.5], np.float32), "w")
    w.data_type, w.raw_data = TensorProto.BFLOAT16, (np.array([0.5, 1.5], np.float32).view(np.uint32) >> 16
                                                     ).astype(np.uint16).tobytes()
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array([], np.int64), "none"), w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    imported = import_onnx(model)
    assert imported.graph.inputs["w"].dtype.value == "bfloat16"
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    assert np.allclose(from_onnx(model, **QUICK)(x), x.astype(np.float64).sum() * np.array([0.5, 1.5]), rtol=1e-2)
    old = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "old",
                                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
                            opset_imports=[helper.make_opsetid("", 11)])
    with pytest.raises(OnnxImportError, match="opset is 11.*convert_version"):
        import_onnx(old)


def test_gather_nd_and_gather_on_a_middle_axis_match_the_reference() -> None:
    nodes = [helper.make_node("GatherND", ["x", "pairs"], ["rows"]),
             helper.make_node("Gather", ["x", "picks"], ["middle"], axis=1)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5, 6]),
              helper.make_tensor_value_info("pairs", TensorProto.INT64, [3, 2]),
              helper.make_tensor_value_info("picks", TensorProto.INT64, [2, 2])]
    outputs = [helper.make_tensor_value_info("rows", TensorProto.FLOAT, [3, 6]),
               helper.make_tensor_value_info("middle", TensorProto.FLOAT, [4, 2, 2, 6])]
    model = _model(nodes, inputs, outputs, {})
    program = from_onnx(model, **QUICK)
    x = RNG.standard_normal((4, 5, 6)).astype(np.float32)
    pairs, picks = np.array([[3, 4], [0, -5], [-2, 1]]), np.array([[4, 0], [-1, 2]])   # negative: from the end
    ours = program(x, pairs, picks)
    theirs = ReferenceEvaluator(model).run(None, {"x": x, "pairs": pairs, "picks": picks})
    for a, b in zip(ours, theirs):
        assert np.array_equal(a, b)


def test_bert_with_its_attention_mask_exported_by_torch_matches_eager(tmp_path: Path) -> None:
    """torch.onnx writes the padding mask's indexing as GatherND."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    pytest.importorskip("onnxscript", reason="torch.onnx's exporter needs onnxscript")
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=500)
    model = transformers.BertModel(config).eval()
    ids, mask = torch.randint(0, 500, (2, 16)), torch.ones(2, 16, dtype=torch.long)
    mask[1, 10:] = 0
    path = tmp_path / "bert.onnx"
    torch.onnx.export(model, (ids,), str(path), kwargs={"attention_mask": mask}, dynamo=True)
    program = from_onnx(path, **QUICK)
    mask[0, 12:] = 0
    hidden, pooled = program(ids.numpy(), mask.numpy())
    with torch.no_grad():
        reference = model(ids, mask)
    assert _relative(hidden, reference.last_hidden_state.numpy()) < 1e-5
    assert _relative(pooled, reference.pooler_output.numpy()) < 1e-5


def test_an_output_keeps_its_name_and_nodes_name_their_onnx_node(tmp_path: Path) -> None:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"), helper.make_node("Relu", ["h"], ["logits"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                   [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [4, 3])],
                   {"w": RNG.standard_normal((8, 3)).astype(np.float32)})
    path = tmp_path / "tiny.onnx"
    onnx.save(model, str(path))
    graph = import_onnx(path).graph
    assert list(graph.outputs) == ["logits"]
    wheres = {node.where for node in graph.nodes() if node.where}
    assert "tiny.onnx:proj" in wheres and "tiny.onnx:Relu node 1" in wheres


def test_an_onnx_program_keeps_its_initializers_in_its_folder(tmp_path: Path) -> None:
    """compile model.onnx -o out/ keeps the initializers beside the kernels: `run --inputs` takes the model's real
    inputs alone, and `ts.load(out)` is called with them by name; from_onnx's program saves the same way."""
    from tensorsmith import load
    from tensorsmith.cli import main
    model = _mlp()
    onnx.save(model, str(tmp_path / "mlp.onnx"))
    assert main(["compile", str(tmp_path / "mlp.onnx"), "-o", str(tmp_path / "out"), "--budget", "3",
                 "--no-cache", "-q"]) == 0
    x = RNG.standard_normal((8, 32)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    assert main(["run", str(tmp_path / "out"), "--inputs", str(tmp_path / "x.npz"), "--device", "cpu",
                 "--check"]) == 0
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    assert _relative(load(tmp_path / "out")(x=x, device="cpu")["y"], expected) < 1e-5
    from_onnx(model, **QUICK).save(tmp_path / "saved")
    assert _relative(load(tmp_path / "saved")(x=x, device="cpu")["y"], expected) < 1e-5


def test_convolutions_batch_norm_and_pooling_match_the_reference() -> None:
    """Issue 42: ONNX Conv (grouped, strided, dilated, with pads unequal on two sides), BatchNormalization, MaxPool,
    AveragePool and GlobalAveragePool, against onnx's reference implementation."""
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 0, 2, 1],
                              strides=[1, 2], group=2),
             helper.make_node("BatchNormalization", ["c1", "scale", "shift", "mean", "var"], ["n1"], epsilon=1e-3),
             helper.make_node("Relu", ["n1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 1]),
             helper.make_node("Conv", ["p1", "w2"], ["c2"], kernel_shape=[2, 2], dilations=[2, 1]),
             helper.make_node("AveragePool", ["c2"], ["p2"], kernel_shape=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["p2"], ["y"])]
    weights = {"w1": RNG.standard_normal((6, 2, 3, 3)).astype(np.float32),
               "b1": RNG.standard_normal(6).astype(np.float32),
               "scale": RNG.uniform(0.5, 1.5, 6).astype(np.float32), "shift": RNG.standard_normal(6).astype(np.float32),
               "mean": RNG.standard_normal(6).astype(np.float32), "var": RNG.uniform(0.5, 2, 6).astype(np.float32),
               "w2": RNG.standard_normal((5, 6, 2, 2)).astype(np.float32)}
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 12, 11])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], weights)
    program = from_onnx(model, **QUICK)
    x = RNG.standard_normal((2, 4, 12, 11)).astype(np.float32)
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x})
    ours = program(x)
    assert ours.shape == expected.shape and _relative(ours, expected.astype(np.float64)) < 1e-5


def test_a_batch_norm_is_folded_into_the_conv_it_alone_reads() -> None:
    """Issue 42: Conv (no bias) -> BatchNormalization imports as one convolution with folded weights: the norm's
    four tensors are not read; a Conv whose output is also a graph output keeps its norm. Both match the reference."""
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "scale", "shift", "mean", "var"], ["n1"], epsilon=1e-3),
             helper.make_node("Conv", ["n1", "w2", "b2"], ["c2"], kernel_shape=[1, 1]),
             helper.make_node("BatchNormalization", ["c2", "scale2", "shift2", "mean2", "var2"], ["y"])]
    weights = {"w1": RNG.standard_normal((6, 4, 3, 3)).astype(np.float32),
               "w2": RNG.standard_normal((5, 6, 1, 1)).astype(np.float32),
               "b2": RNG.standard_normal(5).astype(np.float32)}
    for suffix, channels in (("", 6), ("2", 5)):
        weights |= {f"scale{suffix}": RNG.uniform(0.5, 1.5, channels).astype(np.float32),
                    f"shift{suffix}": RNG.standard_normal(channels).astype(np.float32),
                    f"mean{suffix}": RNG.standard_normal(channels).astype(np.float32),
                    f"var{suffix}": RNG.uniform(0.5, 2, channels).astype(np.float32)}
    x = RNG.standard_normal((2, 4, 7, 7)).astype(np.float32)
    outputs = {"folded": ["y"], "kept": ["y", "c2"]}
    for case, names in outputs.items():
        model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 7, 7])],
                       [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in names], weights)
        bound = set(import_onnx(model).bound)
        assert {"w1_folded", "shift_folded"} <= bound and not bound & {"w1", "scale", "shift", "mean", "var"}
        second = {"w2_folded", "shift2_folded"} <= bound and not bound & {"w2", "b2", "scale2", "mean2", "var2"}
        assert second == (case == "folded")
        ours = from_onnx(model, **QUICK)(x)
        for got, expected in zip(ours if isinstance(ours, tuple) else (ours,),
                                 ReferenceEvaluator(model).run(None, {"x": x})):
            assert _relative(got, expected.astype(np.float64)) < 1e-5


def test_pooling_with_pads_unequal_on_two_sides_matches_the_reference() -> None:
    """A MaxPool's padding never wins, even over negative values, and an AveragePool (count_include_pad 0, dilated)
    divides by the elements inside, when the pads differ before and after."""
    nodes = [helper.make_node("MaxPool", ["x"], ["m"], kernel_shape=[3, 3], pads=[0, 0, 1, 1], strides=[2, 2]),
             helper.make_node("AveragePool", ["x"], ["a"], kernel_shape=[2, 3], pads=[1, 0, 0, 1],
                              dilations=[2, 1])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 7])],
                   [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in "ma"], {})
    program = from_onnx(model, **QUICK)
    x = -np.abs(RNG.standard_normal((2, 3, 8, 7))).astype(np.float32) - 0.5       # every value below the padding's 0
    for ours, expected in zip(program(x), ReferenceEvaluator(model).run(None, {"x": x})):
        assert ours.shape == expected.shape and _relative(ours, expected.astype(np.float64)) < 1e-6


def test_transposed_convolutions_match_the_reference() -> None:
    """Issue 42: ConvTranspose with output_padding, groups and bias, and one with pads unequal on two sides and a
    dilation, against PyTorch's (onnx's reference implementation fails on them); output_shape is refused with a
    clear message."""
    torch = pytest.importorskip("torch")
    nodes = [helper.make_node("ConvTranspose", ["x", "w1", "b1"], ["u1"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1], output_padding=[1, 0], group=2),
             helper.make_node("ConvTranspose", ["u1", "w2"], ["y"], kernel_shape=[2, 3], pads=[0, 1, 1, 0],
                              dilations=[2, 1])]
    weights = {"w1": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32),
               "b1": RNG.standard_normal(6).astype(np.float32),
               "w2": RNG.standard_normal((6, 2, 2, 3)).astype(np.float32)}
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 5, 6])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], weights)
    program = from_onnx(model, **QUICK)
    x = RNG.standard_normal((2, 4, 5, 6)).astype(np.float32)
    tensor = {name: torch.from_numpy(value).double() for name, value in {"x": x, **weights}.items()}
    up = torch.nn.functional.conv_transpose2d(tensor["x"], tensor["w1"], tensor["b1"], stride=2, padding=1,
                                              output_padding=(1, 0), groups=2)
    expected = torch.nn.functional.conv_transpose2d(up, tensor["w2"], dilation=(2, 1))[:, :, 0:-1, 1:].numpy()
    ours = program(x)
    assert ours.shape == expected.shape and _relative(ours, expected) < 1e-5
    shaped = _model([helper.make_node("ConvTranspose", ["x", "w2"], ["y"], kernel_shape=[2, 3],
                                      output_shape=[12, 13])],
                    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 5, 6])],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], {"w2": weights["w2"]})
    with pytest.raises(OnnxImportError, match="output_shape"):
        from_onnx(shaped, **QUICK)


def test_a_causal_lm_exported_with_its_present_keys_and_values_matches_eager(tmp_path: Path) -> None:
    """torch.onnx's export of a Llama's default call, the logits and every layer's present keys and values as
    outputs, each by its name."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    pytest.importorskip("onnxscript", reason="torch.onnx's exporter needs onnxscript")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=100, num_hidden_layers=2)
    model = transformers.LlamaForCausalLM(config).eval()

    class Present(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
            out = self.model(input_ids=ids)
            cache = out.cache if hasattr(out, "cache") else out.past_key_values   # 5.25 renamed it
            return (out.logits, *[t for layer in cache.layers for t in (layer.keys, layer.values)])
    names = ["logits"] + [f"present_{i}_{kind}" for i in range(2) for kind in ("key", "value")]
    ids, path = torch.randint(0, 100, (1, 8)), tmp_path / "llama.onnx"
    torch.onnx.export(Present().eval(), (ids,), str(path), dynamo=True, input_names=["ids"], output_names=names)
    program = from_onnx(path, **QUICK)
    assert list(program.program.outputs) == names
    with torch.no_grad():
        for ours, theirs in zip(program(ids.numpy()), Present()(ids), strict=True):
            assert _relative(ours, theirs.numpy()) < 1e-5
