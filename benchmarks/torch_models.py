"""Small Hugging Face models (random weights, built from a configuration) through tensorsmith's two ways in from
PyTorch, on the GPU: `ts.from_torch` and `torch.compile(backend="tensorsmith")`, against eager and torch.compile.

    python benchmarks/torch_models.py [--tokens 64] [--budget 10] [--families llama gpt2 bert]

Each model runs in float16 on token ids (1, tokens); its error is against the same model in float32 (relative L2
of the logits, or of the last hidden state for BERT). Times are as called (CUDA events, L2 flushed, medians; the
bench's `time_runs`). Needs torch with CUDA and transformers.
"""
from __future__ import annotations

import argparse
import copy
import sys
import time

import torch

import tensorsmith as ts
from tensorsmith import torch_backend
from tensorsmith.bench.timing import time_runs
from tensorsmith.suite.imported import small_model   # the models of the suite's imported cases and importers' tests


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in float32; NaN where got is not finite."""
    got, want = got.float(), want.float()
    return float((got - want).norm() / want.norm()) if torch.isfinite(got).all() else float("nan")


def measure(family: str, tokens: int, budget_s: float) -> dict[str, object]:
    """One model's errors and times: from_torch, the backend, eager and torch.compile."""
    torch.manual_seed(0)
    exact = small_model(family).cuda()
    model = copy.deepcopy(exact).half()
    ids = torch.randint(0, 1000, (1, tokens), device="cuda")
    with torch.no_grad():
        truth = exact(ids)
        started = time.perf_counter()
        program = ts.from_torch(model, (ids,), budget_s=budget_s, progress=False)
        from_torch_s = time.perf_counter() - started
        torch_backend.OPTIONS = {"budget_s": budget_s, "progress": False}
        torch._dynamo.reset()
        backend = torch.compile(model, backend="tensorsmith")
        started = time.perf_counter()
        backend(ids)
        backend_s = time.perf_counter() - started
        compiled = torch.compile(copy.deepcopy(model))
        runs = {"from_torch": lambda: program(ids), "backend": lambda: backend(ids), "eager": lambda: model(ids),
                "torch.compile": lambda: compiled(ids)}
        errors = {name: relative(run(), truth) for name, run in runs.items()}
        times = time_runs(torch, runs)
    return {"family": family, "errors": errors, "ms": times, "kernels": len(program.program.kernels),
            "compile_s": {"from_torch": from_torch_s, "backend": backend_s}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--budget", type=float, default=10.0)
    parser.add_argument("--families", nargs="+", default=["llama", "gpt2", "bert"])
    args = parser.parse_args()
    rows = [measure(family, args.tokens, args.budget) for family in args.families]
    names = ["from_torch", "backend", "eager", "torch.compile"]
    print("| model | kernels | " + " | ".join(f"{n} us (error)" for n in names)
          + " | from_torch vs eager | vs torch.compile | compile s (from_torch, backend) |")
    print("|" + " --- |" * (len(names) + 5))
    for row in rows:
        ms, errors, seconds = (dict(row[k]) for k in ("ms", "errors", "compile_s"))   # type: ignore[call-overload]
        cells = [f"{ms[n] * 1e3:.1f} ({errors[n]:.1e})" for n in names]
        print(f"| {row['family']} | {row['kernels']} | " + " | ".join(cells)
              + f" | {ms['eager'] / ms['from_torch']:.2f}x | {ms['torch.compile'] / ms['from_torch']:.2f}x"
              + f" | {seconds['from_torch']:.1f}, {seconds['backend']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
