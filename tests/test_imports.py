"""The layout's promises, read from the source: imports point one way down the pipeline (compiler -> search ->
(rewrites, codegen) -> ir), no package's modules import each other in a circle, no module imports a tensorsmith
module inside a function to dodge one, and the package imports in a fresh interpreter."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"ir": "tensorsmith.ir", "rewrites": "tensorsmith.rewrites", "search": "tensorsmith.search",
            "codegen": "tensorsmith.codegen", "compiler": "tensorsmith", "compiler/bench": "tensorsmith.bench",
            "benchmarks/models": "tensorsmith.suite"}
# Which packages each may import: the pipeline's order (the bench and the suite sit on top of it all).
MAY_IMPORT = {"tensorsmith.ir": set(), "tensorsmith.rewrites": {"tensorsmith.ir"},
              "tensorsmith.codegen": {"tensorsmith.ir"},
              "tensorsmith.search": {"tensorsmith.ir", "tensorsmith.rewrites", "tensorsmith.codegen"}}
# Imports inside functions that are deliberate lazy loading: optional dependencies (PyTorch, ONNX, CuPy, and
# transformers for the suite's models), a helper only some NVRTCs need, and the command line's subcommands.
LAZY = ("torch", "onnx", "cupy", "transformers", "cuda.pathfinder")
LAZY_FILES = {"compiler/cli.py"}


def modules() -> dict[str, Path]:
    """Every module of the distribution by its import name."""
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).glob("*.py")):
            found[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return found


def _resolved(module: str, node: ast.ImportFrom | ast.Import, known: set[str]) -> list[str]:
    """The tensorsmith modules an import statement names (relative imports resolved)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = module if MODULES[module].stem == "__init__" else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        stem = (f"{base}.{node.module}" if node.module else base) if node.level else node.module or ""
        submodules = [f"{stem}.{alias.name}" for alias in node.names]
        # `from package import module` needs the module; `from module import name` (or a package's re-export) the
        # module itself
        names = [name for name in submodules if name in known] or [stem]
    return [name for name in names if name in known]


def _function_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The import statements inside functions."""
    inner: list[ast.Import | ast.ImportFrom] = []
    for func in ast.walk(tree):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner += [n for n in ast.walk(func) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return inner


MODULES = modules()


def import_graph() -> nx.DiGraph:
    """module -> the tensorsmith modules it imports, at any level of the file."""
    graph = nx.DiGraph()
    known = set(MODULES)
    for module, path in MODULES.items():
        graph.add_node(module)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph.add_edges_from((module, target) for target in _resolved(module, node, known)
                                     if target != module)
    return graph


def _lazy(name: str) -> bool:
    return any(name == lazy or name.startswith(lazy + ".") for lazy in LAZY)


def package_of(module: str) -> str:
    return max((p for p in PACKAGES.values() if module == p or module.startswith(p + ".")), key=len)


def test_no_modules_import_each_other_in_a_circle() -> None:
    cycles = list(nx.simple_cycles(import_graph()))
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_imports_point_down_the_pipeline() -> None:
    upward = [(a, b) for a, b in import_graph().edges
              if package_of(a) in MAY_IMPORT and package_of(b) != package_of(a)
              and package_of(b) not in MAY_IMPORT[package_of(a)]]
    assert not upward, f"imports against the pipeline's direction: {upward}"


def test_no_imports_inside_functions_but_deliberate_lazy_loading() -> None:
    found = []
    for module, path in MODULES.items():
        if str(path.relative_to(ROOT)) in LAZY_FILES or package_of(module) == "tensorsmith.suite":
            continue    # the command line loads subcommands lazily; the suite's model files are written as users write
        for node in _function_imports(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                f"{node.module}.{a.name}" for a in node.names]
            if getattr(node, "level", 0) or not all(_lazy(name) for name in names):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"imports inside functions (move the shared piece down instead): {found}"


def test_the_checks_see_a_cycle_and_a_hidden_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk itself: a two-module circle through a function-local import is found by both checks."""
    (tmp_path / "codegen").mkdir()
    (tmp_path / "codegen" / "a.py").write_text("from .b import f\n")
    (tmp_path / "codegen" / "b.py").write_text("def f():\n    from .a import f\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGES", {"codegen": "tensorsmith.codegen"})
    monkeypatch.setattr(sys.modules[__name__], "MODULES", modules())
    with pytest.raises(AssertionError, match="import cycles"):
        test_no_modules_import_each_other_in_a_circle()
    with pytest.raises(AssertionError, match="b.py:2"):
        test_no_imports_inside_functions_but_deliberate_lazy_loading()


def test_the_package_imports_in_a_fresh_interpreter_from_codegens_renderer() -> None:
    """Any module's import runs the package's __init__ first (which imports the pipeline, hence every module), so
    one fresh import stands for each module's alone; the renderer's is the one that needed imports inside functions
    to get past its circle."""
    done = subprocess.run([sys.executable, "-c", "import tensorsmith.codegen.render"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
