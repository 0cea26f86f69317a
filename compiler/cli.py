"""The command line: `tensorsmith compile|inspect ...`, and `compile ...` as the short form of `tensorsmith compile`."""
from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Sequence

from tensorsmith.bench.command import add_arguments as add_bench_arguments
from tensorsmith.bench.command import run_bench
from tensorsmith.ir.errors import InputError, OutputError, TensorsmithError
from tensorsmith.ir.targets import TARGETS
from tensorsmith.rewrites.derivation import chain_text
from tensorsmith.rewrites.saturate import EGGLOG_LOGGER

from .progress import Progress

USAGE_ERRORS = 2   # bad input from the user: a model that raises, an unknown target, a missing file
FAILURE = 1        # tensorsmith itself failed: a compile error, a wrong kernel, a GPU fault


def _compile_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a model.py defining a tensorsmith Graph (module level, or build() returning"
                                      " one), or an ONNX model (model.onnx: its initializers become inputs named after"
                                      " them)")
    parser.add_argument("--target", default="sm90", help=f"GPU to compile for: {', '.join(TARGETS)} (default sm90)")
    parser.add_argument("-o", "--output", default="out",
                        help="folder to write kernels/ and program.json to (default out/); an existing folder is"
                             " replaced only if tensorsmith wrote it")
    parser.add_argument("--force", action="store_true",
                        help="let -o replace an existing folder tensorsmith did not write")
    parser.add_argument("--graph", help="which graph to compile when model.py defines several")
    parser.add_argument("--shape", action="append", default=[], metavar="NAME=D,D,...",
                        help="the shape of an ONNX model's input that the file leaves dynamic (repeatable)")
    parser.add_argument("--budget", type=_positive_seconds, default=60.0, metavar="SECONDS",
                        help="seconds the whole compile may take (default 60; a positive number). It can overrun:"
                             " the search gets at least half of it however long saturation (limited to 10 s)"
                             " took, and the winner's verification is never left out: one random test at full size"
                             " (about two float64 evaluations of the graph in numpy) and, on a GPU, its check and"
                             " timing, and each algebraic form's best program measured (at most four); the exact"
                             " check runs only in what is left")
    parser.add_argument("--seed", type=int, default=0, help="random seed: the same seed gives the same program")
    parser.add_argument("--inputs", metavar="FILE.npz",
                        help="example inputs (one array per input, at the scale the program will see): every"
                             " candidate is tested on them first, then on random ones")
    parser.add_argument("--no-profile", action="store_true", help="do not time kernels even where a GPU is present")
    parser.add_argument("--no-rewrites", action="store_true",
                        help="compile the graph as written: no e-graph, only its kernels and schedules searched")
    parser.add_argument("--no-layers", action="store_true",
                        help="search a model of identical layers whole, not one distinct layer at a time")
    parser.add_argument("--cache-dir", help="where compiled programs are cached (default ~/.cache/tensorsmith/programs)")
    parser.add_argument("--no-cache", action="store_true", help="neither read nor write the compiled-program cache")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each stage's time")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")


def _positive_seconds(text: str) -> float:
    """An option's value in seconds: a positive number, else argparse's one-line usage error (exit 2)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not positive")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tensorsmith", description="A search-based tensor compiler.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _compile_arguments(commands.add_parser("compile", help="compile a model.py to CUDA kernels",
                                           description="Compile a model.py to CUDA kernels and a program folder."))
    inspect = commands.add_parser("inspect", help="show the kernels of a compiled program folder")
    inspect.add_argument("folder", help="a folder written by `tensorsmith compile`")
    inspect.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    rewrites = commands.add_parser("rewrites", help="show what the rewrite rules do to a model's graph",
                                   description="Saturate a model's e-graph and print which rules fired, how often,"
                                               " and the e-graph's size per stage.")
    rewrites.add_argument("model", help="a model.py defining a tensorsmith Graph")
    rewrites.add_argument("--graph", help="which graph, when model.py defines several")
    rewrites.add_argument("--dot", metavar="FILE", help="also write the e-graph as a Graphviz file")
    rewrites.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    run = commands.add_parser("run", help="run a compiled program folder and check it against the reference",
                              description="Run a compiled program on random inputs (or --inputs) and, with --check,"
                                          " compare every output with the reference interpreter (exit 1 on a mismatch).")
    run.add_argument("folder", help="a folder written by `tensorsmith compile`")
    run.add_argument("--check", action="store_true", help="compare the outputs with the reference interpreter")
    run.add_argument("--device", choices=("cuda", "cpu"), help="where to run (default: the GPU if there is one)")
    run.add_argument("--inputs", help="a .npz file with one array per input (default: random inputs)")
    run.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    run.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    add_bench_arguments(commands.add_parser(
        "bench", help="time the model suite (benchmarks/models/) against PyTorch on this GPU",
        description="Compile each case of the suite with tensorsmith, check it against its PyTorch reference, and"
                    " time its kernels, its call from PyTorch, eager PyTorch and torch.compile side by side."))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `tensorsmith`."""
    args = build_parser().parse_args(argv)
    commands = {"compile": run_compile, "inspect": run_inspect, "run": run_program, "rewrites": run_rewrites,
                "bench": lambda parsed: run_bench(parsed, list(argv if argv is not None else sys.argv[1:]))}
    return _guarded(args, commands[args.command])


def compile_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `compile`, the short form of `tensorsmith compile`."""
    parser = argparse.ArgumentParser(prog="compile", description="Compile a model.py to CUDA kernels (tensorsmith).")
    _compile_arguments(parser)
    return _guarded(parser.parse_args(argv), run_compile)


def _guarded(args: argparse.Namespace, command) -> int:
    """Run `command`; any error becomes one line on stderr (a traceback only with --debug, which also lets the
    e-graph library's own records through)."""
    if getattr(args, "debug", False):
        EGGLOG_LOGGER.setLevel(logging.NOTSET)
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
    except Exception as err:   # a bug in tensorsmith itself: say so in one line, the traceback with --debug
        if args.debug:
            traceback.print_exc()
        print(f"error: internal error, {type(err).__name__}: {err} (a tensorsmith bug; run again with --debug "
              f"for the traceback and report it)", file=sys.stderr)
        return FAILURE


def _is_internal(err: TensorsmithError) -> bool:
    from tensorsmith.ir.errors import CompileError, DeviceError
    from tensorsmith.search.verify import VerificationError
    return isinstance(err, (CompileError, DeviceError, VerificationError))


def _shapes(given: list[str]) -> dict[str, tuple[int, ...]]:
    """--shape NAME=D,D,... options as {NAME: shape}; a malformed one is the user's mistake, said in one line."""
    shapes = {}
    for option in given:
        name, _, dims = option.partition("=")
        try:
            shapes[name] = tuple(int(d) for d in dims.split(","))
        except ValueError:
            raise InputError(f"--shape {option!r}: expected NAME=D,D,... with whole numbers, e.g. ids=1,16") from None
        if not name or any(d < 0 for d in shapes[name]):
            raise InputError(f"--shape {option!r}: expected NAME=D,D,... with whole numbers, e.g. ids=1,16")
    return shapes


def run_compile(args: argparse.Namespace) -> int:
    import dataclasses

    import numpy as np

    from tensorsmith.codegen.runtime import gpu_available
    from tensorsmith.ir.targets import get_target

    from .model_loader import load_model
    from .pipeline import STAGES, compile
    get_target(args.target)                # an unknown target fails before any work
    output = _output_for(args.output, args.model, args.force)   # and so does an -o that would destroy something
    graph, bound = load_model(args.model, args.graph, _shapes(args.shape))
    progress = Progress(len(STAGES), quiet=args.quiet)
    if not args.quiet and not args.no_profile and not gpu_available():
        print("note: no GPU found: kernels are ranked by the cost model and compiled to cubin, not timed",
              file=sys.stderr)
    examples = _read_inputs(args.inputs) if args.inputs else None
    program = compile(graph, target=args.target, budget_s=args.budget, seed=args.seed,
                      profile=False if args.no_profile else None, progress=progress,
                      cache=not args.no_cache, cache_dir=args.cache_dir, rewrites=not args.no_rewrites,
                      example_inputs=examples, layers=not args.no_layers)
    progress.done()
    if bound:     # an ONNX model's initializers, kept in the folder: `run` then needs only its real inputs
        program = dataclasses.replace(program, bound={name: np.asarray(value) for name, value in bound.items()})
    folder = program.save(output, force=args.force)
    if not args.quiet:
        print(format_table(program.describe()))
        if args.verbose:
            stages = program.report.get("stage_seconds", {})
            print("stages: " + ", ".join(f"{name} {seconds:.2f}s" for name, seconds in stages.items()))
        count = len(program.kernels)
        print(f"wrote {folder}/ ({count} kernel{'s' if count != 1 else ''}; open {folder / 'report.html'} for the report)")
    return 0


def _output_for(output: str, model: str, force: bool) -> Path:
    """The folder `-o` names, checked before the compile: never one that holds the model file (nor `.` or a
    parent of it), and with --force only may a folder that tensorsmith did not write be replaced."""
    from .program import output_folder
    target = output_folder(output, force)
    model_path = Path(model).expanduser().resolve()
    if target == model_path or target in model_path.parents:
        raise OutputError(f"-o {output} holds the model file {model}: saving there would delete it; choose another"
                          f" folder")
    existing = next(folder for folder in target.parents if folder.exists())   # nothing is made before the compile
    try:   # a folder that cannot be written is said now, not after the whole compile
        if not existing.is_dir():
            raise NotADirectoryError(f"{existing} is a file")
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise OutputError(f"-o {output}: cannot write in {existing} ({err.strerror or err})") from None
    return target


def run_inspect(args: argparse.Namespace) -> int:
    path = Path(args.folder) / "program.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise TensorsmithError(f"{args.folder} is not a compiled program folder ({path}: {err})") from None
    print(format_table(doc))
    return 0


def run_rewrites(args: argparse.Namespace) -> int:
    from tensorsmith.rewrites.inspect import describe

    from .model_loader import load_graph
    print(describe(load_graph(args.model, args.graph), dot_path=args.dot))
    if args.dot:
        print(f"wrote {args.dot} (render it with: dot -Tsvg {args.dot} -o egraph.svg)")
    return 0


def _read_inputs(path: str) -> dict:
    """The arrays of an .npz file by name, or one InputError saying why it cannot be read."""
    import numpy as np
    try:
        with np.load(path) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError, TypeError) as err:   # missing, unreadable, or not an .npz (a .npy: one array)
        raise InputError(f"--inputs {path}: cannot read it as an .npz of arrays ({err})") from None


def run_program(args: argparse.Namespace) -> int:
    import numpy as np

    from tensorsmith.codegen.runtime import gpu_available
    from tensorsmith.ir.interpreter import evaluate
    from tensorsmith.search.verify import compare, random_inputs

    from .program import load
    if args.device == "cuda" and not gpu_available():
        raise InputError("--device cuda: no NVIDIA GPU was found on this machine (no driver or no device); run"
                         " with --device cpu, or without --device to use the GPU where there is one")
    program = load(args.folder)
    given = _read_inputs(args.inputs) if args.inputs else {}
    drawn = random_inputs(program.graph, args.seed, only=[name for name in program.graph.inputs
                                                          if name not in given and name not in program.bound])
    inputs = {**program.bound, **drawn, **given}
    outputs = program(device=args.device, **inputs)
    for name, value in outputs.items():
        summary = f"mean {float(np.mean(value)):.6g}" if value.size else "no elements"
        print(f"{name}: shape {tuple(value.shape)} {value.dtype}, {summary}")
    if not args.check:
        return 0
    checks = compare(program.graph, outputs, evaluate(program.graph, inputs))
    for check in checks:
        verdict = "ok" if check.ok else "MISMATCH"
        print(f"check {check.output}: relative L2 error {check.error:.3g} (tolerance {check.tolerance:g}) {verdict}")
    return 0 if all(check.ok for check in checks) else FAILURE


def format_table(doc: dict) -> str:
    """The kernels of a program.json document as a table, with the totals and the speedup over unfused."""
    def us(ms: float | None) -> str:
        return f"{ms * 1000:.1f} us" if ms is not None else "-"
    rows = [("#", "kernel", "archetype", "grid x block", "schedule", "predicted", "measured")]
    for i, k in enumerate(doc["kernels"]):
        schedule = ", ".join(f"{key}={value}" for key, value in k["schedule"].items())
        rows.append((str(i), k["name"], k["archetype"], f"{k['grid'][0]} x {k['block'][0]}", schedule,
                     us(k.get("predicted_ms")), us(k["measured_ms"])))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    report = doc.get("report", {})
    count = len(doc["kernels"])
    title = f"{doc['graph']} for {doc['target']}: {count} kernel{'s' if count != 1 else ''}"
    functions = len({k.get("entry", k["name"]) for k in doc["kernels"]})
    if functions < count:
        title += f" ({functions} distinct: kernels that compute alike, as identical layers' do, are one function)"
    if report.get("total_ms") is not None:
        title += f", {us(report['total_ms'])} measured"
    else:
        title += " (not timed: no GPU was used, so kernels were compiled to cubin but not run)"
    footer = []
    if report.get("speedup"):
        footer.append(f"speedup over the unfused program: {report['speedup']:.2f}x ({report['speedup_basis']})")
    fired = [(name, count) for name, count in report.get("saturation", {}).get("matches", []) if count]
    if fired:
        footer.append("rewrites that fired while saturating: "
                      + ", ".join(f"{name} x{count}" for name, count in sorted(fired, key=lambda r: -r[1])))
    footer += _form_lines(report.get("forms", []), len(fired))
    footer += _layer_lines(report.get("layers") or {})
    if report.get("from_cache"):
        footer.append("(from the cache)")
    return "\n".join([title, *lines, *footer])


def _layer_lines(layers: dict) -> list[str]:
    """The model's identical layers and each distinct piece's search, where it had them."""
    if not layers:
        return []
    def us(value: float | None) -> str:
        return f"{value:.1f} us" if value is not None else "-"
    lines = [f"{layers['identical']} identical layers: each distinct piece compiled once (predicted / measured,"
             f" compile seconds):"]
    for piece in layers["pieces"]:
        lines.append(f"  {piece['piece']}: {piece['kernels']} kernels, {us(piece['predicted_us'])} /"
                     f" {us(piece['measured_us'])}, {sum(piece['stage_seconds'].values()):.1f} s")
    whole = layers.get("whole_model_seconds") or {}
    if whole:
        judged = {"gpu": "; tested end to end on the GPU", "numpy": "; tested end to end in numpy"}
        lines.append("  the whole model: " + ", ".join(f"{stage} {seconds:.1f} s" for stage, seconds in whole.items())
                     + judged.get(layers.get("end_to_end", ""), ""))
    return lines


def _form_lines(forms: list[dict], fired: int) -> list[str]:
    """The algebraic forms the search chose among (the e-graph's choices), the winner marked, where there were
    several or the winner is not the graph as written; then the rewrites the winner depends on, in order, of the
    `fired` rules that fired."""
    if not forms or (len(forms) == 1 and forms[0].get("as_written")):
        return []
    def us(value: float | None) -> str:
        return f"{value:.1f} us" if value is not None else "-"
    lines = ["algebraic forms searched (e-graph choices; best candidate of each, predicted / measured):"]
    for form in forms:
        mark = "won" if form.get("won") else "   "
        written = " (the graph as written)" if form.get("as_written") and form["change"] != "as written" else ""
        lines.append(f"  {mark}  {form['change']}{written}: {us(form.get('predicted_us'))} / "
                     f"{us(form.get('measured_us'))}")
    derivation = next((form["derivation"] for form in forms if form.get("won") and form.get("derivation")), None)
    if derivation is not None:
        chain = chain_text(derivation["rules"], derivation["stopped"], derivation["seconds"])
        share = f" ({len(derivation['rules'])} of the {fired} rules that fired)" if derivation["rules"] else ""
        lines.append(f"rewrites the winner depends on, in order from the graph as written: {chain}{share}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
