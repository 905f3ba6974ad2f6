"""``perfscope generate`` through ``perfscope.cli.main``: output, JSON, and one-line errors."""

from __future__ import annotations

import json

import pytest

from perfscope.cli import main
from perfscope.engine import SamplingParams, build_model, generate
from perfscope.errors import UsageError


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["generate", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_prints_the_engine_greedy_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["--model", "tiny", "--prompt-ids", "1,2,3", "--max-new-tokens", "5"], capsys)
    assert code == 0 and err == ""
    want = generate(build_model("tiny"), [[1, 2, 3]], 5).generated_ids[0]
    assert out.split() == [str(t) for t in want]


def test_json_output_with_sampling(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--prompt-ids", "4, 5,6", "--max-new-tokens", "4", "--temperature", "0.9", "--top-k", "20",
            "--top-p", "0.9", "--seed", "3", "--attention", "naive", "--json"]
    code, out, _ = run(args, capsys)
    assert code == 0
    data = json.loads(out)
    assert set(data) == {"prompt_ids", "generated_ids", "text", "output_tokens", "ttft_s", "tpot_s", "compile",
                         "compile_s"}
    assert data["text"] is None and data["output_tokens"] == 4
    assert data["compile"] is False and data["compile_s"] is None  # eager by default on the CPU
    assert data["prompt_ids"] == [4, 5, 6]
    sampling = SamplingParams(temperature=0.9, top_k=20, top_p=0.9, seed=3)
    want = generate(build_model("tiny", attention="naive", seed=3), [[4, 5, 6]], 4, sampling).generated_ids[0]
    assert data["generated_ids"] == want
    assert data["ttft_s"] > 0 and data["tpot_s"] > 0


@pytest.mark.parametrize("args, message", [
    (["--prompt-ids", "1,x"], "--prompt-ids must be comma-separated integers"),
    (["--prompt-ids", ","], "--prompt-ids is empty"),
    (["--prompt-ids", "1,99999"], "outside the vocabulary"),
    (["--model", "gpt-9", "--prompt-ids", "1"], "unknown model 'gpt-9'"),
    (["--prompt-ids", "1", "--max-new-tokens", "0"], "max_new_tokens must be >= 1"),
    (["--prompt-ids", "1", "--temperature", "-1"], "temperature must be >= 0"),
])
def test_bad_input_is_one_line_and_a_usage_error(args: list[str], message: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(args, capsys)
    assert code == UsageError.exit_code and out == ""
    assert err.startswith("perfscope: error:") and message in err and err.count("\n") == 1


def test_bfloat16_runs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--prompt-ids", "1,2", "--max-new-tokens", "3", "--dtype", "bfloat16"], capsys)
    assert code == 0 and len(out.split()) == 3
