"""Small Hugging Face models, built from a configuration with random weights (nothing downloaded) and imported as a
PyTorch user's model is (`ts.import_torch`, torch.export underneath): a 2-layer Llama, a 2-layer GPT-2 and a BERT
encoder layer, in float16 on 64 token ids. Built when run, as exporting takes seconds; need torch and transformers.

Their inputs are the model's own: token ids drawn from the vocabulary and the module's float16 weights. The
reference is the module itself, in the dtype it is given (the float32 truth is the same float16 weights widened)."""
from __future__ import annotations

import functools
from typing import Any

from tensorsmith.bench import Case, DeferredCase

try:
    import torch
except ImportError:   # the suite lists without torch; building these cases needs it
    torch = None  # type: ignore[assignment]

TOKENS, VOCAB = 64, 1000
LAYER_WIDTH = 128
FAMILIES = ("llama", "gpt2", "bert")
LAYERS = ("llama", "gpt2")       # the families whose layer `small_layer` builds alone
SMALL_MODULES = [(family, False) for family in FAMILIES] + [(family, True) for family in LAYERS]   # (family, layer)


if torch is not None:
    class Layer(torch.nn.Module):
        """One transformer layer alone, called as hidden states (batch, tokens, width) -> hidden states, causal:
        a Llama decoder layer with the rotary embedding it is given, or a GPT-2 block."""

        def __init__(self, family: str) -> None:
            super().__init__()
            import transformers
            from transformers.models.llama import modeling_llama

            config: Any
            if family == "llama":
                config = transformers.LlamaConfig(hidden_size=LAYER_WIDTH, intermediate_size=2 * LAYER_WIDTH,
                                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB)
                self.layer: torch.nn.Module = modeling_llama.LlamaDecoderLayer(config, layer_idx=0)
                self.rotary: torch.nn.Module | None = modeling_llama.LlamaRotaryEmbedding(config)
            else:
                config = transformers.GPT2Config(n_embd=LAYER_WIDTH, n_head=4, vocab_size=VOCAB, n_positions=TOKENS,
                                                 bos_token_id=0, eos_token_id=0)
                self.layer, self.rotary = transformers.models.gpt2.modeling_gpt2.GPT2Block(config, layer_idx=0), None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.rotary is None:
                out = self.layer(x)
            else:
                positions = torch.arange(x.shape[1], device=x.device)[None]
                out = self.layer(x, position_embeddings=self.rotary(x, positions))
            return out[0] if isinstance(out, tuple) else out


def small_layer(family: str) -> Any:
    """A Llama decoder layer or a GPT-2 block (width 128), float32, in eval mode."""
    return Layer(family).eval()


def small_input(layer: bool, tokens: int) -> Any:
    """An input for `small_layer` (hidden states) or `small_model` (token ids), one sequence of `tokens`."""
    return torch.randn(1, tokens, LAYER_WIDTH) if layer else torch.randint(0, VOCAB, (1, tokens))


def small_model(family: str) -> Any:
    """A 2-layer Llama (hidden 256, grouped-query attention) or GPT-2 (hidden 128), or one BERT encoder layer (hidden
    128, exact GELU, token types and positions from its buffers), vocabulary 1000, float32, in eval mode."""
    import transformers

    from tensorsmith.suite.hugging_face import Hidden, Logits

    if family == "bert":
        return Hidden(transformers.BertModel(transformers.BertConfig(
            hidden_size=128, num_hidden_layers=1, num_attention_heads=4, intermediate_size=256, vocab_size=VOCAB,
            max_position_embeddings=TOKENS), add_pooling_layer=False)).eval()
    model: Any
    if family == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
            num_hidden_layers=2, vocab_size=VOCAB))
    else:
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_embd=128, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=TOKENS, bos_token_id=0, eos_token_id=0))
    return Logits(model).eval()


def imported_case(family: str) -> Case:
    """The toy model of `family` in float16 on TOKENS ids, imported as every Hugging Face case is."""
    from tensorsmith.suite.hugging_face import hf_case

    return hf_case(functools.partial(small_model, family), (1, TOKENS), VOCAB, f"hf_{family}", "imported",
                   _note(family))


def _note(family: str) -> str:
    return f"Hugging Face {family}, random weights, {TOKENS} tokens, imported by ts.import_torch"


CASES = [DeferredCase(f"hf_{family}", "imported", functools.partial(imported_case, family), note=_note(family))
         for family in FAMILIES]
