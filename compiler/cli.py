"""The command line: `tensorsmith compile|inspect ...`, and `compile ...` as the short form of `tensorsmith compile`."""
from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path
from typing import Sequence

from tensorsmith.ir.errors import TensorsmithError

from .targets import TARGETS

USAGE_ERRORS = 2   # bad input from the user: a model that raises, an unknown target, a missing file
FAILURE = 1        # tensorsmith itself failed: a compile error, a wrong kernel, a GPU fault


def _compile_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a model.py defining a tensorsmith Graph (module level, or build() returning one)")
    parser.add_argument("--target", default="sm90", help=f"GPU to compile for: {', '.join(TARGETS)} (default sm90)")
    parser.add_argument("-o", "--output", default="out", help="folder to write kernels/ and program.json to (default out/)")
    parser.add_argument("--graph", help="which graph to compile when model.py defines several")
    parser.add_argument("--budget", type=float, default=60.0, metavar="SECONDS", help="search time budget (default 60)")
    parser.add_argument("--seed", type=int, default=0, help="random seed: the same seed gives the same program")
    parser.add_argument("--no-profile", action="store_true", help="do not time kernels even where a GPU is present")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each stage's time")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tensorsmith", description="A search-based tensor compiler.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _compile_arguments(commands.add_parser("compile", help="compile a model.py to CUDA kernels",
                                           description="Compile a model.py to CUDA kernels and a program folder."))
    inspect = commands.add_parser("inspect", help="show the kernels of a compiled program folder")
    inspect.add_argument("folder", help="a folder written by `tensorsmith compile`")
    inspect.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `tensorsmith`."""
    args = build_parser().parse_args(argv)
    return _guarded(args, {"compile": run_compile, "inspect": run_inspect}[args.command])


def compile_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `compile`, the short form of `tensorsmith compile`."""
    parser = argparse.ArgumentParser(prog="compile", description="Compile a model.py to CUDA kernels (tensorsmith).")
    _compile_arguments(parser)
    return _guarded(parser.parse_args(argv), run_compile)


def _guarded(args: argparse.Namespace, command) -> int:
    """Run `command`; a tensorsmith error becomes one line on stderr, a traceback only with --debug."""
    try:
        return command(args)
    except TensorsmithError as err:
        if args.debug:
            traceback.print_exc()
        print(f"error: {err}", file=sys.stderr)
        return FAILURE if _is_internal(err) else USAGE_ERRORS
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _is_internal(err: TensorsmithError) -> bool:
    from tensorsmith.ir.errors import CompileError, DeviceError
    from tensorsmith.search.verify import VerificationError
    return isinstance(err, (CompileError, DeviceError, VerificationError))


def run_compile(args: argparse.Namespace) -> int:
    from .model_loader import load_graph
    from .pipeline import STAGES, compile
    from .targets import get_target
    get_target(args.target)                # an unknown target fails before any work
    graph = load_graph(args.model, args.graph)
    step = iter(range(1, len(STAGES) + 1))

    def progress(stage: str) -> None:
        if not args.quiet:
            print(f"[{next(step)}/{len(STAGES)}] {stage}", file=sys.stderr, flush=True)

    program = compile(graph, target=args.target, budget_s=args.budget, seed=args.seed,
                      profile=False if args.no_profile else None, progress=progress)
    folder = program.save(args.output)
    if not args.quiet:
        print(format_table(program.describe()))
        if args.verbose:
            stages = program.report["stage_seconds"]
            print("stages: " + ", ".join(f"{name} {seconds:.2f}s" for name, seconds in stages.items()))
        print(f"wrote {folder}/ ({len(program.kernels)} kernels)")
    return 0


def run_inspect(args: argparse.Namespace) -> int:
    path = Path(args.folder) / "program.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise TensorsmithError(f"{args.folder} is not a compiled program folder ({path}: {err})") from None
    print(format_table(doc))
    return 0


def format_table(doc: dict) -> str:
    """The kernels of a program.json document as a table, with a note when nothing was timed."""
    rows = [("#", "kernel", "archetype", "grid x block", "schedule", "time")]
    for i, k in enumerate(doc["kernels"]):
        ms = k["measured_ms"]
        schedule = ", ".join(f"{key}={value}" for key, value in k["schedule"].items())
        rows.append((str(i), k["name"], k["archetype"], f"{k['grid'][0]} x {k['block'][0]}", schedule,
                     f"{ms * 1000:.1f} us" if ms is not None else "-"))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    title = f"{doc['graph']} for {doc['target']}: {len(doc['kernels'])} kernel(s)"
    total = doc.get("report", {}).get("total_ms")
    if total is not None:
        title += f", {total * 1000:.1f} us in all"
    else:
        title += " (not timed: no GPU was used, so kernels were compiled to cubin but not run)"
    return "\n".join([title, *lines])


if __name__ == "__main__":
    sys.exit(main())
