"""The dashboard's first page: the overview is drawn without waiting for the findings, which a
second callback (bound to the status line the overview sets) fills in."""

from __future__ import annotations

from pathlib import Path

from perfscope.analysis.findings import run_rules
from perfscope.dashboard import callbacks as cb
from perfscope.dashboard import ids
from perfscope.dashboard.app import create_app
from perfscope.dashboard.store import ReportStore
from perfscope.report import Report


def _texts(component: object) -> list[str]:
    out: list[str] = []
    stack = [component]
    while stack:
        c = stack.pop()
        if isinstance(c, (list, tuple)):
            stack.extend(c)
        elif isinstance(c, str):
            out.append(c)
        elif hasattr(c, "children"):
            stack.append(c.children)
    return out


def test_overview_first_then_findings(tmp_path: Path, sample_reports_dir: Path) -> None:
    Report.load(sample_reports_dir / "cpu-small-b1-p128-g32.perfscope").save(tmp_path / "e.perfscope")
    store = ReportStore([tmp_path])
    key = store.entries()[0].key
    children, status = cb.on_overview(store, key)
    assert status.endswith(" kernels")
    assert "Findings" not in _texts(children) and "Headline" in _texts(children)
    found = run_rules(store.load(key))
    assert found
    later = _texts(cb.on_findings(store, key))
    assert later[-1] == "Findings" or "Findings" in later
    assert all(any(f.title in t for t in later) for f in found)
    assert cb.on_findings(store, None) == []
    # bound to the status line, so it runs after the overview (one report load, not two at once)
    app = create_app([tmp_path])
    deps = [c for c in app.callback_map.values() if ids.FINDINGS in str(c.get("output"))]
    assert len(deps) == 1 and [i["id"] for i in deps[0]["inputs"]] == [ids.STATUS]
