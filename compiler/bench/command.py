"""`tensorsmith bench`: run the suite (or the cases named) and print, and with -o write, the table."""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tensorsmith.codegen.runtime import gpu_available
from tensorsmith.ir.errors import TensorsmithError
from tensorsmith.ir.knobs import CACHE_DIR_ENV

from .case import FAMILIES, AnyCase, Case, load_suite, select
from .harness import BASELINES, DEFAULT_BASELINES, Harness, commit
from .report import format_text, from_json, markdown, summary, table_rows, write_results
from .results import NOT_RUN, Row, ratio, unmeasured_row

DEFAULT_BUDGET_S = 10.0


class BenchError(TensorsmithError):
    """`tensorsmith bench` cannot run here: no GPU, no PyTorch, a bad option."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `tensorsmith bench`."""
    parser.add_argument("cases", nargs="*", metavar="CASE",
                        help=f"case names, families ({', '.join(FAMILIES)}) or prefixes ending in '*' (default: all)")
    parser.add_argument("--list", action="store_true", help="list the cases and exit (needs no GPU)")
    parser.add_argument("--baselines", default=",".join(DEFAULT_BASELINES),
                        help=f"comma-separated, of {', '.join(BASELINES)} (default {','.join(DEFAULT_BASELINES)})")
    parser.add_argument("--no-backend", action="store_true",
                        help='skip the model cases\' torch.compile(backend="tensorsmith") column (its compile is long)')
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, metavar="SECONDS",
                        help=f"tensorsmith's search budget per case (default {DEFAULT_BUDGET_S:g})")
    parser.add_argument("-o", "--output", metavar="BENCHMARKS.md",
                        help="write the run into this Markdown file (between its bench markers; the rest is kept) and "
                             "every number into the .json beside it")
    parser.add_argument("--time-limit", type=float, metavar="SECONDS",
                        help="start no case after this many seconds; those left are rows that say so")
    parser.add_argument("--from-json", nargs="+", metavar="RESULTS.json",
                        help="no run: write -o (or print) from the results of earlier runs, rows joined in order")
    parser.add_argument("--seed", type=int, default=0, help="seed of the inputs and of the search")
    parser.add_argument("--cache-dir", help="tensorsmith's cache to use (default: a fresh one for each case, and fresh"
                                             " Inductor and Triton caches for each baseline, so that every compile is"
                                             " cold; then a second compile measures our warm one)")
    parser.add_argument("--commit", default=None, help="the commit to name in the report (default: git's)")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")


def run_bench(args: argparse.Namespace, argv: list[str]) -> int:
    """`tensorsmith bench`: list the cases, join saved results, or run the cases on this GPU."""
    cases = select(load_suite(), args.cases)
    if args.list:
        for case in cases:
            print(f"{case.name:30s} {case.family:13s} {_listed_size(case):>25s}  {case.note}")
        return 0
    output = Path(args.output) if args.output else None
    if output is not None and output.is_dir():
        raise BenchError(f"-o {output}: is a folder; give the Markdown file to write")
    if args.from_json:
        return _from_json(args.from_json, output)
    baselines = [b for b in args.baselines.split(",") if b]
    unknown = [b for b in baselines if b not in BASELINES]
    if unknown:
        raise BenchError(f"unknown baseline {unknown[0]!r}; choose from {', '.join(BASELINES)}")
    if args.budget <= 0:
        raise BenchError(f"--budget must be positive, got {args.budget:g}")
    torch = _torch_on_gpu()
    if args.cache_dir:       # the user's cache: compiles are cold only where it lacks them
        os.environ[CACHE_DIR_ENV] = args.cache_dir
        return _run(torch, cases, baselines, args, output, argv, None)
    with tempfile.TemporaryDirectory(prefix="tensorsmith-bench-") as fresh:
        return _run(torch, cases, baselines, args, output, argv, Path(fresh))


def _listed_size(case: AnyCase) -> str:
    """What `--list` says of a case's size: its floor's bytes and FLOPs, or a deferred model's parameter count (read
    without building it), as a user sizes the model they run."""
    if isinstance(case, Case):
        return f"{case.bytes_moved() / 1e6:9.1f} MB {case.matmul_flops() / 1e9:9.1f} GFLOP"
    if case.parameters is None:
        return "(built when run)"
    try:
        count = case.parameters()
    except ImportError:
        return "(needs torch and transformers)"
    return f"{count / 1e9:.2f} B params" if count >= 1e9 else f"{count / 1e6:.1f} M params"


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _run(torch: Any, cases: list[AnyCase], baselines: list[str], args: argparse.Namespace, output: Path | None,
         argv: list[str], cache_root: Path | None) -> int:
    started = time.perf_counter()
    _log("measuring the GPU's copy bandwidth and matmul rate ...")
    harness = Harness(torch, baselines, args.budget, args.seed, args.commit or commit(), cache_root,
                      backend=not args.no_backend)
    meta = harness.meta("tensorsmith " + shlex.join(argv))
    _log(f"{meta['gpu']}: copy {meta['copy_tb_s']:.2f} TB/s, float16 matmul {meta['matmul_tflop_s']:.0f} TFLOP/s; "
         f"{len(cases)} cases, baselines {', '.join(baselines)}")
    rows: list[Row] = []
    for index, case in enumerate(cases):
        if args.time_limit is not None and time.perf_counter() - started > args.time_limit:
            _log(f"time limit of {args.time_limit:g} s reached; not run: {', '.join(c.name for c in cases[index:])}")
            rows.extend(_not_run(case, baselines, args.time_limit) for case in cases[index:])
            break
        _log(f"[{index + 1}/{len(cases)}] {case.name} ...")
        case_start = time.perf_counter()
        rows.append(harness.run(case))
        cells = table_rows(rows[-1:], baselines)
        _log("    " + ", ".join(f"{h} {c}" for h, c in zip(cells[0][1:], cells[1][1:]))
             + f" ({time.perf_counter() - case_start:.0f} s)")
        if output is not None:
            write_results(output, meta, rows)
    if output is not None:
        write_results(output, meta, rows)
    print(format_text(table_rows(rows, baselines)))
    s = summary(rows)
    print(f"geometric mean of the speedup over the best baseline: kernels {ratio(s['geomean_kernels'])}, "
          f"call {ratio(s['geomean_call'])} ({s['cases_compared']} of {s['cases']} cases); "
          f"{time.perf_counter() - started:.0f} s")
    if output is not None:
        print(f"wrote {output} and {output.with_suffix('.json')}")
    return 0


def _not_run(case: AnyCase, baselines: list[str], limit: float) -> Row:
    """The row of a case that the time limit left out: it says so in every column."""
    return unmeasured_row(case.name, case.family, baselines, f"{NOT_RUN}: the time limit of {limit:g} s was reached"
                          " first", note=case.note)


def _from_json(paths: list[str], output: Path | None) -> int:
    """One report from several results files: rows in order, a case measured again taking its earlier row's place."""
    meta: dict | None = None
    rows: dict[str, Row] = {}
    for path in paths:
        try:
            run_meta, run_rows = from_json(Path(path).read_text())
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise BenchError(f"{path} is not a results file of tensorsmith bench: {err}") from None
        meta = dict(run_meta) if meta is None else _joined(meta, run_meta)
        rows.update({row.case: row for row in run_rows})
    assert meta is not None
    if output is not None:
        write_results(output, meta, list(rows.values()))
        print(f"wrote {output} and {output.with_suffix('.json')}")
    else:
        print(markdown(meta, list(rows.values())))
    return 0


def _joined(meta: dict, later: dict) -> dict:
    """The meta of two runs as one: every baseline either ran, and each commit, budget, command, GPU, driver and
    torch version said once, in order (the ceilings stay the first run's; each row's floor used its own run's)."""
    joined = dict(meta)
    joined["baselines"] = [*meta["baselines"], *(b for b in later["baselines"] if b not in meta["baselines"])]
    for key in ("commit", "budget_s", "command", "gpu", "driver", "torch", "date"):
        separator = "` then `" if key == "command" else ", "
        said = str(joined[key]).split(separator)
        if str(later[key]) not in said:
            joined[key] = separator.join([*said, str(later[key])])
    return joined


def _torch_on_gpu() -> Any:
    """PyTorch with a CUDA GPU, or a BenchError saying which is missing."""
    if not gpu_available():
        raise BenchError("tensorsmith bench needs an NVIDIA GPU and found none (`tensorsmith bench --list` works"
                         " anywhere)")
    try:
        import torch
    except ImportError:
        raise BenchError("tensorsmith bench compares with PyTorch, which is not installed (pip install torch)") \
            from None
    if not torch.cuda.is_available():
        raise BenchError(f"PyTorch {torch.__version__} sees no GPU (a CPU-only build?); tensorsmith bench needs CUDA")
    return torch
