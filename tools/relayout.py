#!/usr/bin/env python3
"""Regroup the source folders so the tree reads as the pipeline (issue 25), then rewrite every
reference to a moved module across the whole tree.

Run from anywhere: ``python tools/relayout.py`` (``--dry-run`` prints the plan and changes
nothing). It is idempotent, and it works on a tree with modules it does not know:

1. ``git mv`` each module of MOVES that is still at its old place; SPLITS cut a module into
   one module per subject (top-level definitions assigned by name, the rest to a default), and
   ``__init__`` files with a docstring are created for every new package (ROOMS).
2. In every tracked or new ``.py`` file, imports of a moved module (``from .x import``,
   ``from ..x import``, ``import perfscope.analysis.x``, ``from perfscope.analysis import x``,
   lazy ones inside functions) are resolved against the file's own module name, mapped, and
   written back relative if they were relative; imports from a split module are regrouped by
   the module that now holds each name.
3. Every remaining dotted name (``"perfscope.analysis.kineto.read"`` in a monkeypatch target, a
   ``:mod:`` reference, a docs page) and every source path (``analysis/kineto_graphs.py``) in
   ``.py``, ``.md``, ``.toml``, ``.sh``, ``.txt`` and ``.ci`` files is rewritten.
4. pyproject.toml's ``packages`` list is regenerated from the folders holding ``__init__.py``.
5. ``ruff check --fix --select I,F401`` tidies the import blocks of the files it changed.

Last, it lists the flat modules it does not know (neither moved nor kept where they are), so
that the integrator can add them to MOVES and run it again.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

FOLDERS = {"perfscope": "perfscope", "collectors": "perfscope.collectors",
           "analysis": "perfscope.analysis", "dashboard": "perfscope.dashboard"}
"""Source folder -> the package it is installed as (pyproject's package-dir)."""

A, D, P = "perfscope.analysis", "perfscope.dashboard", "perfscope"

MOVES: dict[str, str] = {
    # readers: one subpackage or module per format, with format detection and the finish step
    f"{A}.importers": f"{A}.readers.detect",
    f"{A}.finish": f"{A}.readers.finish",
    f"{A}.kineto": f"{A}.readers.kineto.reader",
    f"{A}.kineto_json": f"{A}.readers.kineto.events",
    f"{A}.kineto_parse": f"{A}.readers.kineto.parse",
    f"{A}.kineto_ops": f"{A}.readers.kineto.ops",
    f"{A}.kineto_graphs": f"{A}.readers.kineto.graphs",
    f"{A}.capture_traces": f"{A}.readers.kineto.capture",
    f"{A}.nsys_reader": f"{A}.readers.nsys.reader",
    f"{A}.nsys_db": f"{A}.readers.nsys.sqlite",
    f"{A}.nsys_nvtx": f"{A}.readers.nsys.nvtx",
    f"{A}.ncu_reader": f"{A}.readers.ncu.reader",
    f"{A}.ncu_csv": f"{A}.readers.ncu.csv_launches",
    f"{A}.ncu_metrics": f"{A}.readers.ncu.metrics",
    f"{A}.nvml_reader": f"{A}.readers.nvml",
    # costs: what work a kernel does, and how it compares with the roofs
    f"{A}.costs": f"{A}.costs.operators",
    f"{A}.analytic": f"{A}.costs.analytic",
    f"{A}.compiled_steps": f"{A}.costs.compiled_steps",
    f"{A}.roofline": f"{A}.costs.roofline",
    f"{A}.costs_framework": f"{A}.costs.framework",
    f"{A}.costs_quantized": f"{A}.costs.quantized",
    f"{A}.costs_args": f"{A}.costs.args",
    # the steps table of any source (engine, vLLM, SGLang, HF generate(), by hand): read by the
    # readers' finish step, the summaries and the rules, so it sits beside intervals and findings
    f"{A}.framework_steps": f"{A}.steps",
    # ranks: many ranks of one distributed job
    f"{A}.ranks": f"{A}.ranks.stats",
    f"{A}.ranks_dask": f"{A}.ranks.dask_import",
    f"{A}.ranks_io": f"{A}.ranks.partial_read",
    f"{A}.ranks_job": f"{A}.ranks.job",
    f"{A}.ranks_tiling": f"{A}.ranks.tiling",
    # summaries: tables computed from a finished Report
    f"{A}.summary": f"{A}.summaries.kernels",
    f"{A}.serving": f"{A}.summaries.serving",
    f"{A}.compare": f"{A}.summaries.compare",
    f"{A}.sweep": f"{A}.summaries.sweep",
    f"{A}.loadtest": f"{A}.summaries.loadtest",
    f"{A}.hierarchy": f"{A}.summaries.hierarchy",
    f"{A}.server_timeline": f"{A}.summaries.server_timeline",
    # dashboard figures, one module per subject (figures.py and figures_more.py: SPLITS)
    f"{D}.figures_load": f"{D}.figures.loadtest",
    f"{D}.figures_ranks": f"{D}.figures.ranks",
    f"{D}.figures_sweep": f"{D}.figures.sweep",
    f"{D}.roofline_data": f"{D}.figures.roofline_data",
    f"{D}.timeline_data": f"{D}.figures.timeline_data",
    f"{D}.figures_tree": f"{D}.figures.tree",
    # exports of a Report to other viewers (Perfetto, Chrome trace JSON)
    f"{P}.trace_export": f"{D}.export.perfetto",
    f"{P}.perfetto_proto": f"{D}.export.protobuf",
    # sessions: what runs a capture (collectors, engine, analysis) apart from the Report
    f"{P}.session": f"{P}.sessions.profile",
    f"{P}.loadtest_session": f"{P}.sessions.loadtest",
    f"{P}.endpoint_loadtest": f"{P}.sessions.endpoint",
    f"{P}.http_stream": f"{P}.sessions.http_stream",
    f"{P}.server_profile": f"{P}.sessions.server_profile",
    f"{P}.openai_server": f"{P}.sessions.openai_server",
}
"""Old module -> new module. Imports of old names are rewritten wherever they are."""


@dataclass(frozen=True)
class Split:
    """One module cut into several by subject: top-level names -> module, the rest to ``default``."""

    old: str
    default: str
    names: dict[str, str]
    docs: dict[str, str] = field(default_factory=dict)


SPLITS: list[Split] = [
    Split(f"{D}.figures", f"{D}.figures.roofline",
          {"timeline": f"{D}.figures.timeline", "_bar_traces": f"{D}.figures.timeline",
           "_heat_trace": f"{D}.figures.timeline", "_counter_traces": f"{D}.figures.timeline",
           "_lod_note": f"{D}.figures.timeline",
           # names figures.py re-exported from figures_more
           "message_figure": f"{D}.figures.messages", "phase_breakdown": f"{D}.figures.phases",
           "step_times": f"{D}.figures.phases", "latency_distributions": f"{D}.figures.latency",
           "counters": f"{D}.figures.counters", "compare": f"{D}.figures.compare",
           "COMPARE_TOP": f"{D}.figures.compare"},
          {f"{D}.figures.roofline": "The roofline figure: kernel points (WebGL above WEBGL_ABOVE), roof "
                                    "lines and ridges.\n\nThe points and lines come from "
                                    ":mod:`.roofline_data` (a view-model tested on its own).",
           f"{D}.figures.timeline": "The timeline figure: lanes of GPU and CPU work at a level of detail "
                                    "that fits\nthe window, counters below.\n\nThe lanes come from "
                                    ":mod:`.timeline_data` (a view-model tested on its own)."}),
    Split(f"{D}.figures_more", f"{D}.figures.messages",
          {"PHASE_ORDER": f"{D}.figures.phases", "_phase_labels": f"{D}.figures.phases",
           "phase_breakdown": f"{D}.figures.phases", "step_times": f"{D}.figures.phases",
           "LATENCIES": f"{D}.figures.latency", "latency_distributions": f"{D}.figures.latency",
           "COUNTER_UNITS": f"{D}.figures.counters", "counters": f"{D}.figures.counters",
           "COMPARE_TOP": f"{D}.figures.compare", "compare": f"{D}.figures.compare"},
          {f"{D}.figures.messages": "A figure that only says why there is nothing to draw.",
           f"{D}.figures.phases": "Time per phase and category, and the step times of an engine run.",
           f"{D}.figures.latency": "Distributions of the per-request latencies (TTFT, TPOT, ITL).",
           f"{D}.figures.counters": "Sampled counters (NVML: power, clocks, utilisation) over time.",
           f"{D}.figures.compare": "Two reports side by side: per phase and per kernel name."}),
]

FACADES: dict[str, str] = {
    f"{D}.figures": "Every perfscope figure: pure functions from a Report to a plotly ``Figure``, one "
                    "module\nper subject (roofline, timeline, phases, latency, counters, compare; loadtest, "
                    "ranks and\nsweep for those reports).\n\nThe Dash app, the standalone HTML report and "
                    "the notebook API (``report.roofline()``) all\ncall these, so a figure looks the same "
                    "everywhere. Text that comes from a report (kernel\nnames, range names, device names) is "
                    "HTML-escaped before it reaches plotly, which renders a\nsubset of HTML in hover labels, "
                    "legends and annotations. The data behind the two large\nfigures lives in "
                    ":mod:`.roofline_data` and :mod:`.timeline_data` (view-models, tested on\ntheir own). "
                    "This package's namespace (``__all__``) is what callers use as ``figures.roofline``.",
}
"""A split module that becomes a package -> the docstring of its ``__init__``, which re-exports the
old module's ``__all__`` from the modules that now hold each name."""

ROOMS: dict[str, str] = {
    f"{A}.readers": "Readers: a profiler output in, an analysed Report out. One subpackage or module per "
                    "format\n(kineto, nsys, ncu, nvml), format detection (:mod:`.detect`) and the one "
                    "finishing\nstep every reader ends with (:mod:`.finish`).",
    f"{A}.readers.kineto": "PyTorch profiler (Kineto) chrome traces: the events file, the parse, the CPU "
                           "ops and\nthe kernels replayed by CUDA graphs.",
    f"{A}.readers.nsys": "Nsight Systems exports: the SQLite export, its NVTX ranges, the reader.",
    f"{A}.readers.ncu": "Nsight Compute results: ``.ncu-rep`` and ``ncu --csv``, and their metrics.",
    f"{A}.costs": "Costs: the FLOPs and bytes of operators and compiled steps, analytic vs measured, and "
                  "the\nroofline classification against the device's roofs.",
    f"{A}.ranks": "Ranks: the per-rank statistics of a distributed job, how its files make one job, the\n"
                  "parallel import on Dask and partial reads of a multi-rank report.",
    f"{A}.summaries": "Summaries: tables computed from a finished Report (kernels, serving, compare, "
                      "sweep,\nload test). They read a Report and never parse a file.",
    f"{D}.export": "Exports of a Report to other viewers: the Perfetto TrackEvent protobuf and Chrome trace JSON.",
    f"{P}.sessions": "Sessions: run a workload under collectors (the engine, a script, a load test), "
                     "analyse\nthe capture and return a Report.",
}
"""New package -> the docstring of the ``__init__.py`` created for it."""

KEEP: set[str] = {
    f"{A}.findings", f"{A}.intervals", f"{A}.tree",
    f"{D}.app", f"{D}.callbacks", f"{D}.details", f"{D}.html_report", f"{D}.ids", f"{D}.layout",
    f"{D}.memo", f"{D}.store", f"{D}.style", f"{D}.text", f"{D}.views", f"{D}.html_tree",
}
"""Flat modules that stay where they are (shared by the rooms; the app and the HTML writer)."""

NO_TEXT = {"tools/relayout.py", "pyproject.toml", "docs/development.md"}
"""The mapping itself, pyproject (step 4 writes its packages list) and the page that describes
the new rooms by their package names."""
TEXT_SUFFIXES = {".py", ".md", ".toml", ".sh", ".txt", ".cfg", ".ini", ".yml", ".yaml"}
SKIP_DIRS = {".git", ".venv", ".venv-lower-bounds", "venv", "build", "dist", "__pycache__",
             "tests/fixtures", "sample_reports", ".ci-cache", ".mypy_cache", ".ruff_cache",
             ".pytest_cache", "runs", "benchmarks/out"}


# ---- module names and paths -------------------------------------------------------------------

def module_path(module: str, *, package: bool = False) -> Path:
    """perfscope.analysis.readers.kineto.reader -> analysis/readers/kineto/reader.py."""
    for folder, pkg in sorted(FOLDERS.items(), key=lambda kv: -len(kv[1])):
        if module == pkg or module.startswith(pkg + "."):
            rest = module[len(pkg):].lstrip(".").split(".") if module != pkg else []
            base = REPO / folder
            if package or not rest:
                return base.joinpath(*rest, "__init__.py")
            return base.joinpath(*rest[:-1], rest[-1] + ".py")
    raise ValueError(module)


def module_of(path: Path) -> str | None:
    rel = path.relative_to(REPO)
    folder = rel.parts[0]
    if folder not in FOLDERS or rel.suffix != ".py":
        return None
    parts = [p for p in rel.with_suffix("").parts[1:] if p != "__init__"]
    return ".".join([FOLDERS[folder], *parts])


def src_rel(module: str) -> str:
    return module_path(module).relative_to(REPO).as_posix()


def new_name(module: str) -> str:
    """The module's name after the move (a package or attribute under a moved module follows it)."""
    for old in sorted(MOVES, key=len, reverse=True):
        if module == old:
            return MOVES[old]
        if module.startswith(old + ".") and not _is_new_child(old, module):
            return MOVES[old] + module[len(old):]
    return module


def _is_new_child(old: str, name: str) -> bool:
    """``perfscope.analysis.costs.analytic`` is a new module, not an attribute of the old ``costs``."""
    return any(name == new or name.startswith(new + ".") for new in _new_modules() if new.startswith(old + "."))


def _new_modules() -> set[str]:
    news = set(MOVES.values()) | set(ROOMS) | set(FACADES)
    for split in SPLITS:
        news |= set(split.names.values()) | {split.default}
    return news


SPLIT_OF = {s.old: s for s in SPLITS}


def _is_module(name: str) -> bool:
    """Whether ``name`` is a module or package of the tree as it is now."""
    try:
        return module_path(name).exists() or module_path(name, package=True).exists()
    except ValueError:
        return False


def split_target(module: str, name: str) -> str | None:
    split = SPLIT_OF.get(module)
    if split is None:
        return None
    return split.names.get(name, split.default)


# ---- step 1: moves, splits, packages ----------------------------------------------------------

def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout


_CREATED: set[str] = set()


def _docstring(doc: str) -> str:
    """A module docstring: on one line when it fits one, else closed on its own line."""
    return f'"""{doc}"""\n' if "\n" not in doc else f'"""{doc}\n"""\n'



def ensure_package(module: str, dry: bool, log: list[str]) -> None:
    """Create ``__init__.py`` for ``module`` and its parents up to the mapped folder."""
    parts = module.split(".")
    for i in range(2, len(parts) + 1):
        pkg = ".".join(parts[:i])
        if pkg in FOLDERS.values():
            continue
        init = module_path(pkg, package=True)
        if init.exists() or pkg in _CREATED or not any(pkg.startswith(f + ".") for f in FOLDERS.values()):
            continue
        _CREATED.add(pkg)
        text = _docstring(ROOMS.get(pkg, FACADES.get(pkg, f"{pkg.rsplit('.', 1)[-1]}.")))
        log.append(f"create {init.relative_to(REPO)}")
        if not dry:
            init.parent.mkdir(parents=True, exist_ok=True)
            init.write_text(text, encoding="utf-8")
            git("add", str(init.relative_to(REPO)))


def do_moves(dry: bool, log: list[str]) -> dict[Path, str]:
    """Move what is still at its old place. Returns path -> old module name of every moved file."""
    moved: dict[Path, str] = {}
    for old, new in MOVES.items():
        src, dst = module_path(old), module_path(new)
        if not src.exists():
            continue
        if dst.exists():
            sys.exit(f"relayout: both {src.relative_to(REPO)} and {dst.relative_to(REPO)} exist; "
                     "merge them by hand, then run again")
        ensure_package(new.rsplit(".", 1)[0], dry, log)
        log.append(f"git mv {src.relative_to(REPO)} {dst.relative_to(REPO)}")
        if not dry:
            dst.parent.mkdir(parents=True, exist_ok=True)
            git("mv", str(src.relative_to(REPO)), str(dst.relative_to(REPO)))
        moved[dst] = old
    return moved


def _segments(tree: ast.Module, lines: list[str]) -> tuple[str, list[tuple[list[str], str]]]:
    """The module's head (docstring, imports) and its top-level statements, each as (names, text);
    a string statement after an assignment (an attribute docstring) stays with it."""
    body = tree.body
    start = 0
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        start = 1
    while start < len(body) and isinstance(body[start], (ast.Import, ast.ImportFrom)):
        start += 1
    head_end = body[start - 1].end_lineno if start else 0
    head = "".join(lines[:head_end])
    segs: list[tuple[list[str], str]] = []
    prev_end = head_end
    for node in body[start:]:
        text = "".join(lines[prev_end:node.end_lineno])
        prev_end = node.end_lineno or prev_end
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = [node.target.id]
        else:
            names = []
        if not names and segs and isinstance(node, ast.Expr):
            segs[-1] = (segs[-1][0], segs[-1][1] + text)
            continue
        segs.append((names, text))
    return head, segs


def _head_imports(head: str) -> str:
    """The head without its module docstring."""
    tree = ast.parse(head)
    lines = head.splitlines(keepends=True)
    if tree.body and isinstance(tree.body[0], ast.Expr):
        return "".join(lines[tree.body[0].end_lineno:])
    return head


def do_splits(dry: bool, log: list[str]) -> dict[Path, str]:
    """Cut each split module (still at its old place, as a file) into its subjects."""
    made: dict[Path, str] = {}
    for split in SPLITS:
        src = module_path(split.old)
        if not src.exists() or src.name == "__init__.py":
            continue
        source = src.read_text(encoding="utf-8")
        tree = ast.parse(source)
        head, segs = _segments(tree, source.splitlines(keepends=True))
        imports = _head_imports(head)
        parts: dict[str, list[tuple[list[str], str]]] = {}
        for names, text in segs:
            target = next((split.names[n] for n in names if n in split.names), split.default)
            if names == ["__all__"]:
                target = split.default + ".__all__"  # the facade re-exports it
            parts.setdefault(target, []).append((names, text))
        exports = parts.pop(split.default + ".__all__", None)
        defined = {n: t for t, ss in parts.items() for names, _ in ss for n in names}
        facade = _facade(split, tree, head, defined, exports) if split.old in FACADES else None
        log.append(f"split {src.relative_to(REPO)} -> "
                   + ", ".join(module_path(t).relative_to(REPO).as_posix() for t in parts))
        if dry:
            continue
        git("rm", "-q", "--cached", str(src.relative_to(REPO)))
        src.unlink()
        for target, ss in parts.items():
            ensure_package(target.rsplit(".", 1)[0], dry, log)
            used = {n.id for _, text in ss for n in ast.walk(ast.parse(_dedent_block(text)))
                    if isinstance(n, ast.Name)}
            mine = {n for names, _ in ss for n in names}
            cross: dict[str, list[str]] = {}
            for name in sorted(used - mine):
                if name in defined:
                    cross.setdefault(defined[name], []).append(name)
            # written from the old module's place: the import rewrite below resolves it from there
            extra = "".join(_fmt_from(*_relative(split.old, False, t), ns) + "\n" for t, ns in cross.items())
            doc = split.docs.get(target, target.rsplit(".", 1)[-1])
            body = "".join(text for _, text in ss)
            text = _docstring(doc) + imports.rstrip("\n") + "\n" + extra + body
            dst = module_path(target)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(text, encoding="utf-8")
            git("add", str(dst.relative_to(REPO)))
            made[dst] = split.old
        if facade is not None:
            ensure_package(split.old, dry, log)
            init = module_path(split.old, package=True)
            init.write_text(facade, encoding="utf-8")
            git("add", str(init.relative_to(REPO)))
            made[init] = split.old + ".__init__"  # resolved as the package itself: see rewrite_imports
    return made


def _facade(split: Split, tree: ast.Module, head: str, defined: dict[str, str],
            exports: list[tuple[list[str], str]] | None) -> str:
    """The ``__init__`` of a split module turned package: its ``__all__``, each name imported from
    the module that holds it now (written relative, inside the package)."""
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                for t in node.targets):
            names = [e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)]
    if not names:
        names = sorted(n for n in defined if not n.startswith("_"))
    imported: dict[str, str] = {}
    for node in ast.parse(head).body:
        if isinstance(node, ast.ImportFrom):
            stem = _resolve(split.old, False, node.level, node.module) if node.level else node.module or ""
            for a in node.names:
                where = split_target(stem, a.name) if stem in SPLIT_OF else new_name(stem)
                imported[a.asname or a.name] = where or stem
    by_module: dict[str, list[str]] = {}
    for name in names:
        by_module.setdefault(defined.get(name) or imported.get(name, split.default), []).append(name)
    lines = []
    for module in sorted(by_module):
        level, mod = _relative(split.old, True, module)
        lines.append(_fmt_from(level, mod, sorted(by_module[module])))
    all_ = "__all__ = [\n" + "".join(f'    "{n}",\n' for n in names) + "]\n"
    return (_docstring(FACADES[split.old]) + "\nfrom __future__ import annotations\n\n" + "\n".join(lines)
            + "\n\n" + all_)


def _dedent_block(text: str) -> str:
    """A segment's text parses on its own (leading comments and blank lines are fine)."""
    return text


# ---- step 2: imports ---------------------------------------------------------------------------

def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _mapped_package(module: str) -> str:
    """The mapped top package a module lives in (relative imports never cross these)."""
    for pkg in sorted(FOLDERS.values(), key=len, reverse=True):
        if module == pkg or module.startswith(pkg + "."):
            return pkg
    return module


def _relative(from_module: str, is_package: bool, target: str) -> tuple[int, str]:
    """(level, module) of a relative import of ``target`` written in ``from_module``."""
    here = from_module.split(".") if is_package else from_module.split(".")[:-1]
    parts = target.split(".")
    common = 0
    while common < min(len(here), len(parts)) and here[common] == parts[common]:
        common += 1
    level = len(here) - common + 1
    return level, ".".join(parts[common:])


def _fmt_from(level: int, module: str, names: list[str]) -> str:
    return f"from {'.' * level}{module} import {', '.join(names)}"


def _alias(a: ast.alias) -> str:
    return a.name if a.asname is None else f"{a.name} as {a.asname}"


def rewrite_imports(path: Path, old_module: str | None) -> bool:
    """Rewrite the imports of ``path`` (whose module name before the move was ``old_module``)."""
    source = path.read_text(encoding="utf-8")
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    new_module = module_of(path)
    is_package = path.name == "__init__.py"
    cur_module = old_module or new_module
    edits: list[tuple[int, int, int, int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            relative = node.level > 0
            if relative:
                if cur_module is None:
                    continue
                # a file inside a package that moved resolves against its old name
                stem = _resolve(cur_module, is_package and old_module is None, node.level, node.module)
            else:
                stem = node.module or ""
            groups: dict[str, list[str]] = {}
            for a in node.names:
                full = f"{stem}.{a.name}"
                if full in MOVES or full in SPLIT_OF or new_name(full) != full:
                    # `from pkg import module`: import the moved module from its new package
                    if full in SPLIT_OF:
                        target = full  # the split module is a package facade now: unchanged
                        groups.setdefault(new_name(stem), []).append(_alias(a))
                        continue
                    target = new_name(full)
                    pkg, leaf = target.rsplit(".", 1)
                    local = a.asname or a.name
                    groups.setdefault(pkg, []).append(leaf if leaf == local else f"{leaf} as {local}")
                elif stem in SPLIT_OF and not _is_module(full):
                    groups.setdefault(split_target(stem, a.name) or stem, []).append(_alias(a))
                elif _is_module(full):
                    groups.setdefault(stem, []).append(_alias(a))  # a module of a package that exists
                else:
                    groups.setdefault(new_name(stem), []).append(_alias(a))
            if list(groups) == [stem] and (not relative or old_module is None):
                continue
            lines = []
            for target, names in groups.items():
                if relative and new_module and _mapped_package(target) == _mapped_package(new_module):
                    level, mod = _relative(new_module, is_package, target)
                    lines.append(_fmt_from(level, mod, names))
                else:
                    lines.append(_fmt_from(0, target, names))
            text = f"\n{' ' * node.col_offset}".join(lines)
            original = _fmt_from(node.level, node.module or "", [_alias(a) for a in node.names])
            if text == original:
                continue
            edits.append((node.lineno, node.col_offset, node.end_lineno or node.lineno,
                          node.end_col_offset or 0, text))
        elif isinstance(node, ast.Import):
            names = []
            changed = False
            for a in node.names:
                target = new_name(a.name)
                changed |= target != a.name
                names.append(target if a.asname is None else f"{target} as {a.asname}")
            if changed:
                edits.append((node.lineno, node.col_offset, node.end_lineno or node.lineno,
                              node.end_col_offset or 0, "import " + ", ".join(names)))
    if not edits:
        return False
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line.encode("utf-8")))
    data = source.encode("utf-8")
    for l0, c0, l1, c1, text in sorted(edits, reverse=True):
        a, b = offsets[l0 - 1] + c0, offsets[l1 - 1] + c1
        data = data[:a] + text.encode("utf-8") + data[b:]
    path.write_text(data.decode("utf-8"), encoding="utf-8")
    return True


# ---- step 3: dotted names and paths in any text ------------------------------------------------

def _name_patterns(pending: set[str]) -> list[tuple[re.Pattern[str], str]]:
    """Regexes for old dotted names and paths. An old module whose name is now a package's
    (``costs`` -> ``costs.operators``) is rewritten alone only while its move is ``pending``;
    afterwards the name alone means the package, and only ``costs.attr`` still means the module."""
    pats = []
    for old, new in sorted(MOVES.items(), key=lambda kv: -len(kv[0])):
        children = sorted({n[len(old) + 1:].split(".")[0] for n in _new_modules() if n.startswith(old + ".")})
        guard = rf"(?!\.(?:{'|'.join(map(re.escape, children))})\b)" if children else ""
        alone = "" if not children or old in pending else r"(?=\.\w)"
        pats.append((re.compile(rf"(?<![\w.]){re.escape(old)}(?![\w]){guard}{alone}"), new))
        # the same module written as a source path (docs, comments)
        pats.append((re.compile(rf"(?<![\w/.]){re.escape(src_rel(old))}(?![\w])"), src_rel(new)))
    for split in SPLITS:
        pkg = split.default.rsplit(".", 1)[0]
        folder = module_path(pkg, package=True).parent.relative_to(REPO).as_posix() + "/"
        # the split module's file is gone: a path names the folder that holds its subjects
        pats.append((re.compile(rf"(?<![\w/.]){re.escape(src_rel(split.old))}(?![\w])"), folder))
        if split.old != pkg:
            # figures_more is gone; a reference names the package whose namespace has its figures
            pats.append((re.compile(rf"(?<![\w.]){re.escape(split.old)}(?![\w])"), pkg))
    return pats


def rewrite_text(path: Path, pats: list[tuple[re.Pattern[str], str]]) -> bool:
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return False
    out = []
    for line in text.splitlines(keepends=True):
        # import statements are step 2's (a package written alone, ``from perfscope.analysis.costs
        # import roofline``, is not the old module ``costs``)
        if path.suffix != ".py" or not re.match(r"\s*(from\s+\S+\s+import\s|import\s)", line):
            for pat, repl in pats:
                line = pat.sub(repl, line)
        out.append(line)
    new = "".join(out)
    if new != text:
        path.write_text(new, encoding="utf-8")
        return True
    return False


def tree_files() -> list[Path]:
    """Every tracked or new (not ignored) file of the tree, outside SKIP_DIRS."""
    out = git("ls-files", "--cached", "--others", "--exclude-standard", "-z").split("\0")
    files = []
    for rel in out:
        if not rel or any(rel == d or rel.startswith(d + "/") for d in SKIP_DIRS):
            continue
        if rel in NO_TEXT:
            continue
        p = REPO / rel
        if p.is_file() and (p.suffix in TEXT_SUFFIXES or rel.startswith(".ci/")):
            files.append(p)
    return files


# ---- step 4: pyproject ------------------------------------------------------------------------

def update_pyproject() -> bool:
    path = REPO / "pyproject.toml"
    text = path.read_text(encoding="utf-8")
    packages = []
    for folder, pkg in FOLDERS.items():
        for init in sorted((REPO / folder).rglob("__init__.py")):
            rel = init.parent.relative_to(REPO / folder)
            if folder == "perfscope" and rel.parts and rel.parts[0] in FOLDERS:
                continue
            packages.append(".".join([pkg, *rel.parts]))
    order = {pkg: i for i, pkg in enumerate(FOLDERS.values())}
    packages.sort(key=lambda p: (order.get(_mapped_package(p), 9) if p != "perfscope" else -1, p))
    block = "packages = [\n" + "".join(f'  "{p}",\n' for p in packages) + "]"
    new = re.sub(r"packages = \[\n(?:  \"[\w.]+\",\n)*\]", block, text, count=1)
    if new != text:
        path.write_text(new, encoding="utf-8")
        return True
    return False


# ---- the run -----------------------------------------------------------------------------------

def unknown_flat_modules() -> list[str]:
    known = set(MOVES) | set(SPLIT_OF) | KEEP | _new_modules()
    flat = []
    for folder in ("analysis", "dashboard", "perfscope"):
        pkg = FOLDERS[folder]
        for path in sorted((REPO / folder).glob("*.py")):
            module = module_of(path)
            if path.name == "__init__.py" or module is None or module in known:
                continue
            # the core (Report, schema, format, errors, ...) stays flat; only capture runners move
            if folder == "perfscope" and not re.search(r"session|capture|runner", path.stem):
                continue
            flat.append(f"{pkg}.{path.stem}  ({path.relative_to(REPO)})")
    return flat


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    args = ap.parse_args(argv)
    log: list[str] = []
    pending = {old for old in MOVES if module_path(old).exists()} | {
        s.old for s in SPLITS if module_path(s.old).exists()}
    moved = do_moves(args.dry_run, log)
    moved.update(do_splits(args.dry_run, log))
    for room in ROOMS:
        ensure_package(room, args.dry_run, log)
    changed: set[Path] = set()
    if not args.dry_run:
        pats = _name_patterns(pending)
        for path in tree_files():
            if path.suffix == ".py" and rewrite_imports(path, moved.get(path)):
                changed.add(path)
            if rewrite_text(path, pats):
                changed.add(path)
        if update_pyproject():
            changed.add(REPO / "pyproject.toml")
        py = sorted(str(p.relative_to(REPO)) for p in changed | set(moved) if p.suffix == ".py" and p.exists())
        ruff = shutil.which("ruff")
        if py and ruff:
            subprocess.run([ruff, "check", "--fix", "--quiet", "--select", "I,F401", *py],
                           cwd=REPO, check=False)
        elif py:
            log.append("ruff not found: import blocks were not re-sorted")
    for line in log:
        print(line)
    print(f"relayout: {len([x for x in log if x.startswith(('git mv', 'split'))])} moves/splits, "
          f"{len(changed)} files rewritten" + (" (dry run)" if args.dry_run else ""))
    unknown = unknown_flat_modules()
    if unknown:
        print("relayout: flat modules not in the mapping (add them to MOVES or KEEP, then run again):")
        for line in unknown:
            print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
