"""Dash callbacks: thin functions that load a report from the store and call figures/views.

Each callback is a plain module-level function (``on_*``) taking the store first, so tests call
them directly; :func:`register_callbacks` binds them to component ids. A view's callback does
its work only while its tab is shown (``tab`` input), so the first page load draws the overview
alone. One callback runs in the browser: the timeline's zoom filter (``TIMELINE_ZOOM_JS``).
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import TYPE_CHECKING, Any

import dash
from dash import ALL, Input, Output, State, dcc, html

from perfscope.analysis.summaries.compare import compare as compare_reports
from perfscope.errors import PerfscopeError
from perfscope.format import duration, labelled_rows, nbytes
from perfscope.schema import text_of

from . import figures, ids, layout, views
from .details import point_details
from .figures.roofline_data import filter_mask

if TYPE_CHECKING:
    from collections.abc import Callable

    import pandas as pd

    from .store import ReportStore

MAX_GRID_ROWS = 5000
NO = dash.no_update
MAX_INPUT_CHARS = 1024
"""The longest string a callback takes from the browser (a report key, a filter); longer is not a
value the page sends: the callback does nothing."""


def _text(v: Any) -> bool:
    return v is None or (isinstance(v, str) and len(v) <= MAX_INPUT_CHARS)


def _choice(*values: str) -> Callable[[Any], bool]:
    return lambda v: v is None or v in values


def _obj(v: Any) -> bool:
    return v is None or isinstance(v, dict)


INPUTS: dict[str, Callable[[Any], bool]] = {
    "key": _text, "a": _text, "b": _text, "tab": _text, "trigger": _text, "phase": _text, "needle": _text,
    "range_filter": _text, "name_filter": _text, "per": _choice("kernel", "name"), "color": _choice("bound", "phase"),
    "mode": _choice("name", "rows"), "expand": _choice("collapsed", "expanded"), "click": _obj, "relayout": _obj,
    "metric": _choice("caused", "wait", "duration", "compute", "idle"),
    "picked": _obj, "selection": _obj,
    "n_clicks": lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)),
}
"""What each callback argument (by parameter name) may be: the values the page's components send.
Anything else (a crafted request to ``/_dash-update-component``) is no update (HTTP 204)."""


def checked(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Check ``fn``'s arguments named in :data:`INPUTS` and raise ``PreventUpdate`` (no update)
    for a value the page could not have sent, before ``fn`` runs."""
    sig = inspect.signature(fn)
    names = [n for n in sig.parameters if n in INPUTS]

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind_partial(*args, **kwargs).arguments
        if not all(INPUTS[n](bound[n]) for n in names if n in bound):
            raise dash.exceptions.PreventUpdate
        return fn(*args, **kwargs)

    return run


def _first_point(click: dict[str, Any] | None) -> dict[str, Any] | None:
    """The first clicked point of a plotly ``clickData``, or None (no click, or not the shape
    plotly sends)."""
    points = (click or {}).get("points")
    if isinstance(points, list) and points and isinstance(points[0], dict):
        return points[0]
    return None


def _skip(tab: str, view: str) -> bool:
    return tab != view


@checked
def on_overview(store: ReportStore, key: str | None) -> tuple[list[Any], str]:
    """Overview children and the status line for report ``key``."""
    if not key:
        return [html.P("No reports found under the served folders.")], "no report"
    report = store.load(key)
    return layout.overview_children(report, findings=False), f"{len(report.kernels):,} kernels"


@checked
def on_findings(store: ReportStore, key: str | None) -> list[Any]:
    """The overview's findings, drawn after the rest of the overview: the app binds this to the
    status line the overview sets, so the first page shows before the rules have run (they are
    most of the overview's time on a 1M-kernel report) and the report is loaded once."""
    if not key:
        return []
    return layout.findings_children(store.load(key))


def window_from_relayout(relayout: dict[str, Any] | None) -> tuple[int | None, int | None]:
    """The x window (ns) a timeline zoom asked for; (None, None) for autorange/reset."""
    relayout = relayout or {}
    pair = relayout.get("xaxis.range")
    pair = pair if isinstance(pair, list) and len(pair) == 2 else [None, None]
    lo = relayout.get("xaxis.range[0]", pair[0])
    hi = relayout.get("xaxis.range[1]", pair[1])
    if lo is None or hi is None or relayout.get("xaxis.autorange"):
        return None, None
    try:
        lo_ms, hi_ms = float(lo), float(hi)
    except (TypeError, ValueError):
        return None, None  # not a zoom plotly sends: the whole timeline
    if not all(math.isfinite(x) and abs(x) < 1e15 for x in (lo_ms, hi_ms)):
        return None, None
    return int(lo_ms * 1e6), int(hi_ms * 1e6)


def _is_zoom(relayout: dict[str, Any]) -> bool:
    return any(k.startswith("xaxis") for k in relayout)


TIMELINE_ZOOM_JS = """function(relayout) {
    const zoom = relayout && Object.keys(relayout).some(function(k) { return k.startsWith('xaxis'); });
    return zoom ? relayout : window.dash_clientside.no_update;
}"""
"""A clientside callback: the timeline's relayout into the ``TIMELINE_ZOOM`` store when it is a
zoom (an x key, as ``_is_zoom``), else no update.

The figure callback listens to this store, not to ``relayoutData``: plotly reports
``{"autosize": True}`` when a graph is first drawn, i.e. just after the Timeline tab opens and
while the figure that tab asked for may still be on its way. Dash drops a callback's pending
response when a newer call of the same callback starts, so had that relayout called the figure
callback again, its no-update would have won and the timeline stayed empty. The filter runs in
the browser so that it has no pending call of its own for the autosize to supersede (a zoom
right after the first drawing would be lost the same way on its way to a server-side filter).
"""


@checked
def on_timeline(store: ReportStore, key: str | None, tab: str, relayout: dict[str, Any] | None,
                trigger: str | None = None, selection: dict[str, Any] | None = None) -> Any:
    """The timeline for the zoom window (level of detail re-chosen on every zoom), with the places
    of the selected finding shaded; a new selection zooms to its largest place."""
    if _skip(tab, "timeline") or not key:
        return NO
    spans = _selected_spans(selection) if (selection or {}).get("key") == key else []
    if trigger == ids.FINDING_SELECTION and spans:
        s, e = spans[0]  # the largest place first: zoom around it, its own length on each side
        pad = max(e - s, 1e-3)
        relayout = {"xaxis.range[0]": s - pad, "xaxis.range[1]": e + pad}
    elif trigger in (ids.REPORT, ids.TIMELINE_RESET, ids.TABS, ids.FINDING_SELECTION):
        relayout = None
    elif relayout is not None and not _is_zoom(relayout):
        return NO  # a relayout that is not a zoom (legend click, y pan): keep the figure
    t0, t1 = window_from_relayout(relayout)
    fig = figures.timeline(store.load(key), t0_ns=t0, t1_ns=t1)
    if spans and isinstance(fig.layout.meta, dict) and fig.layout.meta.get("kind") == "timeline":
        from .figures.timeline import highlight

        fig = highlight(fig, spans, str((selection or {}).get("finding", "")))
    return fig


def _selected_spans(selection: dict[str, Any] | None) -> list[tuple[float, float]]:
    """The selection's places as (start, end) ms, only well-formed finite pairs (it comes back from
    the browser)."""
    out = []
    for pair in (selection or {}).get("spans") or []:
        if isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                             and math.isfinite(x) and abs(x) < 1e12 for x in pair):
            out.append((float(pair[0]), float(pair[1])))
    return out


@checked
def on_finding_pick(store: ReportStore, key: str | None, picked: dict[str, Any] | None,
                    trigger: str | None = None) -> tuple[Any, Any]:
    """A click on a finding's button: its selection (:func:`views.finding_selection`) and the tab
    that shows it (the timeline, or the kernel table); a new report or the clear button clears it."""
    if trigger in (ids.REPORT, ids.FINDING_CLEAR) or not key:
        return None, NO
    index, view = (picked or {}).get("index"), (picked or {}).get("view")
    if not isinstance(index, int) or isinstance(index, bool) or view not in ("timeline", "kernels"):
        return NO, NO
    selection = views.finding_selection(store.load(key), index)
    if selection is None:
        return NO, NO
    return {**selection, "key": key}, view


def on_finding_note(selection: dict[str, Any] | None) -> str:
    """The line above the tabs that says what is selected."""
    if not isinstance(selection, dict) or "finding" not in selection:
        return "click a finding's buttons to select its gaps or kernels"
    spans, names = len(_selected_spans(selection)), len(selection.get("kernels") or [])
    what = ", ".join(p for p in (f"{spans} place(s) shaded on the timeline" if spans else "",
                                 f"{names} kernel name(s) in the kernel table" if names else "") if p)
    return f"selected: {selection['finding']}: {str(selection.get('title', ''))[:120]} ({what or 'nothing to show'})"


IDLE_GAPS_SHOWN = 20
"""How many gaps of a clicked idle cause the timeline tab lists (the largest first)."""


@checked
def on_idle(store: ReportStore, key: str | None, tab: str) -> Any:
    """Idle time per cause (docs/idle.md), under the timeline."""
    if _skip(tab, "timeline") or not key:
        return NO
    return figures.idle_causes(store.load(key))


@checked
def on_idle_click(store: ReportStore, key: str | None, click: dict[str, Any] | None) -> Any:
    """The gaps of the clicked cause bar: the largest first, each with its start (ms from the
    timeline's origin), length, range and call; zoom the timeline there to see them."""
    points = (click or {}).get("points")
    point = points[0] if isinstance(points, list) and points and isinstance(points[0], dict) else None
    data = point.get("customdata") if point else None
    if not key or not isinstance(data, list) or len(data) < 2:
        return html.P("click a cause's bar to list its gaps", className="muted")
    device, cause = data[:2]
    from perfscope.analysis.idle import idle_of

    from .figures.timeline_data import timeline_index

    report = store.load(key)
    idle = idle_of(report)
    rows = idle[(idle["device"] == device) & (idle["cause"] == cause)]
    if not len(rows):
        return html.P(f"no {cause} gaps on {device}", className="muted")
    origin = timeline_index(report).origin_ns
    top = rows.nlargest(IDLE_GAPS_SHOWN, "duration_ns")
    table = [{"start ms": f"{(int(r.start_ns) - origin) / 1e6:.3f}", "length": duration(float(r.duration_ns)),
              "range": str(r.range) if isinstance(r.range, str) else "", "call": str(r.api) if isinstance(r.api, str) else ""}
             for r in top.itertuples(index=False)]
    return html.Div([html.P(f"{len(rows)} {cause} gaps on {device}, {duration(float(rows['duration_ns'].sum()))} "
                            f"in all; the {len(top)} largest:", className="muted"), layout.dict_table(table)])


@checked
def on_roofline(store: ReportStore, key: str | None, tab: str, per: str, color: str, phase: str,
                range_filter: str | None, name_filter: str | None) -> Any:
    """The roofline with the chosen aggregation, colouring and filters."""
    if _skip(tab, "roofline") or not key:
        return NO
    return figures.roofline(store.load(key), per=per, color=color, phase=None if phase == "all" else phase,
                            range_filter=range_filter or None, name_filter=name_filter or None)


@checked
def on_phase_options(store: ReportStore, key: str | None) -> tuple[list[dict[str, str]], str]:
    """Phase filter choices present in the report."""
    if not key:
        return [{"label": "all", "value": "all"}], "all"
    phases = store.load(key).kernels["phase"].dropna().astype(str).unique()
    values = ["all", *sorted(phases), "none"]
    return [{"label": v, "value": v} for v in values], "all"


@checked
def on_click(store: ReportStore, click: dict[str, Any] | None, key: str | None, per: str) -> Any:
    """Details of the clicked roofline point."""
    point = _first_point(click)
    data = point.get("customdata") if point else None
    if not key or not isinstance(data, list) or not data:
        return NO
    return layout.details_children(point_details(store.load(key), data[0], per))


@checked
def kernel_frame(store: ReportStore, key: str, mode: str, needle: str | None, limit: int | None,
                 selection: dict[str, Any] | None = None) -> pd.DataFrame:
    """The kernel table (per name, or individual executions) filtered by name substring, and to the
    kernels of the selected finding when there is one."""
    report = store.load(key)
    picked = views.selection_mask(report, selection if (selection or {}).get("key") == key else None)
    if mode == "name":
        frame = views.kernels_by_name(report)
        if needle:
            frame = frame[text_of(frame["name"]).str.contains(needle, case=False, regex=False)]
        if picked is not None:
            frame = frame[frame["name"].astype("object").isin(set(report.kernels["name"][picked].astype("object")))]
        return frame
    mask = filter_mask(report, name_filter=needle) if needle else None
    if picked is not None:
        mask = picked if mask is None else mask & picked
    return views.kernel_rows(report, mask, limit)


@checked
def on_kernels(store: ReportStore, key: str | None, tab: str, mode: str, needle: str | None,
               selection: dict[str, Any] | None = None) -> Any:
    """Rows, columns and a note for the kernel grid (individual executions capped)."""
    if _skip(tab, "kernels") or not key:
        return NO, NO, NO
    frame = kernel_frame(store, key, mode, needle, MAX_GRID_ROWS, selection)
    total = len(store.load(key).kernels)
    note = (f"{len(frame):,} names" if mode == "name" else
            f"the {len(frame):,} longest of {total:,} executions" + (" matching the filter" if needle else ""))
    if selection and selection.get("key") == key and selection.get("kernels"):
        note = f"the kernels of finding {selection.get('finding')} (clear it above the tabs): " + note
    records = frame.astype(object).where(frame.notna(), None).to_dict("records")
    return records, layout.grid_columns(frame), note + "; sort and filter in the column headers"


@checked
def on_download(store: ReportStore, n_clicks: int, key: str | None, mode: str, needle: str | None) -> Any:
    """The full (uncapped) filtered kernel table as a CSV download."""
    if not n_clicks or not key:
        return NO
    frame = kernel_frame(store, key, mode, needle, None)
    return {"content": frame.to_csv(index=False), "filename": f"kernels-{mode}.csv", "type": "text/csv"}


@checked
def on_phases(store: ReportStore, key: str | None, tab: str) -> Any:
    """Phase metrics, phase breakdown, step times and latency distributions."""
    if _skip(tab, "phases") or not key:
        return NO, NO, NO, NO
    report = store.load(key)
    table = views.phase_metrics(report)
    metrics = html.Div([layout.dict_table(labelled_rows(views.frame_rows(table))),
                        *(html.P(n, className="muted") for n in views.phase_notes(table))]) if table is not None \
        else html.P("no phase metrics for this report", className="muted")
    return (metrics, figures.phase_breakdown(report), figures.step_times(report),
            figures.latency_distributions(report))


@checked
def on_load(store: ReportStore, key: str | None, tab: str) -> Any:
    """Load-test figures (latency CDFs, load over time, decode roofline, rate curve) and the server's gauges over
    the run (a load test's ``--metrics``, or a serving run's saved ``/metrics``); none for other reports."""
    if _skip(tab, "phases") or not key:
        return NO
    from .figures.loadtest import load_figures

    report = store.load(key)
    figs = [*load_figures(report).values(), *([figures.gauges_beside_latency(report)] if len(report.gauges) else [])]
    return [dcc.Graph(figure=fig, config=layout.GRAPH_CONFIG) for fig in figs]


@checked
def on_tails(store: ReportStore, key: str | None, tab: str) -> Any:
    """A load test's tails: the p50/p99 table and bars with their parts, and the requests to click."""
    if _skip(tab, "phases") or not key:
        return NO, NO, NO
    from perfscope.analysis.summaries.tails import splits, tails_table

    from .figures.tails import requests_figure, tails_figure

    report = store.load(key)
    if not splits(report):
        empty = figures.message_figure("no load-test requests in this report", "tails")
        return html.P("no load-test requests: no tails to split", className="muted"), empty, empty
    notes = [html.P(n, className="muted") for s in splits(report) for n in s.notes]
    table = html.Div([html.H4("Serving tails: p50 and p99 split into their causes"),
                      layout.dict_table(labelled_rows(views.frame_rows(tails_table(report))), "tails"), *notes])
    return table, tails_figure(report), requests_figure(report)


@checked
def on_request_click(store: ReportStore, key: str | None, click: Any) -> Any:
    """The clicked request's timeline: its pieces by part, its tokens, the steps with their batch and kernels."""
    from .figures.tails import request_timeline_figure

    point = ((click or {}).get("points") or [{}])[0]
    custom = point.get("customdata") if isinstance(point, dict) else None
    try:
        run, rid = custom[0], int(custom[1])  # type: ignore[index]
    except (TypeError, ValueError, IndexError, KeyError):
        run, rid = None, None
    if not key or rid is None or not _text(run):
        return figures.message_figure("click a request above for its timeline", "request_timeline")
    return request_timeline_figure(store.load(key), run or None, rid)


@checked
def on_memory(store: ReportStore, key: str | None, tab: str) -> Any:
    """The memory track under the timeline."""
    return NO if _skip(tab, "timeline") or not key else figures.memory_timeline(store.load(key))


@checked
def on_memory_click(store: ReportStore, key: str | None, click: Any) -> Any:
    """What was live just after the clicked event of the memory track: bytes by category (adding up to
    the allocated bytes), reserved and fragmentation beside, the largest live tensors."""
    from perfscope.analysis.summaries.memory import breakdown
    from perfscope.text_memory import breakdown_tables

    point = ((click or {}).get("points") or [{}])[0]
    custom = point.get("customdata")
    if not key or not custom:
        return "click a point of the memory track to list what was live"
    device, event = str(custom[0]), int(custom[1])
    b = breakdown(store.load(key), device, event, top=25)
    cats, beside, tensors = breakdown_tables(b)

    def grid(rows: list[dict[str, str]]) -> Any:
        if not rows:
            return html.P("none")
        return html.Table([html.Tr([html.Th(h) for h in rows[0]]),
                           *[html.Tr([html.Td(v) for v in r.values()]) for r in rows]])

    head = (f"{b['live_tensors']} allocation(s) live on {device} at {b['at']}, "
            f"{nbytes(b['allocated_bytes'])} allocated")
    return html.Div([html.P(head), grid(cats), html.P(f"beside it: {beside}") if beside else None,
                     html.P("largest live tensors:"), grid(tensors)])


@checked
def on_counters(store: ReportStore, key: str | None, tab: str) -> Any:
    """NVML counters."""
    return NO if _skip(tab, "counters") or not key else figures.counters(store.load(key))


@checked
def on_compare(store: ReportStore, a: str | None, b: str | None, tab: str) -> Any:
    """The comparison of two reports: the tables and verdict of ``perfscope compare A B``, and a chart."""
    if _skip(tab, "compare") or not a or not b:
        return NO, NO
    ra, rb = store.load(a), store.load(b)
    c = compare_reports(ra, rb)
    return figures.compare(ra, rb, comparison=c), layout.compare_tables(c, figures.COMPARE_TOP)


def _rank_views(store: ReportStore, key: str) -> Any:
    """The report's rank views (stored by the import, else computed), once per loaded report."""
    from perfscope.analysis.ranks.partial_read import report_views
    from perfscope.memo import memo

    report = store.load(key)
    return memo(report, "dashboard:rank_views", lambda: report_views(report))


@checked
def on_ranks(store: ReportStore, key: str | None, tab: str, metric: str | None) -> Any:
    """The rank x step heat map of a multi-rank report (a message for any other report)."""
    if _skip(tab, "ranks") or not key:
        return NO
    if "rank" not in store.load(key).kernels.columns:
        return figures.message_figure("not a multi-rank report: import a folder of rank traces with "
                                      "perfscope import DIR --ranks", "rank_step_heatmap")
    from .figures.ranks import step_heatmap

    t, s = _rank_views(store, key)
    return step_heatmap(t, s, metric or "caused")


def _cell(click: dict[str, Any] | None) -> tuple[int, int] | None:
    """(rank, step) of a clicked heat-map cell, or None."""
    point = _first_point(click)
    if point is None:
        return None
    x, y = point.get("x"), point.get("y")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) < 1e9
               for v in (x, y)):
        return None
    return int(y), int(x)  # type: ignore[arg-type]  # both checked to be finite numbers above


@checked
def on_rank_step(store: ReportStore, key: str | None, click: dict[str, Any] | None) -> Any:
    """The clicked rank's step: its timeline over the step's window, and a line on what it waited
    for and what it made the others wait."""
    cell = _cell(click)
    if not key or cell is None:
        return NO, "click a cell of the heat map to see that rank's step"
    rank, step = cell
    from perfscope.analysis.ranks.partial_read import one_rank_report, rank_steps

    t, s = _rank_views(store, key)
    steps = rank_steps(t, s)
    row = steps[(steps["rank"] == rank) & (steps["step"] == step)] if len(steps) else steps
    if not len(row):
        return figures.message_figure(f"rank {rank} has no step {step}"), ""
    r = row.iloc[0]
    from .figures.timeline_data import timeline_index

    report = one_rank_report(store.load(key), rank)
    origin = timeline_index(report).origin_ns  # the timeline's x is time since its origin
    fig = figures.timeline(report, t0_ns=int(r["start_ns"]) - origin, t1_ns=int(r["end_ns"]) - origin)
    fig.update_layout(title=f"rank {rank}, step {step}")

    def ns(col: str) -> str:
        v = r.get(col)
        return duration(float(v)) if v is not None and not (isinstance(v, float) and math.isnan(v)) else "n/a"

    note = (f"rank {rank}, step {step}: {ns('duration_ns')}; compute {ns('compute_ns')}, collectives "
            f"{ns('comm_ns')} (of which waiting {ns('wait_ns')}), device idle {ns('idle_ns')}; the other ranks of its "
            f"group wait {ns('waited_for_ns')} each for it")
    return fig, note


TREE_GRID_ROWS = 500


def _tree_phase(phase: str | None) -> str | None:
    return None if phase in (None, "all") else phase


@checked
def on_tree(store: ReportStore, key: str | None, tab: str, phase: str | None, expand: str | None = None) -> Any:
    """The icicle of the report's module -> op -> kernel tree (for one phase, or all kernels;
    repeated layers collapsed unless ``expand`` is ``expanded``)."""
    if _skip(tab, "tree") or not key:
        return NO
    from .figures.tree import tree_figure

    return tree_figure(store.load(key), phase=_tree_phase(phase), collapse=expand != "expanded")


@checked
def on_tree_phases(store: ReportStore, key: str | None) -> tuple[list[dict[str, str]], str]:
    """The tree's phase choices: all, then each phase with kernels."""
    from perfscope.analysis.summaries.hierarchy import phases_of

    values = ["all", *(phases_of(store.load(key)) if key else [])]
    return [{"label": v, "value": v} for v in values], "all"


@checked
def tree_selection(store: ReportStore, key: str, phase: str | None, click: dict[str, Any] | None,
                   expand: str | None = None) -> tuple[Any, str]:
    """(mask over the kernels or None, label) of the clicked node (None: the whole tree)."""
    from perfscope.analysis.summaries.hierarchy import hierarchy
    from perfscope.schema import value_mask

    report = store.load(key)
    tree = hierarchy(report, phase=_tree_phase(phase), collapse=expand != "expanded")
    point = _first_point(click)
    node = point.get("id", point.get("customdata")) if point else None  # the icicle's ids are node numbers
    if isinstance(node, list):
        node = node[0] if node else None
    if isinstance(node, str):
        node = int(node) if node.isascii() and node.isdigit() and len(node) < 19 else None
    if not isinstance(node, int) or isinstance(node, bool):
        node = None
    if node is None or int(node) not in set(tree.nodes["node"].tolist()):
        mask = None
        if tree.phase is not None:
            mask = value_mask(report.kernels, "phase", lambda v: v == tree.phase)
        return mask, "the whole tree" + (f" ({tree.phase})" if tree.phase else "")
    row = tree.nodes[tree.nodes["node"] == int(node)].iloc[0]
    return tree.kernel_mask(int(node), len(report.kernels)), str(row["path"])


def _longest(report: Any, mask: Any, n: int) -> Any:
    """A mask of the ``n`` longest kernels within ``mask`` (all kernels when None)."""
    import numpy as np

    dur = report.kernels["duration_ns"].to_numpy("float64", na_value=np.nan)
    pos = np.flatnonzero(mask) if mask is not None else np.arange(len(dur))
    if len(pos) > n:
        pos = pos[np.argpartition(-dur[pos], n - 1)[:n]]
    out = np.zeros(len(dur), dtype=bool)
    out[pos] = True
    return out


@checked
def on_tree_select(store: ReportStore, key: str | None, tab: str, phase: str | None,
                   click: dict[str, Any] | None, trigger: str | None = None, expand: str | None = None) -> Any:
    """The roofline (per kernel name) and the longest kernels of the clicked node (the whole
    tree after a change of report, phase or expansion)."""
    if _skip(tab, "tree") or not key:
        return NO, NO, NO, NO
    if trigger in (ids.REPORT, ids.TREE_PHASE, ids.TREE_EXPAND):
        click = None
    report = store.load(key)
    mask, label = tree_selection(store, key, phase, click, expand)
    fig = figures.roofline(report, per="name", rows=mask if mask is not None else None)
    frame = views.kernel_rows(report, _longest(report, mask, TREE_GRID_ROWS))
    n = int(mask.sum()) if mask is not None else len(report.kernels)
    note = f"{label}: {n:,} kernels" + (f"; the table lists the {len(frame):,} longest" if n > len(frame) else "")
    records = frame.astype(object).where(frame.notna(), None).to_dict("records")
    return fig, records, layout.grid_columns(frame), note


def _picked(store: ReportStore, key: str | None, clicks: list[Any]) -> tuple[Any, Any]:
    """:func:`on_finding_pick` for the button that fired: a finding's button with a click (a button
    just drawn fires with no click, and is no pick), the clear button, or a new report."""
    trigger = dash.ctx.triggered_id
    if isinstance(trigger, dict):
        if not any(isinstance(c, int) and c > 0 for c in [t.get("value") for t in dash.ctx.triggered]):
            return NO, NO
        return on_finding_pick(store, key, dict(trigger))
    return on_finding_pick(store, key, None, trigger)


def _guard(fn: Any, *kinds: str) -> Any:
    """Wrap a callback so a PerfscopeError (bad key, unreadable report) is shown, not raised.

    ``kinds`` names each output: ``figure`` gets a message figure, ``text`` a message
    paragraph, anything else is left unchanged.
    """
    def run(*args: Any) -> Any:
        try:
            return fn(*args)
        except PerfscopeError as exc:
            out = [figures.message_figure(str(exc)) if k == "figure" else
                   html.P(str(exc), className="error") if k == "text" else NO for k in kinds]
            return out[0] if len(out) == 1 else tuple(out)
    return run


def register_callbacks(app: dash.Dash, store: ReportStore) -> None:
    """Bind every ``on_*`` function to its components."""
    cb = app.callback
    cb(Output(ids.OVERVIEW, "children"), Output(ids.STATUS, "children"), Input(ids.REPORT, "value"))(
        _guard(lambda key: on_overview(store, key), "text", "-"))
    cb(Output(ids.FINDINGS, "children"), Input(ids.STATUS, "children"), State(ids.REPORT, "value"))(
        _guard(lambda _status, key: on_findings(store, key), "text"))
    app.clientside_callback(TIMELINE_ZOOM_JS, Output(ids.TIMELINE_ZOOM, "data"), Input(ids.TIMELINE, "relayoutData"))
    cb(Output(ids.TIMELINE, "figure"), Input(ids.REPORT, "value"), Input(ids.TABS, "value"),
       Input(ids.TIMELINE_ZOOM, "data"), Input(ids.TIMELINE_RESET, "n_clicks"), Input(ids.FINDING_SELECTION, "data"))(
        _guard(lambda key, tab, relayout, _n, selection: on_timeline(store, key, tab, relayout, dash.ctx.triggered_id,
                                                                     selection), "figure"))
    cb(Output(ids.FINDING_SELECTION, "data"), Output(ids.TABS, "value"), Input(ids.REPORT, "value"),
       Input({"type": ids.FINDING_PICK, "index": ALL, "view": ALL}, "n_clicks"), Input(ids.FINDING_CLEAR, "n_clicks"),
       prevent_initial_call=True)(_guard(lambda key, clicks, _n: _picked(store, key, clicks), "-", "-"))
    cb(Output(ids.FINDING_NOTE, "children"), Input(ids.FINDING_SELECTION, "data"))(on_finding_note)
    cb(Output(ids.IDLE_FIGURE, "figure"), Input(ids.REPORT, "value"), Input(ids.TABS, "value"))(
        _guard(lambda *a: on_idle(store, *a), "figure"))
    cb(Output(ids.IDLE_GAPS, "children"), Input(ids.REPORT, "value"), Input(ids.IDLE_FIGURE, "clickData"))(
        _guard(lambda key, click: on_idle_click(store, key, click if dash.ctx.triggered_id == ids.IDLE_FIGURE else None),
               "text"))
    cb(Output(ids.ROOFLINE, "figure"), Input(ids.REPORT, "value"), Input(ids.TABS, "value"),
       Input(ids.ROOF_PER, "value"), Input(ids.ROOF_COLOR, "value"), Input(ids.ROOF_PHASE, "value"),
       Input(ids.ROOF_RANGE, "value"), Input(ids.ROOF_NAME, "value"))(
        _guard(lambda *a: on_roofline(store, *a), "figure"))
    cb(Output(ids.ROOF_PHASE, "options"), Output(ids.ROOF_PHASE, "value"), Input(ids.REPORT, "value"))(
        _guard(lambda key: on_phase_options(store, key), "-", "-"))
    cb(Output(ids.DETAILS, "children"), Input(ids.ROOFLINE, "clickData"), State(ids.REPORT, "value"),
       State(ids.ROOF_PER, "value"))(_guard(lambda *a: on_click(store, *a), "text"))
    cb(Output(ids.KERNEL_GRID, "rowData"), Output(ids.KERNEL_GRID, "columnDefs"), Output(ids.KERNEL_NOTE, "children"),
       Input(ids.REPORT, "value"), Input(ids.TABS, "value"), Input(ids.KERNEL_MODE, "value"),
       Input(ids.KERNEL_FILTER, "value"), Input(ids.FINDING_SELECTION, "data"))(
        _guard(lambda *a: on_kernels(store, *a), "-", "-", "text"))
    cb(Output(ids.KERNEL_GRID, "exportDataAsCsv"), Input(ids.KERNEL_EXPORT, "n_clicks"), prevent_initial_call=True)(
        lambda n: bool(n))
    cb(Output(ids.KERNEL_DOWNLOAD, "data"), Input(ids.KERNEL_DOWNLOAD_BTN, "n_clicks"), State(ids.REPORT, "value"),
       State(ids.KERNEL_MODE, "value"), State(ids.KERNEL_FILTER, "value"), prevent_initial_call=True)(
        _guard(lambda *a: on_download(store, *a), "-"))
    cb(Output(ids.PHASE_TABLE, "children"), Output(ids.PHASE_FIGURE, "figure"), Output(ids.STEP_FIGURE, "figure"),
       Output(ids.LATENCY_FIGURE, "figure"), Input(ids.REPORT, "value"), Input(ids.TABS, "value"))(
        _guard(lambda *a: on_phases(store, *a), "text", "figure", "figure", "figure"))
    cb(Output(ids.LOAD_FIGURES, "children"), Input(ids.REPORT, "value"), Input(ids.TABS, "value"))(
        _guard(lambda *a: on_load(store, *a), "text"))
    cb(Output(ids.TAILS_TABLE, "children"), Output(ids.TAILS_FIGURE, "figure"), Output(ids.TAIL_REQUESTS, "figure"),
       Input(ids.REPORT, "value"), Input(ids.TABS, "value"))(
        _guard(lambda *a: on_tails(store, *a), "text", "figure", "figure"))
    cb(Output(ids.REQUEST_TIMELINE, "figure"), Input(ids.REPORT, "value"), Input(ids.TAIL_REQUESTS, "clickData"))(
        _guard(lambda key, click: on_request_click(store, key, click if dash.ctx.triggered_id == ids.TAIL_REQUESTS
                                                   else None), "figure"))
    cb(Output(ids.COUNTERS, "figure"), Input(ids.REPORT, "value"), Input(ids.TABS, "value"))(
        _guard(lambda *a: on_counters(store, *a), "figure"))
    cb(Output(ids.MEMORY, "figure"), Input(ids.REPORT, "value"), Input(ids.TABS, "value"))(
        _guard(lambda *a: on_memory(store, *a), "figure"))
    cb(Output(ids.MEMORY_LIVE, "children"), Input(ids.REPORT, "value"), Input(ids.MEMORY, "clickData"))(
        _guard(lambda *a: on_memory_click(store, *a), "text"))
    cb(Output(ids.TREE_PHASE, "options"), Output(ids.TREE_PHASE, "value"), Input(ids.REPORT, "value"))(
        _guard(lambda key: on_tree_phases(store, key), "-", "-"))
    cb(Output(ids.TREE_FIGURE, "figure"), Input(ids.REPORT, "value"), Input(ids.TABS, "value"),
       Input(ids.TREE_PHASE, "value"), Input(ids.TREE_EXPAND, "value"))(_guard(lambda *a: on_tree(store, *a), "figure"))
    cb(Output(ids.TREE_ROOFLINE, "figure"), Output(ids.TREE_GRID, "rowData"), Output(ids.TREE_GRID, "columnDefs"),
       Output(ids.TREE_NOTE, "children"), Input(ids.REPORT, "value"), Input(ids.TABS, "value"),
       Input(ids.TREE_PHASE, "value"), Input(ids.TREE_FIGURE, "clickData"), Input(ids.TREE_EXPAND, "value"))(
        _guard(lambda key, tab, phase, click, expand: on_tree_select(store, key, tab, phase, click,
                                                                     dash.ctx.triggered_id, expand),
               "figure", "-", "-", "text"))
    cb(Output(ids.RANKS_HEATMAP, "figure"), Input(ids.REPORT, "value"), Input(ids.TABS, "value"),
       Input(ids.RANKS_METRIC, "value"))(_guard(lambda *a: on_ranks(store, *a), "figure"))
    cb(Output(ids.RANKS_STEP, "figure"), Output(ids.RANKS_NOTE, "children"), Input(ids.REPORT, "value"),
       Input(ids.RANKS_HEATMAP, "clickData"))(
        _guard(lambda key, click: on_rank_step(store, key, click if dash.ctx.triggered_id == ids.RANKS_HEATMAP else None),
               "figure", "text"))
    cb(Output(ids.COMPARE_FIGURE, "figure"), Output(ids.COMPARE_TABLE, "children"), Input(ids.COMPARE_A, "value"),
       Input(ids.COMPARE_B, "value"), Input(ids.TABS, "value"))(_guard(lambda *a: on_compare(store, *a), "figure", "text"))
