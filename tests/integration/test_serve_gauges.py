"""``perfscope serve`` publishes its gauges under vLLM's names; ``perfscope loadtest --endpoint
--metrics`` scrapes them on the requests' clock, and a TTFT rise is tied to the queue they show."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

import perfscope
from perfscope.analysis.findings import run_rules
from perfscope.cli import main
from perfscope.gauges import canonical, parse_prometheus

from .test_serve import _stopped_cleanly, served


def test_serve_metrics_scraped_during_a_load_test(tmp_path: Path) -> None:
    with served("--max-batch", "1", cwd=tmp_path) as (url, proc):
        root = url.rsplit("/v1", 1)[0]
        with urllib.request.urlopen(root + "/metrics", timeout=10) as resp:
            first = {r["server_name"] for r in canonical(parse_prometheus(resp.read().decode()))}
        assert {"vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting"} <= first
        out = tmp_path / "lt.perfscope"
        code = main(["loadtest", "--endpoint", url, "--rate", "50", "--requests", "16", "--output-len", "16",
                     "--metrics", "--metrics-interval", "0.1", "--out", str(out), "--no-html"])
        assert code == 0
        _stopped_cleanly(proc)
    report = perfscope.load(out)
    g = report.gauges
    assert len(g) and report.params["gauges"]["interval_s"] == 0.1
    waiting = g[g["metric"] == "requests_waiting"]["value"]
    running = g[g["metric"] == "requests_running"]["value"]
    assert waiting.max() > 0 and running.max() == 1  # one slot: the rest queue
    # on the requests' clock: scrapes span the run
    assert g["t_s"].min() < 0.5 and g["t_s"].max() >= report.requests["end_s"].max() - 0.5
    # no server steps: the split uses the gauges (the queue, first come first served) and says what it cannot split
    from perfscope.analysis.summaries.tails import splits, tails_payload

    tails = tails_payload(report)
    assert tails["source"] == "gauges" and "decode" in tails["unmeasured"]
    for metric in ("ttft", "e2e"):  # how long the queue was depends on the machine; what the split is does not
        e = tails[metric]["p99"]
        assert set(e["parts"]) <= {"queued", "unmeasured"} and sum(e["parts"].values()) == pytest.approx(e["value_s"])
    split = splits(report)[0].requests
    assert (split["ttft_queued_s"] <= split["ttft_s"] + 1e-9).all() and (split["ttft_queued_s"] >= 0).all()
    found = [f for f in run_rules(report, rules=["ttft-gauges"])]
    # the rule's own decision on this run's numbers (how far TTFT rises depends on the machine's load):
    # when TTFT rose, the finding names the queue the gauges saw; when it did not, there is none
    from perfscope.analysis.rules.memory import TTFT_RISE

    ok = report.requests.dropna(subset=["ttft_s", "arrival_s"]).sort_values("arrival_s")
    q = max(2, len(ok) // 4)
    rose = ok["ttft_s"].iloc[-q:].median() / ok["ttft_s"].iloc[:q].median() >= TTFT_RISE
    assert bool(found) == bool(rose)
    if found:
        assert "waited in the queue" in found[0].title
