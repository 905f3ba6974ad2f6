"""`perfscope analyze` on a multi-rank report: the ranks section in text and JSON."""

from __future__ import annotations

import json
import shutil

from perfscope.cli import main


def test_analyze_a_rank_report(tmp_path, fixtures_dir, capsys):
    traces = tmp_path / "traces"
    traces.mkdir()
    for r in (0, 1):
        shutil.copy(fixtures_dir / "kineto" / f"hta_trace_filter__sampled_rank-{r}.json.gz", traces)
    out = tmp_path / "job.perfscope"
    assert main(["import", str(traces), "--ranks", "--workers", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["analyze", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in doc["ranks"]["per_rank"]] == [0, 1]
    assert doc["ranks"]["coverage"]["ranks"] == [0, 1]
    assert any(f["id"] in ("exposed-comm", "rank-imbalance") for f in doc["findings"])
    assert main(["analyze", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ranks: 2 (0, 1)" in text and "exposed_comm ms" in text
