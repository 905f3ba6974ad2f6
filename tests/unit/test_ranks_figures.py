"""The rank-view figures and page, from the per-rank tables of a tiled job with a slow rank."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from perfscope.analysis.ranks.stats import RankTables, empty_rank_tables, rank_tables
from perfscope.dashboard.figures.ranks import (
    category_heatmap,
    kernel_spread,
    overlap,
    overlap_parts,
    rank_figures,
    rank_view_html,
    step_times,
)
from tests.unit.ranks_support import (
    RANK0,
    RANK1,
    build_rank_set,
    load_json,
    multi_rank_report,
    step_durations,
)


@pytest.fixture(scope="module")
def job(fixtures_dir, tmp_path_factory):
    files = build_rank_set(fixtures_dir, tmp_path_factory.mktemp("fig"), [(RANK0, 1.0), (RANK1, 1.0), (RANK0, 1.3)])
    report = multi_rank_report(files)
    return files, report, rank_tables(report)


def test_step_times_mark_the_straggler(job):
    files, _, t = job
    fig = step_times(t)
    assert fig.layout.meta["stragglers"] == [2]
    bar = fig.data[0]
    means = [statistics.mean(step_durations(load_json(f)).values()) / 1e6 for f in files]
    assert list(bar.y) == pytest.approx(means)
    assert list(bar.marker.color) == ["#1f77b4", "#1f77b4", "#d62728"]
    assert any(a.text.startswith("+") for a in fig.layout.annotations)


def test_overlap_parts_add_up_to_the_span(job):
    _, _, t = job
    parts = overlap_parts(t.per_rank)
    assert (parts >= 0).all().all()
    np.testing.assert_allclose(parts.sum(axis=1).to_numpy(), t.per_rank["span_ns"].to_numpy())
    fig = overlap(t)
    stacked = np.sum([np.asarray(tr.y, dtype=float) for tr in fig.data], axis=0)
    np.testing.assert_allclose(stacked, 100.0)
    assert [tr.name for tr in fig.data][:3] == ["compute only", "comm hidden by compute", "exposed comm"]


def test_category_heatmap_rows_are_shares_of_each_rank(job):
    _, report, t = job
    fig = category_heatmap(t)
    z = np.asarray(fig.data[0].z, dtype=float)
    np.testing.assert_allclose(z.sum(axis=1), 100.0)
    cats = list(fig.data[0].x)
    k0 = report.kernels[report.kernels["rank"] == 0]
    gemm = float(k0.loc[k0["category"] == "gemm", "duration_ns"].sum()) / float(k0["duration_ns"].sum())
    assert z[0, cats.index("gemm")] == pytest.approx(100 * gemm)


def test_kernel_spread_is_relative_to_the_median_rank(job):
    _, _, t = job
    fig = kernel_spread(t, top=5)
    z = np.asarray(fig.data[0].z, dtype=float)
    assert z.shape == (5, 3)
    np.testing.assert_allclose(np.nanmedian(z, axis=1), 1.0)


def test_empty_tables_give_message_figures():
    empty = empty_rank_tables()
    for name, fig in rank_figures(empty).items():
        assert fig.layout.meta["empty"] is True, name


def test_rank_view_page_is_standalone_and_escapes_text(job):
    _, _, t = job
    manifest = {"name": "job<1>", "warnings": ["<script>alert(1)</script>"],
                "params": {"ranks": {"world_size": 8, "missing_count": 5, "skipped": [{"path": "x"}]}}}
    page = rank_view_html(t, manifest)
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "job&lt;1&gt;: rank view" in page and "ranks 0-2 of world size 8; 5 ranks have no trace" in page
    assert page.count("plotly.js v") == 1 and '<script src="http' not in page  # inlined once, offline
    assert isinstance(t, RankTables)
