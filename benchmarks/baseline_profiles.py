"""Which kernels the Llama block's PyTorch baseline runs, with q, k and v given to SDPA as 3-D tensors (how the bench
wrote it until 2026-12-04) and as 4-D ones (how Hugging Face calls it), eager and through torch.compile: the
profiles, their kernel classes, the bench's verdict on each (`tensorsmith.bench.profile.slow_path`) and GPU times.

    python benchmarks/baseline_profiles.py [--tokens 2048] [-o profiles.json]

The JSON holds each profile as the bench records it; tests/bench/data/ keeps one run's, so that the CPU tests check
the verdicts on profiles the H200 recorded. Needs torch with CUDA.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict

import torch
import torch.nn.functional as F

from tensorsmith.bench import profile
from tensorsmith.bench.timing import time_runs
from tensorsmith.suite import blocks


def block_3d(x, attn_norm, ffn_norm, wq, wk, wv, wo, w_gate, w_up, w_down):
    """The block as the bench wrote it before: SDPA on (heads, tokens, dim)."""
    tokens, width, heads = x.shape[0], blocks.WIDTH, blocks.HEADS
    h = F.rms_norm(x, (width,), attn_norm, eps=blocks.RMS_EPS)
    q, k, v = (F.linear(h, w).view(tokens, heads, width // heads).transpose(0, 1) for w in (wq, wk, wv))
    attended = F.scaled_dot_product_attention(blocks.torch_rope(q), blocks.torch_rope(k), v, is_causal=True)
    x = x + F.linear(attended.transpose(0, 1).reshape(tokens, width), wo)
    h = F.rms_norm(x, (width,), ffn_norm, eps=blocks.RMS_EPS)
    return x + F.linear(F.silu(F.linear(h, w_gate)) * F.linear(h, w_up), w_down)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("-o", "--output", default="profiles.json")
    args = parser.parse_args()
    graph = blocks.llama_block(args.tokens)
    tensors = {name: torch.randn(node.shape, device="cuda", dtype=torch.float16) * (node.shape[-1] ** -0.5
                                                                                  if node.ndim == 2 and name != "x"
                                                                                  else 1.0)
               for name, node in graph.inputs.items()}
    runs, recorded = {}, {}
    for layout, fn in (("3d", block_3d), ("4d", blocks.torch_llama_block)):
        for mode in ("eager", "compile"):
            run = fn if mode == "eager" else torch.compile(fn, dynamic=False)
            run(**tensors)
            torch.cuda.synchronize()
            name = f"{layout}_{mode}"
            ran = profile.record(torch, lambda: run(**tensors))
            recorded[name] = asdict(ran)
            runs[name] = (lambda r: lambda: r(**tensors))(run)
            verdict = profile.slow_path(ran, calls_sdpa=True, half_precision_matmuls=True)
            classes = ", ".join(f"{c} {us:.0f} us" for c, us in ran.by_class().items())
            print(f"{name:12s} {classes}\n{'':12s} verdict: {verdict or 'at its best'}")
    times = time_runs(torch, runs, queued=frozenset(runs))
    print("\n".join(f"{name:12s} {ms * 1e3:8.0f} us (GPU time, median)" for name, ms in times.items()))
    with open(args.output, "w") as out:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": args.tokens,
                   "profiles": recorded, "gpu_ms": times}, out, indent=1)


if __name__ == "__main__":
    main()
