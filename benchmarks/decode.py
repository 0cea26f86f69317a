"""Greedy decoding over a static KV cache: tokens per second, tensorsmith against transformers with torch.compile.

Llama-3.2-1B's shape (random weights, float16) at `--layers` layers (default 16, its own), a prompt of `--prompt`
tokens, a cache of `--cache` positions. Ours: a prefill program and a one-token decode program through
`ts.from_torch` over transformers' StaticCache (each call writes the cache back). Theirs: `model.generate` with
`cache_implementation="static"`, with which transformers compiles the decoding forward itself (torch.compile,
`reduce-overhead`: CUDA graphs), as its documentation advises for fast generation; a first, untimed call compiles.
Both loops are timed by wall clock over `--new` tokens after the prefill, each run synchronized at its end; the
first tokens of both are compared (float16 noise may part them later). Needs a GPU, but for `--tiny` (a narrow
model, a smoke test of the script that runs on the CPU too, where transformers compiles nothing):

    python benchmarks/decode.py [--layers 16] [--prompt 32] [--new 64] [--cache 2048] [--budget 20] [--kernels 12]
                                [--save DIR]
    python benchmarks/decode.py --tiny --layers 2 --new 8 --cache 64 --budget 3 [--device cpu]
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import torch
import transformers

import tensorsmith as ts
from tensorsmith.imported import ImportedProgram


class Step(torch.nn.Module):
    """One call of the model over a static cache: the last position's logits."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, position: torch.Tensor, cache: object) -> torch.Tensor:
        return self.model(input_ids=ids, past_key_values=cache, cache_position=position).logits[:, -1]


def llama1b(layers: int, tiny: bool = False) -> transformers.LlamaConfig:
    """Llama-3.2-1B's shape at `layers` layers; with `tiny`, a narrow model of the same kind."""
    width = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 vocab_size=1000) if tiny else dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                                                    num_key_value_heads=8, head_dim=64, vocab_size=128256)
    return transformers.LlamaConfig(  # type: ignore[call-arg]
        **width, rope_theta=500000.0, tie_word_embeddings=True, max_position_embeddings=131072, rms_norm_eps=1e-5,
        num_hidden_layers=layers)


def static_cache(config: transformers.LlamaConfig, length: int, device: str) -> transformers.StaticCache:
    cache = transformers.StaticCache(config=config, max_cache_len=length)
    cache.early_initialization(1, config.num_key_value_heads, config.head_dim, torch.float16, device)
    return cache


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def ours(model: torch.nn.Module, prompt: torch.Tensor, new: int, length: int, budget: float,
         slowest: int = 0, save: str | None = None) -> tuple[list, float]:
    """Our tokens and seconds per decoded token (the prefill untimed), after compiling both programs."""
    step, n, device = Step(model), prompt.shape[1], prompt.device.type
    began = time.perf_counter()
    prefill = ts.from_torch(step, (prompt, torch.arange(n, device=device), static_cache(model.config, length, device)),
                            budget_s=budget)
    decode = ts.from_torch(step, (prompt[:, :1], torch.tensor([n], device=device),
                                  static_cache(model.config, length, device)), budget_s=budget)
    print(f"tensorsmith: prefill and decode programs compiled in {time.perf_counter() - began:.1f} s "
          f"({len(prefill.program.kernels)} and {len(decode.program.kernels)} kernels)")
    if save:
        print(f"the decode program written to {decode.program.save(save)}/")
    runs = []
    for _ in range(2):   # the first run warms the programs' device state up
        cache = static_cache(model.config, length, device)
        tokens = [prefill(prompt, torch.arange(n, device=device), cache).argmax(-1, keepdim=True)]
        synchronize(device)
        start = time.perf_counter()
        for i in range(new - 1):
            tokens.append(decode(tokens[-1], torch.tensor([n + i], device=device), cache).argmax(-1, keepdim=True))
        synchronize(device)
        runs.append((time.perf_counter() - start) / (new - 1))
    if device == "cuda":
        step_alone(decode, tokens[-1], n, length, model.config, new, slowest)
    return torch.cat(tokens, dim=1)[0].tolist(), min(runs)


def step_alone(decode: ImportedProgram, token: torch.Tensor, n: int, length: int,
               config: transformers.LlamaConfig, calls: int, slowest: int = 0) -> None:
    """Where a decoded token's time goes: the decode program's calls back to back (no argmax, no new tensors) by
    wall clock, against the sum of its kernels' times as the compile measured them (each alone, L2 flushed); the
    `slowest` kernels listed."""
    cache, position = static_cache(config, length, "cuda"), torch.tensor([n], device="cuda")
    decode(token, position, cache)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        decode(token, position, cache)
    issued_s = (time.perf_counter() - start) / calls   # the host's time a call, where it does not wait for the GPU
    torch.cuda.synchronize()
    call_s = (time.perf_counter() - start) / calls
    measured = [k.measured_ms for k in decode.program.kernels if k.measured_ms is not None]
    kernels = f"{sum(measured):.3f} ms" if len(measured) == len(decode.program.kernels) else "unmeasured"
    print(f"tensorsmith decode step alone: {call_s * 1e3:.3f} ms a call ({issued_s * 1e3:.3f} ms of it to issue the "
          f"call, as the host saw it); its {len(decode.program.kernels)} kernels "
          f"{kernels} (each alone, L2 flushed); CUDA graphs made over all its calls: "
          f"{decode.program.gpu_state['device_caller'].graphs_made}")
    by_archetype: dict[str, list[float]] = {}
    for kernel in decode.program.kernels:
        by_archetype.setdefault(kernel.archetype, []).append(kernel.measured_ms or 0.0)
    print("  by archetype: " + ", ".join(f"{name} {len(times)} kernels {sum(times):.3f} ms"
                                         for name, times in sorted(by_archetype.items(), key=lambda i: -sum(i[1]))))
    as_run(decode, token, position, cache, slowest)
    if any(kernel.programmatic for kernel in decode.program.kernels):
        serial = step_seconds(without_programmatic_launch(decode), token, position, cache, calls)
        print(f"  each kernel launched when the one before has ended (no programmatic launch): {serial * 1e3:.3f} ms a "
              f"call, against {call_s * 1e3:.3f} ms as compiled")
    for kernel in sorted(decode.program.kernels, key=lambda k: -(k.measured_ms or 0.0))[:slowest]:
        how = next((line for line in kernel.source.splitlines() if line.startswith("// archetype:")), "")
        print(f"  {kernel.measured_ms or 0.0:7.4f} ms  {kernel.name}  {kernel.schedule}  grid {kernel.grid}\n"
              f"      {how[:240]}")


def step_seconds(decode: ImportedProgram, token: torch.Tensor, position: torch.Tensor, cache: object,
                 calls: int) -> float:
    """Wall-clock seconds a call of `decode`, its calls back to back (after one that sets its device state up)."""
    decode(token, position, cache)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        decode(token, position, cache)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls


def without_programmatic_launch(decode: ImportedProgram) -> ImportedProgram:
    """`decode` with every kernel launched as an ordinary launch, for the comparison (its device state rebuilt)."""
    program = dataclasses.replace(decode.program, kernels=[dataclasses.replace(kernel, programmatic=False)
                                                           for kernel in decode.program.kernels])
    return ImportedProgram(decode.imported, program)


def as_run(decode: ImportedProgram, token: torch.Tensor, position: torch.Tensor, cache: object, slowest: int,
           calls: int = 10) -> None:
    """The decode step's kernels as its calls run them (CUDA graphs, the cache written in place, L2 warm), from
    PyTorch's profiler: the GPU's busy time a call against the call's wall time says whether the step waits on the
    host; the `slowest` kernels by their time a call."""
    sharing: dict[str, list[str]] = {}
    for kernel in decode.program.kernels:   # a stitched model's layers run one function each, under one symbol
        sharing.setdefault(kernel.symbol, []).append(kernel.name)
    names = {symbol: kernels[0] + (f" (x{len(kernels)})" if len(kernels) > 1 else "")
             for symbol, kernels in sharing.items()}
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        start = time.perf_counter()
        for _ in range(calls):
            decode(token, position, cache)
        torch.cuda.synchronize()
        wall_s = (time.perf_counter() - start) / calls
    busy: dict[str, float] = {}
    for event in profile.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            name = names.get(event.name, event.name)
            busy[name] = busy.get(name, 0.0) + event.time_range.elapsed_us() / calls
    ours = sum(us for name, us in busy.items() if name in names.values())
    print(f"  as run (profiled, {calls} calls): the GPU busy {sum(busy.values()) / 1e3:.3f} ms a call, "
          f"{ours / 1e3:.3f} ms of it in the program's kernels, against {wall_s * 1e3:.3f} ms a call by wall clock")
    for name, us in sorted(busy.items(), key=lambda item: -item[1])[:slowest]:
        print(f"  {us / 1e3:7.4f} ms  {name[:90]}")


def theirs(model: torch.nn.Module, prompt: torch.Tensor, new: int, length: int) -> tuple[list, float]:
    """transformers' generate with a static cache, which compiles the decoding forward by itself (torch.compile,
    reduce-overhead: CUDA graphs) on a GPU."""
    device = prompt.device.type
    model.generation_config.cache_implementation = "static"
    model.generation_config.max_length = None
    began = time.perf_counter()
    model.generate(prompt, max_new_tokens=new, do_sample=False)
    print(f"transformers: first generate (compiles on a GPU) {time.perf_counter() - began:.1f} s")
    runs = []
    for _ in range(2):
        model.generate(prompt, max_new_tokens=1, do_sample=False)            # the prefill alone, to subtract
        synchronize(device)
        start = time.perf_counter()
        model.generate(prompt, max_new_tokens=1, do_sample=False)
        synchronize(device)
        prefill_s = time.perf_counter() - start
        start = time.perf_counter()
        out = model.generate(prompt, max_new_tokens=new, do_sample=False)
        synchronize(device)
        runs.append((time.perf_counter() - start - prefill_s) / (new - 1))
    return out[0, prompt.shape[1]:].tolist(), min(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--cache", type=int, default=2048)
    parser.add_argument("--budget", type=float, default=20.0, help="tensorsmith's search budget per program")
    parser.add_argument("--tiny", action="store_true", help="a narrow model: a smoke test of this script")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--kernels", type=int, default=0, help="list this many of the decode step's slowest kernels")
    parser.add_argument("--save", help="write the decode program (its kernels, program.json, report.html) here")
    args = parser.parse_args()
    torch.manual_seed(0)
    with torch.device(args.device):
        model = transformers.LlamaForCausalLM(llama1b(args.layers, args.tiny)).to(torch.float16).eval()
    model.generation_config.eos_token_id = None          # every run makes --new tokens
    prompt = torch.randint(0, model.config.vocab_size, (1, args.prompt), device=args.device)
    with torch.no_grad():
        our_tokens, our_s = ours(model, prompt, args.new, args.cache, args.budget, args.kernels, args.save)
        their_tokens, their_s = theirs(model, prompt, args.new, args.cache)
    same = next((i for i, (a, b) in enumerate(zip(our_tokens, their_tokens)) if a != b), len(our_tokens))
    print(f"{'':28s} {'ms/token':>9s} {'tokens/s':>9s}")
    print(f"{'tensorsmith':28s} {our_s * 1e3:9.3f} {1 / our_s:9.1f}")
    theirs_label = "torch.compile reduce-overhead" if args.device == "cuda" else "transformers, eager"
    print(f"{theirs_label:28s} {their_s * 1e3:9.3f} {1 / their_s:9.1f}")
    print(f"ratio (ours / theirs in tokens/s): {their_s / our_s:.2f}x; the first {same} of {len(our_tokens)} tokens "
          f"agree")
    if same < len(our_tokens):
        with torch.no_grad():
            parting(model, prompt, our_tokens, their_tokens, same)


def parting(model: torch.nn.Module, prompt: torch.Tensor, ours: list, theirs: list, step: int) -> None:
    """Where the two loops part: the model's own logits (eager, no cache, in float32) after the tokens both chose,
    for the two tokens they chose there. Within float16 noise the two are near equal; a wide gap is a wrong step."""
    ids = torch.cat([prompt, torch.tensor([ours[:step]], device=prompt.device, dtype=prompt.dtype)], dim=1)
    logits = model.float()(input_ids=ids).logits[0, -1]
    model.half()
    top = logits.topk(2)
    print(f"the loops part at token {step}: eager float32 logits give ours ({ours[step]}) {logits[ours[step]]:.4f} and "
          f"theirs ({theirs[step]}) {logits[theirs[step]]:.4f}; the top two {top.values[0]:.4f}, "
          f"{top.values[1]:.4f} (spread of all logits {logits.std():.4f})")


if __name__ == "__main__":
    main()
