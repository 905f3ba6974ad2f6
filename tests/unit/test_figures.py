"""figures.py and its view-models on real imported reports, checked against direct computations
on the same kernel tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.summaries.compare import compare
from perfscope.dashboard import figures
from perfscope.dashboard.figures import roofline_data as rd
from perfscope.dashboard.figures import timeline_data as td
from perfscope.report import Report
from tests.unit.dashboard_reports import HTA, NSYS, QWEN, engine, imported


@pytest.fixture(scope="module")
def qwen(fixtures_dir: object) -> Report:
    return imported(QWEN)


@pytest.fixture(scope="module")
def hta(fixtures_dir: object) -> Report:
    return imported(HTA)


def _placed(k: pd.DataFrame) -> np.ndarray:
    x = k["arith_intensity"].to_numpy(dtype="float64", na_value=np.nan)
    y = k["achieved_flops_per_s"].to_numpy(dtype="float64", na_value=np.nan)
    return np.nan_to_num(x) > 0 & (np.nan_to_num(y) > 0)


def _point_traces(fig: object) -> list:
    return [t for t in fig.data if t.mode == "markers" and t.legendgroup == "points"]  # type: ignore[attr-defined]


def test_roofline_log_axes_roofs_and_ridges(qwen: Report) -> None:
    fig = figures.roofline(qwen)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    device = qwen.device
    present = set(qwen.kernels.loc[_placed(qwen.kernels), "precision"].dropna())
    assert present == {"bf16", "fp32"}
    roof_names = [t.name for t in fig.data if t.mode == "lines"]
    for prec in present:
        line = next(t for t in fig.data if t.mode == "lines" and t.name.startswith(prec + " "))
        assert "datasheet" in line.name and line.y[0] == device.compute[prec].value
    assert any(n.startswith("dram ") for n in roof_names)
    ridges = next(t for t in fig.data if t.name == "ridge points")
    assert sorted(ridges.x) == pytest.approx(sorted(device.ridge(p) for p in present))


def test_roofline_point_count_and_keys_match_kernel_table(qwen: Report) -> None:
    k = qwen.kernels
    placed = _placed(k)
    fig = figures.roofline(qwen)
    traces = _point_traces(fig)
    assert sum(len(t.x) for t in traces) == int(placed.sum())
    for t in traces:
        keys = [int(row[0]) for row in t.customdata]
        assert np.allclose(k.loc[keys, "arith_intensity"].to_numpy(dtype=float), np.asarray(t.x))
        assert set(k.loc[keys, "bound"]) == {t.name.split("-")[0]}


def test_roofline_says_how_much_time_it_cannot_place(qwen: Report) -> None:
    k = qwen.kernels
    flops = k["flops"].to_numpy(dtype="float64", na_value=np.nan)
    unknown = ~_placed(k) & ~(flops == 0)
    note = figures.roofline(qwen).layout.annotations[0].text
    assert f"{int(unknown.sum()):,} kernels with unknown FLOPs" in note
    share = k["duration_ns"][unknown].sum() / k["duration_ns"].sum() * 100
    assert f"{share:.1f}% of kernel time" in note


def test_roofline_per_name_aggregates_and_filters(qwen: Report) -> None:
    k = qwen.kernels
    known = k[k["flops"].notna() & k["dram_bytes"].notna()]
    per_name = known.groupby("name")[["flops", "dram_bytes"]].sum()
    expected = int(((per_name["flops"] > 0) & (per_name["dram_bytes"] > 0)).sum())
    fig = figures.roofline(qwen, per="name")
    assert sum(len(t.x) for t in _point_traces(fig)) == expected
    gemm = figures.roofline(qwen, name_filter="GEMM")
    names = [row[1] for t in _point_traces(gemm) for row in t.customdata]
    assert names and all("gemm" in n.lower() for n in names)
    want = _placed(k) & k["name"].str.lower().str.contains("gemm").to_numpy()
    assert len(names) == int(want.sum())


def test_roofline_phases_get_distinct_symbols_and_colours() -> None:
    report = engine()
    fig = figures.roofline(report, color="phase")
    symbols = {t.name: t.marker.symbol for t in _point_traces(fig)}
    assert symbols["prefill"] == "circle" and symbols["decode"] == "diamond"
    decode = figures.roofline(report, phase="decode")
    keys = [int(row[0]) for t in _point_traces(decode) for row in t.customdata]
    assert keys and set(report.kernels.loc[keys, "phase"]) == {"decode"}


def test_roofline_merges_points_above_the_cap_without_losing_time(hta: Report) -> None:
    full = rd.roofline_points(hta)
    assert not full.merged
    merged = rd.roofline_points(hta, max_points=len(full.points) - 1)
    assert merged.merged and merged.hidden == 0 and len(merged.points) < len(full.points)
    assert merged.points["count"].sum() == len(full.points)
    assert merged.points["duration_ns"].sum() == pytest.approx(full.points["duration_ns"].sum())
    capped = rd.roofline_points(hta, max_points=10)
    assert len(capped.points) == 10 and capped.hidden == len(merged.points) - 10


def test_nsys_roofline_draws_roofs_and_says_bounds_are_unknown(fixtures_dir: object) -> None:
    report = imported(NSYS)
    fig = figures.roofline(report)
    assert not _point_traces(fig)
    assert f"{len(report.kernels)} kernels with unknown FLOPs" in fig.layout.annotations[0].text


def _clipped_busy(report: Report, lane_label: str, t0: int, t1: int) -> int:
    k = report.kernels
    origin = td.timeline_index(report).origin_ns
    sel = ("cuda:0 stream " + k["stream"].astype(str)) == lane_label
    s = k.loc[sel, "start_ns"].to_numpy() - origin
    e = k.loc[sel, "end_ns"].to_numpy() - origin
    return int(np.clip(np.minimum(e, t1) - np.maximum(s, t0), 0, None).sum())


def test_timeline_switches_to_busy_bins_above_max_items(hta: Report) -> None:
    fig = figures.timeline(hta)
    assert fig.layout.meta["binned"] is True
    heat = next(t for t in fig.data if t.type == "heatmap")
    view = td.timeline_view(hta)
    lane = next(v for v in view.lanes if v.lane.label == "cuda:0 stream 7")
    busy = lane.lane.busy_ns(view.edges_ns).sum()
    assert busy == _clipped_busy(hta, "cuda:0 stream 7", view.t0_ns, view.t1_ns)
    assert "cuda:0 stream 7" in list(heat.y)
    n = fig.layout.meta["items"]
    assert not td.timeline_view(hta, max_items=n).binned and td.timeline_view(hta, max_items=n - 1).binned


def test_timeline_zoomed_window_draws_exact_kernels(hta: Report) -> None:
    k = hta.kernels
    origin = td.timeline_index(hta).origin_ns
    t0 = int(np.median(k["start_ns"]) - origin)
    t1 = t0 + 2_000_000
    fig = figures.timeline(hta, t0_ns=t0, t1_ns=t1)
    assert fig.layout.meta["binned"] is False
    bars = sum(len(t.y) for t in fig.data if t.type == "bar" and not str(t.y[0]).startswith(("ranges", "memcpy")))
    inside = ((k["start_ns"] - origin < t1) & (k["end_ns"] - origin > t0)).sum()
    assert bars == inside > 0
    assert tuple(fig.layout.xaxis.range) == pytest.approx((t0 / 1e6, t1 / 1e6))


def test_timeline_lanes_cover_streams_ranges_memcpy_and_phases(hta: Report) -> None:
    labels = [lane.label for lane in td.timeline_index(hta).lanes]
    streams = {f"cuda:0 stream {s}" for s in hta.kernels["stream"].unique()}
    assert streams <= set(labels) and "memcpy cuda:0" in labels and "ranges depth 0" in labels
    eng = td.timeline_index(engine())
    phase_lane = next(lane for lane in eng.lanes if lane.kind == "phase")
    assert len(phase_lane) == len(engine().steps)


def test_union_busy_share_matches_direct_sweep() -> None:
    starts = np.array([0, 5, 8, 20, 21])
    ends = np.array([10, 6, 12, 25, 22])
    covered = np.zeros(30, dtype=bool)
    for s, e in zip(starts, ends):
        covered[s:e] = True
    assert td.union_ns(starts, ends) == covered.sum() == 17


def test_engine_phase_step_and_latency_figures() -> None:
    report = engine()
    phases = figures.phase_breakdown(report)
    by_phase = report.kernels.groupby(report.kernels["phase"].fillna("none"))["duration_ns"].sum() / 1e6
    from perfscope.dashboard.figures.phases import NONE_ROW_MIN_SHARE

    for phase, ms in by_phase.items():
        if phase == "none" and ms < NONE_ROW_MIN_SHARE * by_phase.sum():  # too thin to see: said in the title
            assert all(phase not in list(t.y) for t in phases.data)
            assert "outside any phase" in phases.layout.title.text
            continue
        drawn = sum(t.x[list(t.y).index(phase)] for t in phases.data)
        assert drawn == pytest.approx(ms)
    steps = figures.step_times(report)
    assert sum(len(t.x) for t in steps.data) == len(report.steps)
    lat = figures.latency_distributions(report)
    ttft = next(t for t in lat.data if t.name == "TTFT")
    # the headline run's requests (the warm unprofiled run, as the request table beside it), said in the title
    headline = report.requests_unprofiled if len(report.requests_unprofiled) else report.requests
    assert sorted(ttft.y) == pytest.approx(sorted(headline["ttft_s"] * 1e3))
    if len(report.requests_unprofiled):
        assert "headline" in lat.layout.title.text


def test_empty_tables_give_message_figures(qwen: Report) -> None:
    for fn in (figures.step_times, figures.latency_distributions, figures.counters):
        assert fn(qwen).layout.meta["empty"] is True


def test_compare_figure_deltas(qwen: Report) -> None:
    report = engine()
    fig = figures.compare(qwen, report, top=10)
    a, b = fig.data
    movers = compare(qwen, report).by_name.head(10)  # the rows of `perfscope compare`, largest change first
    assert list(a.x) == pytest.approx(list(movers["time_a_s"][::-1] * 1e3))
    assert list(b.x) == pytest.approx(list(movers["time_b_s"][::-1] * 1e3))
    assert len(a.x) == len(b.x) == 10
    assert sum(a.x) <= qwen.kernels["duration_ns"].sum() / 1e6 + 1e-9


def test_merged_points_respect_filters_exactly(hta: Report) -> None:
    k = hta.kernels
    want = _placed(k) & k["name"].str.contains("elementwise", case=False, regex=False).to_numpy()
    merged = rd.roofline_points(hta, name_filter="elementwise", max_points=1)
    every = rd.roofline_points(hta, name_filter="elementwise", max_points=len(k))
    assert merged.merged and len(every.points) == int(want.sum())
    assert merged.hidden + len(merged.points) == len(rd._cells(hta, every.points))
    uncapped = rd.roofline_points(hta, name_filter="elementwise", max_points=int(want.sum()) - 1)
    assert uncapped.points["count"].sum() == int(want.sum())
    assert uncapped.points["duration_ns"].sum() == pytest.approx(k.loc[want, "duration_ns"].sum())


def test_every_kernel_category_has_its_own_colour() -> None:
    """reduction and softmax once fell back to the colour of 'other' (three browns in one legend)."""
    from perfscope.analysis.costs.base import CATEGORIES
    from perfscope.analysis.costs.operators import category_of
    from perfscope.dashboard.style import CATEGORY_COLORS

    samples = [("mm", None), ("scaled_dot_product_attention", None), (None, "ncclKernel_AllReduce"),
               ("copy_", None), ("view", None), ("sum", None), ("layer_norm", None), ("_softmax", None),
               ("add", None), (None, "some_kernel")]
    assert {category_of(op, name) for op, name in samples} == set(CATEGORIES)
    colours = [CATEGORY_COLORS[c] for c in CATEGORIES]
    assert len(set(colours)) == len(colours)


@pytest.mark.parametrize("which", ["qwen", "hta", "engine"])
@pytest.mark.parametrize("share", [0.9, 0.3, 0.02])
def test_per_name_points_of_a_selection_equal_the_aggregate_of_its_kernels(
        which: str, share: float, request: pytest.FixtureRequest) -> None:
    """The tree tab's per-name roofline sums a selection per group of alike kernels first: the
    result equals ``aggregate_by_name`` over the selected kernels themselves, column by column."""
    from perfscope.analysis.summaries.kernels import aggregate_by_name

    report = engine() if which == "engine" else request.getfixturevalue(which)
    mask = np.random.default_rng(7).random(len(report.kernels)) < share
    want = aggregate_by_name(report.kernels[mask], report.device)
    got = rd._aggregate_rows(report, mask)
    assert list(got.columns) == list(want.columns) and len(got) == len(want) > 0
    want, got = (d.sort_values("name", key=lambda s: s.astype(str)).reset_index(drop=True) for d in (want, got))
    for col in want.columns:
        a, b = want[col], got[col]
        if a.dtype.kind in "fiu" or b.dtype.kind in "fiu":
            np.testing.assert_allclose(pd.to_numeric(b).to_numpy("float64", na_value=np.nan),
                                       pd.to_numeric(a).to_numpy("float64", na_value=np.nan), rtol=1e-12, err_msg=col)
        else:
            assert b.astype(object).where(b.notna(), None).tolist() == a.astype(object).where(a.notna(), None).tolist(), col
    assert int(got["count"].sum()) == int(mask.sum())
