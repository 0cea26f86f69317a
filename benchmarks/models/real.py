"""Hugging Face models at the sizes people import them: Llama-3.2-1B's shape, Qwen2.5-0.5B's, Mixtral-8x7B's,
GPT-2 124M's and BERT-base's, each built from a transformers configuration with random weights (nothing is
downloaded) and imported by `ts.import_torch`, as a user imports the model they run; need torch and transformers.

- family "model": each model at 2 of its layers (the width, heads and vocabulary are the real model's), on one
  sequence of a decode-like 16 tokens and a prefill of 512 and 2048 (1024 for GPT-2, whose positions end there; 512
  only for BERT), in float16 and bfloat16, and one float32 row per model at 512 tokens; Mixtral-8x7B's shape (a
  mixture of 8 experts, 2 per token) at 512 tokens in float16 only (its 2 layers hold 3.2 billion parameters);
- family "depth": Llama-3.2-1B's shape at 1, 2, 4, 8, 16 and 32 layers (`llama1b_<N>layers`), 512 tokens, float16,
  so that compile and run time are seen growing with depth.

Every case is built when run (importing takes seconds); `--list` gives each one's parameter count, read off the model
made on PyTorch's meta device (shapes, no weights)."""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tensorsmith.bench import Case, DeferredCase


@dataclass(frozen=True)
class Model:
    """A real model's shape: its configuration at any depth, its real depth, the shapes its positions allow."""

    title: str
    config: Callable[[int], Any]       # layers -> the transformers configuration
    layers: int                        # the real model's
    shapes: tuple[str, ...]            # keys of SHAPES
    encoder: bool = False              # the last hidden state is the output (no language-model head)
    rows: tuple[tuple[str, str], ...] = ()   # its (shape, dtype) rows where not every narrow dtype and float32


def _llama1b(layers: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(  # type: ignore[call-arg]   # rope_theta: transformers 5 reads it into rope_parameters
        hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
        vocab_size=128256, rope_theta=500000.0, tie_word_embeddings=True, max_position_embeddings=131072,
        rms_norm_eps=1e-5, num_hidden_layers=layers)


def _qwen05b(layers: int) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(  # type: ignore[call-arg]   # rope_theta: as for Llama
        hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
        tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=32768,
        num_hidden_layers=layers)


def _mixtral(layers: int) -> Any:
    from transformers import MixtralConfig

    return MixtralConfig(  # type: ignore[call-arg]   # rope_theta: as for Llama
        hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
        num_local_experts=8, num_experts_per_tok=2, rope_theta=1000000.0, rms_norm_eps=1e-5,
        max_position_embeddings=32768, num_hidden_layers=layers)


def _gpt2(layers: int) -> Any:
    from transformers import GPT2Config

    return GPT2Config(n_layer=layers)


def _bert(layers: int) -> Any:
    from transformers import BertConfig

    return BertConfig(num_hidden_layers=layers)


MODELS = {
    "llama1b": Model("Llama-3.2-1B", _llama1b, 16, ("d16", "p512", "p2048")),
    "qwen05b": Model("Qwen2.5-0.5B", _qwen05b, 24, ("d16", "p512", "p2048")),
    "mixtral": Model("Mixtral-8x7B", _mixtral, 32, ("p512",), rows=(("p512", "fp16"),)),
    "gpt2": Model("GPT-2 124M", _gpt2, 12, ("d16", "p512", "p1024")),
    "bert": Model("BERT-base", _bert, 12, ("d16", "p512"), encoder=True),
}
SHAPES = {"d16": (16, "decode-like 16 tokens"), "p512": (512, "prefill of 512 tokens"),
          "p1024": (1024, "prefill of 1024 tokens"), "p2048": (2048, "prefill of 2048 tokens")}
DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
MODEL_LAYERS = 2                       # the "model" family's depth: the "depth" family measures depth
NARROW = ("fp16", "bf16")              # at every shape
FLOAT32_SHAPE = "p512"                 # float32: one row per model
DEPTH_MODEL, DEPTH_SHAPE, DEPTH_DTYPE = "llama1b", "p512", "fp16"
DEPTHS = (1, 2, 4, 8, 16, 32)


def module(model: str, layers: int) -> Any:
    """The model as a user runs it, at `layers` layers, float32, in eval mode: ids -> logits (a causal language
    model) or -> the last hidden state (an encoder, without its pooler)."""
    import transformers

    from tensorsmith.suite.hugging_face import Hidden, Logits

    config = MODELS[model].config(layers)
    if MODELS[model].encoder:
        return Hidden(transformers.AutoModel.from_config(config, add_pooling_layer=False)).eval()
    return Logits(transformers.AutoModelForCausalLM.from_config(config)).eval()


@functools.cache
def parameter_count(model: str, layers: int) -> int:
    """The parameters of `module(model, layers)`, tied ones once, counted on the meta device: no weights made."""
    import torch

    with torch.device("meta"):
        made = module(model, layers)
    return sum(p.numel() for p in made.parameters())


def note(model: str, layers: int, shape: str, dtype: str) -> str:
    """What a row measures, in words."""
    own = MODELS[model].layers
    depth = f"{layers} of its {own} layers" if layers <= own else f"{layers} layers (its own are {own})"
    return f"{MODELS[model].title}'s shape, {depth}, {SHAPES[shape][1]}, {dtype}"


def build(model: str, layers: int, shape: str, dtype: str, name: str, family: str) -> Case:
    """The case, its model made and imported (seconds; minutes for the deepest on a CPU)."""
    from tensorsmith.suite.hugging_face import hf_case

    vocab = MODELS[model].config(layers).vocab_size
    return hf_case(functools.partial(module, model, layers), (1, SHAPES[shape][0]), vocab, name, family,
                   note(model, layers, shape, DTYPES[dtype]), DTYPES[dtype])


def case(model: str, layers: int, shape: str, dtype: str, name: str, family: str) -> DeferredCase:
    """One row, built when run; its parameter count is known without building it."""
    return DeferredCase(name, family, functools.partial(build, model, layers, shape, dtype, name, family),
                        note=note(model, layers, shape, DTYPES[dtype]),
                        parameters=functools.partial(parameter_count, model, layers))


def rows(model: str) -> list[tuple[str, str]]:
    """The (shape, dtype) of each of a model's rows: its own, else the narrow dtypes at every shape, float32 at
    one."""
    if MODELS[model].rows:
        return list(MODELS[model].rows)
    return [(shape, dtype) for shape in MODELS[model].shapes for dtype in NARROW] + [(FLOAT32_SHAPE, "fp32")]


CASES = [case(model, MODEL_LAYERS, shape, dtype, f"{model}_{shape}_{dtype}", "model")
         for model in MODELS for shape, dtype in rows(model)] + [
    case(DEPTH_MODEL, layers, DEPTH_SHAPE, DEPTH_DTYPE, f"{DEPTH_MODEL}_{layers}layers", "depth")
    for layers in DEPTHS]
