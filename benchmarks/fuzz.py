"""The fuzzer of issue 18 at any size: random graphs through the public API, compiled and run by the numpy
executor, each compared with an independent numpy evaluation (tests/fuzz_graphs.py).

    python benchmarks/fuzz.py [--graphs 10000] [--seed 0] [--ops 6] [--budget 0.5]

It prints every graph that is not ok (its seed, verdict, detail and steps), the counts so far every --every graphs,
then the counts and the time taken.
Exit status 1 if any graph crashed, compiled wrong or failed to compile; rejections (issue 17) are counted.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fuzz_graphs import check, random_graph  # noqa: E402  (the generator lives beside the tests that use it)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0, help="the first graph's seed; graph i has seed + i")
    parser.add_argument("--ops", type=int, default=6, help="operations per graph")
    parser.add_argument("--budget", type=float, default=0.5, help="search budget per compile, seconds")
    parser.add_argument("--every", type=int, default=100, help="print the counts so far every this many graphs")
    args = parser.parse_args()
    counts: Counter[str] = Counter()
    started = time.perf_counter()
    for done, seed in enumerate(range(args.seed, args.seed + args.graphs), 1):
        fuzzed = random_graph(seed, args.ops)
        verdict, detail = check(fuzzed, args.budget)
        counts[verdict] += 1
        if verdict != "ok":
            print(f"seed {seed}: {verdict}: {detail[:300]}\n    " + "; ".join(fuzzed.steps), flush=True)
        if done % args.every == 0 and done < args.graphs:
            print(_counts(done, counts, time.perf_counter() - started), flush=True)
    print(_counts(args.graphs, counts, time.perf_counter() - started))
    return 1 if counts["wrong"] or counts["crash"] or counts["compile error"] else 0


def _counts(graphs: int, counts: Counter[str], elapsed: float) -> str:
    return f"{graphs} graphs in {elapsed:.0f} s: " + ", ".join(f"{counts[v]} {v}" for v in VERDICTS)


VERDICTS = ("ok", "rejected", "wrong", "crash", "compile error")


if __name__ == "__main__":
    sys.exit(main())
