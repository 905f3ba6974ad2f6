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
    req = report.requests
    waiting = g[g["metric"] == "requests_waiting"]
    running = g[g["metric"] == "requests_running"]
    # the server's decision, whatever the machine's speed: one slot, so never two running
    assert running["value"].max() <= 1
    # a sample taken while the client had three or more requests in flight (arrived, not ended) saw a queue
    # with one slot (the third is queued however the server's and the client's clocks differ by a round trip);
    # how many such samples there are depends on the machine's speed, not the rule
    arrival, end = req["arrival_s"].to_numpy(), req["end_s"].to_numpy()
    crowded = [t for t in waiting["t_s"] if ((arrival <= t) & (t < end)).sum() >= 3]
    if crowded:
        assert waiting.loc[waiting["t_s"].isin(crowded), "value"].max() > 0
    if ((arrival <= running["t_s"].to_numpy()[:, None]) & (running["t_s"].to_numpy()[:, None] < end)).any(axis=1).any():
        assert running["value"].max() == 1  # a sample inside a request's service saw it running
    # on the requests' clock: a scrape is taken as the run starts and one after its last request ended (the
    # samples are stamped when their answer arrives), unless a scrape failed (counted: a loaded machine may
    # miss a scrape's deadline)
    failed = report.params["gauges"]["scrapes_failed"]
    assert failed > 0 or (g["t_s"].nunique() >= 2 and g["t_s"].max() >= req["end_s"].max())
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
    # when TTFT rose, the finding says whether requests queued; when it did not, there is none
    from perfscope.analysis.rules.memory import TTFT_RISE

    ok = req.dropna(subset=["ttft_s", "arrival_s"]).sort_values("arrival_s")
    q = max(2, len(ok) // 4)
    rose = ok["ttft_s"].iloc[-q:].median() / ok["ttft_s"].iloc[:q].median() >= TTFT_RISE
    assert bool(found) == bool(rose)
    if found:
        # one slot (--max-batch 1): a late request sent while another was still in flight waited for it, whether
        # or not a sample of the queue gauge (every 0.1 s) fell inside that wait; counted here from the client's
        # requests alone, against the slot count the server was started with
        late = ok["arrival_s"].iloc[-q:].to_numpy()
        in_flight = max(int(((req["arrival_s"] <= t) & (t < req["end_s"])).sum()) for t in late)
        if in_flight >= 2 and running["value"].max() >= 1:  # the gauges saw the server run its one request
            assert "waited in the queue" in found[0].title, found[0].title
        elif in_flight == 1:  # no late request overlapped another: the rise is the server's own step time
            assert "without queueing" in found[0].title, found[0].title
