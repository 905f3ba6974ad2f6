"""Server gauges: the committed vLLM /metrics dump and scraped time series (vLLM 0.5.2, V0 names),
vLLM V1 and SGLang names, and the text perfscope serve writes read back by the same parser."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from perfscope.gauges import canonical, info_labels, parse_prometheus, render_vllm, series_rows
from perfscope.report import Report

DUMP = "serving/vllm_metrics_llama2_7b_h100_bsc"


def test_vllm_v0_dump(fixtures_dir: Path) -> None:
    samples = parse_prometheus((fixtures_dir / DUMP / "cache_config_server_0.txt").read_text())
    assert len(samples) == 15
    rows = {r["metric"]: r for r in canonical(samples)}
    assert rows["kv_cache_usage_pct"]["server_name"] == "vllm:gpu_cache_usage_perc"
    assert rows["kv_cache_usage_pct"]["value"] == 0.0
    assert rows["requests_running"]["value"] == 0.0 and rows["requests_waiting"]["value"] == 0.0
    assert rows["preemptions_total"]["server_name"] == "vllm:num_preemptions_total"
    assert math.isnan(rows["prefix_cache_hit_pct"]["value"])  # vLLM's -1: no data
    assert '"model_name"' in rows["requests_running"]["labels"]
    info = info_labels(samples, "vllm:cache_config_info")
    assert info["num_gpu_blocks"] == "5644" and info["block_size"] == "16" and info["gpu_memory_utilization"] == "0.9"


def test_vllm_time_series(fixtures_dir: Path) -> None:
    text = (fixtures_dir / DUMP / "metrics_engine_server_0.csv").read_text()
    n_lines = len([ln for ln in text.splitlines()[1:] if ln.strip()])
    rows = pd.DataFrame(series_rows(text))
    assert set(rows["metric"]) >= {"kv_cache_usage_pct", "requests_running", "requests_waiting", "preemptions_total"}
    assert (rows.groupby("metric").size() == n_lines).all()
    kv = rows[rows["metric"] == "kv_cache_usage_pct"].set_index("t_s")["value"]
    assert abs(kv.loc[3.2562540699727833] - 40.98157335223246) < 1e-9  # 0.4098... in vLLM's 0-1 units
    running = rows[rows["metric"] == "requests_running"]["value"]
    assert running.max() == 256  # the launcher's --max-num-seqs
    waiting = rows[rows["metric"] == "requests_waiting"]["value"]
    assert waiting.max() > 1000  # 2000 prompts at infinite rate: most wait
    report = Report.build({"gauges": rows})
    assert len(report.gauges) == len(rows)


def test_v1_and_sglang_names_and_serve_round_trip() -> None:
    text = """# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:num_requests_running{engine="0",model_name="m"} 3
vllm:num_requests_waiting{engine="0",model_name="m"} 7
vllm:num_preemptions_total{engine="0",model_name="m"} 2
sglang:token_usage{model_name="s"} 0.5
sglang:num_queue_reqs{model_name="s"} 4
garbage line that does not parse
"""
    rows = {r["metric"]: r["value"] for r in canonical(parse_prometheus(text))}
    assert rows == {"kv_cache_usage_pct": 25.0, "requests_running": 3.0, "requests_waiting": 7.0,
                    "preemptions_total": 2.0}
    sg = {r["metric"]: r["value"] for r in canonical(parse_prometheus(text.replace("vllm:", "other:")))}
    assert sg == {"kv_cache_usage_pct": 50.0, "requests_waiting": 4.0}
    values = {"kv_cache_usage_pct": 12.5, "requests_running": 2.0, "requests_waiting": 5.0, "preemptions_total": 0.0}
    back = {r["metric"]: r["value"] for r in canonical(parse_prometheus(render_vllm(values, info={"block_size": 1})))}
    assert back == values
