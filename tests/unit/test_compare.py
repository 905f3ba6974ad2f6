"""compare(A, B) and ``perfscope compare`` on real traces, checked against plain groupbys of the tables."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from perfscope.analysis.summaries.compare import SAME_PCT, compare
from perfscope.cli import main
from perfscope.errors import UsageError
from perfscope.report import Report

RANK0 = "kineto/hta_trace_filter__sampled_rank-0.json.gz"
RANK1 = "kineto/hta_trace_filter__sampled_rank-1.json.gz"
QWEN = "kineto/tracelens_h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
B200 = "kineto/tracelens_b200__eager_trace.json.gz"



def totals(report: Report, key: str) -> pd.DataFrame:
    """Count and time per matched name: the key column, else the full name (also where a short name
    is a parser slip: a C++ keyword or a number)."""
    k = report.kernels
    col = k[key].astype("object")
    slip = col.astype(str).isin(["void", "std", ""]) | col.astype(str).str.isdigit()
    names = col.where(col.notna() & ~(slip if key == "short_name" else False), k["name"]) if key != "name" else k["name"]
    return k.groupby(names.astype(str))["duration_ns"].agg(["size", "sum"])


def test_by_name_matches_groupby_and_set_difference(load) -> None:
    a, b = load(RANK0), load(RANK1)
    c = compare(a, b)
    ta, tb = totals(a, "short_name"), totals(b, "short_name")
    assert set(c.by_name["name"]) == set(ta.index) | set(tb.index)
    rows = c.by_name.set_index("name")
    for name in ta.index.intersection(tb.index):
        assert rows.loc[name, "status"] == "both"
        assert rows.loc[name, "count_a"] == ta.loc[name, "size"] and rows.loc[name, "count_b"] == tb.loc[name, "size"]
        assert rows.loc[name, "delta_s"] == pytest.approx((tb.loc[name, "sum"] - ta.loc[name, "sum"]) / 1e9)
    assert set(rows.index[rows["status"] == "vanished"]) == set(ta.index) - set(tb.index)
    assert set(rows.index[rows["status"] == "new"]) == set(tb.index) - set(ta.index)
    deltas = c.by_name["delta_s"].abs().tolist()
    assert deltas == sorted(deltas, reverse=True)


def test_total_row_is_each_profile_span(load) -> None:
    a, b = load(RANK0), load(RANK1)
    c = compare(a, b)
    total = c.by_phase.set_index("phase").loc["total"]

    def span(r: Report) -> float:
        starts = pd.concat([r.kernels["start_ns"], r.transfers["start_ns"]])
        ends = pd.concat([r.kernels["end_ns"], r.transfers["end_ns"]])
        return (ends.max() - starts.min()) / 1e9

    assert total["time_a_s"] == pytest.approx(span(a)) and total["time_b_s"] == pytest.approx(span(b))
    assert total["kernel_time_a_s"] == pytest.approx(a.kernels["duration_ns"].sum() / 1e9)
    assert list(c.by_phase["phase"]) == ["total"]  # a training trace has no prefill/decode
    change = (span(b) - span(a)) / span(a) * 100
    assert c.verdict[0].startswith("Overall:")
    assert ("about the same" in c.verdict[0]) == (abs(change) < SAME_PCT)


def test_a_report_compared_with_itself_changes_nothing(load) -> None:
    r = load(QWEN)
    c = compare(r, r)
    assert (c.by_name["status"] == "both").all() and (c.by_name["delta_s"] == 0).all()
    assert not c.by_name["bound_changed"].any()
    assert "about the same" in c.verdict[0]
    assert not any(v.startswith("Biggest") for v in c.verdict)


@pytest.mark.parametrize("key", ["name", "op"])
def test_other_match_keys(load, key: str) -> None:
    a, b = load(QWEN), load(B200)
    c = compare(a, b, key=key)
    assert set(c.by_name["name"]) == set(totals(a, key).index) | set(totals(b, key).index)
    assert c.key == key


def test_unknown_key_is_a_usage_error(load) -> None:
    with pytest.raises(UsageError, match="kernel_id"):
        compare(load(QWEN), load(QWEN), key="kernel_id")


def test_bound_shift_flags_and_device_note(load) -> None:
    a, b = load(QWEN), load(B200)
    c = compare(a, b, key="op")
    known = c.by_name["bound_a"].isin(["memory", "compute"]) & c.by_name["bound_b"].isin(["memory", "compute"])
    assert (c.by_name["bound_changed"] == (known & (c.by_name["bound_a"] != c.by_name["bound_b"]))).all()
    assert c.verdict[0] == (f"A ran on {a.device.name}, B on {b.device.name}: compare percentages of roof "
                            "(MFU, MBU), not only times.")
    shifted = c.by_name[c.by_name["bound_changed"]]
    assert len(shifted) and any(str(shifted["name"].iloc[0])[:40] in v for v in c.verdict)


def test_to_dict_is_strict_json(load) -> None:
    d = compare(load(RANK0), load(RANK1)).to_dict()
    again = json.loads(json.dumps(d, allow_nan=False))
    assert set(again) == {"a", "b", "key", "run", "roofs", "by_phase", "by_name", "verdict"}
    assert again["by_name"][0]["status"] in ("both", "new", "vanished")


def test_cli_text_json_and_bad_path(fixtures_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = str(fixtures_dir / RANK0), str(fixtures_dir / RANK1)
    assert main(["compare", a, b, "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert "Phases" in text and "Top movers (matched by short_name;" in text and "Verdict" in text
    assert main(["compare", a, b, "--json", "--by", "name"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["key"] == "name" and payload["verdict"]
    assert main(["compare", a, str(fixtures_dir / "no-such-trace.json")]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no-such-trace.json" in err[0] and "no such file" in err[0]


CPU_EAGER = "cpu-small-b1-p128-g32.perfscope"
CPU_COMPILED = "cpu-small-compiled-b1-p128-g32.perfscope"


def test_the_cpu_samples_compare_on_the_headline_runs_against_one_roof(sample_reports_dir: Path) -> None:
    """Issue 45: the compiled sample decodes faster than the eager one, yet its MBU read lower (46.2%
    against 49.9%) because each report divided by its own DRAM roof (55.1 and 30.9 GB/s, measured in
    different minutes) and compare used the profiled runs. On the headline runs against A's roof,
    decode MBU rises with decode speed, by the same ratio."""
    from perfscope.analysis.summaries.serving import phase_summary

    a, b = Report.load(sample_reports_dir / CPU_EAGER), Report.load(sample_reports_dir / CPU_COMPILED)
    assert a.device.memory["dram"].value != b.device.memory["dram"].value  # two roofs measured minutes apart
    c = compare(a, b)
    assert c.run == "headline" and "A's roofs" in c.roofs and "30.9 GB/s" in c.roofs
    dec = c.by_phase.set_index("phase").loc["decode"]
    head_a = phase_summary(a).set_index("phase").loc["decode"]
    assert dec["time_a_s"] == pytest.approx(head_a["wall_s"])  # the warm unprofiled run's, not the profiled one's
    assert dec["time_a_s"] == pytest.approx(a.steps_unprofiled.query("phase == 'decode'")["duration_ns"].sum() / 1e9)
    assert dec["tokens_per_s_b"] > dec["tokens_per_s_a"]  # B decodes faster...
    assert dec["mbu_b_pct"] > dec["mbu_a_pct"]  # ...and its MBU rises with it
    speed = dec["tokens_per_s_b"] / dec["tokens_per_s_a"]
    bytes_per_token = (lambda r: float((r.steps_unprofiled.query("phase == 'decode'").eval(
        "weight_bytes + kv_cache_bytes")).sum()) / float(r.steps_unprofiled.query("phase == 'decode'")["tokens"].sum()))
    assert dec["mbu_b_pct"] / dec["mbu_a_pct"] == pytest.approx(speed * bytes_per_token(b) / bytes_per_token(a))
    assert any("headline runs" in v for v in c.verdict) and any("one roof" in v for v in c.verdict)
    profiled = compare(a, b, profiled=True)
    assert profiled.run == "profiled"
    assert profiled.by_phase.set_index("phase").loc["decode", "time_a_s"] == pytest.approx(
        phase_summary(a, profiled=True).set_index("phase").loc["decode", "wall_s"])
    own = compare(a, b, roofs=b.device)  # --roofs: the roof given, for both
    assert "the roofs given" in own.roofs and "55.1 GB/s" in own.roofs


def test_the_sides_are_labelled_by_their_folders_and_counts_match_the_names(sample_reports_dir: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    a, b = sample_reports_dir / CPU_EAGER, sample_reports_dir / CPU_COMPILED
    ra, rb = Report.load(a), Report.load(b)
    assert ra.name == rb.name  # both reports are named small-b1-p128-g32
    c = compare(ra, rb)
    assert (c.a, c.b) == ("cpu-small-b1-p128-g32", "cpu-small-compiled-b1-p128-g32")
    for line in c.verdict:
        if " name(s) only in " not in line:
            continue
        count = int(line.split()[0])
        listed = line.split(": ", 1)[1].count(" (")
        assert listed == count or f"the {listed} with the most time" in line, line
    new = c.by_name[c.by_name["status"] == "new"]
    assert f"{len(new)} name(s) only in B" in " ".join(c.verdict)
    assert main(["compare", str(a), str(b)]) == 0
    text = capsys.readouterr().out
    assert "A = cpu-small-b1-p128-g32" in text and "B = cpu-small-compiled-b1-p128-g32" in text
    assert "Phases (headline runs: warm, without the profiler)" in text
    assert main(["compare", str(a), str(b), "--profiled", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run"] == "profiled"
