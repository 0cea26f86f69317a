"""Where a bench case's compile spends its time: the pipeline's stages, the search's counters, and cProfile's heaviest
functions, for one cold compile (no program cache).

    python benchmarks/compile_profile.py llama1b_1layers [--budget 20] [--top 25] [--dump out.prof] [--no-profile]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from functools import partial

from tensorsmith import compile as ts_compile
from tensorsmith.bench.case import built, load_suite, select


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("case")
    parser.add_argument("--budget", type=float, default=20.0)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--dump", help="write the cProfile statistics here (pstats format)")
    parser.add_argument("--no-profile", action="store_true", help="time the compile without cProfile's overhead")
    args = parser.parse_args()
    began = time.perf_counter()
    case = built(select(load_suite(), [args.case])[0])
    print(f"{args.case}: built in {time.perf_counter() - began:.1f} s, {len(case.graph.nodes())} nodes")
    profiler = cProfile.Profile()
    began = time.perf_counter()
    run = ts_compile if args.no_profile else partial(profiler.runcall, ts_compile)
    program = run(case.graph, budget_s=args.budget, cache=False, progress=False)
    print(f"compiled in {time.perf_counter() - began:.1f} s (budget {args.budget:g} s), {len(program.kernels)} kernels")
    print("stages:", {k: round(v, 2) for k, v in program.report.get("stage_seconds", {}).items()})
    layers = program.report.get("layers") or {}
    if layers:
        print("layers:", {piece["piece"]: piece["stage_seconds"] for piece in layers["pieces"]},
              "whole model:", layers["whole_model_seconds"])
    search = program.report.get("search") or {}
    print("search:", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in search.items()})
    if args.no_profile:
        return
    stats = pstats.Stats(profiler)
    if args.dump:
        stats.dump_stats(args.dump)
    stats.sort_stats("cumulative").print_stats(args.top)
    stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
