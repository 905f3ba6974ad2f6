"""A serving run's saved /metrics as a report: the committed vLLM 0.5.2 run (2000 ShareGPT prompts at an infinite
rate on a 64 GB H100, vLLMBatchingMemoryGap's harness) read as a folder and as single files, and the
``server-queue`` finding, whose cause is checked against the series computed here by hand from the CSV."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.findings import run_rules
from perfscope.analysis.readers.detect import detect_format
from perfscope.api import load
from perfscope.errors import InputFormatError
from perfscope.gauges import series_rows

RUN = "serving/vllm_metrics_llama2_7b_h100_bsc"


def _queue(report):  # type: ignore[no-untyped-def]
    return [f for f in run_rules(report) if f.id == "server-queue"]


def test_the_run_folder_reads_as_one_report_and_its_queue_is_kv_bound(fixtures_dir: Path) -> None:
    folder = fixtures_dir / RUN
    assert detect_format(folder) == "server-metrics"
    report = load(folder)
    params = report.manifest["params"]
    assert params["server_info"]["num_gpu_blocks"] == "5644" and params["server_info"]["block_size"] == "16"
    client = params["client_results"]
    assert client["completed"] == 2000 and client["median_ttft_ms"] == pytest.approx(60843.428059481084)
    # by hand from the CSV: sample-and-hold, each sample until the next
    raw = pd.read_csv(folder / "metrics_engine_server_0.csv")
    t = raw["time [s]"].to_numpy()
    held = np.diff(t, append=t[-1])
    queued = raw["num_requests_waiting"].to_numpy() > 0
    (f,) = _queue(report)
    assert f.evidence["queued_s"] == pytest.approx(held[queued].sum())
    assert f.evidence["run_s"] == pytest.approx(t[-1] - t[0])
    assert f.evidence["requests_waiting_max"] == raw["num_requests_waiting"].max() == 1727
    assert f.evidence["requests_running_max"] == 256  # the launcher's --max-num-seqs
    assert f.evidence["preemptions"] == raw["num_preemptions_total"].max() - raw["num_preemptions_total"].min() == 543
    full = queued & (raw["gpu_cache_usage_perc"].to_numpy() * 100 >= 90)
    assert f.evidence["queued_at_kv_saturated_share"] == pytest.approx(held[full].sum() / held[queued].sum())
    assert f.evidence["kv_cache_usage_max_pct"] == pytest.approx(100 * raw.loc[queued, "gpu_cache_usage_perc"].max())
    # the cause the gauges show: the KV cache full and preempting, not the 256-sequence limit (reached in under
    # half the queued time)
    assert f.evidence["queued_at_running_max_share"] < 0.5
    assert "KV-cache bound" in f.title and "543 preemptions" in f.title and "median TTFT of 60.8 s" in f.title
    assert f.recommendation.startswith("KV-cache bound")
    smi = pd.read_csv(folder / SMI, skipinitialspace=True)  # the same harness clock, sample for sample
    busy = smi.loc[queued, "utilization.gpu [%]"].str.split().str[0].astype(float)
    assert f.evidence["gpu_util_median_pct_queued"] == busy.median() == 89
    causes = [i.label for i in f.items if i.explains]
    assert any(c.startswith("KV-cache usage") for c in causes) and any(c.startswith("preemptions") for c in causes)


def test_each_file_alone(fixtures_dir: Path) -> None:
    folder = fixtures_dir / RUN
    series = load(folder / "metrics_engine_server_0.csv")
    assert len(series.gauges) == len(series_rows((folder / "metrics_engine_server_0.csv").read_text()))
    (f,) = _queue(series)
    assert "client" not in f.title and "KV-cache bound" in f.title
    dump = load(folder / "cache_config_server_0.txt")
    assert dump.manifest["params"]["server_info"]["gpu_memory_utilization"] == "0.9"
    assert set(dump.gauges["t_s"]) == {0.0} and not _queue(dump)  # one moment: no queue over time
    with pytest.raises(InputFormatError, match="benchmark client's results"):
        load(folder / "openai-infqps-llama-2-7b-20250218-165534.json")
    assert not len(load(folder / "metrics_gpu_device_nvidia_smi_0_server_0.csv").gauges)  # nvidia-smi: counters only


def _series(tmp_path: Path, rows: list[tuple[float, float, float, float]], prefix: str = "vllm:") -> Path:
    """A scraped series under vLLM V1's prefixed names: (t, running, waiting, kv usage 0-1) per sample."""
    p = tmp_path / "series.csv"
    lines = [f"time,{prefix}num_requests_running,{prefix}num_requests_waiting,{prefix}kv_cache_usage_perc,other"]
    lines += [f"{t},{r},{w},{kv},7" for t, r, w, kv in rows]
    p.write_text("\n".join(lines) + "\n")
    return p


def test_a_queue_held_by_the_sequence_limit(tmp_path: Path) -> None:
    """64 running (the most ever) with the KV cache at 40% while 10-30 wait: the sequence limit, and how many
    sequences the KV cache would hold at 90% at this mix (64 x 90 / 40 = 144)."""
    rows = [(0.0, 10, 0, 0.1), (1.0, 64, 10, 0.3), (2.0, 64, 30, 0.4), (3.0, 64, 20, 0.4), (4.0, 30, 0, 0.2)]
    report = load(_series(tmp_path, rows))
    assert set(report.gauges["server_name"]) == {"vllm:num_requests_running", "vllm:num_requests_waiting",
                                                 "vllm:kv_cache_usage_perc"}  # `other` left aside
    (f,) = _queue(report)
    assert f.evidence["queued_s"] == 3.0 and f.evidence["run_s"] == 4.0 and f.evidence["queued_at_running_max_share"] == 1
    assert "sequence limit (64 running" in f.title and "at most 40% full" in f.title
    assert "--max-num-seqs" in f.recommendation and "about 144 would fit" in f.recommendation


def test_a_queue_nothing_in_the_gauges_explains(tmp_path: Path) -> None:
    rows = [(0.0, 64, 0, 0.1), (1.0, 20, 10, 0.3), (2.0, 20, 30, 0.4), (3.0, 20, 0, 0.2)]
    (f,) = _queue(load(_series(tmp_path, rows, prefix="")))
    assert "do not say what held them" in f.title and f.recommendation.startswith("Unexplained")
    assert not any(i.explains for i in f.items)


def test_a_queue_in_the_last_sample_only_or_without_other_gauges(tmp_path: Path) -> None:
    """A queue seen only in the last sample has no measured time: no finding (and no division by it); a series of
    the queue alone is unexplained, naming no running count it does not have."""
    assert not _queue(load(_series(tmp_path, [(0.0, 1, 0, 0.1), (1.0, 2, 0, 0.2), (2.0, 2, 5, 0.3)])))
    p = tmp_path / "q.csv"
    p.write_text("time,num_requests_waiting\n0,0\n1,4\n2,4\n3,0\n")
    (f,) = _queue(load(p))
    assert f.evidence["queued_s"] == 2 and "at their most nor the KV cache full" in f.title and "nan" not in f.title


def test_sglang_names_and_no_queue(tmp_path: Path) -> None:
    p = tmp_path / "sg.csv"
    p.write_text("time_s,sglang:num_running_reqs,sglang:num_queue_reqs,sglang:token_usage\n0,1,0,0.5\n1,2,0,0.6\n")
    report = load(p)
    assert report.gauges.loc[report.gauges["metric"] == "kv_cache_usage_pct", "value"].tolist() == [50.0, 60.0]
    assert not _queue(report)


@pytest.mark.parametrize(("text", "why"), [
    ("time,num_requests_waiting\n0,1\nsoon,2\n", "line 3: a time or value that is not a number"),
    ("time,num_requests_waiting\n0,1\ninf,2\n", "line 3: the time is not a finite number"),
])
def test_a_bad_series_is_one_line(tmp_path: Path, text: str, why: str) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "perfscope", "analyze", str(p)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and why in proc.stderr and str(p) in proc.stderr


def test_values_that_mean_no_data_are_missing(tmp_path: Path) -> None:
    """vLLM's -1 (no data), a value that overflows its scale, and an empty cell are missing, never 0."""
    p = tmp_path / "s.csv"
    p.write_text("time,gpu_cache_usage_perc,num_requests_waiting\n0,-1,\n1,1e308,3\n")
    values = load(p).gauges.set_index(["t_s", "metric"])["value"]
    assert math.isnan(values[(0.0, "kv_cache_usage_pct")]) and math.isnan(values[(1.0, "kv_cache_usage_pct")])
    assert math.isnan(values[(0.0, "requests_waiting")]) and values[(1.0, "requests_waiting")] == 3


def test_the_json_output_carries_the_finding(fixtures_dir: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "perfscope", "analyze", str(fixtures_dir / RUN), "--json"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    (f,) = [f for f in doc["findings"] if f["id"] == "server-queue"]
    assert f["evidence"]["preemptions"] == 543 and doc["params"]["client_results"]["num_prompts"] == 2000


def test_every_output_shows_it(fixtures_dir: Path, tmp_path: Path) -> None:
    """The text summary, the standalone HTML and the dashboard's overview and phases tab (the browser tests
    render them: tests/browser/test_every_page.py, ``import-server-metrics``)."""
    from perfscope.dashboard.callbacks import on_load
    from perfscope.dashboard.html_report import write_html
    from perfscope.dashboard.layout import overview_children
    from perfscope.dashboard.store import ReportStore
    from perfscope.text_report import render_text

    report = load(fixtures_dir / RUN)
    text = render_text(report)
    assert "the benchmark client's results, as it reported them: requests completed 2,000" in text
    assert "TTFT median 60.8 s, TTFT p99 139 s" in text
    html = write_html(report, tmp_path / "r.html").read_text()
    assert "The benchmark client&#x27;s results" in html or "The benchmark client's results" in html
    assert "Server gauges over the run" in html and "TTFT by arrival" not in html  # no requests: no TTFT panel
    overview = str(overview_children(report))
    assert "The benchmark client's results (as it reported them)" in overview and "60.8 s" in overview
    report.save(tmp_path / "runs" / "served.perfscope")
    store = ReportStore([tmp_path / "runs"])
    (key,) = [e.key for e in store.entries()]
    graphs = on_load(store, key, "phases")
    assert [g.figure.layout.meta["kind"] for g in graphs] == ["gauges"]


SMI = "metrics_gpu_device_nvidia_smi_0_server_0.csv"


def test_nvidia_smi_log_alone_and_beside_the_gauges(fixtures_dir: Path) -> None:
    """The run's nvidia-smi samples (the harness's `time [s]` first, then the query's fields with their units):
    alone, times from the first sample; in the folder, on the gauges' clock (the same harness column)."""
    raw = pd.read_csv(fixtures_dir / RUN / SMI, skipinitialspace=True)
    alone = load(fixtures_dir / RUN / SMI)
    assert detect_format(fixtures_dir / RUN / SMI) == "nvidia-smi" and len(alone.counters) == len(raw)
    c = alone.counters
    assert c["t_ns"].iloc[0] == 0 and set(c["device"]) == {"cuda:0"}
    assert c["mem_used_bytes"].tolist() == [float(v.split()[0]) * 2**20 for v in raw["memory.used [MiB]"]]
    assert c["gpu_util_pct"].tolist() == [float(v.split()[0]) for v in raw["utilization.gpu [%]"]]
    assert c["power_w"].isna().all()  # not queried: missing, never 0
    joined = load(fixtures_dir / RUN).counters
    assert joined["t_ns"].tolist() == [round(t * 1e9) for t in raw["time [s]"]]
    gauges_t = sorted(set(load(fixtures_dir / RUN).gauges["t_s"]))
    assert [round(t * 1e9) for t in gauges_t] == joined["t_ns"].tolist()  # one clock, sample for sample


def test_nvidia_smi_own_timestamps_two_gpus_and_missing_values(tmp_path: Path) -> None:
    p = tmp_path / "smi.csv"
    p.write_text("timestamp, index, name, utilization.gpu [%], power.draw [W], memory.used [MiB]\n"
                 "2024/06/01 10:00:00.000, 0, NVIDIA H100, 10 %, 300.5 W, 1024 MiB\n"
                 "2024/06/01 10:00:00.000, 1, NVIDIA H100, [N/A], [Not Supported], 2048 MiB\n"
                 "2024/06/01 10:00:01.500, 0, NVIDIA H100, 90 %, 650.0 W, 4096 MiB\n")
    c = load(p).counters.sort_values(["t_ns", "device"])
    assert c["t_ns"].tolist() == [0, 0, 1_500_000_000] and c["device"].tolist() == ["cuda:0", "cuda:1", "cuda:0"]
    assert c["mem_used_bytes"].tolist() == [2**30, 2 * 2**30, 4 * 2**30] and c["power_w"].iloc[0] == 300.5
    assert math.isnan(c["gpu_util_pct"].iloc[1]) and math.isnan(c["power_w"].iloc[1])
    nounits = tmp_path / "nounits.csv"
    nounits.write_text("timestamp, uuid, utilization.gpu, memory.used\n2024/06/01 10:00:00.000, GPU-a, 5, 100\n"
                       "2024/06/01 10:00:00.000, GPU-b, 7, 200\n")
    c = load(nounits).counters
    assert c["device"].tolist() == ["cuda:0", "cuda:1"] and c["mem_used_bytes"].tolist() == [100 * 2**20, 200 * 2**20]
    bad = tmp_path / "bad.csv"
    bad.write_text(nounits.read_text().replace("10:00:00.000, GPU-b", "yesterday, GPU-b"))
    with pytest.raises(InputFormatError, match="line 3: a time that does not parse"):
        load(bad)
