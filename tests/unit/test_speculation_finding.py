"""The ``speculation`` finding and the profile's prompt file, on hand-built step tables whose
answer is known: 4 verify steps of 5 tokens accepting 3 drafts each emit 16 tokens, 2 plain decode
steps 2 more, in 4 x 30 + 6 x 1 (drafts) + 2 x 20 ms = 166 ms: 9.2 ms per token against a 20 ms
plain decode step, 2.17x."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from perfscope.analysis.rules.llm import speculation
from perfscope.errors import InputFormatError
from perfscope.report import Report
from perfscope.sessions.profile import read_prompt_file
from perfscope.text_report import render_text

MS = 1_000_000


def report(verify_ns: int, decode_steps: int = 2) -> Report:
    rows, t = [], 0

    def add(phase: str, tokens: int, dur: int, drafted=None, accepted=None) -> None:
        nonlocal t
        rows.append({"step": len(rows), "phase": phase, "batch": 1, "tokens": tokens, "context_len": 100,
                     "start_ns": t, "end_ns": t + dur, "weight_bytes": 4e8, "kv_cache_bytes": 1e6,
                     "kv_cache_size_bytes": 1e6, "drafted": drafted, "accepted": accepted})
        t += dur

    add("prefill", 50, 100 * MS)
    for _ in range(4):
        add("draft", 0, 1 * MS)
        add("verify", 5, verify_ns, 4, 3)
    for _ in range(decode_steps):
        add("draft", 0, 1 * MS)
        add("decode", 1, 20 * MS)
    steps = pd.DataFrame(rows)
    steps["duration_ns"] = steps["end_ns"] - steps["start_ns"]
    return Report.build({"steps": steps}, {"params": {"n_params": 1e8, "speculation": {"method": "ngram"}}})


def test_paid_with_the_known_numbers() -> None:
    (f,) = speculation(report(30 * MS))
    e = f.evidence
    assert e["acceptance_rate"] == 0.75 and e["mean_accepted_len"] == 3 and e["tokens_per_verify_step"] == 4
    assert e["decode_step_ns"] == 20 * MS and e["verify_cost_vs_decode"] == 1.5
    # all of the speculative decode: 6 draft steps, 4 verify and 2 plain decode steps, 18 tokens
    assert e["ns_per_token_speculative"] == pytest.approx((4 * 30 + 6 + 40) * MS / 18)
    assert e["speedup_vs_decode"] == pytest.approx(20 * 18 / 166)
    assert e["verify_flop_per_byte"] == pytest.approx(2e8 * 5 / (4e8 + 1e6))
    assert e["decode_flop_per_byte"] == pytest.approx(2e8 / (4e8 + 1e6))
    assert "paid" in f.title and "did not" not in f.title
    assert "acceptance 75.0%" in render_text(report(30 * MS), findings=False)


def test_not_paid_when_verify_costs_more_than_it_yields() -> None:
    (f,) = speculation(report(100 * MS))
    assert "did not pay" in f.title and f.severity in ("high", "medium", "low")
    assert f.time_at_stake_ns == pytest.approx((400 + 6 + 40 - 18 * 20) * MS)
    assert "verify step costs more" in f.recommendation


def test_without_plain_decode_steps_uses_the_bandwidth_floor_or_says_unknown() -> None:
    (f,) = speculation(report(100 * MS, decode_steps=0))
    assert f.severity == "info" and "not known" in f.title  # no DRAM roof, no decode step: cannot tell


def test_silent_without_speculation() -> None:
    r = report(30 * MS)
    plain = r.steps[~r.steps["phase"].isin(["verify", "draft"])]
    assert speculation(Report.build({"steps": plain}, {})) == []


def test_prompt_file_lines_and_jsonl(tmp_path: Path) -> None:
    txt = tmp_path / "p.txt"
    txt.write_text("first prompt\n\nsecond one\n")
    assert read_prompt_file(txt) == ["first prompt", "second one"]
    jl = tmp_path / "p.jsonl"
    jl.write_text(json.dumps("line one\nline two") + "\n" + json.dumps({"prompt": "x"}) + "\n")
    assert read_prompt_file(jl) == ["line one\nline two", "x"]
    jl.write_text("{not json\n")
    with pytest.raises(InputFormatError, match="line 1"):
        read_prompt_file(jl)
    txt.write_text("\n\n")
    with pytest.raises(InputFormatError, match="no prompt"):
        read_prompt_file(txt)
