"""No import circles among the modules of `fp4rl`: every package reads top-down.

A circle between two modules works only while the imports run in a lucky order (one side
imports the other inside a function, or after its own names exist), and it hides which module
is the lower layer. The imports are read from the source (`ast`), so the test costs no JAX
import and sees every import, function-local ones included.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "fp4rl"


def module_files(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every module of `package` (a package is its __init__)."""
    files = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        files[".".join(parts)] = path
    return files


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute name a (possibly relative) `from ... import` refers to."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, modules: set[str]) -> set[str]:
    """The package's modules that `module` imports anywhere in its file (module level, inside
    functions and classes, under `if TYPE_CHECKING`). `from p import name` imports the module
    p.name when there is one, else the module p."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, path.name == "__init__.py")
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found.update(name for name in names if name in modules and name != module)
    return found


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    files = module_files(root, package)
    return {module: imports_of(module, path, set(files)) for module, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each strongly connected component of more than one module (Tarjan),
    as [a, b, ..., a], so that the message shows where each circle closes."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []

    def visit(v):  # graphs of a few hundred modules: recursion depth is not a concern
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_circle(graph, component) for component in components]


def _circle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest circle from the component's first module back to itself (breadth-first)."""
    start = min(component)
    parent, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    path = [v]
                    while parent[path[-1]] is not None:
                        path.append(parent[path[-1]])
                    return [*reversed(path), start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{component} is not strongly connected")


def test_no_import_cycles_among_fp4rl_modules():
    found = cycles(import_graph())
    assert not found, "import circles among fp4rl modules (move the shared piece to a module both import):\n" + "\n".join(
        " -> ".join(circle) for circle in found)


def test_the_cycle_check_sees_function_local_and_relative_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import a\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"} and graph["pkg.c"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.a"]]
    (pkg / "sub" / "b.py").write_text("X = 1\n")
    assert cycles(import_graph(tmp_path, "pkg")) == []


# The floors (docs/design.md "Layout"), lowest first: a module imports its own floor and those below,
# never one above. `fp4rl` itself (the package's __init__) and the presets sit apart: the presets
# (`configs`) are read by entry points only, so they are the top floor.
FLOORS = (
    ("fp4rl.xla_flags", "fp4rl.formats", "fp4rl.exact_dot", "fp4rl.run_files", "fp4rl.config_cli"),
    ("fp4rl.recipe", "fp4rl.operands", "fp4rl.blocked_gemm", "fp4rl.grouped", "fp4rl.qlinear", "fp4rl.numerics_study"),
    ("fp4rl.parallel",),
    ("fp4rl.model",),
    ("fp4rl.rl",),
    ("fp4rl.analysis", "fp4rl.serving"),
    ("fp4rl.studies",),
    ("fp4rl.configs",),
)


def floor_of(module: str) -> int | None:
    """The floor of `module`: that of the longest listed prefix (None: `fp4rl` itself)."""
    best = None
    for level, prefixes in enumerate(FLOORS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (level, len(prefix))
    return None if best is None else best[0]


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs where the imported module lives on a higher floor, plus any
    import between analysis and rl (analysis reads run directories: it never imports the trainer)."""
    found = []
    for module, imported in graph.items():
        for other in imported:
            mine, theirs = floor_of(module), floor_of(other)
            if mine is not None and theirs is not None and theirs > mine:
                found.append((module, other))
            elif module.startswith("fp4rl.analysis") and other.startswith("fp4rl.rl"):
                found.append((module, other))
    return sorted(found)


def test_every_package_of_fp4rl_has_a_floor():
    unplaced = sorted(m for m in module_files() if m != PACKAGE and floor_of(m) is None)
    assert not unplaced, f"modules on no floor (add them to FLOORS): {unplaced}"


def test_nothing_imports_upward():
    found = upward_imports(import_graph())
    assert not found, "imports of a higher floor (move the shared piece down, or the importer up):\n" + "\n".join(
        f"{a} -> {b}" for a, b in found)


def test_the_floor_check_sees_an_upward_import():
    graph = {"fp4rl.model.moe": {"fp4rl.rl.trainer"}, "fp4rl.analysis.learning": {"fp4rl.rl.failures"},
             "fp4rl.rl.trainer": {"fp4rl.model.moe"}}
    assert upward_imports(graph) == [("fp4rl.analysis.learning", "fp4rl.rl.failures"),
                                     ("fp4rl.model.moe", "fp4rl.rl.trainer")]
