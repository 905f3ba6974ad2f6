"""Dash callbacks called as plain functions on real reports saved under a served folder."""

from __future__ import annotations

import io
from pathlib import Path

import dash
import numpy as np
import pandas as pd
import pytest

from perfscope.dashboard import callbacks as cb
from perfscope.dashboard import ids
from perfscope.dashboard.app import create_app
from perfscope.dashboard.store import ReportStore
from tests.unit.dashboard_reports import HTA, QWEN, XSS, engine, hostile, imported


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, fixtures_dir: object) -> tuple[ReportStore, dict[str, str]]:
    root = tmp_path_factory.mktemp("served")
    reports = {"qwen": imported(QWEN), "hta": imported(HTA), "engine": engine(), "hostile": hostile()}
    for name, report in reports.items():
        report.save(root / "runs" / f"{name}.perfscope")
    store = ReportStore([root])
    keys = {e.label.split("/")[-1].removesuffix(".perfscope"): e.key for e in store.entries()}
    assert set(keys) == set(reports)
    return store, keys


def _texts(component: object) -> list[str]:
    """Every string child in a Dash component tree."""
    if isinstance(component, str):
        return [component]
    if isinstance(component, (list, tuple)):
        return [t for c in component for t in _texts(c)]
    children = getattr(component, "children", None)
    return _texts(children) if children is not None else []


def test_overview_shows_device_roofs_and_top_kernels(served: tuple[ReportStore, dict[str, str]]) -> None:
    store, keys = served
    children, status = cb.on_overview(store, keys["qwen"])
    texts = _texts(children)
    report = store.load(keys["qwen"])
    assert report.device.name in " ".join(texts) and "datasheet" in texts
    assert status == f"{len(report.kernels):,} kernels"
    top = report.kernels.groupby("name")["duration_ns"].sum().idxmax()
    assert top in texts


def test_report_strings_reach_components_as_plain_text(served: tuple[ReportStore, dict[str, str]]) -> None:
    store, keys = served
    texts = _texts(cb.on_overview(store, keys["hostile"])[0])
    assert f"warning {XSS}" in texts
    source = "".join(p.read_text() for p in Path(cb.__file__).parent.glob("*.py"))
    assert "dangerously" not in source


def test_roofline_filters_and_click_details(served: tuple[ReportStore, dict[str, str]]) -> None:
    store, keys = served
    report = store.load(keys["qwen"])
    assert cb.on_roofline(store, keys["qwen"], "overview", "kernel", "bound", "all", None, None) is dash.no_update
    fig = cb.on_roofline(store, keys["qwen"], "roofline", "kernel", "bound", "all", None, "gemm")
    points = [row for t in fig.data if t.legendgroup == "points" for row in t.customdata]
    assert points and all("gemm" in row[1].lower() for row in points)
    key = int(points[0][0])
    details = cb.on_click(store, {"points": [{"customdata": list(points[0])}]}, keys["qwen"], "kernel")
    rows = dict(zip(_texts(details)[1::2], _texts(details)[2::2]))
    assert rows["name"] == report.kernels.loc[key, "name"]
    assert rows["launch config"].startswith(f"grid {report.kernels.loc[key, 'grid']}")
    share = report.kernels.loc[key, "duration_ns"] / report.kernels["duration_ns"].sum() * 100
    assert rows["share of total kernel time"] == f"{share:.2f}%"


def test_click_on_a_name_point_aggregates_its_executions(served: tuple[ReportStore, dict[str, str]]) -> None:
    store, keys = served
    fig = cb.on_roofline(store, keys["engine"], "roofline", "name", "phase", "all", None, None)
    name = next(t for t in fig.data if t.legendgroup == "points").customdata[0][0]
    texts = _texts(cb.on_click(store, {"points": [{"customdata": [name]}]}, keys["engine"], "name"))
    rows = dict(zip(texts[1::2], texts[2::2]))
    k = store.load(keys["engine"]).kernels
    assert rows["executions"] == str(int((k["name"] == name).sum()))


def test_phase_filter_options_come_from_the_report(served: tuple[ReportStore, dict[str, str]]) -> None:
    store, keys = served
    options, value = cb.on_phase_options(store, keys["engine"])
    assert [o["value"] for o in options] == ["all", "decode", "prefill", "none"] and value == "all"


def test_timeline_zoom_rerenders_at_finer_detail(served: tuple[ReportStore, dict[str, str]]) -> None:
    store, keys = served
    full = cb.on_timeline(store, keys["hta"], "timeline", None, ids.REPORT)
    assert full.layout.meta["binned"] is True
    lo, hi = full.layout.xaxis.range
    mid = (lo + hi) / 2
    zoom = {"xaxis.range[0]": mid, "xaxis.range[1]": mid + 1.0}
    fine = cb.on_timeline(store, keys["hta"], "timeline", zoom, ids.TIMELINE_ZOOM)
    assert fine.layout.meta["binned"] is False
    assert fine.layout.meta["t0_ns"] == int(mid * 1e6) and fine.layout.meta["t1_ns"] == int((mid + 1.0) * 1e6)
    reset = cb.on_timeline(store, keys["hta"], "timeline", zoom, ids.TIMELINE_RESET)
    assert reset.layout.meta["binned"] is True
    assert cb.on_timeline(store, keys["hta"], "timeline", {"legend": 1}, ids.TIMELINE_ZOOM) is dash.no_update
    assert cb.window_from_relayout({"xaxis.autorange": True}) == (None, None)


def test_kernel_grid_modes_filter_and_full_download(served: tuple[ReportStore, dict[str, str]]) -> None:
    store, keys = served
    k = store.load(keys["hta"]).kernels
    rows, cols, note = cb.on_kernels(store, keys["hta"], "kernels", "name", None)
    assert len(rows) == k["name"].nunique() and cols[0]["field"] == "name"
    rows, _, note = cb.on_kernels(store, keys["hta"], "kernels", "rows", "elementwise")
    want = k["name"].str.contains("elementwise", case=False, regex=False)
    assert len(rows) == min(int(want.sum()), cb.MAX_GRID_ROWS) and "matching the filter" in note
    assert rows[0]["duration_ns"] == k.loc[want, "duration_ns"].max()
    download = cb.on_download(store, 1, keys["hta"], "rows", "elementwise")
    assert len(pd.read_csv(io.StringIO(download["content"]))) == int(want.sum())
    assert cb.on_kernels(store, keys["hta"], "overview", "rows", None) == (dash.no_update,) * 3


def test_phase_view_and_compare(served: tuple[ReportStore, dict[str, str]]) -> None:
    store, keys = served
    table, breakdown, steps, latency = cb.on_phases(store, keys["engine"], "phases")
    assert breakdown.layout.meta["kind"] == "phase_breakdown"
    assert {"prefill", "decode"} <= set(_texts(table))
    assert sum(len(t.x) for t in steps.data) == len(store.load(keys["engine"]).steps)
    assert latency.layout.meta["kind"] == "latency_distributions" and not latency.layout.meta.get("empty")
    fig, rows = cb.on_compare(store, keys["qwen"], keys["engine"], "compare")
    assert fig.layout.meta["kind"] == "compare" and _texts(rows)
    assert cb.on_counters(store, keys["qwen"], "counters").layout.meta["empty"] is True


def test_guard_turns_bad_keys_into_messages(served: tuple[ReportStore, dict[str, str]]) -> None:
    store, _ = served
    guarded = cb._guard(lambda *a: cb.on_roofline(store, *a), "figure")
    fig = guarded("0:../../etc", "roofline", "kernel", "bound", "all", None, None)
    assert fig.layout.meta["empty"] is True and "outside the served folders" in fig.layout.annotations[0].text


def test_app_factory_builds_independent_apps(served: tuple[ReportStore, dict[str, str]]) -> None:
    store, keys = served
    a, b = create_app(store.roots), create_app(store.roots)
    assert a is not b and a.server is not b.server
    outputs = " ".join(a.callback_map)
    for component in (ids.TIMELINE, ids.ROOFLINE, ids.DETAILS, ids.KERNEL_GRID, ids.COMPARE_FIGURE):
        assert component in outputs
    layout = a.layout()
    picker = layout.children[0].children[1]
    assert [o["value"] for o in picker.options] == [e.key for e in store.entries()]
    assert np.all([k in [o["value"] for o in picker.options] for k in keys.values()])


def _components(component: object) -> list[object]:
    """Every component in a Dash component tree."""
    if isinstance(component, (list, tuple)):
        return [c for x in component for c in _components(x)]
    if isinstance(component, str) or component is None:
        return []
    return [component, *_components(getattr(component, "children", None))]


def test_a_click_on_a_finding_selects_its_gaps_and_kernels(served: tuple[ReportStore, dict[str, str]]) -> None:
    """The HTA DDP trace's exposed-comm finding: its buttons, drawn in the overview with its items,
    select the collective kernels: shaded on the timeline (zoomed to the largest), and the kernel
    table filtered to them."""
    from perfscope.dashboard import views

    store, keys = served
    key = keys["hta"]
    report = store.load(key)
    found = views.findings(report)
    i = next(n for n, f in enumerate(found) if f.id == "exposed-comm")
    f = found[i]
    shown = _components(cb.on_findings(store, key))
    buttons = [c.id for c in shown if isinstance(getattr(c, "id", None), dict) and c.id["index"] == i]
    assert {b["view"] for b in buttons} == {"timeline", "kernels"}
    assert any(t.startswith("Evidence: explains") for t in _texts(cb.on_findings(store, key)))
    assert f.items[0].label in _texts(cb.on_findings(store, key))

    selection, tab = cb.on_finding_pick(store, key, {"type": ids.FINDING_PICK, "index": i, "view": "timeline"})
    assert tab == "timeline" and selection["finding"] == "exposed-comm" and selection["key"] == key
    nccl = report.kernels[report.kernels["name"].str.startswith("ncclKernel")]
    assert selection["kernels"] and all(n.startswith("ncclKernel") for n in selection["kernels"])
    # the largest place is the longest collective, in ms from the timeline's origin
    from perfscope.dashboard.figures.timeline_data import timeline_index

    origin = timeline_index(report).origin_ns
    longest = nccl.loc[nccl["duration_ns"].idxmax()]
    s, e = selection["spans"][0]
    assert s == pytest.approx((longest["start_ns"] - origin) / 1e6, abs=1e-3)
    assert e == pytest.approx((longest["end_ns"] - origin) / 1e6, abs=1e-3)
    fig = cb.on_timeline(store, key, "timeline", None, ids.FINDING_SELECTION, selection)
    assert fig.layout.meta["selected"] >= 1 and len(fig.layout.shapes) == fig.layout.meta["selected"]
    lo, hi = fig.layout.xaxis.range if fig.layout.xaxis.range else fig.layout.xaxis2.range
    assert lo <= s and e <= hi and hi - lo <= 3 * (e - s) + 2e-3  # zoomed to it
    assert "exposed-comm" in cb.on_finding_note(selection)

    rows, _, note = cb.on_kernels(store, key, "kernels", "name", None, selection)
    assert rows and all(r["name"].startswith("ncclKernel") for r in rows) and "exposed-comm" in note
    assert {r["name"] for r in rows} == set(nccl["name"])
    rows, _, _ = cb.on_kernels(store, key, "kernels", "rows", None, selection)
    assert len(rows) == min(len(nccl), cb.MAX_GRID_ROWS) and all(r["name"].startswith("ncclKernel") for r in rows)
    # a selection of another report is not applied; the clear button and a new report clear it
    other, _, _ = cb.on_kernels(store, key, "kernels", "name", None, {**selection, "key": keys["qwen"]})
    assert len(other) == report.kernels["name"].nunique()
    assert cb.on_finding_pick(store, key, None, ids.FINDING_CLEAR) == (None, dash.no_update)
    assert cb.on_finding_pick(store, key, None, ids.REPORT) == (None, dash.no_update)
    assert cb.on_finding_pick(store, key, {"index": 10_000, "view": "timeline"}) == (dash.no_update,) * 2
    assert cb.on_finding_pick(store, key, {"index": "0", "view": "timeline"}) == (dash.no_update,) * 2
    plain = cb.on_timeline(store, key, "timeline", None, ids.REPORT, None)
    assert not plain.layout.shapes


# ---------------------------------------------------------------------------- crafted inputs
CRAFTED = [  # (callback, its arguments after the store with one crafted value)
    ("on_overview", lambda k: ("0:" + "a" * 100_000,)),
    ("on_roofline", lambda k: ("0:" + "a" * 100_000, "roofline", "kernel", "bound", "all", None, None)),
    ("on_roofline", lambda k: (k, "roofline", "kernel", "bound", "all", None, ["x"])),
    ("on_roofline", lambda k: (k, "roofline", {"x": 1}, "bound", "all", None, None)),
    ("on_click", lambda k: ("not a dict", k, "kernel")),
    ("on_kernels", lambda k: (k, "kernels", "name", 123)),
    ("on_kernels", lambda k: (k, "kernels", "name", ["x"])),
    ("on_kernels", lambda k: (k, "kernels", "neither", None)),
    ("on_download", lambda k: (True, k, "rows", None)),
    ("on_timeline", lambda k: (k, "timeline", "zoom", None)),
    ("on_tree_select", lambda k: (k, "tree", "all", 5)),
    ("on_compare", lambda k: (k, 7, "compare")),
    ("on_finding_pick", lambda k: (k, "not a dict")),
    ("on_timeline", lambda k: (k, "timeline", None, None, ["x"])),
    ("on_kernels", lambda k: (k, "kernels", "name", None, "selection")),
]


@pytest.mark.parametrize(("name", "args"), CRAFTED, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CRAFTED)])
def test_crafted_inputs_are_no_update(served: tuple[ReportStore, dict[str, str]], name: str, args: object) -> None:
    """A value the page's components cannot send (a 100 KB key, a number as a filter, a string as
    clickData) is no update: ``PreventUpdate``, which Dash answers 204."""
    store, keys = served
    with pytest.raises(dash.exceptions.PreventUpdate):
        getattr(cb, name)(store, *args(keys["hta"]))  # type: ignore[operator]


def test_malformed_click_and_zoom_shapes_are_ignored(served: tuple[ReportStore, dict[str, str]]) -> None:
    store, keys = served
    for click in ({"points": "x"}, {"points": ["x"]}, {"points": [{"customdata": "x"}]}, {"points": [{"customdata": []}]}, {}):
        assert cb.on_click(store, click, keys["hta"], "kernel") is dash.no_update
    assert cb._first_point({"points": [{"id": 1}]}) == {"id": 1}
    mask, label = cb.tree_selection(store, keys["engine"], "all", {"points": [{"id": "9" * 40}]})
    assert mask is None and label == "the whole tree"
    for zoom in ({"xaxis.range[0]": "a", "xaxis.range[1]": 2}, {"xaxis.range": 5}, {"xaxis.range": [1]},
                 {"xaxis.range[0]": float("inf"), "xaxis.range[1]": 1}, {"xaxis.range[0]": 1e300, "xaxis.range[1]": 2}):
        assert cb.window_from_relayout(zoom) == (None, None)
    assert cb.window_from_relayout({"xaxis.range": [1, 2]}) == (1_000_000, 2_000_000)


def _update(app: dash.Dash, output_id: str, values: dict[str, object]) -> object:
    """POST to the Dash server's ``/_dash-update-component`` as the page does, for the callback
    whose outputs include ``output_id``; ``values`` by ``id.property`` (the rest None)."""
    key = next(k for k in app.callback_map if f"{output_id}." in k)
    spec = app.callback_map[key]

    def props(items: list[dict[str, str]]) -> list[dict[str, object]]:
        return [{**i, "value": values.get(f"{i['id']}.{i['property']}")} for i in items]

    outputs = [{"id": o.split(".")[0], "property": o.split(".")[1]} for o in key.strip(".").split("...")]
    payload = {"output": key, "outputs": outputs if key.startswith("..") else outputs[0],
               "inputs": props(spec["inputs"]), "state": props(spec["state"]),
               "changedPropIds": list(values)}
    return app.server.test_client().post("/_dash-update-component", json=payload)


def test_crafted_requests_to_the_dash_server_are_not_500(served: tuple[ReportStore, dict[str, str]]) -> None:
    store, keys = served
    app = create_app(store.roots)
    client = app.server.test_client()
    assert client.get("/").status_code == 200
    key = keys["hta"]
    crafted = [
        (ids.OVERVIEW, {f"{ids.REPORT}.value": "0:" + "a" * 100_000}),
        (ids.DETAILS, {f"{ids.ROOFLINE}.clickData": "not a dict", f"{ids.REPORT}.value": key,
                       f"{ids.ROOF_PER}.value": "kernel"}),
        (ids.KERNEL_GRID, {f"{ids.REPORT}.value": key, f"{ids.TABS}.value": "kernels",
                           f"{ids.KERNEL_MODE}.value": "name", f"{ids.KERNEL_FILTER}.value": 123}),
        (ids.KERNEL_GRID, {f"{ids.REPORT}.value": key, f"{ids.TABS}.value": "kernels",
                           f"{ids.KERNEL_MODE}.value": "name", f"{ids.KERNEL_FILTER}.value": ["x"]}),
    ]
    for output, values in crafted:
        resp = _update(app, output, values)
        assert resp.status_code == 204, (output, resp.status_code, resp.data[:300])  # no update
    # the page still works: the same callback with what the page sends
    resp = _update(app, ids.KERNEL_GRID, {f"{ids.REPORT}.value": key, f"{ids.TABS}.value": "kernels",
                                          f"{ids.KERNEL_MODE}.value": "name", f"{ids.KERNEL_FILTER}.value": "elementwise"})
    assert resp.status_code == 200
    rows = resp.get_json()["response"][ids.KERNEL_GRID]["rowData"]
    assert rows and all("elementwise" in r["name"].lower() for r in rows)
