"""``perfscope whatif``: a measured report projected onto another GPU, batch, prompt, context, dtype or
draft length (perfscope.analysis.projection), checked against known truth: identity when nothing
changes, 2*M*N*K at the new M, attention's 4*B*H*Lq*S*E at the new KV length, the same work as a run
actually measured at the new shapes, and the cross-GPU error bounds measured on the crossgpu tables."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.projection.crossgpu import error_table, validate
from perfscope.analysis.projection.project import Question, project, sweep
from perfscope.analysis.projection.shapes import Dims, rewrite
from perfscope.analysis.projection.speculative import acceptance_per_position, speculative_sweep
from perfscope.analysis.projection.times import Roofs, family_fit, project_times
from perfscope.api import run_whatif
from perfscope.cli import main
from perfscope.errors import UsageError
from perfscope.report import Report

H200 = "h200/h200_llama1b_b1_p2048_g64.perfscope"


@pytest.fixture(scope="module")
def measured(fixtures_dir) -> Report:
    return Report.load(fixtures_dir / H200)


def _mm_flops(shapes: str, rows: int | None = None) -> float:
    (m, k), (_, n) = json.loads(shapes)[:2]
    return 2.0 * (rows if rows is not None else m) * n * k


def test_nothing_changed_is_the_measured_run(measured: Report) -> None:
    p = project(measured, Question())
    k, o = p.kernels, measured.kernels
    assert np.abs(k["duration_ns"].to_numpy() - o["duration_ns"].to_numpy()).max() <= 1  # ns rounding
    steps = measured.steps.sort_values("start_ns").reset_index(drop=True)
    assert np.abs(p.steps["duration_ns"].to_numpy() - steps["duration_ns"].to_numpy()).max() <= 1_000
    assert p.manifest["source"]["kind"] == "projection"
    assert p.manifest["projection"]["measured_name"] == measured.name
    assert "[projected:" in p.name


def test_batch_projection_prices_gemms_at_the_new_m(measured: Report) -> None:
    p = project(measured, Question(batch=8))
    o, k = measured.kernels, p.kernels
    pre_mm = ((o["op"] == "aten::mm") & (o["phase"] == "prefill")).to_numpy()
    assert pre_mm.sum() > 50
    for shapes, f_old, f_new in zip(o.loc[pre_mm, "op_shapes"], o.loc[pre_mm, "flops"], k.loc[pre_mm, "flops"]):
        m = json.loads(shapes)[0][0]
        assert f_old == _mm_flops(shapes)  # one kernel per mm in this trace: the op's whole cost
        assert f_new == _mm_flops(shapes, rows=8 * m)  # 2*M*N*K, M = 8 x 2048 tokens
    dec_mm = ((o["op"] == "aten::mm") & (o["phase"] == "decode")).to_numpy()
    rows = {json.loads(s)[0][0] for s in o.loc[dec_mm, "op_shapes"]}
    assert rows == {1}
    assert np.allclose(k.loc[dec_mm, "flops"].to_numpy(), 8 * o.loc[dec_mm, "flops"].to_numpy())
    # the weights are read once per step whatever the batch: decode GEMM bytes grow far less than 8x
    ratio = k.loc[dec_mm, "dram_bytes"].sum() / o.loc[dec_mm, "dram_bytes"].sum()
    assert 1.0 < ratio < 1.1
    assert p.steps["batch"].eq(8).all() and len(p.requests) == 8


def test_context_projection_prices_attention_at_the_new_kv_length(measured: Report) -> None:
    p = project(measured, Question(context=8192))
    o, k = measured.kernels, p.kernels
    att = ((o["op"] == "aten::_scaled_dot_product_cudnn_attention") & (o["phase"] == "decode")).to_numpy()
    kk = json.loads(o.loc[att, "op_shapes"].iloc[0])[1]
    assert kk[2] == 2049  # the first decode step attends the prompt and its first token
    # the op's cost (4*B*H*Lq*S*E) is split over its kernels by time; each keeps its share at the new S
    first = np.flatnonzero(att)[0]
    assert k["flops"].iloc[first] / o["flops"].iloc[first] == pytest.approx((8192 + 1) / 2049, rel=1e-12)
    last = np.flatnonzero(att)[-1]  # the last decode step: 63 tokens past the prompt
    assert k["flops"].iloc[last] / o["flops"].iloc[last] == pytest.approx((8192 + 63) / (2048 + 63), rel=1e-12)
    # the decode steps now read a KV cache 8192/2048 times larger; prefill is untouched
    pre = (o["phase"] == "prefill").to_numpy()
    assert np.array_equal(k.loc[pre, "flops"].fillna(-1).to_numpy(), o.loc[pre, "flops"].fillna(-1).to_numpy())


def test_weights_and_kv_dtype(measured: Report) -> None:
    p = project(measured, Question(weights_dtype="fp8", kv_dtype="fp8"))
    o, k = measured.kernels, p.kernels
    mm = ((o["op"] == "aten::mm") & (o["phase"] == "decode")).to_numpy()
    assert (k.loc[mm, "precision"] == "fp8").all()
    assert (k.loc[mm, "flops"].to_numpy() == o.loc[mm, "flops"].to_numpy()).all()
    # a decode GEMM's bytes are its weight: about half of them in fp8
    ratio = k.loc[mm, "dram_bytes"].sum() / o.loc[mm, "dram_bytes"].sum()
    assert 0.5 < ratio < 0.52
    assert (p.steps["weight_bytes"] == measured.steps.sort_values("start_ns")["weight_bytes"].to_numpy() / 2).all()


def test_gpu_projection_keeps_host_gaps_and_says_launch_bound(measured: Report) -> None:
    p = project(measured, Question(gpu="B200"))
    assert p.device.name.startswith("B200")
    notes = " ".join(p.manifest["projection"]["notes"])
    assert "decode is launch-bound" in notes
    k = p.kernels
    gemm = (k["category"] == "gemm").to_numpy() & (k["projection_rule"] == "efficiency-kept").to_numpy()
    # a faster GPU: every costed GEMM is faster, none by more than the datasheet FLOP/s ratio
    old = measured.kernels["duration_ns"].to_numpy()[gemm]
    new = k["duration_ns"].to_numpy()[gemm]
    b200, h200 = p.device.peak_flops("bf16"), measured.device.peak_flops("bf16")
    assert (new <= old).all() and (old / new <= b200 / h200 * 1.001 + 1e-9).all()
    # the decode step stays about as long: its time is the host's
    dec = p.manifest["projection"]["phases"]["decode"]
    assert dec["projected_s"] == pytest.approx(dec["measured_s"], rel=0.05)


def test_a_launch_bound_note_names_its_batch(measured: Report) -> None:
    """Issue 45: `whatif --gpu B200 --batch 1,8` printed "decode is launch-bound on B200" twice, with
    different numbers and no batch named. Each note names the question it answers."""
    notes = [n for b in (1, 8) for n in project(measured, Question(gpu="B200", batch=b)).manifest["projection"]["notes"]
             if n.startswith("decode is launch-bound")]
    assert len(notes) == 2 and len(set(notes)) == 2
    assert "on B200 (HGX, per GPU) at batch 1:" in notes[0] and "on B200 (HGX, per GPU) at batch 8:" in notes[1]


def test_unknown_gpu_and_dtype_are_one_line(measured: Report, fixtures_dir, capsys) -> None:
    with pytest.raises(UsageError, match="--gpu Z9000: no datasheet row"):
        project(measured, Question(gpu="Z9000"))
    with pytest.raises(UsageError, match="--kv-dtype int3"):
        project(measured, Question(kv_dtype="int3"))
    code = main(["whatif", str(fixtures_dir / H200), "--gpu", "Q7777-nope"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Q7777-nope" in err and "Traceback" not in err


def test_sweep_and_outputs(measured: Report, tmp_path) -> None:
    assert [q.batch for q in sweep(batch=[1, 8], gpu="B200")] == [1, 8]
    results = run_whatif(measured, out=tmp_path, gpu=["B200"], batch=[1, 4])
    assert len(results) == 2 and all(r.path is not None and r.path.is_dir() for r in results)
    loaded = Report.load(results[1].path)
    assert loaded.manifest["projection"]["question"]["batch"] == 4
    assert "PROJECTED, not measured" in loaded.summary()
    assert "PROJECTED, not measured" in (results[1].path / "report.html").read_text(encoding="utf-8")
    from perfscope.analysis.summaries.compare import compare

    c = compare(measured, loaded)
    assert len(c.verdict)
    from perfscope.dashboard.export.perfetto import export_trace

    stats = export_trace(loaded, tmp_path / "p.pftrace")
    assert stats.slices
    assert results[1].metrics["decode_tokens_per_s"] > 3 * results[0].metrics["decode_tokens_per_s"]
    single = measured.whatif(gpu="B200")
    assert isinstance(single, Report)


def test_shape_rules() -> None:
    old, new = Dims(1, 2048, 2048, 2111), Dims(4, 512, 512, 575)
    s, t = rewrite("aten::mm", [[2048, 2048], [2048, 3072]], ["c10::BFloat16"] * 2, old, new, weights_dtype="fp8")
    assert s == [[2048, 2048], [2048, 3072]] and t[1] == "c10::Float8_e4m3fn"  # 4 x 512 = 2048 tokens again
    s, _ = rewrite("aten::add", [[1, 2048, 2048], [1, 2048, 2048]], ["c10::BFloat16"] * 2, old, new)
    assert s == [[4, 512, 2048], [4, 512, 2048]]  # batch and sequence move, the hidden size (2048 too) stays
    s, t = rewrite("aten::_scaled_dot_product_flash_attention", [[1, 32, 2048, 64], [1, 8, 2111, 64], [1, 8, 2111, 64]],
                   ["c10::BFloat16"] * 3, old, new, kv_dtype="fp8")
    assert s == [[4, 32, 512, 64], [4, 8, 575, 64], [4, 8, 575, 64]] and t[1:] == ["c10::Float8_e4m3fn"] * 2


def test_time_model_rules() -> None:
    src = Roofs({"bf16": 100e12}, 1e12, "s")
    tgt = Roofs({"bf16": 300e12}, 2e12, "t")
    prec = pd.Series(["bf16"] * 3)
    fam = pd.Series(["g"] * 3)
    # compute-heavy kernels: 1e12 FLOPs at 50% -> 20 ms on the source
    out = project_times(np.array([0.02, 0.04, 0.001]), np.array([1e12, 2e12, 1e10]), np.array([1e6, 1e6, 1e6]),
                        prec, fam, src, tgt)
    t0 = 0.0005  # half the family's shortest kernel
    r_src = 1e12 / 100e12 + 1e6 / 1e12
    r_tgt = 1e12 / 300e12 + 1e6 / 2e12
    assert out["time_s"].iloc[0] == pytest.approx(t0 + (0.02 - t0) * r_tgt / r_src)
    assert (out["rule"] == "efficiency-kept").all()
    unknown = project_times(np.array([0.01]), np.array([np.nan]), np.array([np.nan]), pd.Series(["bf16"]),
                            pd.Series(["x"]), src, tgt)
    assert unknown["rule"].iloc[0] == "unknown-cost" and unknown["time_s"].iloc[0] == pytest.approx(0.005)
    # a family at several sizes: the line T = t0 + c R through them
    r = np.array([1e-6, 1e-5, 1e-4, 1e-3])
    t0_, c_ = family_fit(5e-6 + 2 * r, r, pd.Series(["f"] * 4))
    assert t0_[0] == pytest.approx(5e-6) and c_[0] == pytest.approx(2.0)


def test_speculative_acceptance_per_position() -> None:
    steps = pd.DataFrame({"phase": ["verify"] * 4, "drafted": [4, 4, 4, 2], "accepted": [0, 1, 4, 2]})
    # position 1: 3 of 4 accepted; 2: of the 3 that reached it, 2 (4 and 2); 3: 1 of the 1 that drafted it
    assert acceptance_per_position(steps) == [0.75, 2 / 3, 1.0, 1.0]


def test_speculative_needs_a_drafting_run(measured: Report) -> None:
    with pytest.raises(UsageError, match="no speculative verify steps"):
        speculative_sweep(measured, [1, 2])


# ------------------------------------------------------------------ the cross-GPU error, measured
def test_crossgpu_error_bounds(fixtures_dir) -> None:
    """Every 5th row of each crossgpu table, projected onto the other GPU with its datasheet roofs.

    Bounds are what the model achieves (docs/whatif.md has the full-table numbers): GEMMs within the
    issue's 15%, attention and the other operators within 25%, each ahead of both baselines. The A40
    pairs are asserted too; A100 -> MI210 (LLMCompass, 88 rows) misses the goals and is reported, not
    asserted: ROCm's kernels there reach ~40% of the MI210's bandwidth where the A100's reach ~100%, an
    efficiency no A100 measurement carries (docs/whatif.md)."""
    missing: list[str] = []
    rows = validate(fixtures_dir / "crossgpu", every=5, missing=missing)
    table = error_table(rows)
    kinds = table[table["pair"] == "all pairs"].set_index("table")
    gemm, attention, other = kinds.loc["ALL gemm"], kinds.loc["ALL attention"], kinds.loc["ALL other"]
    assert gemm["rows"] > 2500
    assert gemm["model_pct"] <= 15.0 and gemm["model_pct"] < gemm["ratio_pct"] and gemm["model_pct"] < gemm["roof_pct"]
    assert attention["model_pct"] <= 25.0 and attention["model_pct"] < attention["ratio_pct"] \
        and attention["model_pct"] < attention["roof_pct"]
    assert other["model_pct"] <= 25.0 and other["model_pct"] < other["roof_pct"] and other["model_pct"] < other["ratio_pct"]
    assert all("no datasheet row" in m for m in missing)
    for pair in ("a100->h100", "a100->a40"):
        per = table[table["pair"] == pair].set_index("table")
        for kind, goal in (("ALL gemm", 15.0), ("ALL attention", 25.0), ("ALL other", 25.0)):
            if kind in per.index:
                r = per.loc[kind]
                assert r["model_pct"] <= goal and r["model_pct"] < r["ratio_pct"] and r["model_pct"] < r["roof_pct"], \
                    (pair, kind, r.to_dict())
    assert math.isfinite(float(rows["pred_model_s"].median()))


def test_target_roofs_from_a_report_that_describes_its_own_device(fixtures_dir) -> None:
    """`--gpu REPORT` of a rocprof-compute workload (an MI210: 104 CUs, 1700 MHz, no datasheet row matched
    by name): its measured roofs, and the SMs x clock the blend rule needs, from the report itself."""
    from perfscope.analysis.projection.times import Roofs
    from perfscope.analysis.readers.detect import import_file

    roofs = Roofs.of(import_file(fixtures_dir / "rocprof/rocprof_compute_vcopy_MI200").device)
    assert roofs.bytes_per_s == pytest.approx(1388.9302e9)  # roofline.csv HBMBw, row 0
    assert roofs.flops_per_s["fp16"] == pytest.approx(164938.17e9)  # MFMAF16Flops
    assert roofs.sm_mhz == 104 * 1700


def _cycles(pairs: list[tuple[int, int]]) -> pd.DataFrame:
    return pd.DataFrame({"phase": ["verify" if d else "decode" for d, _ in pairs], "batch": 1,
                         "drafted": [d for d, _ in pairs], "accepted": [a for _, a in pairs],
                         "start_ns": range(len(pairs))})


def test_speculative_replay_of_the_measured_cycles() -> None:
    """Three cycles at K=4: all 4 drafts accepted, 1 of 4 (a rejection), a decode step: 8 tokens.
    K=1 from the same tokens: tokens 0, 2 (inside the first run), 4 (the token after a fully accepted
    draft: not measured, accepted with the tail probability 1.0), 6 (the rejected token: none), 7: five
    cycles. K=6 with tail 0.5: the first cycle takes 4, then token 4 with p 0.5, then the second run's
    token 5: 4 or 6 accepted, then 2 or 1 more cycles: 2.5 cycles expected."""
    from perfscope.analysis.projection.speculative import cycles_replayed

    steps = _cycles([(4, 4), (4, 1), (0, 0)])
    got = cycles_replayed(steps, [1, 2, 4], 4, 1.0)
    assert got == {1: pytest.approx(8 / 5), 2: pytest.approx(8 / 4), 4: pytest.approx(8 / 3)}  # K=4: as measured
    assert cycles_replayed(steps, [6], 4, 0.5) == {6: pytest.approx(8 / 2.5)}
    # a lookup that found fewer drafts than K had no more to offer: K=6 gains nothing there
    assert cycles_replayed(_cycles([(2, 2), (0, 0)]), [6], 4, 1.0) == {6: pytest.approx(4 / 2)}
    # several sequences per step: not replayed (the acceptance formula is used)
    assert cycles_replayed(steps.assign(batch=2), [1], 4, 1.0) is None


def test_a_framework_trace_without_a_prompt_or_requests(fixtures_dir, capsys) -> None:
    """vLLM's own step ranges on B200 (a trace this model was not written against): its prefill step
    records no context length and the trace no requests. A batch question is one line and exit 2 (it was
    a TypeError traceback); a GPU question projects the steps and invents no request, so no TTFT appears
    where the measured run has none."""
    from perfscope.analysis.readers.detect import import_file

    report = import_file(fixtures_dir / "kineto/tracelens_b200__eager_trace.json.gz")
    assert len(report.steps) and not len(report.requests)
    code = main(["whatif", str(fixtures_dir / "kineto/tracelens_b200__eager_trace.json.gz"), "--batch", "4"])
    err = capsys.readouterr().err
    assert code == 2 and "no engine steps with batch and prompt length" in err and "Traceback" not in err
    proj = project(report, Question(gpu="H100 SXM5"))
    assert len(proj.steps) == len(report.steps) and not len(proj.requests)


def test_launch_bound_verdict_leaves_outlier_steps_out(fixtures_dir) -> None:
    """SGLang's one profiled decode step on MI300X is a 463 ms host stall at the profiler's start (an
    outlier the analysis keeps out of the headline): a projection onto an H200 does not call decode
    launch-bound from it. The B200 vLLM prefill, busy under a fifth of its steady step, still is."""
    from perfscope.analysis.readers.detect import import_file

    sglang = import_file(fixtures_dir / "thirdparty/tracelens_sglang_decode/sglang_Qwen3-8B_decode.json.gz")
    assert sglang.steps["outlier"].notna().all()
    notes = project(sglang, Question(gpu="H200 SXM")).manifest["projection"]["notes"]
    assert not any("launch-bound" in n for n in notes)
    b200 = import_file(fixtures_dir / "kineto/tracelens_b200__eager_trace.json.gz")
    notes = project(b200, Question(gpu="H200 SXM")).manifest["projection"]["notes"]
    assert any(n.startswith("prefill is launch-bound") for n in notes)
