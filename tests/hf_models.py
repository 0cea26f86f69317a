"""Small Hugging Face models built from a configuration with random weights (nothing downloaded), wrapped so that
ids go in and logits come out: what the importers' tests export. Needs torch and transformers."""
from __future__ import annotations

import torch
import transformers


class Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, use_cache=False).logits


class Hidden(torch.nn.Module):
    """An encoder's last hidden state for token ids (an encoder has no logits)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).last_hidden_state


def small_model(family: str) -> torch.nn.Module:
    """A 2-layer Llama (hidden 256, grouped-query attention) or GPT-2 (hidden 128), or one BERT encoder layer (hidden
    128, exact GELU, token types and positions from its buffers), vocabulary 1000, in eval mode."""
    if family == "bert":
        return Hidden(transformers.BertModel(transformers.BertConfig(
            hidden_size=128, num_hidden_layers=1, num_attention_heads=4, intermediate_size=256, vocab_size=1000,
            max_position_embeddings=64), add_pooling_layer=False)).eval()
    if family == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
            num_hidden_layers=2, vocab_size=1000))
    else:
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_embd=128, n_layer=2, n_head=4, vocab_size=1000, n_positions=64, bos_token_id=0, eos_token_id=0))
    return Logits(model).eval()
