"""Greedy decoding over a static KV cache: tokens per second, tensorsmith against transformers with torch.compile.

Llama-3.2-1B's shape (random weights, float16) at `--layers` layers (default 16, its own), a prompt of `--prompt`
tokens, a cache of `--cache` positions. Ours: a prefill program and a one-token decode program through
`ts.from_torch` over transformers' StaticCache (each call writes the cache back). Theirs: `model.generate` with
`cache_implementation="static"`, with which transformers compiles the decoding forward itself (torch.compile,
`reduce-overhead`: CUDA graphs), as its documentation advises for fast generation; a first, untimed call compiles.
Both loops are timed by wall clock over `--new` tokens after the prefill, each run synchronized at its end; the
first tokens of both are compared (float16 noise may part them later). Needs a GPU:

    python benchmarks/decode.py [--layers 16] [--prompt 32] [--new 64] [--cache 2048] [--budget 20]
"""
from __future__ import annotations

import argparse
import time

import torch
import transformers

import tensorsmith as ts


class Step(torch.nn.Module):
    """One call of the model over a static cache: the last position's logits."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, position: torch.Tensor, cache: object) -> torch.Tensor:
        return self.model(input_ids=ids, past_key_values=cache, cache_position=position).logits[:, -1]


def llama1b(layers: int) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(  # type: ignore[call-arg]
        hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
        vocab_size=128256, rope_theta=500000.0, tie_word_embeddings=True, max_position_embeddings=131072,
        rms_norm_eps=1e-5, num_hidden_layers=layers)


def static_cache(config: transformers.LlamaConfig, length: int) -> transformers.StaticCache:
    cache = transformers.StaticCache(config=config, max_cache_len=length)
    cache.early_initialization(1, config.num_key_value_heads, config.head_dim, torch.float16, "cuda")
    return cache


def ours(model: torch.nn.Module, prompt: torch.Tensor, new: int, length: int, budget: float) -> tuple[list, float]:
    """Our tokens and seconds per decoded token (the prefill untimed), after compiling both programs."""
    step, n = Step(model), prompt.shape[1]
    began = time.perf_counter()
    prefill = ts.from_torch(step, (prompt, torch.arange(n, device="cuda"), static_cache(model.config, length)),
                            budget_s=budget)
    decode = ts.from_torch(step, (prompt[:, :1], torch.tensor([n], device="cuda"), static_cache(model.config, length)),
                           budget_s=budget)
    print(f"tensorsmith: prefill and decode programs compiled in {time.perf_counter() - began:.1f} s "
          f"({len(prefill.program.kernels)} and {len(decode.program.kernels)} kernels)")
    runs = []
    for _ in range(2):   # the first run warms the programs' device state up
        cache = static_cache(model.config, length)
        tokens = [prefill(prompt, torch.arange(n, device="cuda"), cache).argmax(-1, keepdim=True)]
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(new - 1):
            tokens.append(decode(tokens[-1], torch.tensor([n + i], device="cuda"), cache).argmax(-1, keepdim=True))
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - start) / (new - 1))
    return torch.cat(tokens, dim=1)[0].tolist(), min(runs)


def theirs(model: torch.nn.Module, prompt: torch.Tensor, new: int, length: int) -> tuple[list, float]:
    """transformers' generate with a static cache, which compiles the decoding forward by itself (torch.compile,
    reduce-overhead: CUDA graphs) on a GPU."""
    model.generation_config.cache_implementation = "static"
    began = time.perf_counter()
    model.generate(prompt, max_new_tokens=new, do_sample=False, cache_implementation="static")
    print(f"torch.compile: first generate (compiles) {time.perf_counter() - began:.1f} s")
    runs = []
    for _ in range(2):
        model.generate(prompt, max_new_tokens=1, do_sample=False)            # the prefill alone, to subtract
        torch.cuda.synchronize()
        start = time.perf_counter()
        model.generate(prompt, max_new_tokens=1, do_sample=False)
        torch.cuda.synchronize()
        prefill_s = time.perf_counter() - start
        start = time.perf_counter()
        out = model.generate(prompt, max_new_tokens=new, do_sample=False)
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - start - prefill_s) / (new - 1))
    return out[0, prompt.shape[1]:].tolist(), min(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--cache", type=int, default=2048)
    parser.add_argument("--budget", type=float, default=20.0, help="tensorsmith's search budget per program")
    args = parser.parse_args()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(llama1b(args.layers)).to(torch.float16).eval()
    model.generation_config.eos_token_id = None          # every run makes --new tokens
    prompt = torch.randint(0, model.config.vocab_size, (1, args.prompt), device="cuda")
    with torch.no_grad():
        our_tokens, our_s = ours(model, prompt, args.new, args.cache, args.budget)
        their_tokens, their_s = theirs(model, prompt, args.new, args.cache)
    same = next((i for i, (a, b) in enumerate(zip(our_tokens, their_tokens)) if a != b), len(our_tokens))
    print(f"{'':28s} {'ms/token':>9s} {'tokens/s':>9s}")
    print(f"{'tensorsmith':28s} {our_s * 1e3:9.3f} {1 / our_s:9.1f}")
    print(f"{'torch.compile reduce-overhead':28s} {their_s * 1e3:9.3f} {1 / their_s:9.1f}")
    print(f"ratio (ours / theirs in tokens/s): {their_s / our_s:.2f}x; the first {same} of {len(our_tokens)} tokens "
          f"agree")


if __name__ == "__main__":
    main()
