"""Findings and comparisons on perfscope's own engine, profiled on the CPU in the test: batch 1 vs 16
decode, naive vs SDPA attention. Every number is recomputed from the report's steps and kernels;
nothing depends on how fast this machine happens to be (the rules fire or not by their threshold
applied to the independently recomputed value)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from perfscope.analysis import findings as F
from perfscope.analysis.rules import llm
from perfscope.analysis.summaries.compare import compare
from perfscope.cli import main
from perfscope.report import Report
from perfscope.sessions.profile import EngineRun, profile_engine

COMMON = {"model": "tiny", "prompt_len": 32, "gen_len": 6, "device": "cpu"}


@pytest.fixture(scope="module")
def roofs(tmp_path_factory: pytest.TempPathFactory):
    """This machine's CPU roofs, measured for real (cached for the session like the other engine tests)."""
    from perfscope.collectors.roofs import device_roofs

    os.environ.setdefault("PERFSCOPE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    return device_roofs("cpu")


@pytest.fixture(scope="module")
def runs(roofs) -> dict[str, Report]:
    return {
        "b1": profile_engine(EngineRun(batch=1, attention="sdpa", **COMMON), roofs=roofs),
        "b16": profile_engine(EngineRun(batch=16, attention="sdpa", **COMMON), roofs=roofs),
        "naive": profile_engine(EngineRun(batch=1, attention="naive", **COMMON), roofs=roofs),
    }


def headline(r: Report):
    """The steps of the headline run, which the LLM rules time: the warm unprofiled passes, or, when a busy
    machine disturbed them (every pass slower than the profiled run, rechecks included: docs/report-format.md),
    the profiled run's, which then leads."""
    if not len(r.steps_unprofiled):
        assert r.params["baseline_verdict"] == "disturbed"
        return r.steps
    assert len(r.steps_unprofiled) == len(r.steps)
    return r.steps_unprofiled


def headline_run(r: Report) -> str:
    """The run a finding timed on the headline steps names (``Finding.run``)."""
    return "headline" if len(r.steps_unprofiled) else "profiled"


def decode(r: Report):
    s = headline(r)
    return s[s["phase"] == "decode"]


def mbu_of(r: Report) -> float:
    s = decode(r)
    nbytes = (s["weight_bytes"] + s["kv_cache_bytes"]).sum()
    return 100 * nbytes / (s["duration_ns"].sum() * 1e-9) / r.device.peak_bandwidth("dram")


@pytest.mark.parametrize("run", ["b1", "b16"])
def test_decode_mbu_equals_steps_over_the_dram_roof(runs, run: str) -> None:
    r = runs[run]
    s = decode(r)
    mbu = mbu_of(r)
    found = F.RULES["decode-mbu"](r)
    assert bool(found) == (mbu < llm.DECODE_MBU_LOW_PCT)
    if found:
        f = found[0]
        bw = r.device.peak_bandwidth("dram")
        assert f.evidence["mbu_pct"] == pytest.approx(mbu)
        assert f.evidence["decode_steps"] == len(s) == COMMON["gen_len"] - 1
        # time at stake on the run the numbers come from (the headline): its decode steps above their floor
        floor = (s["weight_bytes"] + s["kv_cache_bytes"]) / bw * 1e9
        assert f.run == headline_run(r)
        assert f.time_at_stake_ns == pytest.approx(float(np.clip(s["duration_ns"] - floor, 0, None).sum()))
        assert f.evidence["batch"] == int(run[1:]) and f.ranges == ("decode",)


def test_decode_mbu_advice_knows_a_compiled_cpu_run(runs) -> None:
    """The tiny model's decode is launch-bound (its floor is microseconds): an eager CPU run is told to
    compile (not to capture CUDA graphs); the same run marked compiled is told it already is, and
    what is left."""
    r = runs["b1"]
    eager = F.RULES["decode-mbu"](r)
    assert len(eager) == 1 and "perfscope profile --compile" in eager[0].recommendation
    assert "CUDA graph" not in eager[0].recommendation  # a CPU run is not told to capture CUDA graphs
    compiled = F.RULES["decode-mbu"](r.with_manifest(params={**r.params, "compile": True}))
    assert len(compiled) == 1 and compiled[0].evidence == eager[0].evidence
    advice = compiled[0].recommendation
    assert "already compiled" in advice and "compile it" not in advice and "CUDA graph" not in advice


def test_batch_16_reads_more_per_step_for_sixteen_times_the_tokens(runs) -> None:
    b1, b16 = decode(runs["b1"]), decode(runs["b16"])
    per_step = lambda s: float((s["weight_bytes"] + s["kv_cache_bytes"]).mean())
    assert per_step(b16) > per_step(b1)
    assert b16["tokens"].sum() == 16 * b1["tokens"].sum()


def test_kv_cache_share_fires_for_batch_16_only(runs) -> None:
    for run in ("b1", "b16"):
        s = decode(runs[run]).sort_values("step")
        share = 100 * s["kv_cache_bytes"] / (s["weight_bytes"] + s["kv_cache_bytes"])
        found = F.RULES["kv-cache-share"](runs[run])
        assert bool(found) == (share.iloc[-1] >= llm.KV_SHARE_HIGH_PCT)
        if found:
            f = found[0]
            assert f.evidence["last_step_kv_share_pct"] == pytest.approx(share.iloc[-1])
            assert f.evidence["first_step_kv_share_pct"] == pytest.approx(share.iloc[0])
            assert f.evidence["last_context_len"] == s["context_len"].iloc[-1]
            bw = runs[run].device.peak_bandwidth("dram")
            assert f.time_at_stake_ns == pytest.approx(s["kv_cache_bytes"].sum() / bw * 1e9)
    assert not F.RULES["kv-cache-share"](runs["b1"]) and F.RULES["kv-cache-share"](runs["b16"])


def test_prefill_mfu_equals_kernel_flops_over_step_time(runs) -> None:
    r = runs["b16"]
    prefill = r.kernels[r.kernels["phase"] == "prefill"]
    # every prefill op's FLOPs are known (aten::index's gather is 0 FLOPs though its indices' shapes
    # are not recorded): the 90% coverage rule cannot hinge on how long the uncosted ones took
    assert prefill["flops"].notna().all(), prefill.loc[prefill["flops"].isna(), "name"].unique()
    k = prefill
    steps = headline(r)
    steps = steps[steps["phase"] == "prefill"]  # timed by the headline run
    wall_s = steps["duration_ns"].sum() * 1e-9
    precision = k.groupby(k["precision"].fillna("fp32"))["flops"].sum().idxmax()
    peak, bw = r.device.peak_flops(precision), r.device.peak_bandwidth("dram")
    mfu = 100 * k["flops"].sum() / wall_s / peak
    floor_s = max(k["flops"].sum() / peak, (steps["weight_bytes"] + steps["kv_cache_bytes"]).sum() / bw)
    found = F.RULES["prefill-mfu"](r)
    assert bool(found) == (100 * floor_s / wall_s < llm.PREFILL_SOL_LOW_PCT)
    if found:
        # the MFU the phase table shows (model FLOPs when the steps carry them, else the kernels')
        from perfscope.analysis.summaries.serving import phase_summary

        row = phase_summary(r).set_index("phase").loc["prefill"]
        assert found[0].evidence["mfu_pct"] == pytest.approx(100 * row["mfu"])
        if row["mfu_source"] == "kernels":
            assert found[0].evidence["mfu_pct"] == pytest.approx(mfu)
        assert found[0].evidence["precision"] == precision
        # time at stake on the run its MFU comes from (the headline): its wall time above the floor
        assert found[0].run == headline_run(r)
        assert found[0].time_at_stake_ns == pytest.approx(wall_s * 1e9 - floor_s * 1e9)


def test_compare_batch_1_vs_16(runs) -> None:
    a, b = runs["b1"], runs["b16"]
    c = compare(a, b, key="name")
    phases = c.by_phase.set_index("phase")
    assert phases.loc["decode", "tokens_b"] == 16 * phases.loc["decode", "tokens_a"]
    lin = c.by_name.set_index("name").loc["aten::linear"]

    def intensity(r: Report) -> float:
        k = r.kernels[(r.kernels["name"] == "aten::linear") & r.kernels["flops"].notna() & r.kernels["dram_bytes"].notna()]
        return k["flops"].sum() / k["dram_bytes"].sum()

    assert lin["intensity_a"] == pytest.approx(intensity(a)) and lin["intensity_b"] == pytest.approx(intensity(b))
    assert lin["intensity_b"] > lin["intensity_a"]
    assert any("16x the tokens" in v for v in c.verdict)


def test_compare_naive_vs_sdpa_shows_the_attention_ops_change(runs) -> None:
    a, b = runs["naive"], runs["b1"]
    c = compare(a, b, key="name")
    rows = c.by_name.set_index("name")
    only_naive = set(a.kernels["name"]) - set(b.kernels["name"])
    only_sdpa = set(b.kernels["name"]) - set(a.kernels["name"])
    assert set(rows.index[rows["status"] == "vanished"]) == only_naive
    assert set(rows.index[rows["status"] == "new"]) == only_sdpa
    assert "aten::softmax" in only_naive and "aten::scaled_dot_product_attention" in only_sdpa
    sdpa = rows.loc["aten::scaled_dot_product_attention"]
    assert sdpa["time_a_s"] == 0 and sdpa["count_b"] == (b.kernels["name"] == "aten::scaled_dot_product_attention").sum()
    assert any("only in B" in v and "scaled_dot_product_attention" in v for v in c.verdict)


def test_engine_findings_serialise_and_reach_analyze_and_compare(runs, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    paths = {}
    for name in ("b1", "b16"):
        paths[name] = runs[name].save(tmp_path / f"{name}.perfscope")
        for f in F.run_rules(runs[name]):
            json.dumps(f.to_dict(), allow_nan=False)
    assert main(["analyze", str(paths["b16"]), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    expected = [f.id for f in F.run_rules(Report.load(paths["b16"]))]
    assert [f["id"] for f in payload["findings"]] == expected and "kv-cache-share" in expected
    assert main(["compare", str(paths["b1"]), str(paths["b16"]), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["phase"] for p in out["by_phase"]] == ["prefill", "decode", "total"]
