"""from_torch: PyTorch modules through torch.export, lowered to tensorsmith, compiled, and matched against eager PyTorch
on the same inputs (on the CPU executor here; the GPU test runs them on the device)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: from_torch needs it")
F = torch.nn.functional

import tensorsmith as ts  # noqa: E402
from tensorsmith.codegen.attention import attention_match  # noqa: E402
from tensorsmith.codegen.runtime import gpu_available  # noqa: E402
from tensorsmith.ir.errors import TensorsmithError  # noqa: E402
from tensorsmith.ir.patterns import match_attention  # noqa: E402
from tensorsmith.torch_import import TorchImportError, from_torch, import_torch  # noqa: E402
from tensorsmith.suite.imported import SMALL_MODULES  # noqa: E402

QUICK = {"budget_s": 3.0, "cache": False, "progress": False}
HF_IDS = [f"{family}_{'layer' if layer else 'model'}" for family, layer in SMALL_MODULES]


class Block(torch.nn.Module):
    """A Llama-style decoder block as PyTorch users write it: RMSNorm, fused QKV, causal SDPA, SwiGLU."""

    def __init__(self, width: int = 64, heads: int = 4, ffn: int = 96):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.RMSNorm(width, eps=1e-6), torch.nn.RMSNorm(width, eps=1e-6)
        self.qkv = torch.nn.Linear(width, 3 * width, bias=False)
        self.o = torch.nn.Linear(width, width, bias=False)
        self.gate, self.up = torch.nn.Linear(width, ffn, bias=False), torch.nn.Linear(width, ffn, bias=False)
        self.down = torch.nn.Linear(ffn, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(self.norm1(x)).split(d, dim=-1))
        x = x + self.o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)


def test_a_decoder_block_written_in_pytorch_compiles_and_matches_eager() -> None:
    block = Block().eval()
    program = from_torch(block, (torch.randn(2, 16, 64),), profile=False, **QUICK)
    assert program.imported.arguments == ["x"]      # the weights are bound (gate and up joined in one product)
    assert {"norm1_weight", "norm2_weight", "qkv_weight", "o_weight", "down_weight", "gate_up_weight"} <= set(
        program.imported.bound)
    x = torch.randn(2, 16, 64)                      # other inputs than the export's
    with torch.no_grad():
        assert _relative(program(x), block(x)) < 1e-5


def test_each_node_keeps_the_line_of_the_module_that_made_it() -> None:
    imported = import_torch(Block().eval(), (torch.randn(1, 8, 64),))
    lines = {node.where for node in imported.graph.nodes() if node.where}
    assert any(where.endswith(".py:" + str(Block.forward.__code__.co_firstlineno + 4)) for where in lines)


def test_nodes_name_the_users_forward_not_torchs_modules() -> None:
    """Each node's line is in the user's own code: nn.Linear's matmul is the line of `self.qkv(...)` in Block, not
    torch/nn/modules/linear.py."""
    imported = import_torch(Block().eval(), (torch.randn(1, 8, 64),))
    torch_dir = str(__import__("pathlib").Path(torch.__file__).parent)
    wheres = [node.where for node in imported.graph.nodes() if node.where]
    assert wheres and not any(where.startswith(torch_dir) for where in wheres)
    assert all(where.startswith(__file__) for where in wheres if not where.startswith("<"))


class Exact(torch.nn.Module):
    """Exact GELU (erf), an embedding lookup, a concatenation, a clamp and a power."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(50, 16)

    def forward(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        e = self.table(ids)
        joined = torch.cat([F.gelu(e), x.clamp(-0.5, 0.5)], dim=-1)
        return joined.pow(2) + joined


def test_exact_gelu_embedding_concatenation_clamp_and_power() -> None:
    module = Exact().eval()
    ids, x = torch.randint(0, 50, (3, 5)), torch.randn(3, 5, 8)
    program = from_torch(module, (ids, x), profile=False, **QUICK)
    ids, x = torch.randint(0, 50, (3, 5)), torch.randn(3, 5, 8)
    with torch.no_grad():
        assert _relative(program(ids, x), module(ids, x)) < 1e-6
    assert torch.equal(program(x=x, ids=ids), program(ids, x)) and torch.equal(program(ids, x=x, device="cpu"),
                                                                                program(ids, x))
    with pytest.raises(TensorsmithError, match=r"\(ids, x\).*unknown \['y'\]; missing \['x'\]"):
        program(ids, y=x)


def test_fixed_and_tensor_indexing_match_eager() -> None:
    """x[:, 0] (BERT's pooler), x[..., -1], x.select, index_select, x[:, ids] and x[rows, ids] (ids broadcast
    together, as transformers' masks index) become slices and lookups."""
    class Indexing(torch.nn.Module):
        def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
            rows = ids % 3
            return (x[:, 0], x[..., -1], x.select(1, 2), torch.index_select(x, 2, ids), x[:, ids],
                    torch.nn.functional.embedding(ids, x[0]), x[rows[:, None], ids[None, :]],
                    x[rows - 3, ids - 7])      # negative ids count from the end, as in PyTorch
    module = Indexing()
    x, ids = torch.randn(3, 7, 9), torch.tensor([0, 6, 2, 2])
    program = from_torch(module, (x, ids), profile=False, **QUICK)
    x, ids = torch.randn(3, 7, 9), torch.tensor([5, 0, 3, 1])
    for ours, theirs in zip(program(x, ids), module(x, ids)):
        assert ours.shape == theirs.shape and torch.equal(ours, theirs)
    with pytest.raises(TensorsmithError, match="out of range"):     # PyTorch raises IndexError
        program(x, torch.tensor([0, 1, 2, 7]))


def test_remainder_takes_the_sign_of_the_divisor_as_pytorch_does() -> None:
    class Remainders(torch.nn.Module):
        def forward(self, n: torch.Tensor, x: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return n % 3, n % -3, torch.fmod(n, 3), x % 2.5, x % d, torch.remainder(n, n.abs() + 1)
    module = Remainders()
    args = (torch.arange(-7, 8), torch.linspace(-6, 6, 15), torch.linspace(-3, 3, 15).round() + 0.5)
    program = from_torch(module, args, profile=False, **QUICK)
    for ours, theirs in zip(program(*args), module(*args)):
        assert torch.allclose(ours.to(theirs.dtype), theirs, atol=1e-6), (ours, theirs)


def test_statistics_argmax_and_running_sums() -> None:
    class Stats(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return x.var(dim=-1), x.std(dim=0, correction=0), x.argmax(dim=-1), x.argmin(dim=0), x.cumsum(dim=1)
    module, x = Stats(), torch.randn(6, 10)
    program = from_torch(module, (x,), profile=False, **QUICK)
    x = torch.randn(6, 10)
    for ours, theirs in zip(program(x), module(x)):
        assert ours.shape == theirs.shape and _relative(ours.double(), theirs.double()) < 1e-6


def test_values_that_depend_on_no_input_are_folded_at_import() -> None:
    class Masked(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            n = x.shape[-1]
            mask = (torch.arange(n)[None, :] + torch.arange(n)[:, None]) % 3 == 0   # made from shapes alone (a
            return torch.where(mask, x, torch.zeros_like(x)).sum(-1)                # causal one is rebuilt: below)
    module = Masked()
    imported = import_torch(module, (torch.randn(6, 6),))
    assert [name for name in imported.bound if name.startswith("folded")]   # the mask, computed by PyTorch
    program = from_torch(module, (torch.randn(6, 6),), profile=False, **QUICK)
    x = torch.randn(6, 6)
    assert _relative(program(x), module(x)) < 1e-6


def test_a_value_folded_again_in_each_layer_is_one_bound_input() -> None:
    """Each layer of a model recomputes its causal mask (and RoPE tables) from shapes alone: folded at import, equal
    values are one bound input, whichever layer folded them; a different value is one of its own."""
    class Layers(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            n = x.shape[-1]
            for scale in (1.0, 1.0, 1.0, 2.0):        # three layers with one mask, a fourth with another
                mask = (torch.arange(n)[None, :] <= torch.arange(n)[:, None]) * scale
                x = torch.softmax(x + mask, dim=-1)
            return x
    module = Layers()
    imported = import_torch(module, (torch.randn(6, 6),))
    assert len([name for name in imported.bound if name.startswith("folded")]) == 2
    program = from_torch(module, (torch.randn(6, 6),), profile=False, **QUICK)
    x = torch.randn(6, 6)
    assert _relative(program(x), module(x)) < 1e-6


def test_an_op_with_no_lowering_is_reported_by_name_and_line() -> None:
    class Ranked(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cummax(x.sort(dim=-1).values, dim=-1).values
    with pytest.raises(TorchImportError) as caught:
        import_torch(Ranked(), (torch.randn(4, 8),))
    message = str(caught.value)
    assert "aten.sort" in message and "aten.cummax" in message and "test_torch_import.py:" in message
    assert isinstance(caught.value, TensorsmithError)


def test_a_module_torch_export_refuses_is_one_clear_error() -> None:
    class DataDependent(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 if x.sum() > 0 else x   # control flow on a value: torch.export cannot trace it
    with pytest.raises(TorchImportError, match="torch.export could not export DataDependent"):
        import_torch(DataDependent(), (torch.randn(3),))


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs an NVIDIA GPU")
def test_a_float16_block_on_the_gpu_matches_eager() -> None:
    block = Block(width=256, heads=4, ffn=512).eval().half().cuda()
    program = from_torch(block, (torch.randn(2, 128, 256, device="cuda", dtype=torch.float16),), **QUICK)
    x = torch.randn(2, 128, 256, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        out, ref = program(x), block(x)
    assert out.is_cuda and out.dtype == torch.float16 and _relative(out, ref) < 1e-2


@pytest.mark.parametrize("family,layer", SMALL_MODULES, ids=HF_IDS)
def test_a_small_hugging_face_model_or_layer_matches_eager(family: str, layer: bool) -> None:
    """A small Llama, GPT-2 or BERT on token ids, or a Llama decoder layer or GPT-2 block alone on hidden states."""
    pytest.importorskip("transformers", reason="transformers is not installed")
    from tensorsmith.suite.imported import small_input, small_layer, small_model   # these need torch
    torch.manual_seed(0)
    module = small_layer(family) if layer else small_model(family)
    program = from_torch(module, (small_input(layer, 16),), profile=False, **QUICK)
    x = small_input(layer, 16)
    with torch.no_grad():
        assert _relative(program(x), module(x)) < 1e-5
    assert np.isfinite(program(x).numpy()).all()


def test_a_mask_filled_with_minus_infinity_and_other_corners_match_eager() -> None:
    """masked_fill(-inf) before a softmax (where() blends its branches, so -inf must enter as the largest finite
    value, not make NaN), any() of negative values, rsub with alpha, and a folded tensor among cat's inputs."""
    class Corners(torch.nn.Module):
        def forward(self, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            mask = torch.ones(s.shape[-1], s.shape[-1], dtype=torch.bool).triu(1)
            probs = s.masked_fill(mask, float("-inf")).softmax(-1)
            ramp = torch.arange(s.shape[-1], dtype=s.dtype).expand(s.shape[0], 1, s.shape[-1])   # folded, in a cat
            return probs, (s - 5.0).any(dim=-1), torch.cat([torch.rsub(s, 2.0, alpha=3.0), ramp], dim=1)
    module, s = Corners(), torch.randn(3, 8, 8)
    program = from_torch(module, (s,), profile=False, **QUICK)
    s = torch.randn(3, 8, 8)
    for ours, theirs in zip(program(s), module(s)):
        assert torch.isfinite(ours.float()).all() and _relative(ours.double(), theirs.double()) < 1e-6


def test_a_folded_tensor_holding_minus_infinity_enters_finite() -> None:
    """A bias computed from shapes alone, -inf above the diagonal and a ramp below it (not one repeated value, so a
    bound input rather than a constant), picked by where() before a softmax: its infinities enter as the largest
    finite value, as a constant's do, so the blend of where's branches makes no NaN."""
    class Biased(torch.nn.Module):
        def forward(self, s: torch.Tensor) -> torch.Tensor:
            n = s.shape[-1]
            ramp = torch.arange(n * n, dtype=s.dtype).reshape(n, n) / (n * n)
            bias = ramp.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
            return torch.where(s > -1.0, s, bias).softmax(-1)
    module, s = Biased(), torch.randn(3, 8, 8)
    imported = import_torch(module, (s,))
    assert [name for name in imported.bound if name.startswith("folded")]
    program = from_torch(module, (s,), profile=False, **QUICK)
    s = torch.randn(3, 8, 8) * 2
    ours, theirs = program(s), module(s)
    assert torch.isfinite(ours).all() and _relative(ours.double(), theirs.double()) < 1e-6


def test_fused_attention_flags_are_read_by_name_not_position() -> None:
    """torch leaves trailing defaults out of a recorded call: (q, k, v, None, True) to the memory-efficient kernel
    sets compute_log_sumexp, not is_causal, so the attention must not be masked."""
    import tensorsmith as ts
    from tensorsmith.torch_import import _attention
    g = ts.Graph("fused")
    q, k, v = (g.input(name, (1, 2, 4, 8), "float32") for name in "qkv")

    class Recorded:
        target = torch.ops.aten._scaled_dot_product_efficient_attention.default
    g.output("y", _attention(Recorded(), q, k, v, None, True)[0])
    x = {name: np.random.default_rng(i).standard_normal((1, 2, 4, 8)).astype(np.float32)
         for i, name in enumerate("qkv")}
    expected = F.scaled_dot_product_attention(*(torch.from_numpy(x[n]) for n in "qkv"), is_causal=False)
    assert _relative(torch.from_numpy(ts.evaluate(g, x)["y"]), expected.double()) < 1e-6


def test_bert_with_its_attention_mask_and_pooler_matches_eager() -> None:
    """transformers' padding mask indexes with broadcast id tensors and multiplies bool masks; the pooler reads
    x[:, 0]."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=500)
    model = transformers.BertModel(config).eval()
    ids, mask = torch.randint(0, 500, (2, 16)), torch.ones(2, 16, dtype=torch.long)
    mask[1, 10:] = 0
    program = from_torch(model, (ids, mask), profile=False, **QUICK)
    ids = torch.randint(0, 500, (2, 16))
    mask[0, 12:] = 0
    with torch.no_grad():
        ours, reference = program(ids, mask), model(ids, mask)
    assert type(ours) is type(reference)   # called as the model is: its ModelOutput, by field
    assert _relative(ours.last_hidden_state, reference.last_hidden_state) < 1e-5
    assert _relative(ours.pooler_output, reference.pooler_output) < 1e-5


def _causal_lm(family: str):
    """A two-layer causal LM of `family` with random weights, as transformers builds it."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    small = dict(hidden_size=64, num_attention_heads=4, vocab_size=100, num_hidden_layers=2)
    decoder = dict(small, intermediate_size=128, max_position_embeddings=64)
    configs = {
        "llama": (transformers.LlamaConfig, dict(decoder, num_key_value_heads=2)),
        "gemma2": (transformers.Gemma2Config, dict(decoder, num_key_value_heads=2, head_dim=16)),
        "opt": (transformers.OPTConfig, dict(small, ffn_dim=128, word_embed_proj_dim=64, max_position_embeddings=64)),
        "falcon": (transformers.FalconConfig, small),
        "gpt_neox": (transformers.GPTNeoXConfig, decoder),
    }
    config, options = configs[family]
    model_class = getattr(transformers, {"llama": "LlamaForCausalLM", "gemma2": "Gemma2ForCausalLM",
                                         "opt": "OPTForCausalLM", "falcon": "FalconForCausalLM",
                                         "gpt_neox": "GPTNeoXForCausalLM"}[family])
    return model_class(config(**options)).eval()


@pytest.mark.parametrize("family", ["llama", "gemma2", "opt", "falcon", "gpt_neox"])
def test_a_causal_lm_imports_from_its_default_call(family: str) -> None:
    """model(ids) with its default use_cache=True: the cache starts as empty 1-D tensors that torch.cat skips, and
    the output holds a DynamicCache. The logits match; the cache, not asked for, is neither computed nor returned."""
    model = _causal_lm(family)
    program = from_torch(model, (torch.randint(0, 100, (1, 8)),), profile=False, **QUICK)
    assert program.imported.outputs == ["logits"]
    assert all(0 not in node.shape for node in program.graph.inputs.values())
    ids = torch.randint(0, 100, (1, 8))
    with torch.no_grad():
        ours, reference = program(ids), model(ids)
    assert type(ours) is type(reference) and _cache(ours) is None and _cache(reference) is not None
    assert _relative(ours.logits, reference.logits) < 1e-5


def _cache(output: object) -> object:
    """A ModelOutput's KV cache: `cache` in transformers 5.25, `past_key_values` before it."""
    return output.cache if hasattr(output, "cache") else output.past_key_values


def test_a_causal_lms_cache_comes_back_with_keep_cache() -> None:
    """keep_cache=True: the keys and values of every layer are outputs, returned in the model's own cache."""
    model = _causal_lm("llama")
    program = from_torch(model, (torch.randint(0, 100, (1, 8)),), keep_cache=True, profile=False, **QUICK)
    ids = torch.randint(0, 100, (1, 8))
    with torch.no_grad():
        ours, reference = program(ids), model(ids)
    assert type(_cache(ours)) is type(_cache(reference)) and _cache(ours).get_seq_length() == 8
    for layer, expected in zip(_cache(ours).layers, _cache(reference).layers, strict=True):
        assert _relative(layer.keys, expected.keys) < 1e-5 and _relative(layer.values, expected.values) < 1e-5
    assert _relative(ours.logits, reference.logits) < 1e-5


def test_cat_skips_empty_1d_operands_as_torch_does() -> None:
    """torch.cat([empty (0,), x], dim=-2) is x whatever x's rank; the empty operand leaves no input behind."""
    class Grown(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("past", torch.tensor([]))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat([self.past, x, torch.tensor([])], dim=-2) * 2
    module, x = Grown(), torch.randn(1, 2, 4, 8)
    program = from_torch(module, (x,), profile=False, **QUICK)
    assert all(0 not in node.shape for node in program.graph.inputs.values())
    x = torch.randn(1, 2, 4, 8)
    assert _relative(program(x), module(x)) < 1e-6


def test_without_torch_the_import_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "torch", None)     # `import torch` now raises ImportError
    with pytest.raises(TorchImportError, match="pip install torch"):
        import_torch(object(), ())


def test_a_bfloat16_model_returns_bfloat16_tensors() -> None:
    module = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.GELU()).to(torch.bfloat16).eval()
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    program = from_torch(module, (x,), profile=False, **QUICK)
    with torch.no_grad():
        out, ref = program(x, device="cpu"), module(x)
    assert out.dtype == torch.bfloat16 and _relative(out, ref) < 2e-2


def test_an_imported_program_saves_with_its_weights_and_loads(tmp_path) -> None:
    from tensorsmith import load
    module = Exact().eval()
    ids, x = torch.randint(0, 50, (3, 5)), torch.randn(3, 5, 8)
    program = from_torch(module, (ids, x), profile=False, **QUICK)
    program.save(tmp_path / "exact")
    loaded = load(tmp_path / "exact")
    assert set(loaded.bound) == set(program.imported.bound)
    with torch.no_grad():
        expected = module(ids, x).numpy()
    out = loaded(ids=ids.numpy().astype(np.int32), x=x.numpy(), device="cpu")
    assert float(np.abs(next(iter(out.values())) - expected).max()) < 1e-5


class SmallCNN(torch.nn.Module):
    """A torchvision-style CNN: convolutions (padded, strided, dilated, grouped, depthwise), batch norm, pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                                        torch.nn.ReLU(), torch.nn.MaxPool2d(3, stride=2, padding=1))
        self.grouped = torch.nn.Conv2d(8, 12, 3, stride=2, padding=2, dilation=2, groups=2, bias=False)
        self.depthwise = torch.nn.Conv2d(12, 12, 3, padding=1, groups=12)
        self.norm = torch.nn.BatchNorm2d(12)
        self.head = torch.nn.Linear(12, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.norm(self.depthwise(self.grouped(self.stem(x)))))
        h = F.avg_pool2d(h, 2, stride=1, padding=1, count_include_pad=False)
        return self.head(F.adaptive_avg_pool2d(h, 1).flatten(1))


def _with_statistics(module: torch.nn.Module) -> torch.nn.Module:
    """Batch norm's running statistics made other than their defaults (0 and 1), so that they matter."""
    for norm in (m for m in module.modules() if isinstance(m, torch.nn.BatchNorm2d)):
        norm.running_mean.uniform_(-0.5, 0.5)
        norm.running_var.uniform_(0.5, 2.0)
        norm.weight.data.uniform_(0.5, 1.5)
        norm.bias.data.uniform_(-0.5, 0.5)
    return module.eval()


def test_a_cnn_with_batch_norm_and_pooling_matches_eager() -> None:
    """Issue 42: convolutions (padded, strided, dilated, grouped and depthwise), batch norm in eval mode, max,
    average and adaptive average pooling import and match eager PyTorch."""
    module = _with_statistics(SmallCNN())
    program = from_torch(module, (torch.randn(2, 3, 16, 16),), profile=False, **QUICK)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert _relative(program(x), module(x)) < 1e-6
    # each batch norm folded into the convolution before it: its statistics and affine tensors are read by nothing
    bound = list(program.imported.bound)
    assert sum("folded_weight" in name for name in bound) == 2 and not [n for n in bound if "running" in n]


@pytest.mark.parametrize("conv_bias, affine", [(False, True), (True, False)])
def test_a_batch_norm_without_a_bias_or_an_affine_part_folds_as_well(conv_bias: bool, affine: bool) -> None:
    module = _with_statistics(torch.nn.Sequential(torch.nn.Conv1d(4, 6, 3, bias=conv_bias),
                                                  torch.nn.BatchNorm1d(6, affine=affine)))
    if not affine:
        module[1].running_var.uniform_(0.5, 2.0)
        module[1].running_mean.uniform_(-0.5, 0.5)
    program = from_torch(module, (torch.randn(2, 4, 20),), profile=False, **QUICK)
    folded = sorted(name for name in program.imported.bound if "folded" in name)
    assert folded == ["t_0_folded_bias", "t_0_folded_weight"]
    x = torch.randn(2, 4, 20)
    with torch.no_grad():
        assert _relative(program(x), module(x)) < 1e-6


def test_a_patch_embedding_and_a_1d_convolution_match_eager() -> None:
    """A ViT's patch embedding (stride equal to its kernel: a reshape, a permute and one product) and a strided
    Conv1d (slices and reshapes, one product) match eager PyTorch."""
    class Patches(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.patch = torch.nn.Conv2d(3, 32, 4, stride=4)
            self.audio = torch.nn.Conv1d(2, 6, 5, stride=3, padding=2)

        def forward(self, image: torch.Tensor, wave: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.patch(image).flatten(2).transpose(1, 2), self.audio(wave)
    module = Patches().eval()
    program = from_torch(module, (torch.randn(2, 3, 16, 16), torch.randn(2, 2, 40)), profile=False, **QUICK)
    image, wave = torch.randn(2, 3, 16, 16), torch.randn(2, 2, 40)
    with torch.no_grad():
        for ours, theirs in zip(program(image, wave), module(image, wave)):
            assert ours.shape == theirs.shape and _relative(ours, theirs) < 1e-5


def test_transposed_convolutions_of_a_decoder_match_eager() -> None:
    """Issue 42: a decoder's upsampling (ConvTranspose2d, stride 2, output_padding 1, in two groups), a dilated
    ConvTranspose1d and a 4 x 4 stride-2 one without bias import and match eager PyTorch."""
    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2)
            self.up4 = torch.nn.ConvTranspose2d(6, 3, 4, stride=2, padding=1, bias=False)
            self.wave = torch.nn.ConvTranspose1d(2, 3, 5, stride=3, padding=2, dilation=2)

        def forward(self, x: torch.Tensor, wave: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.up4(torch.relu(self.up(x))), self.wave(wave)
    module = Decoder().eval()
    program = from_torch(module, (torch.randn(2, 4, 5, 6), torch.randn(1, 2, 9)), profile=False, **QUICK)
    x, wave = torch.randn(2, 4, 5, 6), torch.randn(1, 2, 9)
    with torch.no_grad():
        for ours, theirs in zip(program(x, wave), module(x, wave)):
            assert ours.shape == theirs.shape and _relative(ours, theirs) < 1e-5


def test_a_vision_transformer_from_transformers_matches_eager() -> None:
    """Issue 42: a ViT (transformers' ViTModel, random weights) imports through its patch embedding's convolution."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    config = transformers.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                    image_size=32, patch_size=8, num_channels=3)
    vit = transformers.ViTModel(config, add_pooling_layer=False).eval()

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.vit = vit

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return self.vit(pixel_values=pixel_values).last_hidden_state
    module = Hidden().eval()
    program = from_torch(module, (torch.randn(2, 3, 32, 32),), profile=False, **QUICK)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert _relative(program(x), module(x)) < 1e-5


def test_pooling_sizes_given_once_stand_for_every_pooled_axis() -> None:
    """F.max_pool2d(x, [3], [2], [1]) pools both axes, as PyTorch does; so do avg_pool2d([2]) and 3-D pooling."""
    class Pools(torch.nn.Module):
        def forward(self, x: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (F.max_pool2d(x, [3], [2], [1]), F.avg_pool2d(x, [2]), F.max_pool3d(v, 2),
                    F.avg_pool3d(v, 2, stride=1, padding=1, count_include_pad=False))
    x, v = torch.randn(2, 3, 8, 8), torch.randn(1, 2, 4, 6, 6)
    program = from_torch(Pools(), (x, v), profile=False, **QUICK)
    for ours, theirs in zip(program(x, v), Pools()(x, v)):
        assert ours.shape == theirs.shape and _relative(ours, theirs) < 1e-6


def test_products_of_one_input_with_several_weights_are_joined_into_one() -> None:
    """q, k and v of one input become one product over their weights concatenated at import (biased ones apart from
    unbiased ones), each taking its columns; the members' own weights are dropped; a weight used twice, or products
    of different inputs, stay apart. The result matches eager."""
    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v = (torch.nn.Linear(32, n, bias=False) for n in (32, 16, 16))
            self.gate, self.up = torch.nn.Linear(32, 24), torch.nn.Linear(32, 24)
            self.tied = torch.nn.Linear(32, 8, bias=False)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
            q, k, v = self.q(x), self.k(x), self.v(x)
            return (q[..., :16] * k + v, F.silu(self.gate(x)) * self.up(x),
                    self.tied(y) + F.linear(y, self.tied.weight), self.k(y))
    module, x, y = Attention(), torch.randn(2, 6, 32), torch.randn(2, 6, 32)
    imported = import_torch(module, (x, y))
    weights = sorted(name for name in imported.bound if name.endswith(("weight", "bias")))
    assert weights == ["gate_up_bias", "gate_up_weight", "k_weight", "q_k_v_weight", "tied_weight"]
    assert imported.bound["q_k_v_weight"].shape == (64, 32)
    program = from_torch(module, (x, y), profile=False, **QUICK)
    x, y = torch.randn(2, 6, 32), torch.randn(2, 6, 32)
    with torch.no_grad():
        for ours, theirs in zip(program(x, y), module(x, y), strict=True):
            assert _relative(ours, theirs) < 1e-6


def test_a_llama_layers_products_are_two_joined_ones() -> None:
    """A Hugging Face Llama layer: q, k and v as one product, gate and up as one (o and down stay alone)."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=100, num_hidden_layers=1)
    imported = import_torch(transformers.LlamaForCausalLM(config).eval(), (torch.randint(0, 100, (1, 8)),))
    joined = [name for name in imported.bound if name.startswith("model_layers_0") and "proj" in name]
    assert sorted(joined) == ["model_layers_0_mlp_down_proj_weight", "model_layers_0_mlp_gate_proj_up_proj_weight",
                              "model_layers_0_self_attn_o_proj_weight",
                              "model_layers_0_self_attn_q_proj_k_proj_v_proj_weight"]


def test_sdpa_imported_on_the_cpu_is_one_causal_attention_per_layer() -> None:
    """F.scaled_dot_product_attention is kept whole through the export, so a model exported on a CPU has the
    attention a GPU export has (there, the device's fused kernel): decomposed, its 'safe' softmax (a row masked
    whole gives 0) matched no attention kernel and a 2-layer Llama compiled to 52 kernels, not 35."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=100, num_hidden_layers=2)
    model = transformers.LlamaForCausalLM(config).to(torch.float16).eval()   # the attention kernel's dtypes
    imported = import_torch(model, (torch.randint(0, 100, (1, 8)),))
    attentions = [node for node in imported.graph.nodes() if node.op.name == "SUM" and attention_match(node)]
    assert len(attentions) == 2 and not any(node.op.name == "MAX" and node.dtype.name == "BOOL"
                                            for node in imported.graph.nodes())   # no any() of a safe softmax
    # the causal mask transformers folds is rebuilt from indices, so the kernel skips the tiles past the diagonal
    # and loads no mask
    assert [match_attention(node).causal_offset for node in attentions] == [0, 0]
    assert not [node for node in imported.graph.inputs.values() if node.dtype.name == "BOOL"]


@pytest.mark.parametrize("kind", ["bool_mask", "float_mask", "causal", "causal_fewer_queries", "gqa"])
def test_sdpa_masks_causality_and_grouped_heads_match_torch(kind: str) -> None:
    """A boolean mask (True: attend), a float one (added), is_causal aligned top-left as PyTorch aligns it where
    there are fewer queries than keys, and enable_gqa's shared key and value heads."""
    class Attend(torch.nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            if kind == "bool_mask":
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            if kind == "float_mask":
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.float() * -3.0)
            if kind == "gqa":
                return F.scaled_dot_product_attention(q, k[:, :2], v[:, :2], is_causal=True, enable_gqa=True)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    queries = 5 if kind == "causal_fewer_queries" else 8
    q, k, v = torch.randn(1, 4, queries, 16), torch.randn(1, 4, 8, 16), torch.randn(1, 4, 8, 16)
    mask = torch.rand(1, 1, queries, 8) > 0.3
    mask[..., 0] = True   # no row masked whole
    imported = import_torch(Attend(), (q, k, v, mask))
    got = ts.evaluate(imported.graph, {name: t.numpy() for name, t in zip(imported.graph.inputs, (q, k, v, mask))})
    assert np.abs(next(iter(got.values())) - Attend()(q, k, v, mask).numpy()).max() < 1e-5


@pytest.mark.parametrize("diagonal, causal", [(0, True), (3, True), (None, False)], ids=["causal", "offset", "other"])
def test_a_folded_causal_mask_is_rebuilt_from_indices_and_any_other_stays_a_bound_input(diagonal, causal) -> None:
    """A mask the module makes from no input is folded at import: where it is key <= query + d it becomes that
    comparison of indices (an attention kernel reads it as causal), any other (a padding pattern) a bound input."""
    class Masked(torch.nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            ones = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool)
            mask = ones.tril(diagonal) if diagonal is not None else ones.index_fill(1, torch.tensor([2, 5]), False)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    q, k, v = (torch.randn(1, 2, 8, 16).half() for _ in range(3))
    imported = import_torch(Masked(), (q, k, v))
    (attention,) = [node for node in imported.graph.nodes() if node.op.name == "SUM" and attention_match(node)]
    assert (match_attention(attention).causal_offset == diagonal) if causal else bool(imported.bound)
    inputs = {**{name: t.float().numpy() for name, t in zip(imported.arguments, (q, k, v))},
              **{name: t.numpy() for name, t in imported.bound.items()}}
    got = ts.evaluate(imported.graph, inputs)
    assert np.abs(next(iter(got.values())) - Masked()(q, k, v).float().numpy()).max() < 1e-2


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_a_mixture_of_experts_imports_from_its_default_call_and_matches_eager(family: str) -> None:
    """Routing by topk, every expert on every token weighted by its routing weights (the form to which the export
    switches transformers' experts, and back); where fewer pairs are routed than there are experts (one token),
    each routed pair's product over its own expert's weights. A shared expert and its gate for Qwen2-MoE."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    decoder = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                   vocab_size=100, num_hidden_layers=2, max_position_embeddings=64, num_experts_per_tok=2)
    model = (transformers.MixtralForCausalLM(transformers.MixtralConfig(**decoder, num_local_experts=4))
             if family == "mixtral" else
             transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
                 **decoder, num_experts=8, moe_intermediate_size=32, shared_expert_intermediate_size=64))).eval()
    before = model.config._experts_implementation
    program = from_torch(model, (torch.randint(0, 100, (1, 8)),), profile=False, **QUICK)
    assert model.config._experts_implementation == before     # the module is given back as it was
    up = 2 * (128 if family == "mixtral" else 32)
    experts = 4 if family == "mixtral" else 8
    assert (experts, 8, up) in {node.shape for node in program.graph.nodes()}   # all experts on all 8 tokens
    decoding = import_torch(model, (torch.randint(0, 100, (1, 1)),))   # 2 routed pairs: each its own expert's
    shapes = {node.shape for node in decoding.graph.nodes()}
    assert (2, up) in shapes and (experts, 1, up) not in shapes
    ids = torch.randint(0, 100, (1, 8))
    with torch.no_grad():
        assert _relative(program(ids).logits, model(ids).logits) < 1e-5


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_a_mixture_of_experts_over_many_tokens_computes_the_routed_tokens_only(family: str) -> None:
    """At 160 tokens the grouped form has fewer rows than every expert on every token: the experts' products run on
    the routed pairs' rows, grouped by expert in whole tiles (no product of all experts over all tokens), and the
    logits match eager; the form's own PyTorch computation matches the model's default too."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    from tensorsmith.ir.experts import TILE, grouped_rows
    from tensorsmith.torch_experts import NAME, register
    tokens, k, experts = 160, 2, 4 if family == "mixtral" else 8
    decoder = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                   vocab_size=100, num_hidden_layers=2, max_position_embeddings=256, num_experts_per_tok=k)
    model = (transformers.MixtralForCausalLM(transformers.MixtralConfig(**decoder, num_local_experts=experts))
             if family == "mixtral" else
             transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
                 **decoder, num_experts=experts, moe_intermediate_size=32, shared_expert_intermediate_size=64))).eval()
    ffn = 128 if family == "mixtral" else 32
    ids = torch.randint(0, 100, (1, tokens))
    imported = import_torch(model, (ids,))
    shapes = {node.shape for node in imported.graph.nodes()}
    assert (grouped_rows(tokens, k, experts) // TILE, TILE, ffn) in shapes      # each tile times its expert's gate
    assert not {(experts, tokens, 2 * ffn), (1, experts, tokens, 2 * ffn)} & shapes
    inputs = {**{name: t.numpy() for name, t in zip(imported.arguments, (ids,))},
              **{name: t.detach().numpy() for name, t in imported.bound.items()}}
    with torch.no_grad():
        want = model(ids).logits
        assert register()
        model.config._experts_implementation = NAME        # the form the export takes, run by PyTorch
        assert _relative(model(ids).logits, want) < 1e-5
    assert _relative(torch.from_numpy(next(iter(ts.evaluate(imported.graph, inputs).values()))), want) < 1e-5


class _CacheStep(torch.nn.Module):
    """One call of a causal LM over a static cache, as a generate loop makes it: the last position's logits."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, position: torch.Tensor, cache: object) -> torch.Tensor:
        return self.model(input_ids=ids, past_key_values=cache, cache_position=position).logits[:, -1]


def test_a_greedy_loop_over_a_static_cache_gives_generates_tokens() -> None:
    """A prefill program and a one-token decode program over transformers' StaticCache: 32 greedy tokens equal to
    model.generate's with a static cache, token for token; each call writes the cache it is given (the caller's
    tensors, same data pointers)."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    model = _causal_lm("llama")
    model.generation_config.eos_token_id = None          # 32 tokens, past any end of sequence
    prompt, new = 8, 32

    def fresh_cache() -> object:
        cache = transformers.StaticCache(config=model.config, max_cache_len=prompt + new)
        cache.early_initialization(1, 2, 16, torch.float32, "cpu")
        return cache
    step, ids = _CacheStep(model), torch.randint(0, 100, (1, prompt))
    prefill = from_torch(step, (ids, torch.arange(prompt), fresh_cache()), profile=False, **QUICK)
    decode = from_torch(step, (ids[:, :1], torch.tensor([prompt]), fresh_cache()), profile=False, **QUICK)
    caches = {argument for argument in decode.imported.updates.values() if decode.graph.inputs[argument].ndim == 4}
    assert caches and set(decode.program.written_in_place.values()) == caches   # on a GPU: no copy of the cache
    attentions = [match for node in decode.graph.nodes() if (match := match_attention(node)) is not None]
    assert attentions and all(match.offset_base is not None for match in attentions)   # read up to the position
    cache = fresh_cache()
    pointers = [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in cache.layers]
    with torch.no_grad():
        tokens = [prefill(ids, torch.arange(prompt), cache).argmax(-1, keepdim=True)]
        for i in range(new - 1):
            tokens.append(decode(tokens[-1], torch.tensor([prompt + i]), cache).argmax(-1, keepdim=True))
        expected = model.generate(ids, max_new_tokens=new, do_sample=False, cache_implementation="static")
    assert torch.equal(torch.cat(tokens, dim=1), expected[:, prompt:])
    assert [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in cache.layers] == pointers
    assert int(cache.layers[0].cumulative_length) == prompt + new - 1
    assert cache.layers[0].keys[0, :, prompt + new - 2].abs().sum() > 0         # the last step's keys, written


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs an NVIDIA GPU")
def test_a_float16_decode_loop_on_the_gpu_matches_eager_step_by_step() -> None:
    """The prefill and decode programs on the GPU, each step's logits against transformers' own step on a cache of
    its own fed the same tokens (float16 noise may part greedy tokens, so each step is compared, not the tokens);
    the keys and values written into the caller's tensors where they are, as transformers' own."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    model = _causal_lm("llama").half().cuda()
    prompt, length = 8, 24

    def fresh_cache() -> object:
        cache = transformers.StaticCache(config=model.config, max_cache_len=length)
        cache.early_initialization(1, 2, 16, torch.float16, "cuda")
        return cache
    step, ids = _CacheStep(model), torch.randint(0, 100, (1, prompt), device="cuda")
    prefill = from_torch(step, (ids, torch.arange(prompt, device="cuda"), fresh_cache()), **QUICK)
    decode = from_torch(step, (ids[:, :1], torch.tensor([prompt], device="cuda"), fresh_cache()), **QUICK)
    ours_cache, theirs_cache = fresh_cache(), fresh_cache()
    tokens, positions = ids, torch.arange(prompt, device="cuda")
    with torch.no_grad():
        for call in range(length - prompt):
            ours = (prefill if call == 0 else decode)(tokens, positions, ours_cache)
            theirs = step(tokens, positions, theirs_cache)
            assert ours.is_cuda and _relative(ours, theirs) < 1e-2, call
            tokens, positions = theirs.argmax(-1, keepdim=True), positions[-1:] + 1
    assert decode.program.written_in_place
    for ours_layer, theirs_layer in zip(ours_cache.layers, theirs_cache.layers, strict=True):
        assert _relative(ours_layer.keys, theirs_layer.keys) < 1e-2
        assert _relative(ours_layer.values, theirs_layer.values) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("tokens", [16, 160])    # every expert on every token; the routed tokens grouped by expert
def test_a_float16_mixture_of_experts_on_the_gpu_matches_eager(tokens: int) -> None:
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    config = transformers.MixtralConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                        num_key_value_heads=2, vocab_size=100, num_hidden_layers=2,
                                        max_position_embeddings=256, num_experts_per_tok=2, num_local_experts=4)
    model = transformers.MixtralForCausalLM(config).eval().half().cuda()
    ids = torch.randint(0, 100, (1, tokens), device="cuda")
    program = from_torch(model, (ids,), **QUICK)
    with torch.no_grad():
        assert _relative(program(ids).logits, model(ids).logits) < 1e-2


def test_a_prefill_that_keeps_the_last_positions_logits_computes_no_other_positions_logits() -> None:
    """model(...).logits[:, -1], as a hand-written generation loop takes it: the slice sinks below the vocabulary
    projection and the last norm (ir.sliced), so the prefill's largest product is one row, not the prompt's."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    model = _causal_lm("llama")
    cache = transformers.StaticCache(config=model.config, max_cache_len=16)
    cache.early_initialization(1, 2, 16, torch.float32, "cpu")
    ids = torch.randint(0, 100, (1, 8))
    imported = import_torch(_CacheStep(model), (ids, torch.arange(8), cache))
    logits = [node.shape for node in imported.graph.nodes() if node.op.name == "SUM" and node.shape[-1:] == (100,)]
    assert logits and all(8 not in shape for shape in logits)   # (the lookup's one-hot is (1, 8, 100), not a sum)


def test_a_static_cache_not_yet_allocated_is_one_clear_error() -> None:
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    model = _causal_lm("llama")
    cache = transformers.StaticCache(config=model.config, max_cache_len=16)
    with pytest.raises(TorchImportError, match="early_initialization"):
        import_torch(_CacheStep(model), (torch.randint(0, 100, (1, 4)), torch.arange(4), cache))


def test_a_decode_steps_layers_are_found_identical() -> None:
    """Each layer of a decode step writes its cache (outputs beside the residual stream) and reads a mask and
    rotary tables computed from the positions given: the layers are still cut apart and found identical, so one
    is searched for all."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    from tensorsmith.ir.layers import find_layers
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=100, num_hidden_layers=4)
    model = transformers.LlamaForCausalLM(config).eval()
    cache = transformers.StaticCache(config=config, max_cache_len=32)
    cache.early_initialization(1, 2, 16, torch.float32, "cpu")
    imported = import_torch(_CacheStep(model), (torch.randint(0, 100, (1, 1)), torch.tensor([8]), cache))
    layers = find_layers(imported.graph)
    assert layers is not None and layers.repeats >= 3


def test_adaptive_average_pooling_to_sizes_that_do_not_divide_matches_eager() -> None:
    """AlexNet's pooling of 13 x 13 to 6 x 6 (overlapping windows of 2 and 3), compiled."""
    module, x = torch.nn.AdaptiveAvgPool2d((6, 6)), torch.randn(2, 4, 13, 13)
    program = from_torch(module, (x,), profile=False, **QUICK)
    x = torch.randn(2, 4, 13, 13)
    assert _relative(program(x), module(x)) < 1e-6


def test_pools_in_ceil_mode_with_a_last_partial_window_match_eager() -> None:
    """GoogLeNet's MaxPool2d(3, 2, ceil_mode=True) on 112 x 112 and an average pool likewise, compiled. Their one
    kernel reads through a chain of pads, reshapes and slices; each view's long index is named once (inlined, the
    kernel was 4.7 MB of C, over which NVRTC took 26 s)."""
    module = torch.nn.Sequential(torch.nn.MaxPool2d(3, 2, ceil_mode=True),
                                 torch.nn.AvgPool2d(3, 2, padding=1, ceil_mode=True, count_include_pad=False))
    x = torch.randn(1, 4, 112, 112)
    program = from_torch(module, (x,), profile=False, **QUICK)
    for kernel in program.program.kernels:
        lines = kernel.source.splitlines()
        assert len(kernel.source) < 400_000 and max(map(len, lines)) < 400, kernel.name
    assert any(line.lstrip().startswith("const idx_t i") for kernel in program.program.kernels
               for line in kernel.source.splitlines())
    x = torch.randn(1, 4, 112, 112)
    assert _relative(program(x), module(x)) < 1e-6
