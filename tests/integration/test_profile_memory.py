"""``perfscope profile --memory`` on the engine (CPU): the kv_cache category equals the engine's KV
bytes exactly, weights its weight bytes, and the peak equals torch's own accounting of the run;
and on a script."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from perfscope.sessions.profile import EngineRun, profile_engine, profile_script


def test_engine_memory_categories_and_peak(tmp_path: Path) -> None:
    run = EngineRun(model="tiny", batch=2, prompt_len=16, gen_len=8, device="cpu", memory=True)
    report = profile_engine(run, baseline=1, keep_trace_dir=tmp_path)
    mem, p = report.memory, report.params
    allocs = mem[mem["action"] == "alloc"]
    kv = float(allocs.loc[allocs["category"] == "kv_cache", "size_bytes"].sum())
    # the engine's own formula: bytes per token x sequences x cache slots (prompt + gen - 1)
    assert kv == p["kv_cache_bytes_per_token"] * 2 * (16 + 8 - 1) == p["engine_kv_cache_tensor_bytes"]
    weights = float(allocs.loc[allocs["category"] == "weights", "size_bytes"].sum())
    assert weights == p["weight_bytes"]
    # torch's own accounting: its CPU allocator's Total Allocated over the run (it counts only what it
    # saw while profiling) plus the tensors the engine made before (which torch's CPU counter misses)
    with gzip.open(tmp_path / "trace.json.gz", "rt") as fh:
        events = [e for e in json.load(fh)["traceEvents"] if e.get("name") == "[memory]"]
    assert events
    before = float(allocs.loc[allocs["preexisting"].astype(bool), "size_bytes"].sum())
    torch_peak = max(e["args"]["Total Allocated"] for e in events if e["args"]["Device Type"] == 0) + before
    assert float(mem["allocated_bytes"].max()) == torch_peak
    assert set(mem["phase"].dropna()) >= {"prefill", "decode"} and mem["step"].notna().any()
    # what is live at the decode phase's peak: the engine's KV cache and weights, adding up to it
    from perfscope.analysis.summaries.memory import breakdown, instant

    b = breakdown(report, "cpu", instant(report, "cpu", phase="decode"))
    assert sum(b["by_category"].values()) == b["allocated_bytes"]
    assert b["by_category"]["kv_cache"] == kv and b["by_category"]["weights"] == weights
    assert {t["category"] for t in b["tensors"][:3]} <= {"weights", "kv_cache", "activations", "workspace"}


def test_script_memory(tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text("import torch\nx = torch.randn(256, 256)\nfor _ in range(3):\n    y = (x @ x).relu().sum()\n")
    report = profile_script(["python", str(script)], device="cpu", memory=True, baseline=False)
    mem = report.memory
    allocs = mem[mem["action"] == "alloc"]
    assert len(allocs) >= 3 and (allocs["size_bytes"] == 256 * 256 * 4).sum() >= 3
    assert allocs["op"].notna().any()
