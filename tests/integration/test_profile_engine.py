"""End to end: the reference engine profiled on the CPU into a Report, and the CLI around it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import perfscope
from perfscope.analysis.summaries.serving import phase_summary, request_summary
from perfscope.cli import main
from perfscope.report import Report
from perfscope.sessions.profile import EngineRun, align_steps, profile_engine


@pytest.fixture(scope="session")
def cpu_roofs(tmp_path_factory):
    """This machine's CPU roofs, measured for real once per test session."""
    from perfscope.collectors.roofs import device_roofs

    os.environ["PERFSCOPE_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    return device_roofs("cpu")


@pytest.fixture(scope="session")
def tiny_report(cpu_roofs):
    return profile_engine(EngineRun(model="tiny", batch=2, prompt_len=16, gen_len=6, device="cpu"), roofs=cpu_roofs)


def test_measured_roofs_have_provenance(cpu_roofs):
    assert cpu_roofs.kind == "cpu"
    assert cpu_roofs.compute["fp32"].provenance == "measured" and cpu_roofs.compute["fp32"].value > 1e9
    assert cpu_roofs.memory["dram"].provenance == "measured" and cpu_roofs.memory["dram"].value > 1e8
    assert "torch.mm" in cpu_roofs.compute["fp32"].method
    assert cpu_roofs.ridge("fp32") == cpu_roofs.compute["fp32"].value / cpu_roofs.memory["dram"].value


def test_ranges_steps_and_phases(tiny_report):
    r = tiny_report
    names = set(r.ranges["name"])
    assert {"prefill", "decode", "layer.0", "attn", "mlp"} <= names
    assert (r.ranges["name"] == "decode").sum() == 5
    assert r.steps["phase"].tolist() == ["prefill"] + ["decode"] * 5
    decode_ranges = r.ranges[r.ranges["name"] == "decode"].sort_values("start_ns")
    assert r.steps[r.steps["phase"] == "decode"]["start_ns"].tolist() == decode_ranges["start_ns"].tolist()
    k = r.kernels
    assert set(k["phase"].dropna()) == {"prefill", "decode"}
    attn_rows = k[k["range"].fillna("").str.endswith("/attn")]
    assert len(attn_rows) and attn_rows["range"].str.startswith(("prefill/layer.", "decode/layer.")).all()
    assert (k["device"] == "cpu").all()


def test_requests_and_serving_metrics(tiny_report):
    req = tiny_report.requests
    assert len(req) == 2 and (req["output_tokens"] == 6).all()
    assert (req["ttft_s"] < req["e2e_s"]).all()
    expected_tpot = (req["e2e_s"] - req["ttft_s"]) / 5
    assert req["tpot_s"].tolist() == pytest.approx(expected_tpot.tolist())
    phases = phase_summary(tiny_report).set_index("phase")
    assert phases.loc["prefill", "tokens"] == 32 and phases.loc["decode", "tokens"] == 10
    assert phases.loc["decode", "mbu_source"] == "model"
    assert 0 < phases.loc["decode", "mbu"] and 0 < phases.loc["prefill", "mfu"]
    # MFU from the model's FLOPs (the steps'), like MBU from its bytes
    disturbed = tiny_report.params["baseline_verdict"] == "disturbed"  # a busy machine: the profiled steps lead
    steps = tiny_report.steps if disturbed else tiny_report.steps_unprofiled
    for phase in ("prefill", "decode"):
        row = phases.loc[phase]
        assert row["mfu_source"] == "model"
        assert row["model_flops"] == steps.loc[steps["phase"] == phase, "flops"].sum() > 0
        peak = tiny_report.device.peak_flops(row["precision"])
        assert row["mfu"] == pytest.approx(row["model_flops"] / row["wall_s"] / peak)
    summary = request_summary(tiny_report)
    assert summary["requests"] == 2 and summary["output_tokens"] == 12


def test_bound_is_consistent_with_the_measured_ridge(tiny_report):
    k = tiny_report.kernels
    ridge = tiny_report.device.ridge("fp32")
    known = k[k["arith_intensity"].notna() & (k["precision"] == "fp32")]
    assert len(known) > 50
    expect = known["arith_intensity"].lt(ridge).map({True: "memory", False: "compute"})
    assert (known["bound"] == expect).all()


def test_profiler_overhead_is_measured(tiny_report):
    p = tiny_report.params
    assert p["unprofiled_wall_s"] > 0 and p["profiled_wall_s"] > 0
    assert p["profiler_overhead_ratio"] == pytest.approx(p["profiled_wall_s"] / p["unprofiled_wall_s"])


def test_headline_comes_from_a_warm_unprofiled_run(tiny_report):
    r, p = tiny_report, tiny_report.params
    if p["baseline_verdict"] == "disturbed":
        # a busy machine made every warm pass slower than the profiled run, rechecks included: the passes are
        # not kept and a warning says to believe the profiled run (the same rule as test_hf_generate's)
        assert not len(r.steps_unprofiled) and any("Believe the profiled run" in w for w in r.warnings)
        assert set(phase_summary(r)["timing"]) == {"profiled"}
        return
    # the unprofiled run did the same work as the profiled one, step for step
    assert r.steps_unprofiled["phase"].tolist() == r.steps["phase"].tolist()
    assert r.steps_unprofiled["tokens"].tolist() == r.steps["tokens"].tolist()
    assert r.steps_unprofiled["weight_bytes"].tolist() == r.steps["weight_bytes"].tolist()
    assert r.steps_unprofiled["start_ns"].iloc[0] == 0 and (r.steps_unprofiled["duration_ns"] > 0).all()
    assert len(r.requests_unprofiled) == 2 and (r.requests_unprofiled["output_tokens"] == 6).all()
    from perfscope.sessions.profile import MAX_PASSES, RECHECK_PASSES, pass_spread

    passes = p["unprofiled_wall_s_passes"]  # two, more while the two fastest disagree (a loaded machine)
    assert 2 <= len(passes) <= MAX_PASSES + RECHECK_PASSES and p["unprofiled_wall_s"] == min(passes)
    assert p["baseline_spread"] == pytest.approx(pass_spread(passes))
    assert len(passes) == 2 or pass_spread(passes[:-1]) > 0.10 or p["profiled_wall_s"] < min(passes[:-1])
    assert p["warmup_s"] > 0 and p["compile"] is False and p["compile_s"] is None
    head, prof = phase_summary(r).set_index("phase"), phase_summary(r, profiled=True).set_index("phase")
    assert set(head["timing"]) == {"unprofiled"} and set(prof["timing"]) == {"profiled"}
    decode = r.steps_unprofiled[r.steps_unprofiled["phase"] == "decode"]
    assert head.loc["decode", "wall_s"] == pytest.approx(decode["duration_ns"].sum() / 1e9)
    assert head.loc["decode", "flops"] == prof.loc["decode", "flops"]  # FLOPs: the profiled kernels', same work
    tpot = r.requests_unprofiled["tpot_s"].mean()
    assert request_summary(r)["tpot_s_mean"] == pytest.approx(tpot)
    assert request_summary(r, profiled=True)["tpot_s_mean"] == pytest.approx(r.requests["tpot_s"].mean())


def test_headline_tables_survive_save_and_old_reports_load_without_them(tmp_path, tiny_report):
    back = Report.load(tiny_report.save(tmp_path / "t.perfscope"))
    assert len(back.steps_unprofiled) == len(tiny_report.steps_unprofiled)
    (tmp_path / "t.perfscope" / "steps_unprofiled.parquet").unlink()  # a report from before these tables
    (tmp_path / "t.perfscope" / "requests_unprofiled.parquet").unlink()
    old = Report.load(tmp_path / "t.perfscope")
    assert not len(old.steps_unprofiled)
    assert set(phase_summary(old)["timing"]) == {"profiled"}
    assert request_summary(old) == request_summary(old, profiled=True)


def test_baseline_params_flag_noise_and_never_report_overhead_below_one():
    from perfscope.sessions.profile import baseline_params

    p, warn = baseline_params(1.3, [1.0, 1.02], 5.0, compiled=True)
    assert p["profiler_overhead_ratio"] == pytest.approx(1.3) and p["unprofiled_wall_s"] == 1.0
    assert p["compile_s"] == pytest.approx(4.0) and not warn and p["baseline_verdict"] == "steady"
    p, warn = baseline_params(1.3, [1.0, 1.2], 1.1, compiled=False, phase_passes_s={"decode": [0.8, 0.95]})
    assert p["compile_s"] is None and len(warn) == 1 and "noisy baseline" in warn[0]
    assert p["baseline_verdict"] == "noisy" and p["headline_range"] == {"all": [1.0, 1.2], "decode": [0.8, 0.95]}
    p, warn = baseline_params(0.9, [1.0, 1.05], 1.1, compiled=False)
    assert p["profiler_overhead_ratio"] == pytest.approx(0.9) and p["baseline_verdict"] == "disturbed"
    assert len(warn) == 1 and "A profiler only adds time" in warn[0] and "Believe the profiled run" in warn[0]
    p, warn = baseline_params(1.3, [1.5, 1.0, 1.05], 1.1, compiled=False)  # the two fastest agree
    assert p["baseline_spread"] == pytest.approx(0.05) and not warn
    p, warn = baseline_params(8.0, [1.0, 1.02], 1.1, compiled=False)  # an 8x slower profiled run: said which to read
    assert p["baseline_verdict"] == "profiled-slow" and "Believe the headline" in warn[0]
    p, warn = baseline_params(0.9, [], 1.1, compiled=False)
    assert p["profiler_overhead_ratio"] is None and not warn


def test_a_noisy_baseline_is_retried_within_its_time_budget():
    from perfscope.sessions.profile import BASELINE_RETRY_S, MAX_PASSES, more_passes

    assert not more_passes([1.0, 1.05], 0.0)  # the two fastest agree
    assert more_passes([1.0, 1.5], 0.0)  # they do not: one more
    assert not more_passes([1.0, 1.5], BASELINE_RETRY_S - 0.5)  # a pass of 1 s does not fit what is left
    assert not more_passes([1.0] + [1.5] * (MAX_PASSES - 1), 0.0)  # enough passes
    assert not more_passes([1.0], 0.0)  # one pass: no spread to judge


def test_compile_defaults_to_cuda_only_and_is_one_flag_away():
    assert EngineRun().resolved_compile("cuda") is True and EngineRun().resolved_compile("cpu") is False
    assert EngineRun(compile=False).resolved_compile("cuda") is False
    assert EngineRun(compile=True).resolved_compile("cpu") is True
    from click.testing import CliRunner

    from perfscope.cli.generate import generate
    from perfscope.cli.profile import profile
    from perfscope.cli.sweep import sweep

    for command in (profile, generate, sweep):
        assert "--compile / --no-compile" in CliRunner().invoke(command, ["--help"]).output


def test_text_summary_labels_headline_and_profiled(tiny_report):
    from perfscope.text_report import render_text

    text = render_text(tiny_report)
    if tiny_report.params["baseline_verdict"] == "disturbed":  # a busy machine: the profiled run is the headline
        assert "timing: profiled run" in text and "the headline" in text and "Believe the profiled run" in text
        return
    assert "timing: warm unprofiled run" in text and "headline" in text
    assert "prof. MBU %" in text and "profiled run: TTFT" in text
    assert "(profiler overhead x" in text or "profiler overhead not measured" in text


def test_align_steps_falls_back_to_the_engine_clock_when_counts_differ(tiny_report):
    from perfscope.engine.generate import StepRecord

    steps = [StepRecord(0, "prefill", 1, 4, 4, 1000, 2000, 1.0, 1.0, 1.0)]
    ranges = tiny_report.ranges.iloc[0:0]
    df, note = align_steps(steps, ranges)
    assert note and "engine's own clock" in note and df["duration_ns"].tolist() == [1000]


@pytest.mark.slow
def test_small_model_decode_is_memory_bound_and_512_token_prefill_compute_bound(cpu_roofs):
    """The issue's acceptance check, on the default CPU model."""
    r = profile_engine(EngineRun(model="small", batch=1, prompt_len=512, gen_len=3, device="cpu"), roofs=cpu_roofs)
    gemm = r.kernels[r.kernels["category"] == "gemm"]
    ridge = cpu_roofs.ridge("fp32")
    decode, prefill = gemm[gemm["phase"] == "decode"], gemm[gemm["phase"] == "prefill"]
    assert len(decode) and len(prefill)
    assert (decode["arith_intensity"] < ridge).all() and (decode["bound"] == "memory").all()
    big = prefill[prefill["flops"] > 1e9]  # the projection matmuls, not the tiny lm-head of the last token
    assert len(big) and (big["arith_intensity"] > ridge).all() and (big["bound"] == "compute").all()


@pytest.mark.slow
def test_compiled_cpu_decode_is_visible_in_the_profile(cpu_roofs):
    """--compile on the CPU: the compiled decode step's kernels are operators of the profile (inductor's
    kernel profiling), not time between operators, and the advice does not say to compile."""
    r = profile_engine(EngineRun(model="tiny", batch=1, prompt_len=8, gen_len=6, device="cpu", compile=True),
                       roofs=cpu_roofs)
    assert r.params["compile"] is True
    k = r.kernels
    decode = k[k["phase"] == "decode"]
    compiled = decode[decode["name"].str.contains("cpp_fused", regex=False)]
    n_steps = int((r.steps["phase"] == "decode").sum())
    assert n_steps == 5 and len(compiled) >= n_steps  # one compiled call (at least one kernel) per decode step
    step_ns = float(r.steps.loc[r.steps["phase"] == "decode", "duration_ns"].sum())
    assert 0 < compiled["duration_ns"].sum() < step_ns  # inside the steps
    from perfscope.analysis.findings import run_rules

    findings = {f.id: f for f in run_rules(r)}
    advice = [f.recommendation for f in findings.values() if f.id in ("time-outside-ops", "short-kernels", "decode-mbu")]
    assert advice and not any("torch.compile" in a for a in advice)  # a compiled run is not told to compile
    # the tiny model's operators are mostly views and small ops under 5 µs: the finding says where they are
    ev = findings["short-kernels"].evidence
    short = k[k["duration_ns"] < 5000]
    in_decode = short["phase"] == "decode"
    step_work = in_decode & (short["name"].str.contains("_cpp_fused_", regex=False) | (short["category"] == "gemm"))
    assert ev["short_compiled_step_work"] == int(step_work.sum()) > 0
    assert ev["short_other_decode"] == int((in_decode & ~step_work).sum())
    assert ev["short_other_phases"] == int((~in_decode).sum())
    decode_phase = phase_summary(r).set_index("phase").loc["decode"]
    assert decode_phase["mfu_source"] == "model" and decode_phase["mfu"] > 0  # from the engine's steps
    # the tiny model's matrices take inductor's extern BLAS calls between several kernels per step, each
    # an aten::mm with its shapes (inductor's Python launch code; the C++ wrapper's aoti_torch_cpu_mm_out
    # has none), costed 2·M·N·K: per step, the 9 products of 2 layers (wqkv, wo, w13, w2) and the head
    steps = r.steps[r.steps["phase"] == "decode"]
    mm = decode[(decode["name"] == "aten::mm") & (decode["start_ns"] >= steps["start_ns"].min())]
    assert len(mm) == 9 * n_steps and (mm["flops_source"] == "analytic").all()
    per_token = 2 * 2 * (64 * (4 + 2 * 2) * 16 + 64 * 64 + 64 * 2 * 128 + 128 * 64) + 2 * 64 * 512
    assert mm["flops"].sum() == pytest.approx(per_token * n_steps)
    # what is left of each step's model FLOPs is attention's QK^T and PV (4 x heads x head_dim x context
    # per layer and token): it goes, with the KV cache's bytes, to the 2 kernels per step (one per layer)
    # that fuse the bmm; the other fused kernels (norms, activations) stay uncosted
    att = decode[decode["flops_source"] == "engine-attention"]
    assert len(att) == 2 * n_steps and att["name"].str.contains("_bmm_", regex=False).all()
    assert att["flops"].sum() == pytest.approx(float((4 * 2 * 4 * 16 * steps["context_len"]).sum()))
    assert att["dram_bytes"].sum() == pytest.approx(float(steps["kv_cache_bytes"].sum()))
    assert compiled.loc[~compiled.index.isin(att.index), "flops"].isna().all()


@pytest.mark.slow
def test_a_step_compiled_into_one_kernel_takes_the_steps_model_cost(cpu_roofs, monkeypatch):
    """Matrices large enough for the engine's threaded matrix-vector path compile, with the rest of
    the step, into one inductor kernel per decode step: that kernel gets the step's 2·M·N·K-based
    FLOPs and weight + KV bytes (flops_source engine-step) and a place on the roofline."""
    import torch

    from perfscope.engine.model import ModelArgs, build_random

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # the threaded path needs 2 threads
    args = ModelArgs.from_name("tiny", n_layer=1, dim=512, n_head=8, n_kv_head=4, head_dim=64,
                               intermediate_size=1024, vocab_size=512)
    r = profile_engine(EngineRun(model="tiny", batch=1, prompt_len=8, gen_len=6, device="cpu", compile=True),
                       roofs=cpu_roofs, model=build_random(args, seed=1))
    steps = r.steps[r.steps["phase"] == "decode"]
    k = r.kernels
    costed = k[k["flops_source"] == "engine-step"].sort_values("start_ns")
    assert len(costed) == len(steps) == 5  # one kernel per decode step, each costed
    assert costed["flops"].tolist() == steps["flops"].tolist()
    assert costed["dram_bytes"].tolist() == (steps["weight_bytes"] + steps["kv_cache_bytes"]).tolist()
    assert (costed["bytes_source"] == "engine-step").all() and (costed["precision"] == "fp32").all()
    assert (costed["bound"] == "memory").all() and (costed["pct_of_roof"] > 0).all()
    per_token = 2 * (512 * 1024 + 512 * 512 + 512 * 2048 + 1024 * 512 + 512 * 512)  # wqkv, wo, w13, w2, head
    assert (costed["flops"] == per_token + 4 * 8 * 64 * steps["context_len"].to_numpy()).all()
    assert not any(name in w for w in r.warnings for name in set(costed["name"]))  # not listed as uncosted


# --------------------------------------------------------------------------- CLI
def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "perfscope", *args], cwd=cwd, capture_output=True, check=False,
                          text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"})


def test_cli_profile_writes_a_report_and_refuses_to_overwrite(tmp_path, cpu_roofs):
    out = tmp_path / "run.perfscope"
    args = ["profile", "--model", "tiny", "--prompt-len", "8", "--gen-len", "3", "--device", "cpu",
            "--out", str(out), "--no-html", "-q"]
    assert main(args) == 0
    first = Report.load(out)
    assert first.params["model"] == "tiny"
    before = (out / "manifest.json").read_text()
    assert main(args) == 7  # exists, no --force
    assert (out / "manifest.json").read_text() == before
    assert main([*args, "--force"]) == 0


def test_cli_analyze_json(tmp_path, tiny_report):
    path = tiny_report.save(tmp_path / "t.perfscope")
    proc = run_cli("analyze", str(path), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert {"device", "phases", "phases_profiled", "requests", "requests_profiled", "top_kernels"} <= set(doc)
    assert doc["params"]["profiler_overhead_ratio"] > 0
    # the warm unprofiled passes are the headline unless a busy machine disturbed them: then the profiled run is
    disturbed = tiny_report.params["baseline_verdict"] == "disturbed"
    assert {p["timing"] for p in doc["phases"]} == {"profiled" if disturbed else "unprofiled"}
    assert {p["timing"] for p in doc["phases_profiled"]} == {"profiled"}
    headline = tiny_report.requests if disturbed else tiny_report.requests_unprofiled
    assert doc["requests"]["tpot_s_mean"] == pytest.approx(headline["tpot_s"].mean())
    assert doc["device"]["roofs"][0]["provenance"] == "measured"
    assert {p["phase"] for p in doc["phases"]} == {"prefill", "decode"}
    text = run_cli("analyze", str(path), cwd=tmp_path)
    assert text.returncode == 0 and "top CPU operators by total time" in text.stdout


@pytest.mark.parametrize("args,code", [
    (["profile", "--batch", "0"], 2),
    (["profile", "--dtype", "float64"], 2),
    (["profile", "--device", "cuda", "--model", "tiny"], 6),
    (["analyze", "no/such/report.perfscope"], 3),
    (["report", "no/such/report.perfscope"], 3),
])
def test_cli_bad_arguments_give_one_line_and_an_exit_code(tmp_path, args, code):
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == code
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("perfscope: error:"), proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_folder_that_is_not_a_report(tmp_path):
    (tmp_path / "x.perfscope").mkdir()
    proc = run_cli("analyze", str(tmp_path / "x.perfscope"), cwd=tmp_path)
    assert proc.returncode == 3 and "is a folder, not a profiler output or a perfscope report" in proc.stderr


def test_profile_a_user_script_with_the_torch_collector(tmp_path, cpu_roofs):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import sys, torch
        x = torch.randn(64, 128)
        w = torch.randn(128, 32)
        for _ in range(int(sys.argv[1])):
            y = torch.relu(x @ w)
    """))
    out = tmp_path / "script.perfscope"
    code = main(["profile", "--collector", "torch", "--device", "cpu", "--out", str(out), "--no-html", "-q",
                 "--", "python", str(script), "3"])
    assert code == 0
    k = Report.load(out).kernels
    mm = k[k["name"] == "aten::matmul"]  # `x @ w` is priced at the outermost op, aten::matmul
    assert len(mm) == 3 and (mm["flops"] == 2 * 64 * 128 * 32).all()
    assert (k["name"] == "aten::relu").sum() == 3


def test_notebook_profile_context(cpu_roofs):
    import torch

    with perfscope.profile(device="cpu", roofs=cpu_roofs) as run:
        torch.ones(32, 64) @ torch.ones(64, 16)
    k = run.report.kernels
    assert (k["name"] == "aten::matmul").sum() == 1
    assert k.loc[k["name"] == "aten::matmul", "flops"].iloc[0] == 2 * 32 * 64 * 16


def test_an_older_engine_report_says_its_figures_are_the_profiled_runs(fixtures_dir) -> None:
    """The H200 report was made before the warm headline (a cold 2-token warm-up, overhead x0.31):
    the summary must not call its unprofiled time a warm headline, and labels the phases profiled."""
    from perfscope.report import Report
    from perfscope.text_report import render_text

    text = render_text(Report.load(fixtures_dir / "h200" / "h200_llama1b_b1_p2048_g64.perfscope"), top=3)
    assert "timing: unprofiled run" in text and "(headline" not in text
    assert "the figures below are the profiled run's" in text and "phases (the profiled run):" in text
    assert "overhead x0.3" not in text


def test_python_m_perfscope_from_the_repository_root(tmp_path):
    """`python -m perfscope` in a source checkout imports ./perfscope, not the install: the
    subpackages kept beside it (collectors/, analysis/, dashboard/) must still be found."""
    repo = Path(__file__).resolve().parents[2]
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "ts": 0, "dur": 5, "pid": 1, "tid": 1}]}))
    proc = run_cli("import", str(trace), "--out", str(tmp_path / "t.perfscope"), "--no-html", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert Report.load(tmp_path / "t.perfscope").kernels["name"].tolist() == ["aten::relu"]
