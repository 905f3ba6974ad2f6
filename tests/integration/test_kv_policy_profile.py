"""``--kv-policy`` end to end on the tiny engine: a profile holds the policy's steps and the full cache
measured beside it, the kv-policy finding follows the evidence contract and decides from those numbers,
``whatif --kv-policy`` projects a full-cache run, and the load test and the CLIs carry the policy."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from perfscope.analysis.findings import run_rules
from perfscope.analysis.projection.project import Question, project, projected_metrics
from perfscope.analysis.summaries.kv_policy import kv_policy_line, kv_policy_summary
from perfscope.cli import main
from perfscope.kv_policy import parse_kv_policy
from perfscope.sessions.profile import EngineRun, profile_engine
from perfscope.text_report import render_text

POLICY = "streaming:sink=4,window=16"
RUN = {"model": "tiny", "prompt_len": 120, "gen_len": 6, "device": "cpu", "gemm_curve_s": 0}


@pytest.fixture(scope="module")
def policy_report():
    return profile_engine(EngineRun(**RUN, kv_policy=POLICY), baseline=1)


@pytest.fixture(scope="module")
def full_report():
    return profile_engine(EngineRun(**RUN), baseline=1)


def test_a_policy_profile_holds_the_full_cache_beside_it(policy_report) -> None:
    r = policy_report
    assert r.params["kv_policy"] == POLICY and r.name.endswith("-streaming")
    dec = r.steps[r.steps["phase"] == "decode"]
    assert (dec["kv_entries"] == 20).all() and (dec["context_len"] > 120).all()
    ref = r.params["kv_policy_reference"]
    assert ref["kv_policy"] == "full" and ref["decode_steps"] == 5 and ref["kv_entries_last"] == 125
    assert ref["attention_ns_per_step"] > 0 and len(ref["passes_wall_s"]) == 1
    s = kv_policy_summary(r)
    assert s is not None and s["full_kv_bytes_per_step"] > s["policy_run"]["kv_bytes_per_step"]
    assert s["sequences_fit_ratio"] == pytest.approx(126 / 20)
    # the decode attention kernels are the cache's work, inside its kv_policy ranges
    k = r.kernels
    assert k.loc[k["phase"] == "decode", "range"].str.contains("/kv_policy").any()
    assert "KV policy streaming:sink=4,window=16: decode reads 20.0 KV entries" in render_text(r)


def _finding(report):
    return [f for f in run_rules(report, rules=["kv-policy"]) if f.id == "kv-policy"]


def test_the_finding_decides_from_the_measured_steps(policy_report) -> None:
    r = policy_report
    own = kv_policy_summary(r)["policy_run"]
    for factor, paid in ((2.0, True), (0.5, False)):  # the full cache's steps twice / half as long
        ref = {**r.params["kv_policy_reference"], "step_ns": own["step_ns"] * factor,
               "attention_ns_per_step": own["attention_ns_per_step"] * factor}
        (f,) = _finding(r.with_manifest(params={**r.params, "kv_policy_reference": ref}))
        assert ("saved" in f.title) is paid and ("did not pay" in f.title) is not paid
        assert f.severity == "info" if paid else f.severity in ("low", "medium", "high")
        assert f.run == "headline" and f.time_at_stake_ns > 0
        # the attention kernels and the KV held per sequence (ranked() orders the items by time, so an
        # unexplained remainder on a loaded machine may come first)
        assert any(i.kind == "kernels" and i.explains and i.time_ns > 0 for i in f.items)
        assert any(i.kind == "metric" and "sequences fit" in i.label for i in f.items)
        assert 0 < f.explained_ns <= f.time_at_stake_ns
        assert f.evidence["kv_entries_per_step"] == 20 and f.evidence["saved_ns_per_step"] == pytest.approx(
            own["step_ns"] * (factor - 1))
    no_ref = {k: v for k, v in r.params.items() if k != "kv_policy_reference"}
    (f,) = _finding(r.with_manifest(params=no_ref))
    assert f.severity == "info" and "no full-cache run" in f.title


def test_no_item_holds_more_than_the_stake(policy_report) -> None:
    """The profiled steps moved less than their attention (the rest of the step moved the other way, as
    on a loaded machine): the attention item explains the whole stake, never more (it read 242%)."""
    r = policy_report
    own = kv_policy_summary(r)["policy_run"]
    for factor in (2.0, 0.5):
        ref = {**r.params["kv_policy_reference"], "step_ns": own["step_ns"] * factor,
               "attention_ns_per_step": own["attention_ns_per_step"] * (factor * 3 if factor > 1 else factor / 3),
               "profiled_step_ns": own["profiled_step_ns"] * (1.001 if factor > 1 else 0.999)}
        (f,) = _finding(r.with_manifest(params={**r.params, "kv_policy_reference": ref}))
        timed = [i for i in f.items if math.isfinite(i.time_ns)]
        assert timed and all(0 <= i.time_ns <= f.time_at_stake_ns * (1 + 1e-9) for i in timed), f.items
        assert f.explained_ns == pytest.approx(f.time_at_stake_ns)


def test_whatif_projects_a_full_cache_run_under_a_policy(full_report) -> None:
    r = full_report
    assert "kv_policy_reference" not in r.params and kv_policy_summary(r) is None
    p = project(r, Question(kv_policy=POLICY))
    dec_old = r.steps[r.steps["phase"] == "decode"]
    dec = p.steps[p.steps["phase"] == "decode"]
    assert (dec["kv_entries"] == 20).all()
    assert dec["kv_cache_bytes"].to_numpy() == pytest.approx(
        dec_old["kv_cache_bytes"].to_numpy() * 20 / dec_old["context_len"].to_numpy())
    # the decode attention operators are priced at 20 KV entries: their bytes fall with the KV length
    k_old, k_new = r.kernels, p.kernels
    sdpa = (k_old["op"] == "aten::scaled_dot_product_attention") & (k_old["phase"] == "decode")
    assert (k_new.loc[sdpa, "dram_bytes"] < k_old.loc[sdpa, "dram_bytes"]).all()
    assert p.params["kv_policy"] == POLICY and p.params["kv_policy_reference"]["measured"]
    line = kv_policy_line(p)
    assert line is not None and "reads 20 KV entries" in line and "6.3x the sequences fit" in line
    m = projected_metrics(p)
    assert math.isfinite(m["tpot_s_mean"]) and m["tpot_s_mean"] <= projected_metrics(r)["tpot_s_mean"] * 1.001
    quest = project(r, Question(kv_policy="quest:budget=16,page=4"))
    qd = quest.steps[quest.steps["phase"] == "decode"]
    # tiny has two layers, both dense under Quest: it reads (and holds) everything, plus nothing
    assert (qd["kv_entries"] == dec_old["context_len"].to_numpy()).all()


def test_whatif_cli(full_report, tmp_path: Path, capsys) -> None:
    path = full_report.save(tmp_path / "full.perfscope")
    assert main(["whatif", str(path), "--kv-policy", POLICY, "--kv-policy", "h2o:budget=32"]) == 0
    out = capsys.readouterr().out
    assert "kv-policy=streaming:sink=4,window=16" in out and "h2o:budget=32,recent=16 reads 32 KV entries" in out
    assert main(["whatif", str(path), "--kv-policy", "nonsense"]) == 2


def test_loadtest_cli_with_a_policy(tmp_path: Path, capsys) -> None:
    assert main(["loadtest", "--model", "tiny", "--requests", "4", "--rate", "50", "--prompt-len", "40",
                 "--output-len", "4", "--no-profile", "--json", "--kv-policy", "h2o:budget=16", "--kv-dtype", "int8",
                 "--out", str(tmp_path / "lt"), "--no-html"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["kv_policy"] == "h2o:budget=16,recent=8"
    err = got["kv_logit_error"]
    assert err["kv_policy"] == "h2o:budget=16,recent=8" and err["prompt_tokens"] == 32 and 0 <= err["top1_agreement"] <= 1
    from perfscope.api import load

    steps = load(tmp_path / "lt.perfscope").steps
    assert (steps.loc[steps["phase"] == "decode", "kv_entries"] == 16).all()


def test_profile_refuses_what_a_policy_does_not_run_with() -> None:
    from perfscope.errors import UsageError

    with pytest.raises(UsageError, match="--speculative"):
        EngineRun(**RUN, kv_policy=POLICY, speculative="ngram").check()
    with pytest.raises(UsageError, match="runs eagerly"):
        EngineRun(**RUN, kv_policy=POLICY, compile=True).check()
    assert EngineRun(kv_policy=POLICY).resolved_compile("cuda") is False  # a policy runs eagerly by default
    assert parse_kv_policy(EngineRun(kv_policy="h2o:budget=8").kv_policy).recent == 4

