"""``perfscope loadtest`` end to end on the tiny model (CPU): JSON, report tables, errors.

The metrics printed by ``--json`` are recomputed here from ``requests.parquet`` alone, with
numpy, following vLLM's benchmark_serving definitions (no perfscope code involved).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfscope.cli import main
from perfscope.report import Report


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["loadtest", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _independent(req: pd.DataFrame, slo: dict[str, float]) -> dict:
    times = [np.asarray(json.loads(t), dtype=float) for t in req["token_times_s"]]
    arrival = req["arrival_s"].to_numpy(dtype=float)
    first = np.array([t[0] for t in times])
    last = np.array([t[-1] for t in times])
    n_out = np.array([len(t) for t in times])
    ttft, e2e = first - arrival, last - arrival
    tpot = np.array([(l - f) / (n - 1) for f, l, n in zip(first, last, n_out) if n > 1])
    itl = np.concatenate([np.diff(t) for t in times if len(t) > 1])
    duration = last.max()

    def s(v: np.ndarray) -> dict:
        return {"p50": np.percentile(v, 50), "p90": np.percentile(v, 90), "p99": np.percentile(v, 99),
                "mean": v.mean()}

    tpot_all = np.array([(l - f) / (n - 1) if n > 1 else 0.0 for f, l, n in zip(first, last, n_out)])
    good = (ttft <= slo["ttft"]) & (tpot_all <= slo["tpot"])
    return {"requests": len(req), "request_throughput_per_s": len(req) / duration,
            "output_tokens_per_s": n_out.sum() / duration, "ttft_s": s(ttft), "tpot_s": s(tpot),
            "itl_s": s(itl), "e2e_s": s(e2e), "goodput_per_s": good.sum() / duration}


def test_loadtest_json_matches_requests_parquet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "lt"
    code, stdout, err = _run(capsys, "--model", "tiny", "--rate", "20", "--requests", "50", "--json",
                             "--slo", "ttft=0.5,tpot=0.05", "--out", str(out))
    assert code == 0, err
    payload = json.loads(stdout)
    for key in ("requests", "request_throughput_per_s", "output_tokens_per_s", "goodput_per_s"):
        assert key in payload
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert set(payload[key]) == {"p50", "p90", "p99", "mean"}
    folder = Path(payload["report_path"])
    req = pd.read_parquet(folder / "requests.parquet")
    expected = _independent(req, {"ttft": 0.5, "tpot": 0.05})
    assert payload["requests"] == expected["requests"] == 50
    assert sorted(req["request_id"]) == list(range(50))
    for key in ("request_throughput_per_s", "output_tokens_per_s", "goodput_per_s"):
        assert payload[key] == pytest.approx(expected[key], rel=1e-6), key
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        for stat in ("p50", "p90", "p99", "mean"):
            assert payload[key][stat] == pytest.approx(expected[key][stat], rel=1e-6, abs=1e-8), (key, stat)
    # the report: profiled kernels with phases, steps aligned to the trace, composition columns
    report = Report.load(folder)
    assert len(report.kernels) and set(report.kernels["phase"].dropna()) == {"prefill", "decode"}
    steps = report.steps
    assert {"prefill_tokens", "decode_seqs", "kv_slots_in_use", "queue_len", "flops"} <= set(steps.columns)
    assert steps["prefill_tokens"].sum() == req["prompt_tokens"].sum()
    assert steps["decode_seqs"].sum() + len(req) == req["output_tokens"].sum()
    assert (steps["kv_slots_in_use"] <= 16).all()
    html = (folder / "report.html").read_text(encoding="utf-8")
    assert "Serving under load" in html


def test_rate_sweep_and_arrivals_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, err = _run(capsys, "--rate", "2,50", "--requests", "6", "--prompt-len", "uniform:4,12",
                             "--output-len", "4", "--no-profile", "--json", "--kv-dtype", "int8",
                             "--out", str(tmp_path / "sweep"))
    assert code == 0, err
    payload = json.loads(stdout)
    assert [r["rate_per_s"] for r in payload["runs"]] == [2.0, 50.0]
    assert "knee_rate_per_s" in payload and payload["kv_logit_error"]["kv_dtype"] == "int8"
    report = Report.load(payload["report_path"])
    assert len(report.kernels) == 0 and sorted(report.requests["run"].unique()) == ["rate=2", "rate=50"]
    arrivals = tmp_path / "arrivals.txt"
    arrivals.write_text("0.0\n0.01\n0.02\n")
    code, stdout, err = _run(capsys, "--arrivals", str(arrivals), "--output-len", "3", "--no-profile", "--json",
                             "--out", str(tmp_path / "arr"))
    assert code == 0, err
    req = pd.read_parquet(Path(json.loads(stdout)["report_path"]) / "requests.parquet")
    assert req["arrival_s"].tolist() == [0.0, 0.01, 0.02]


@pytest.mark.parametrize("args,code,needle", [
    (["--rate", "0"], 2, "--rate must be > 0"),
    (["--rate", "-3"], 2, "--rate must be > 0"),
    (["--prompt-len", "500", "--output-len", "100"], 2, "context"),
    (["--prompt-len", "normal:400,300", "--output-len", "100", "--requests", "20"], 2, "context"),
    (["--max-batch", "8", "--max-batched-tokens", "4"], 2, "--max-batched-tokens"),
    (["--slo", "ttft"], 2, "--slo"),
])
def test_bad_input_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                      code: int, needle: str) -> None:
    got, _, err = _run(capsys, *args, "--no-profile", "--no-html", "--out", str(tmp_path / "x"))
    assert got == code
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "x.perfscope").exists()


def test_empty_length_file_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "lens.txt"
    empty.write_text("")
    got, _, err = _run(capsys, "--prompt-len", str(empty), "--no-profile", "--out", str(tmp_path / "x"))
    assert got == 3 and "empty" in err and str(empty) in err and len(err.strip().splitlines()) == 1
