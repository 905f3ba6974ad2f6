"""The Dash layout: pure functions from entries and reports to components.

Every string from a report is passed to components as text children or props, which Dash
renders as text; nothing here builds raw HTML.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import dash_ag_grid as dag
from dash import dcc, html

from perfscope.analysis.costs.limiter import bound_label
from perfscope.analysis.summaries.compare import Comparison, name_view, phase_view, tail_view
from perfscope.analysis.summaries.projection import band_line, family_rows, whole_run_rows
from perfscope.analysis.summaries.serving import CLIENT_RESULTS_TITLE, client_results
from perfscope.format import column_label, evidence_rows

from . import ids, views
from .text import MISSING, duration, pct, si

if TYPE_CHECKING:
    import pandas as pd

    from perfscope.report import Report

    from .store import Entry

GRAPH_CONFIG: Any = {"displaylogo": False, "scrollZoom": True}

# AG Grid value formatters (our own code, never report text): durations, percentages, SI rates.
_FMT = {
    "ns": f"params.value == null ? '{MISSING}' : d3.format('.3~s')(params.value / 1e9) + 's'",
    "pct": f"params.value == null ? '{MISSING}' : d3.format('.2f')(params.value) + '%'",
    "si": f"params.value == null ? '{MISSING}' : d3.format('.3~s')(params.value)",
    "num": f"params.value == null ? '{MISSING}' : d3.format('.4~g')(params.value)",
}


def facts_table(rows: list[tuple[str, str]], table_id: str | None = None) -> html.Table:
    """Label/value rows as a two-column table."""
    body = [html.Tr([html.Th(k), html.Td(v)]) for k, v in rows]
    if table_id:
        return html.Table(html.Tbody(body), className="facts", id=table_id)
    return html.Table(html.Tbody(body), className="facts")


def dict_table(rows: list[dict[str, str]], table_id: str | None = None) -> html.Div | html.P:
    """Rows of equal keys as a table (header from the first row), in a box that scrolls sideways
    when the table is wider than the page (the phases table has 14 columns)."""
    if not rows:
        return html.P("none", className="muted")
    head = html.Thead(html.Tr([html.Th(k) for k in rows[0]]))
    body = html.Tbody([html.Tr([html.Td(v) for v in row.values()]) for row in rows])
    table = html.Table([head, body], id=table_id) if table_id else html.Table([head, body])
    return html.Div(table, className="scrollx")


def compare_tables(c: Comparison, top: int) -> html.Div:
    """The tables and verdict of ``perfscope compare A B``: the same rows, cells and order."""
    return html.Div([
        html.H4("Phases"), dict_table(phase_view(c).to_dict("records"), "compare-phases"),
        html.H4(f"Top movers (matched by {c.key})"), dict_table(name_view(c, top).to_dict("records"), "compare-rows"),
        *([html.H4("Tails: how each part of the p99 moved"), dict_table(tail_view(c).to_dict("records"), "compare-tails")]
          if len(c.by_tail) else []),
        html.H4("Verdict"), html.Ul([html.Li(v) for v in c.verdict], id="compare-verdict"),
    ])


def _top_kernels(report: Report, n: int = 10) -> html.Div | html.P:
    from perfscope.analysis.summaries.kernels import top_kernels

    top = top_kernels(report, n)
    rows = [{"name": str(r["name"]), "calls": f"{int(r['count']):,}", "time": duration(r["duration_ns"]),
             "share": pct(r["share_pct"]), "bound": bound_label(r.get("bound"), r.get("limiter")),
             "achieved": si(r.get("achieved_flops_per_s"), "FLOP/s"), "% of roof": pct(r.get("pct_of_roof"))}
            for _, r in top.iterrows()]
    from perfscope.analysis.summaries.kernels import limiter_notes, roof_notes

    notes = [html.Li(n) for n in roof_notes(top, report.device)]
    differ = [html.Li(n) for n in limiter_notes(top)]
    return html.Div([dict_table(rows, "top-kernels"), *([html.P("Above the roof:"), html.Ul(notes)] if notes else []),
                     *([html.P("The measured limiter disagrees with the roofline:"), html.Ul(differ)] if differ else [])])


def _finding(f: Any, index: int = 0) -> html.Div:
    stake = getattr(f, "time_at_stake_ns", None)
    run = getattr(f, "run", "") or ""
    return html.Div([html.B(f"[{getattr(f, 'severity', '')}] {getattr(f, 'title', '')}"),
                     html.Span(f" — time at stake: {duration(stake)}" if stake is not None else ""),
                     html.Span(f" [{run} run]" if run else "", className="muted"),
                     html.P(html.I(str(getattr(f, "recommendation", "")))),
                     *_finding_evidence(f, index),
                     html.Details([html.Summary("numbers"),
                                   facts_table(evidence_rows(getattr(f, "evidence", None) or {}))])],
                    className=f"finding {getattr(f, 'severity', '')}")


def _finding_evidence(f: Any, index: int) -> list[Any]:
    """The items behind a finding (a small table and the share they explain) and the buttons that
    select them: its places on the timeline, its kernels in the kernel table."""
    share, rows, more = views.finding_evidence(f)
    if not rows:
        return []
    items = list(getattr(f, "items", ()) or ())
    placed = any(i.places() for i in items if hasattr(i, "places"))
    named = any(i.kind in ("kernel", "kernels") and i.attrs.get("name") for i in items) or bool(getattr(f, "kernels", ()))
    buttons = ([html.Button("show on the timeline", id={"type": ids.FINDING_PICK, "index": index, "view": "timeline"},
                            n_clicks=0, className="pick")] if placed else []) + \
        ([html.Button("show its kernels", id={"type": ids.FINDING_PICK, "index": index, "view": "kernels"},
                      n_clicks=0, className="pick")] if named else [])
    table = html.Table([html.Thead(html.Tr([html.Th("of the stake"), html.Th("cause"), html.Th("evidence")])),
                        html.Tbody([html.Tr([html.Td(r["share"]), html.Td(r["cause"]), html.Td(r["evidence"])],
                                            className=r["cause"]) for r in rows])], className="items")
    return [html.P([f"Evidence: {share}." if share else "Evidence:", *buttons], className="evidence-share"), table,
            *([html.P(more, className="muted")] if more else [])]


def overview_children(report: Report, findings: bool = True) -> list[Any]:
    """Source, device roofs, headline metrics, phases, requests, top kernels, findings (unless
    ``findings`` is false: the app fills them in apart, see :func:`findings_children`), warnings."""
    out: list[Any] = [html.H3("Report"), facts_table(views.source_facts(report))]
    projection = report.manifest.get("projection") or {}
    if projection.get("whole_run"):
        out += [html.H3("Projection: the whole run"), dict_table(whole_run_rows(projection), "projection-whole-run"),
                dict_table(family_rows(projection), "projection-families"), html.P(band_line(projection), className="muted")]
    if views.has_device_work(report):
        out += [html.H3("Device roofs"), dict_table(views.roofs_rows(report), "roofs"),
                html.H3("Headline"), facts_table(views.overview_facts(report), "headline")]
    else:
        out += [html.H3("Device: none profiled"), html.P(views.no_device_why(report), className="muted")]
    from perfscope.analysis.summaries.runs import range_text, timing_text

    timing = timing_text(report)
    if timing:
        out += [html.P([html.B("Timing: "), timing], className="timing")]
    phases = views.phase_metrics(report)
    if phases is not None:
        detail = views.phase_rows(report, phases, detail=True)
        rng = range_text(report)
        out += [html.H3("Phases"), dict_table(views.phase_rows(report, phases), "phase-summary"),
                *([html.P(views.RUN_NOTE, className="muted")] if "timing" in phases and phases["timing"].nunique() > 1 else []),
                *([html.P(rng, className="warnings")] if rng else []),
                *(html.P(n, className="muted") for n in views.phase_notes(phases)),
                *([html.H4("Phase work (the FLOPs and bytes behind MFU and MBU)"), dict_table(detail, "phase-work")]
                  if detail else [])]
    requests = views.request_metrics(report)
    if requests:
        out += [html.H3("Requests"), facts_table([(column_label(k), views.format_value(k, v))
                                                  for k, v in requests.items()])]
    client = client_results(report)
    if client:
        out += [html.H3(CLIENT_RESULTS_TITLE), facts_table(client)]
    if len(report.kernels):
        out += [html.H3("Top kernels"), _top_kernels(report)]
    if findings:
        out += findings_children(report)
    notes = report.warnings + [f"unavailable metric: {m}" for m in report.unavailable_metrics]
    if notes:
        out += [html.H3("Warnings"), html.Ul([html.Li(w) for w in notes], className="warnings")]
    return out


def findings_children(report: Report) -> list[Any]:
    """The findings section of the overview (empty when the rules are not installed)."""
    found = views.findings(report)
    if found is None:
        return []
    from perfscope.analysis.findings import stake_clock

    items: list[Any] = [_finding(f, i) for i, f in enumerate(found)] or [html.P("No rule fired.", className="muted")]
    clock = [html.P(f"Most time at stake first; {stake_clock(report)}.", className="muted")] if found else []
    return [html.H3("Findings"), *clock, *items]


def details_children(rows: list[tuple[str, str]]) -> list[Any]:
    """The roofline click panel."""
    return [html.H4("Selected point"), facts_table(rows, "details-table")]


def grid_columns(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """AG Grid column definitions for a kernel table, with unit-aware formatters."""
    cols = []
    for name in frame.columns:
        key, label, kind = views.KERNEL_TABLE_COLUMNS.get(name, (name, name, "text"))
        col: dict[str, Any] = {"field": key, "headerName": label}
        if kind in _FMT:
            col["valueFormatter"] = {"function": _FMT[kind]}
            col["filter"] = "agNumberColumnFilter"
        if key == "name":
            col.update(minWidth=320, flex=2, tooltipField="name")
        cols.append(col)
    return cols


def _controls(*children: Any) -> html.Div:
    return html.Div(list(children), className="controls")


def _graph(graph_id: str) -> dcc.Graph:
    return dcc.Graph(id=graph_id, config=GRAPH_CONFIG, figure={"data": [], "layout": {}})


def _roofline_panel() -> html.Div:
    return html.Div([
        _controls(
            html.Label(["points ", dcc.RadioItems(id=ids.ROOF_PER, value="kernel", inline=True, options=[
                {"label": "per kernel", "value": "kernel"}, {"label": "per name", "value": "name"}])]),
            html.Label(["colour by ", dcc.RadioItems(id=ids.ROOF_COLOR, value="bound", inline=True, options=[
                {"label": "bound", "value": "bound"}, {"label": "phase", "value": "phase"}])]),
            html.Label(["phase ", dcc.Dropdown(id=ids.ROOF_PHASE, value="all", clearable=False, options=[
                {"label": "all", "value": "all"}], style={"width": "140px"})]),
            dcc.Input(id=ids.ROOF_RANGE, type="text", placeholder="range contains…", debounce=True),
            dcc.Input(id=ids.ROOF_NAME, type="text", placeholder="kernel name contains…", debounce=True),
        ),
        html.Div([html.Div(_graph(ids.ROOFLINE), className="main"),
                  html.Div([html.P("Click a point to see its shapes, launch configuration, achieved vs "
                                   "attainable rate and share of time.", className="muted")],
                           id=ids.DETAILS, className="details")], className="split"),
    ])


def _kernels_panel() -> html.Div:
    return html.Div([
        _controls(
            dcc.RadioItems(id=ids.KERNEL_MODE, value="name", inline=True, options=[
                {"label": "per kernel name", "value": "name"}, {"label": "individual executions", "value": "rows"}]),
            dcc.Input(id=ids.KERNEL_FILTER, type="text", placeholder="name or operator contains…", debounce=True),
            html.Button("Export shown rows (CSV)", id=ids.KERNEL_EXPORT, n_clicks=0),
            html.Button("Download full table (CSV)", id=ids.KERNEL_DOWNLOAD_BTN, n_clicks=0),
            dcc.Download(id=ids.KERNEL_DOWNLOAD),
        ),
        html.P(id=ids.KERNEL_NOTE, className="muted"),
        dag.AgGrid(id=ids.KERNEL_GRID, rowData=[], columnDefs=[], csvExportParams={"fileName": "kernels.csv"},
                   defaultColDef={"sortable": True, "filter": True, "resizable": True, "floatingFilter": True},
                   dashGridOptions={"pagination": True, "paginationPageSize": 50, "tooltipShowDelay": 300},
                   style={"height": "640px"}),
    ])


def _tree_panel() -> html.Div:
    """The hierarchy tab: the icicle of module -> op -> kernel; a click on a node filters the
    roofline (per kernel name) and the kernel table below it to that node's kernels."""
    return html.Div([
        _controls(html.Label(["phase ", dcc.Dropdown(id=ids.TREE_PHASE, value="all", clearable=False, options=[
            {"label": "all", "value": "all"}], style={"width": "140px"})]),
            html.Label(["repeated layers ", dcc.RadioItems(id=ids.TREE_EXPAND, value="collapsed", inline=True, options=[
                {"label": "collapsed", "value": "collapsed"}, {"label": "every instance", "value": "expanded"}])]),
            html.Span("click a box to filter the roofline and the table to it; click the top bar to go back up",
                      className="muted")),
        _graph(ids.TREE_FIGURE),
        html.P(id=ids.TREE_NOTE, className="muted"),
        _graph(ids.TREE_ROOFLINE),
        dag.AgGrid(id=ids.TREE_GRID, rowData=[], columnDefs=[],
                   defaultColDef={"sortable": True, "filter": True, "resizable": True},
                   dashGridOptions={"pagination": True, "paginationPageSize": 20, "tooltipShowDelay": 300},
                   style={"height": "560px"}),
    ])


def _ranks_panel() -> html.Div:
    """The ranks tab of a multi-rank report: a rank x step heat map (who the others wait for, by
    default); a click on a cell draws that rank's step below it."""
    from perfscope.analysis.ranks.partial_read import STEP_METRICS

    return html.Div([
        _controls(html.Label(["show ", dcc.RadioItems(id=ids.RANKS_METRIC, value="caused", inline=True, options=[
            {"label": label, "value": key} for key, (label, _) in STEP_METRICS.items()])]),
            html.Span("click a cell to see that rank's step", className="muted")),
        _graph(ids.RANKS_HEATMAP),
        html.P(id=ids.RANKS_NOTE, className="muted"),
        _graph(ids.RANKS_STEP),
    ])


def _compare_panel(options: list[dict[str, str]]) -> html.Div:
    first = options[0]["value"] if options else None
    second = options[1]["value"] if len(options) > 1 else first
    return html.Div([
        _controls(html.Label(["A ", dcc.Dropdown(id=ids.COMPARE_A, options=options, value=first,
                                                 clearable=False, style={"width": "420px"})]),
                  html.Label(["B ", dcc.Dropdown(id=ids.COMPARE_B, options=options, value=second,
                                                 clearable=False, style={"width": "420px"})])),
        _graph(ids.COMPARE_FIGURE), html.Div(id=ids.COMPARE_TABLE),
    ])


def build_layout(entries: list[Entry]) -> html.Div:
    """The whole page: title, report picker, and one tab per view."""
    options = [{"label": e.label, "value": e.key} for e in entries]
    panels = {
        "overview": html.Div([html.Div(id=ids.OVERVIEW), html.Div(id=ids.FINDINGS)]),
        "timeline": html.Div([_controls(html.Button("Reset zoom", id=ids.TIMELINE_RESET, n_clicks=0),
                                        html.Span("drag to zoom; zoomed in far enough, individual kernels appear",
                                                  className="muted")), _graph(ids.TIMELINE),
                              _graph(ids.IDLE_FIGURE), html.Div(id=ids.IDLE_GAPS),
                              _graph(ids.MEMORY), html.Div(id=ids.MEMORY_LIVE)]),
        "roofline": _roofline_panel(),
        "kernels": _kernels_panel(),
        "tree": _tree_panel(),
        "phases": html.Div([html.Div(id=ids.PHASE_TABLE), _graph(ids.PHASE_FIGURE), _graph(ids.STEP_FIGURE),
                            _graph(ids.LATENCY_FIGURE), html.Div(id=ids.LOAD_FIGURES), html.Div(id=ids.TAILS_TABLE),
                            _graph(ids.TAILS_FIGURE), _graph(ids.TAIL_REQUESTS), _graph(ids.REQUEST_TIMELINE)]),
        "ranks": _ranks_panel(),
        "counters": _graph(ids.COUNTERS),
        "compare": _compare_panel(options),
    }
    tabs = [dcc.Tab(label=name.capitalize(), value=name, children=panels[name], id=f"tab-{name}")
            for name in ids.VIEWS]
    header = html.Div([html.H2("perfscope"),
                       dcc.Dropdown(id=ids.REPORT, options=options, value=options[0]["value"] if options else None,
                                    clearable=False, placeholder="no reports found", style={"width": "520px"}),
                       html.Span(id=ids.STATUS, className="muted")], className="topbar")
    picked = html.Div([html.Span(id=ids.FINDING_NOTE, className="muted"),
                       html.Button("clear", id=ids.FINDING_CLEAR, n_clicks=0, className="pick")],
                      className="controls", id="finding-bar")
    # The stores lie outside the tabs, which unmount the views that are not shown.
    return html.Div([header, picked, dcc.Tabs(id=ids.TABS, value="overview", children=tabs),
                     dcc.Store(id=ids.TIMELINE_ZOOM), dcc.Store(id=ids.FINDING_SELECTION)], className="page")
