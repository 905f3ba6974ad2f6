"""The ranks tab: the rank x step heat map of a multi-rank report and a click on a cell (that rank's
step as a timeline), called as plain callbacks on a report saved under a served folder; the rank view
page of ``perfscope import --ranks``."""

from __future__ import annotations

import numpy as np
import pytest

from perfscope.analysis.ranks.partial_read import rank_steps, write_views
from perfscope.analysis.ranks.stats import rank_tables
from perfscope.analysis.ranks.straggler import analyse
from perfscope.analysis.ranks.tiling import SyncJob, load_trace, write_sync_job
from perfscope.dashboard import callbacks as cb
from perfscope.dashboard.figures.ranks import rank_view_html, step_heatmap
from perfscope.dashboard.store import ReportStore
from tests.unit.dashboard_reports import HTA, imported
from tests.unit.ranks_support import B200, multi_rank_report


@pytest.fixture(scope="module")
def served(tmp_path_factory, fixtures_dir):
    root = tmp_path_factory.mktemp("served")
    files = write_sync_job(load_trace(fixtures_dir / B200), root / "traces",
                           SyncJob(world_size=4, group_size=4, copies=2, slow=((1, 1.2),), jitter=0.01,
                                   drop_python=True))
    report = multi_rank_report(files)
    folder = report.save(root / "runs" / "job.perfscope")
    t = rank_tables(report)
    s = analyse(t)
    write_views(folder, t, s)  # as the import stores them
    imported(HTA).save(root / "runs" / "one.perfscope")
    store = ReportStore([root])
    keys = {e.label.split("/")[-1].removesuffix(".perfscope"): e.key for e in store.entries()}
    return store, keys, t, s


def test_the_heat_map_shows_who_the_others_wait_for(served):
    store, keys, t, s = served
    fig = cb.on_ranks(store, keys["job"], "ranks", "caused")
    z = np.array(fig.data[0].z, dtype=float)
    assert list(fig.data[0].y) == [0, 1, 2, 3] and list(fig.data[0].x) == [0, 1]
    assert fig.layout.meta["stragglers"] == [1]
    assert (z[1] > 5 * np.nanmax(np.delete(z, 1, axis=0))).all()  # rank 1's row: the others wait for it
    steps = rank_steps(t, s)
    want = steps[steps["rank"] == 1].sort_values("step")["waited_for_ns"].to_numpy() / 1e6
    assert z[1] == pytest.approx(want)
    own = np.array(cb.on_ranks(store, keys["job"], "ranks", "wait").data[0].z, dtype=float)
    assert (own[1] < own[0]).all()  # the straggler itself hardly waits
    assert cb.on_ranks(store, keys["job"], "overview", "caused") is cb.NO
    msg = cb.on_ranks(store, keys["one"], "ranks", "caused")
    assert "not a multi-rank report" in msg.layout.annotations[0].text


def test_a_click_on_a_cell_draws_that_ranks_step(served):
    store, keys, t, _ = served
    fig, note = cb.on_rank_step(store, keys["job"], {"points": [{"x": 1, "y": 1, "z": 3.0}]})
    step = t.steps[(t.steps["rank"] == 1) & (t.steps["step"] == 1)].iloc[0]
    assert fig.layout.title.text == "rank 1, step 1"
    assert note.startswith("rank 1, step 1:") and "wait" in note
    xs = [x for tr in fig.data for x in (tr.x if tr.x is not None else []) if isinstance(x, (int, float))]
    assert xs, "the step's kernels are drawn"
    report = store.load(keys["job"])
    k = report.kernels[(report.kernels["rank"] == 1) & (report.kernels["start_ns"] >= step["start_ns"])
                       & (report.kernels["end_ns"] <= step["end_ns"])]
    assert len(k) > 0
    assert cb.on_rank_step(store, keys["job"], None)[0] is cb.NO
    assert cb.on_rank_step(store, keys["job"], {"points": [{"x": "1", "y": None}]})[0] is cb.NO
    missing, _ = cb.on_rank_step(store, keys["job"], {"points": [{"x": 9, "y": 1}]})
    assert "rank 1 has no step 9" in missing.layout.annotations[0].text


def test_rank_view_page_leads_with_the_heat_map_and_the_statement(served):
    _, _, t, s = served
    page = rank_view_html(t, {"name": "job<script>", "params": {"ranks": {"world_size": 4}}}, s)
    assert "job&lt;script&gt;" in page and "1 straggler: rank 1" in page
    assert page.index("rank_step_heatmap") < page.index("rank_steps")
    assert step_heatmap(t.__class__(t.per_rank, t.steps.iloc[:0], t.categories, t.kernels)).layout.meta["kind"] == \
        "rank_step_heatmap"
