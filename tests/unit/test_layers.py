"""The layer rules, checked over every import statement of the source (AST, lazy imports included).

- the CLI sits above everything: nothing below ``perfscope.cli`` imports it;
- analysis, collectors and the engine never import the dashboard;
- the engine never imports analysis; collectors and analysis never import each other
  (a collector hands raw files to analysis through the session, not directly);
- click is used only by the CLI.
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
ALLOWED = {
    ("perfscope.__main__", "perfscope.cli"),  # `python -m perfscope` is the CLI's entry point
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
    assert {"perfscope.cli", "perfscope.engine.generate", "perfscope.analysis.compare",
            "perfscope.collectors.nvml", "perfscope.dashboard.figures"} <= set(modules)


def test_relative_imports_resolve_to_the_installed_names() -> None:
    modules = dict(_modules())
    names = {n for n, _ in _imports("perfscope.analysis.compare", modules["perfscope.analysis.compare"])}
    assert "perfscope.analysis.summary" in names and "perfscope.report" in names
    init = {n for n, _ in _imports("perfscope.collectors", modules["perfscope.collectors"])}
    assert "perfscope.collectors.nvml" in init


def test_layer_rules_hold() -> None:
    assert _violations() == []


@pytest.mark.parametrize(("module", "source", "want"), [
    ("perfscope.analysis.x", "from perfscope.dashboard import figures\n", "analysis never imports the dashboard"),
    ("perfscope.engine.x", "def f():\n    from ..analysis import costs\n", "the engine never imports analysis"),
    ("perfscope.collectors.x", "import click\n", "click is used only by the CLI"),
])
def test_a_violation_is_reported(tmp_path: Path, module: str, source: str, want: str) -> None:
    path = tmp_path / "x.py"
    path.write_text(source)
    names = [n for n, _ in _imports(module, path)]
    hits = [why for importer, forbidden, why in RULES
            if _within(module, importer) and any(_within(n, forbidden) for n in names)]
    assert want in hits
