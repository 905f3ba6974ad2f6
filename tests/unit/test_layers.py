"""The layer rules, checked over every import statement of the source (AST, lazy imports included).

- the CLI sits above everything: nothing below ``perfscope.cli`` imports it;
- analysis, collectors and the engine never import the dashboard;
- the engine never imports analysis; collectors and analysis never import each other
  (a collector hands raw files to analysis through the session, not directly);
- click is used only by the CLI.

Inside analysis/ the rooms follow the pipeline (ROOMS, named by folder):

- readers (a file in, a Report out) use the cost model, never the summaries, rules or ranks;
- the cost model knows operators and roofs, not file formats or summaries;
- summaries are computed from a finished Report: they never parse a file;
- ranks may read files (their parallel import) and use summaries, never the rules;
- figures are pure functions of a Report: they never import the Dash app;
- sessions run captures; the core below them (Report, schema, format) never imports a session.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FOLDERS = {"perfscope": "perfscope", "collectors": "perfscope.collectors", "analysis": "perfscope.analysis",
           "dashboard": "perfscope.dashboard"}
"""Source folder -> the package it is installed as (pyproject's package-dir)."""

RULES: list[tuple[str, str, str]] = [
    # (importing package, forbidden import, why)
    ("perfscope.analysis", "perfscope.dashboard", "analysis never imports the dashboard"),
    ("perfscope.collectors", "perfscope.dashboard", "collectors never import the dashboard"),
    ("perfscope.engine", "perfscope.dashboard", "the engine never imports the dashboard"),
    ("perfscope.engine", "perfscope.analysis", "the engine never imports analysis"),
    ("perfscope.engine", "perfscope.collectors", "the engine never imports collectors"),
    ("perfscope.collectors", "perfscope.analysis", "collectors never import analysis"),
    ("perfscope.analysis", "perfscope.collectors", "analysis never imports collectors"),
    ("perfscope.analysis", "perfscope.cli", "the CLI sits above analysis"),
    ("perfscope.collectors", "perfscope.cli", "the CLI sits above collectors"),
    ("perfscope.dashboard", "perfscope.cli", "the CLI sits above the dashboard"),
    ("perfscope.engine", "perfscope.cli", "the CLI sits above the engine"),
    ("perfscope", "click", "click is used only by the CLI"),
]
ROOM_FOLDERS = ("analysis/readers", "analysis/costs", "analysis/summaries", "analysis/ranks",
                "analysis/rules", "dashboard/figures", "perfscope/sessions")
"""The rooms of the pipeline, as folders (a room's last name, ``costs``, is also spelled as a word in
module names, so rooms are named by their folders here)."""
ROOMS: dict[str, str] = {
    folder: ".".join([FOLDERS[folder.split("/")[0]], *folder.split("/")[1:]]) for folder in ROOM_FOLDERS
}
R = {folder.split("/")[-1]: package for folder, package in ROOMS.items()}

RULES += [
    (R["readers"], R["summaries"], "readers build a Report; summaries are computed from one"),
    (R["readers"], R["rules"], "readers never run the rules"),
    (R["readers"], R["ranks"], "a reader reads one file; ranks join many"),
    (R["costs"], R["readers"], "the cost model knows operators, not file formats"),
    (R["costs"], R["summaries"], "the cost model never reads a summary"),
    (R["costs"], R["rules"], "the cost model never runs the rules"),
    (R["summaries"], R["readers"], "summaries read a finished Report, never a file"),
    (R["summaries"], R["rules"], "summaries never run the rules"),
    (R["ranks"], R["rules"], "the rank statistics never run the rules"),
    (R["figures"], "perfscope.dashboard.app", "figures are pure: they never import the Dash app"),
    (R["figures"], "perfscope.dashboard.callbacks", "figures are pure: they never import the Dash app"),
    (R["figures"], "perfscope.dashboard.layout", "figures are pure: they never import the Dash app"),
    (R["figures"], "dash", "figures are plotly only: dash is the app's"),
    ("perfscope.report", R["sessions"], "the Report never runs a capture"),
    ("perfscope.schema", R["sessions"], "the schema never runs a capture"),
    ("perfscope.format", R["sessions"], "the format layer never runs a capture"),
    ("perfscope.analysis", R["sessions"], "analysis never runs a capture"),
    ("perfscope.collectors", R["sessions"], "collectors are run by sessions, not the reverse"),
    ("perfscope.dashboard", R["sessions"], "the dashboard shows reports, never runs a capture"),
]

ALLOWED = {
    ("perfscope.__main__", "perfscope.cli"),  # `python -m perfscope` is the CLI's entry point
    ("perfscope.launch", "perfscope.cli"),  # the console script: imports the CLI, Ctrl-C meanwhile is exit 130
}
"""(module, import) pairs exempt from a rule, each with its reason."""


def _modules() -> Iterator[tuple[str, Path]]:
    for folder, package in FOLDERS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if folder == "perfscope" and parts and parts[0] in FOLDERS:
                continue  # never the case; guards against a nested copy
            yield ".".join([package, *parts]), path


def _imports(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """Absolute names of everything ``path`` imports, with line numbers (relative imports resolved)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            yield stem, node.lineno
            for alias in node.names:  # `from perfscope import dashboard` imports a subpackage
                yield f"{stem}.{alias.name}", node.lineno


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _violations() -> list[str]:
    found = []
    for module, path in _modules():
        for name, line in _imports(module, path):
            for importer, forbidden, why in RULES:
                if not _within(module, importer) or not _within(name, forbidden) or (module, forbidden) in ALLOWED:
                    continue
                if forbidden == "click" and _within(module, "perfscope.cli"):
                    continue
                found.append(f"{path.relative_to(REPO)}:{line} imports {name}: {why}")
    return found


def test_every_source_file_is_seen() -> None:
    modules = dict(_modules())
    assert {"perfscope.cli", "perfscope.engine.generate", "perfscope.analysis.summaries.compare",
            "perfscope.collectors.nvml", "perfscope.dashboard.figures"} <= set(modules)


def test_relative_imports_resolve_to_the_installed_names() -> None:
    modules = dict(_modules())
    names = {n for n, _ in _imports("perfscope.analysis.summaries.compare", modules["perfscope.analysis.summaries.compare"])}
    assert "perfscope.analysis.summaries.kernels" in names and "perfscope.report" in names
    init = {n for n, _ in _imports("perfscope.collectors", modules["perfscope.collectors"])}
    assert "perfscope.collectors.nvml" in init


def test_every_room_exists_and_holds_modules() -> None:
    """A room renamed or emptied would make its rules hold vacuously."""
    modules = dict(_modules())
    for folder, package in ROOMS.items():
        assert (REPO / folder / "__init__.py").is_file(), f"{folder}/ is not a package"
        assert any(m.startswith(package + ".") for m in modules), f"{folder}/ holds no module"


def test_analysis_has_no_flat_prefixed_modules() -> None:
    """analysis/ reads as the pipeline: no flat kineto_*, nsys_*, ncu_* or ranks_* files."""
    flat = sorted(p.name for p in (REPO / "analysis").glob("*.py")
                  if p.name.split("_")[0] in {"kineto", "nsys", "ncu", "nvml", "ranks", "figures"})
    assert flat == []


def test_layer_rules_hold() -> None:
    assert _violations() == []


@pytest.mark.parametrize(("module", "source", "want"), [
    ("perfscope.analysis.x", "from perfscope.dashboard import figures\n", "analysis never imports the dashboard"),
    ("perfscope.engine.x", "def f():\n    from ..analysis import costs\n", "the engine never imports analysis"),
    ("perfscope.collectors.x", "import click\n", "click is used only by the CLI"),
    ("perfscope.analysis.readers.kineto.x", "from ...summaries.kernels import top_kernels\n",
     "readers build a Report; summaries are computed from one"),
    (ROOMS["analysis/costs"] + ".x", "def f():\n    from ..readers.detect import import_file\n",
     "the cost model knows operators, not file formats"),
    ("perfscope.dashboard.figures.x", "import dash\n", "figures are plotly only: dash is the app's"),
])
def test_a_violation_is_reported(tmp_path: Path, module: str, source: str, want: str) -> None:
    path = tmp_path / "x.py"
    path.write_text(source)
    names = [n for n, _ in _imports(module, path)]
    hits = [why for importer, forbidden, why in RULES
            if _within(module, importer) and any(_within(n, forbidden) for n in names)]
    assert want in hits


# ---------------------------------------------------------------------------- import cycles
def _type_checking_lines(path: Path) -> set[int]:
    """Lines inside ``if TYPE_CHECKING:`` blocks: imports for annotations only, never run."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            lines.update(n.lineno for n in ast.walk(node) if hasattr(n, "lineno"))
    return lines


FACADES = {"perfscope.report": "the Report's notebook methods (report.roofline(), .to_html(), .summary(), "
                                ".hierarchy(), .whatif()) call the outputs above it, imported when called"}
"""Modules whose imports inside functions are a facade over the layers above them, not a dependency:
the one sanctioned upward import, each with its reason. Their module-level imports still count."""


def _function_lines(path: Path) -> set[int]:
    """Lines inside function bodies (imports there run when the function is called)."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines.update(n.lineno for n in ast.walk(node) if hasattr(n, "lineno") and n is not node)
    return lines


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports when run (module level or inside a function; imports
    for annotations only are left out, and a :data:`FACADES` module's imports inside functions). A
    name resolves to the deepest project module it names, and a module's import of its own package
    (``from . import x`` in a package's child) is no edge."""
    modules = dict(_modules())
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        skip = _type_checking_lines(path) | (_function_lines(path) if module in FACADES else set())
        for name, line in _imports(module, path):
            target = name
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if line not in skip and target and target != module and not _within(module, target):
                graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for root, children_of_root in graph.items():
        if root in index:
            continue
        work = [(root, iter(sorted(children_of_root)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_no_import_cycles() -> None:
    """Modules import down the pipeline, never in a circle: shared pieces live a floor below the
    modules that share them (a cycle makes import order matter and the layers meaningless)."""
    assert cycles(import_graph()) == []


def test_the_report_facade_imports_the_outputs_only_when_called() -> None:
    """The Report's module imports nothing above the core: its notebook methods import the outputs
    inside themselves (the facade), so importing perfscope.report never loads the dashboard."""
    modules = dict(_modules())
    path = modules["perfscope.report"]
    inside = _function_lines(path) | _type_checking_lines(path)
    above = ("perfscope.dashboard", "perfscope.analysis", "perfscope.text_report", "perfscope.sessions",
             "perfscope.collectors", "perfscope.cli")
    at_module_level = [(n, line) for n, line in _imports("perfscope.report", path)
                       if line not in inside and any(_within(n, a) for a in above)]
    assert at_module_level == []


def test_a_cycle_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


FLOAT_DTYPES = {"float", "float64", "np.float64", "f8", "np.double"}


def _float_to_numpy_without_na(tree: ast.AST) -> Iterator[int]:
    """Lines of ``x.to_numpy(float)`` (or ``"float64"``, ``dtype=np.float64``) that name no ``na_value``."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "to_numpy"):
            continue
        dtype = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "dtype"), None)
        if dtype is None:
            continue
        name = dtype.value if isinstance(dtype, ast.Constant) else ast.unparse(dtype)
        if name in FLOAT_DTYPES and not any(k.arg == "na_value" for k in node.keywords):
            yield node.lineno


def test_float_to_numpy_names_its_missing_value() -> None:
    """pandas before 2.2.1 (the range allows 2.0) refuses ``to_numpy(float)`` of a nullable column holding
    a missing value; ``na_value=np.nan`` reads it as NaN on every version (the lower-bounds CI pass failed
    on 171 such calls)."""
    bad = [f"{path.relative_to(REPO)}:{line}" for _, path in _modules()
           for line in _float_to_numpy_without_na(ast.parse(path.read_text()))]
    assert not bad, bad


def test_a_float_to_numpy_without_na_value_is_found() -> None:
    tree = ast.parse('a.to_numpy(float)\nb.to_numpy(dtype="float64")\nc.to_numpy(np.float64, na_value=np.nan)\n'
                     'd.to_numpy("int64")\n')
    assert list(_float_to_numpy_without_na(tree)) == [1, 2]
