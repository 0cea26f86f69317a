"""Search, per example: candidates enumerated, pruned by Z3, verified, search time, and the winner's
predicted time against its measured time and the measured unfused program (where a GPU is present).

    python benchmarks/search_report.py [--budget 60]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import tensorsmith as ts
from tensorsmith.model_loader import load_graph

EXAMPLES = sorted((Path(__file__).parents[1] / "examples").glob("*.py"))




def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=float, default=60.0)
    args = parser.parse_args()
    head = (f"{'example':18s} {'enum':>5s} {'z3 pruned':>9s} {'verified':>8s} {'measured':>8s} {'search s':>8s} "
            f"{'pred us':>8s} {'meas us':>8s} {'unfused us':>10s} {'speedup':>7s}")
    print(head)
    for path in EXAMPLES:
        program = ts.compile(load_graph(path), budget_s=args.budget, cache=False)
        r, s = program.report, program.report["search"]
        measured = f"{r['total_ms'] * 1e3:8.1f}" if r["total_ms"] is not None else f"{'-':>8s}"
        unfused = f"{r['unfused_ms'] * 1e3:10.1f}" if r["unfused_ms"] is not None else f"{'-':>10s}"
        print(f"{path.stem:18s} {s['enumerated']:5d} {s['pruned_expression_z3']:9d} {s['verified']:8d} {s['measured']:8d} "
              f"{s['seconds']:8.1f} {r['predicted_ms'] * 1e3:8.1f} {measured} {unfused} {r['speedup']:6.2f}x")


if __name__ == "__main__":
    main()
