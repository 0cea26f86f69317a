"""The cost model refitted to the kernels a GPU measured: per device and archetype, the fit `compile` would apply
(search/refit.py) and its error on records held out of the fit, before and after.

    python benchmarks/cost_fit.py [kernel_times.jsonl ...]   # default: the one beside the program cache

Records carry features only since the refit landed; older ones are counted but cannot be fitted.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tensorsmith.ir.knobs import cache_root
from tensorsmith.search import refit
from tensorsmith.search.kernel_times import KERNEL_TIMES_FILE, model_fingerprint


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("paths", nargs="*", type=Path, default=[cache_root() / "programs" / KERNEL_TIMES_FILE])
    args = parser.parse_args()
    by_device: dict[str, list[dict]] = {}
    for path in args.paths:
        if not path.is_file():
            print(f"no kernel-time records at {path}: compile with a GPU and a cache (the default) first",
                  file=sys.stderr)
            raise SystemExit(2)
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict):
                continue
            by_device.setdefault(str(record.get("device")), []).append(record)
    for device, records in by_device.items():
        featured = [r for r in records if isinstance(r.get("features"), dict)
                    and r["features"].get("model") == model_fingerprint()]
        counts: dict[str, int] = {}
        for record in featured:
            archetype = record["features"].get("archetype", "?")
            counts[archetype] = counts.get(archetype, 0) + 1
        print(f"{device}: {len(records)} records, {len(featured)} with features of this cost model ({counts})")
        print(f"  {'archetype':12s} {'fitted on':>9s} {'held out':>8s} {'scale':>9s} {'power':>6s} "
              f"{'error before':>12s} {'after':>6s}")
        for fit in refit.fit(featured):
            print(f"  {fit.archetype:12s} {fit.fitted_on:9d} {fit.held_out:8d} {fit.scale:9.3g} {fit.power:6.2f} "
                  f"{fit.error_before:11.2f}x {fit.error_after:5.2f}x")


if __name__ == "__main__":
    main()
