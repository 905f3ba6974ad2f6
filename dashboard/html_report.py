"""The standalone HTML report: one file, offline by default (plotly.js inlined).

Sections: header (source, device, roofs with provenance and ridge points, warnings), metrics,
findings (when ``perfscope.analysis.findings`` is installed), roofline, timeline, phase and
request figures, and sortable, filterable kernel tables (plain JS in ``assets/``).

Safety: every report string placed in markup goes through ``html.escape``; data travels as JSON
inside ``<script type="application/json">`` blocks with ``<``, ``>`` and ``&`` written as
``\\u003c``, ``\\u003e``, ``\\u0026`` (so no ``</script>`` can close the block), and the page's
script inserts table cells with ``textContent``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go
import plotly.io as pio

from perfscope._version import __version__
from perfscope.analysis.summaries.compare import compare as compare_reports
from perfscope.analysis.summaries.compare import name_view, phase_view, tail_view
from perfscope.errors import OutputExistsError
from perfscope.format import column_label, dumps, evidence_rows, nbytes

from . import figures, views
from .html_tree import tree_section
from .text import duration, esc, is_missing

if TYPE_CHECKING:
    import pandas as pd

    from perfscope.report import Report

MAX_TABLE_ROWS = 1000
TOP_ROWS = 500
_SCRIPT_UNSAFE = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def _asset(name: str) -> str:
    return (resources.files("perfscope.dashboard") / "assets" / name).read_text(encoding="utf-8")


def script_safe(text: str) -> str:
    """JSON text made safe inside a ``<script>`` element (no ``</``, ``<!--`` or ``]]>``)."""
    for char, repl in _SCRIPT_UNSAFE.items():
        text = text.replace(char, repl)
    return text


class _Page:
    """Collects the JSON data blocks of one page, each under a unique element id."""

    def __init__(self) -> None:
        self.blocks: list[tuple[str, str]] = []

    def add(self, prefix: str, payload: str) -> str:
        block_id = f"{prefix}-{len(self.blocks)}"
        self.blocks.append((block_id, script_safe(payload)))
        return block_id

    def figure(self, fig: go.Figure, title: str) -> str:
        block = self.add("fig", pio.to_json(fig, validate=False, engine="json"))
        return f'<div class="fig" data-figure="{block}" aria-label="{esc(title)}"></div>'

    def render(self) -> str:
        return "\n".join(f'<script type="application/json" id="{i}">{p}</script>' for i, p in self.blocks)


# ---------------------------------------------------------------- markup helpers
def _facts(rows: list[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    return f'<table class="facts">{body}</table>'


def _dict_rows(rows: list[dict[str, str]]) -> str:
    if not rows:
        return '<p class="muted">none</p>'
    head = "".join(f"<th>{esc(k)}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in row.values()) + "</tr>" for row in rows)
    return f'<div class="scrollx"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _section(title: str, body: str, anchor: str) -> str:
    return f'<section id="{anchor}"><h2>{esc(title)}</h2>{body}</section>'


# ---------------------------------------------------------------- sections
def _header(report: Report) -> str:
    device = report.device
    parts = [f"<h1>perfscope report: {esc(report.name)}</h1>", _facts(views.source_facts(report))]
    projection = report.manifest.get("projection")
    if projection:  # every number below is a projection: say it above them
        parts.append(f'<p class="projected"><b>PROJECTED, not measured</b>: {esc(projection.get("measured_name"))} '
                     f'on {esc(projection.get("source_device"))} &rarr; {esc(projection.get("question_text"))} '
                     '(docs/whatif.md: the model and its measured error)</p>')
        if projection.get("whole_run"):
            from perfscope.analysis.summaries.projection import (
                band_line,
                family_rows,
                whole_run_rows,
            )

            parts.append("<h2>Projection: the whole run</h2>" + _dict_rows(whole_run_rows(projection))
                         + _dict_rows(family_rows(projection)) + f'<p class="muted">{esc(band_line(projection))}</p>')
    if device is None and not views.has_device_work(report):
        parts.append(f'<h2>Device: none profiled</h2><p class="muted">{esc(views.no_device_why(report))}.</p>')
    else:
        parts.append(f"<h2>Device: {esc(device.name if device else 'unknown')}</h2>")
        roofs = views.roofs_rows(report) if device else []
        parts.append(_dict_rows(roofs) if roofs else  # a named device with no roof says so, never a bare "none"
                     '<p class="muted">No roofs known for this device: every bound is unknown.</p>')
    notes = [*report.warnings] + [f"unavailable metric: {m}" for m in report.unavailable_metrics]
    if notes:
        parts.append("<h2>Warnings</h2><ul class=\"warnings\">" + "".join(f"<li>{esc(w)}</li>" for w in notes)
                     + "</ul>")
    return "<header>" + "".join(parts) + "</header>"


def _metrics(report: Report) -> str:
    from perfscope.analysis.summaries.runs import range_text, timing_text

    parts = [_facts(views.overview_facts(report))] if views.has_device_work(report) else []
    timing = timing_text(report)
    if timing:
        parts.append(f'<p class="timing"><b>Timing:</b> {esc(timing)}</p>')
    phases = views.phase_metrics(report)
    if phases is not None:
        detail = views.phase_rows(report, phases, detail=True)
        runs = f'<p class="muted">{esc(views.RUN_NOTE)}</p>' if "timing" in phases and phases["timing"].nunique() > 1 else ""
        rng = range_text(report)
        runs += f'<p class="warnings">{esc(rng)}</p>' if rng else ""
        parts.append("<h3>Phases</h3>" + _dict_rows(views.phase_rows(report, phases)) + runs
                     + "".join(f'<p class="muted">{esc(n)}</p>' for n in views.phase_notes(phases))
                     + ("<h3>Phase work (the FLOPs and bytes behind MFU and MBU)</h3>" + _dict_rows(detail)
                        if detail else ""))
    requests = views.request_metrics(report)
    if requests:
        parts.append("<h3>Requests</h3>" + _facts([(column_label(k), views.format_value(k, v))
                                                   for k, v in requests.items()]))
    from perfscope.analysis.summaries.serving import CLIENT_RESULTS_TITLE, client_results

    client = client_results(report)
    if client:
        parts.append(f"<h3>{esc(CLIENT_RESULTS_TITLE)}</h3>" + _facts(client))
    if not parts:
        parts.append('<p class="muted">No run metrics: this report holds no kernels, steps or requests'
                     + (" (the server's gauges are under Memory)." if len(report.gauges) else ".") + "</p>")
    return _section("Metrics", "".join(parts), "metrics")


def _finding(f: Any) -> str:
    sev = str(getattr(f, "severity", "info"))
    stake = getattr(f, "time_at_stake_ns", None)
    stake_txt = f" — time at stake: {duration(stake)}" if not is_missing(stake) else ""
    evidence = getattr(f, "evidence", {}) or {}
    facts = _facts(evidence_rows(evidence)) if isinstance(evidence, Mapping) else f"<p>{esc(evidence)}</p>"
    run = getattr(f, "run", "") or ""
    return (f'<div class="finding {esc(sev)}"><b>[{esc(sev)}] {esc(getattr(f, "title", ""))}</b>{esc(stake_txt)}'
            + (f' <span class="muted">[{esc(run)} run]</span>' if run else "")
            + f'<p><i>{esc(getattr(f, "recommendation", ""))}</i></p>{_finding_items(f)}'
            f'<details><summary>numbers</summary>{facts}</details></div>')


def _finding_items(f: Any) -> str:
    """The items behind a finding's time at stake as a small table, with the share they explain."""
    share, rows, more = views.finding_evidence(f)
    if not rows:
        return ""
    head = f'<p class="evidence-share">Evidence: {esc(share)}.</p>' if share else "<p>Evidence:</p>"
    body = "".join(f'<tr class="{"known" if r["cause"] == "known" else "unknown"}"><td>{esc(r["share"])}</td>'
                   f'<td>{esc(r["cause"])}</td><td>{esc(r["evidence"])}</td></tr>' for r in rows)
    tail = f'<p class="muted">{esc(more)}</p>' if more else ""
    return (f'{head}<table class="items"><thead><tr><th>of the stake</th><th>cause</th><th>evidence</th></tr>'
            f'</thead><tbody>{body}</tbody></table>{tail}')


def _findings(report: Report) -> str:
    found = views.findings(report)
    if found is None:
        return ""
    from perfscope.analysis.findings import stake_clock

    body = "".join(_finding(f) for f in found) or '<p class="muted">No rule fired on this report.</p>'
    clock = f'<p class="muted">Most time at stake first; {esc(stake_clock(report))}.</p>' if found else ""
    return _section("Findings", clock + body, "findings")


def _table_spec(frame: pd.DataFrame, note: str) -> dict[str, Any]:
    cols = [views.table_column(str(c), frame[c]) for c in frame.columns]
    return {"columns": [{"key": k, "label": label, "kind": kind} for k, label, kind in cols],
            "rows": views.table_records(frame), "note": note}


def _table(page: _Page, frame: pd.DataFrame, note: str, title: str) -> str:
    block = page.add("table", dumps(_table_spec(frame, note), indent=None))
    return (f'<h3>{esc(title)}</h3><div class="tableholder" data-table="{block}"><div class="tablebar">'
            f'<input type="search" placeholder="filter rows (any column)" aria-label="filter {esc(title)}">'
            '<span class="count muted"></span></div><div class="tablewrap"><table class="sortable"></table>'
            "</div></div>")


def _kernel_tables(page: _Page, report: Report, max_rows: int, top_rows: int) -> str:
    w = views.device_words(report)
    if not len(report.kernels):
        return "" if not views.has_device_work(report) else _section(
            w["Kernels"], f'<p class="muted">No {w["kernels"]} in this report.</p>', "kernels")
    by_name = views.kernels_by_name(report)
    note = f"the {max_rows} names with the most time" if len(by_name) > max_rows else ""
    rows = views.kernel_rows(report, limit=top_rows).drop(columns=["key"])
    # columns that tell executions apart, without a sideways scroll: none always missing, device and
    # stream only when they vary, launch geometry left to the dashboard's kernel grid
    rows = rows[[c for c in rows if rows[c].notna().any() and c not in ("grid", "block")
                 and not (c in ("device", "stream") and rows[c].nunique() < 2)]]
    top_note = f"the {top_rows} longest of {len(report.kernels):,} executions" if len(report.kernels) > top_rows else ""
    from perfscope.analysis.summaries.kernels import limiter_notes, roof_notes

    above = "".join(f"<li>{esc(n)}</li>" for n in roof_notes(by_name.head(max_rows), report.device))
    differ = "".join(f"<li>{esc(n)}</li>" for n in limiter_notes(by_name.head(max_rows)))
    body = (_table(page, by_name.head(max_rows), note, f"Per {w['kernel']} name (one row per name and phase)")
            + (f'<p class="muted">Above the roof:</p><ul class="roofnotes">{above}</ul>' if above else "")
            + (f'<p class="muted">The measured limiter disagrees with the roofline (the point stays where the FLOPs '
               f'and bytes put it; the bound is the measured one):</p><ul class="roofnotes">{differ}</ul>'
               if differ else "")
            + _table(page, rows, top_note, "Longest executions"))
    return _section(w["Kernels"], body, "kernels")


def _figures(page: _Page, report: Report, timeline_max_items: int) -> str:
    parts = []
    if len(report.kernels):
        parts.append(_section("Roofline", page.figure(figures.roofline(report), "roofline")
                              + page.figure(figures.roofline(report, per="name"), "roofline per name"), "roofline"))
    if views.has_device_work(report):
        parts.append(_section("Timeline", page.figure(figures.timeline(report, max_items=timeline_max_items),
                                                      "timeline"), "timeline"))
    parts.append(_memory(page, report))
    extra = [figures.phase_breakdown(report), figures.step_times(report),
             figures.latency_distributions(report), figures.counters(report)]
    shown = [f for f in extra if not (f.layout.meta or {}).get("empty")]
    if shown:
        parts.append(_section("Phases, steps, requests and counters",
                              "".join(page.figure(f, str(f.layout.meta["kind"])) for f in shown), "phases"))
    parts.append(_sweep(page, report))
    parts.append(_loadtest(page, report))
    parts.append(_tails(page, report))
    parts.append(_ranks(page, report))
    return "".join(parts)


def _idle(page: _Page, report: Report) -> str:
    """Why the GPU (a CPU run: the cores) waits: a bar per idle cause (docs/idle.md); nothing when the
    report has no idle slices."""
    from perfscope.analysis.idle import idle_of

    if not len(idle_of(report)):
        return ""
    return _section(views.device_words(report)["waits"], page.figure(figures.idle_causes(report), "idle causes"),
                    "idle")


def _memory(page: _Page, report: Report) -> str:
    """The memory track (under the timeline), what is live at each device's peak (by category, the
    largest tensors, reserved and fragmentation beside), the capacity section and the server's gauges
    beside the latencies."""
    from perfscope.analysis.summaries.memory import capacity_section, peaks
    from perfscope.text_memory import breakdown_tables

    body = ""
    if len(report.memory):
        body += page.figure(figures.memory_timeline(report), "memory")
        body += "<h3>Memory peak</h3>"
        for p in peaks(report):
            b = p["breakdown"]
            cats, beside, tensors = breakdown_tables(b)
            body += (f"<p><b>{esc(p['device'])}</b>: {esc(nbytes(p['peak_allocated_bytes']))} allocated at "
                     f"{esc(b['at'])}; live by category (adding up to it), with the rule that gave each:</p>"
                     + _dict_rows(cats) + (f'<p class="muted">beside it: {esc(beside)}</p>' if beside else "")
                     + f'<p class="muted">largest live tensors ({b["live_tensors"]:,} live at the peak):</p>'
                     + _dict_rows(tensors))
    sec = capacity_section(report)
    if sec is not None:
        body += f"<p>{esc(sec['finding'])}</p>"
    if len(report.gauges):
        body += page.figure(figures.gauges_beside_latency(report), "gauges")
    return _section("Memory", body, "memory") if body else ""


def _ranks(page: _Page, report: Report) -> str:
    """The rank view (who waits for whom per rank and step, steps, comm/compute overlap, rank x
    category heatmap, kernel spread), from the views the import stored (else computed)."""
    if "rank" not in report.kernels.columns:
        return ""
    from perfscope.analysis.ranks.partial_read import report_views

    from .figures.ranks import rank_figures

    figs = rank_figures(*report_views(report))
    return _section("Ranks", "".join(page.figure(f, f"ranks {name}") for name, f in figs.items()), "ranks")


def _loadtest(page: _Page, report: Report) -> str:
    """Latency distributions, load over time, decode roofline and the rate table (``perfscope loadtest``)."""
    from perfscope.analysis.summaries.loadtest import rate_summary

    from .figures.loadtest import load_figures, load_notes

    figs = load_figures(report)
    if not figs:
        return ""
    notes = "<ul>" + "".join(f"<li>{esc(n)}</li>" for n in load_notes(report)) + "</ul>"
    body = "".join(page.figure(f, f"load {name}") for name, f in figs.items())
    return _section("Serving under load", notes + body + _table(page, rate_summary(report), "", "Runs"), "loadtest")


def _tails(page: _Page, report: Report) -> str:
    """The p50 and p99 of TTFT, ITL, TPOT and E2E split into their causes (:mod:`perfscope.analysis.summaries.tails`)."""
    from perfscope.analysis.summaries.tails import PART_WORDS, splits, tails_table

    from .figures.tails import requests_figure, tails_figure

    found = splits(report)
    if not found:
        return ""
    words = "".join(f"<li><b>{esc(p)}</b>: {esc(w)}</li>" for p, w in PART_WORDS.items())
    notes = "".join(f"<li>{esc(n)}</li>" for s in found for n in s.notes)
    body = (f"<p>Each request's latency is cut at its own events and at every step's start and end; each piece "
            f"goes to one part, so the parts add up to the latency (largest gap over requests: "
            f"{max(s.additivity_error_pct for s in found):.2g}%). A percentile's parts are those of the requests "
            f"(or gaps) that make it up.</p><ul>{words}</ul>" + (f"<ul class=\"warnings\">{notes}</ul>" if notes else "")
            + page.figure(tails_figure(report), "tails") + page.figure(requests_figure(report), "tail requests")
            + _table(page, tails_table(report), "", "p50 and p99 with their parts"))
    return _section("Serving tails", body, "tails")


def _sweep(page: _Page, report: Report) -> str:
    """The sweep plots and per-run table, for reports written by ``perfscope sweep``."""
    from perfscope.analysis.summaries.sweep import is_sweep, sweep_summary

    from .figures.sweep import sweep_roofline, throughput_latency, ttft_vs_prompt

    if not is_sweep(report):
        return ""
    summary = sweep_summary(report)
    plots = [sweep_roofline(report, summary), ttft_vs_prompt(report, summary), throughput_latency(report, summary)]
    body = "".join(page.figure(fig, f"sweep {i}") for i, fig in enumerate(plots))
    return _section("Sweep: batch size x prompt length",
                    body + _table(page, summary, "", "Runs"), "sweep")


def _plotly_tag(cdn: bool) -> str:
    if cdn:
        from plotly.offline import get_plotlyjs_version

        return f'<script src="https://cdn.plot.ly/plotly-{get_plotlyjs_version()}.min.js" charset="utf-8"></script>'
    from plotly.offline import get_plotlyjs

    return f'<script type="text/javascript">{get_plotlyjs()}</script>'


def _page(title: str, body: str, page: _Page, cdn: bool) -> str:
    return Template(_asset("standalone_report.html")).substitute(
        version=esc(__version__), title=esc(title), css=_asset("standalone_report.css"),
        plotly=_plotly_tag(cdn), body=body, data=page.render(), js=_asset("standalone_report.js"))


def render_html(
    report: Report,
    *,
    cdn: bool = False,
    max_table_rows: int = MAX_TABLE_ROWS,
    top_rows: int = TOP_ROWS,
    timeline_max_items: int = 3000,
) -> str:
    """The whole report as one HTML page.

    Args:
        report: the report to render.
        cdn: load plotly.js from its CDN instead of inlining it (smaller file, needs a network).
        max_table_rows: most rows of the per-name kernel table.
        top_rows: most individual kernel executions listed.
        timeline_max_items: above this many kernels the timeline shows busy bins.
    """
    page = _Page()
    body = (_header(report) + _metrics(report) + _findings(report)
            + _figures(page, report, timeline_max_items) + _idle(page, report) + tree_section(page, report)
            + _kernel_tables(page, report, max_table_rows, top_rows))
    return _page(f"perfscope: {report.name}", body, page, cdn)


def render_compare_html(a: Report, b: Report, *, cdn: bool = False, top: int = figures.COMPARE_TOP) -> str:
    """Two reports side by side: the tables and verdict of ``perfscope compare A B``, the kernel
    time per name (largest change first) and both rooflines."""
    page = _Page()
    c = compare_reports(a, b)
    verdict = "<ul>" + "".join(f"<li>{esc(v)}</li>" for v in c.verdict) + "</ul>"
    runs = {"headline": " (headline runs: warm, without the profiler)", "profiled": " (profiled runs)"}.get(c.run, "")
    body = (f"<header><h1>perfscope compare: {esc(c.a)} (A) vs {esc(c.b)} (B)</h1>"
            + _facts([("A", c.a), ("B", c.b)]) + "</header>"
            + _section("Verdict", verdict, "verdict")
            + _section("Phases", _table(page, phase_view(c), "", f"Per phase, A vs B{runs}"), "phases")
            + _section(f"Kernel time per {c.key}", page.figure(figures.compare(a, b, top, comparison=c), "compare")
                       + _table(page, name_view(c, top), f"the {top} largest changes" if len(c.by_name) > top else "",
                                f"Top movers (matched by {c.key})"), "compare")
            + (_section("Tails", _table(page, tail_view(c), "the parts of each p99 add up to it",
                                        "How each part of the p99 moved"), "tails")
               if len(c.by_tail) else "")
            + _section("Roofline A", page.figure(figures.roofline(a, per="name"), "roofline A"), "roofline-a")
            + _section("Roofline B", page.figure(figures.roofline(b, per="name"), "roofline B"), "roofline-b"))
    return _page(f"perfscope compare: {c.a} vs {c.b}", body, page, cdn)


def _write_atomic(text: str, path: Path, overwrite: bool) -> Path:
    if path.exists() and not overwrite:
        raise OutputExistsError(path, flag="-o")
    from perfscope.report import writing

    with writing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    return path


def write_html(report: Report, path: str | os.PathLike[str], *, overwrite: bool = True, **opts: Any) -> Path:
    """Render ``report`` and write it to ``path`` atomically (temp file, then rename).

    Args:
        report: the report.
        path: the ``.html`` file to write.
        overwrite: replace an existing file (else raise ``OutputExistsError``).
        **opts: passed to :func:`render_html` (``cdn``, ``max_table_rows``, ...).
    """
    return _write_atomic(render_html(report, **opts), Path(path), overwrite)


def write_compare_html(a: Report, b: Report, path: str | os.PathLike[str], *, overwrite: bool = True,
                       **opts: Any) -> Path:
    """Render the comparison of ``a`` and ``b`` and write it to ``path`` atomically."""
    return _write_atomic(render_compare_html(a, b, **opts), Path(path), overwrite)


__all__ = ["render_compare_html", "render_html", "script_safe", "write_compare_html", "write_html"]
