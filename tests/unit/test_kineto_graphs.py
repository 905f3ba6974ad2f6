"""CUDA-graph replays in Kineto traces: every replayed kernel gets an op and FLOPs/bytes.

Checked on the real H200 captures of the reference engine (llama-3.2-1b, batch 2, prompt 256,
8 new tokens; tests/fixtures/h200/README.md) against the analytic cost of the model.
"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from perfscope.analysis.readers.kineto.graphs import kernel_role
from perfscope.analysis.readers.kineto.reader import read_kineto

GRAPH = "h200/h200_llama1b_engine_cudagraph.pt.trace.json.gz"
EAGER = "h200/h200_llama1b_engine_eager.pt.trace.json.gz"

# llama-3.2-1b: dim 2048, 32 heads, 8 KV heads, head dim 64, MLP 8192, 16 layers, vocab 128256
DIM, HEADS, HEAD_DIM, LAYERS, VOCAB = 2048, 32, 64, 16, 128256
LAYER_GEMMS = [(DIM, 3072), (DIM, DIM), (DIM, 16384), (8192, DIM)]  # (K, N): QKV, out, gate/up, down
LAYER_PARAMS = sum(k * n for k, n in LAYER_GEMMS)
BATCH, PROMPT = 2, 256


def attention_flops(q_len: int, kv_len: int) -> float:
    """QK^T and PV over all layers (the explicit mask makes the kernel compute every tile)."""
    return LAYERS * 4.0 * BATCH * HEADS * q_len * kv_len * HEAD_DIM


def decode_step_flops(step: int) -> float:
    """2 x params x batch (the LM head on the new token only) + attention over the context."""
    return 2.0 * BATCH * (LAYERS * LAYER_PARAMS + DIM * VOCAB) + attention_flops(1, PROMPT + step)


@pytest.fixture(scope="module")
def graph(fixtures_dir):
    return read_kineto(fixtures_dir / GRAPH)


@pytest.fixture(scope="module")
def eager(fixtures_dir):
    return read_kineto(fixtures_dir / EAGER)


def per_decode_step(report) -> list[float]:
    """Kernel FLOPs of each decode step (kernels of a step: launched inside its range)."""
    k = report.kernels
    steps = report.ranges[report.ranges["name"] == "decode"].sort_values("start_ns")
    dec = k[k["phase"] == "decode"].sort_values("start_ns")
    # a step's kernels run before the next step's first launch: cut at the step starts
    cuts = np.searchsorted(dec["start_ns"].to_numpy(), steps["start_ns"].to_numpy()[1:])
    return [float(np.nansum(part)) for part in np.split(dec["flops"].to_numpy(), cuts)]


def test_graph_replays_cover_decode_kernel_time(graph):
    k = graph.kernels
    dec = k[k["phase"] == "decode"]
    costed = dec["flops"].notna() & dec["dram_bytes"].notna()
    assert dec.loc[costed, "duration_ns"].sum() >= 0.95 * dec["duration_ns"].sum()
    replayed = k["flops_source"].isin(["graph-match", "graph-shapes", "graph-scaled"])
    assert replayed.sum() == 1386  # 7 replays x 198 kernels, all of them
    # the LM head GEMM has the same shape in prefill (last token only) and decode: an exact twin
    twins = k[k["flops_source"] == "graph-match"]
    assert len(twins) == 7 and (twins["op_shapes"] == f"[[{BATCH},{DIM}],[{DIM},{VOCAB}]]").all()
    assert k.loc[replayed, "op"].notna().all()
    gemms = k[replayed & k["name"].map(kernel_role).eq("gemm")]
    assert len(gemms) == 7 * (4 * LAYERS + 1)
    assert (gemms["op"] == "aten::mm").all()


def test_graph_decode_step_flops_match_the_model(graph, eager):
    got = per_decode_step(graph)
    want = [decode_step_flops(s) for s in range(1, 8)]
    assert len(got) == 7
    np.testing.assert_allclose(got, want, rtol=0.002)  # the rest: norms, rope, SiLU (0.05%)
    # and the same as the eager run of the same steps, whose ops recorded their shapes
    np.testing.assert_allclose(got, per_decode_step(eager), rtol=1e-4)
    g, e = graph.kernels, eager.kernels
    assert g.loc[g["phase"] == "decode", "dram_bytes"].sum() == pytest.approx(
        e.loc[e["phase"] == "decode", "dram_bytes"].sum(), rel=0.05)


def test_graph_gemm_shapes_are_the_decode_shapes(graph):
    k = graph.kernels
    gem = k[k["flops_source"].isin(["graph-shapes", "graph-match"]) & (k["op"] == "aten::mm")]
    per_shape = gem.groupby("op_shapes")["flops"].sum().to_dict()
    reps = 7
    for kk, n in LAYER_GEMMS:
        shape = f"[[{BATCH},{kk}],[{kk},{n}]]"
        assert per_shape[shape] == pytest.approx(reps * LAYERS * 2 * BATCH * kk * n, rel=1e-9)
    assert per_shape[f"[[{BATCH},{DIM}],[{DIM},{VOCAB}]]"] == pytest.approx(reps * 2 * BATCH * DIM * VOCAB)
    attn = k[(k["flops_source"] == "graph-shapes") & (k["category"] == "attention")]
    kv = sorted({json.loads(s)[1][2] for s in attn["op_shapes"]})
    assert kv == list(range(PROMPT + 1, PROMPT + 8))  # the context grows one token per step


def test_eager_fixture_gemm_flops_are_2mnk_and_not_double_counted(eager):
    k = eager.kernels
    pre = k[k["phase"] == "prefill"]
    m = BATCH * PROMPT
    gemm = pre[pre["category"] == "gemm"]
    want_gemm = LAYERS * sum(2.0 * m * kk * n for kk, n in LAYER_GEMMS) + 2.0 * BATCH * DIM * VOCAB
    assert gemm["flops"].sum() == pytest.approx(want_gemm, rel=1e-9)
    for kk, n in LAYER_GEMMS:
        rows = gemm[gemm["op_shapes"] == f"[[{m},{kk}],[{kk},{n}]]"]
        assert rows["flops"].sum() == pytest.approx(LAYERS * 2.0 * m * kk * n, rel=1e-9)
        assert (rows["op"] == "aten::mm").all()  # not aten::linear / matmul as well
    attn = pre[pre["category"] == "attention"]
    assert attn["flops"].sum() == pytest.approx(attention_flops(PROMPT, PROMPT), rel=1e-9)
    # the rest (norms, rope, elementwise) is small: nothing is counted twice
    rest = pre["flops"].sum() - gemm["flops"].sum() - attn["flops"].sum()
    assert 0 <= rest < 0.005 * pre["flops"].sum()
    np.testing.assert_allclose(per_decode_step(eager), [decode_step_flops(s) for s in range(1, 8)], rtol=0.01)


def _as_graph_replay(doc: dict, step: int, *, swap: bool = False) -> tuple[dict, int]:
    """The eager trace with the kernels of decode step ``step`` relinked to one cudaGraphLaunch."""
    ev = doc["traceEvents"]
    dec = sorted((e for e in ev if e.get("cat") == "user_annotation" and e["name"] == "decode"), key=lambda e: e["ts"])
    lo, hi = dec[step - 1]["ts"], dec[step]["ts"] if step < len(dec) else float("inf")
    api = {e["args"]["correlation"]: e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    kernels = sorted((e for e in ev if e.get("cat") == "kernel"
                      and lo <= api.get(e["args"].get("correlation"), {"ts": -1})["ts"] < hi), key=lambda e: e["ts"])
    corr = 10**9
    for e in kernels:
        e["args"]["correlation"] = corr
        e["args"].pop("External id", None)
    if swap:  # break the exact sequence: the two first kernels run the other way round
        kernels[0]["ts"], kernels[1]["ts"] = kernels[1]["ts"], kernels[0]["ts"]
    ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": dec[step - 1]["pid"],
               "tid": dec[step - 1]["tid"], "ts": lo + 1.0, "dur": 5.0, "args": {"correlation": corr}})
    return doc, len(kernels)


@pytest.mark.parametrize("swap, sources", [
    (False, {"graph-capture"}),
    # the exact sequence is gone: kernels with a same-grid twin of one cost copy it, the attention
    # kernels (their KV length differs per step) get shapes re-derived from the nearest eager step
    (True, {"graph-match", "graph-shapes"}),
])
def test_replay_of_a_step_also_run_eagerly(fixtures_dir, tmp_path, swap, sources):
    """A replay whose kernels were also launched eagerly (the capture / warm-up run) copies
    their costs; when the sequence differs, they are matched kernel by kernel or re-derived."""
    with gzip.open(fixtures_dir / EAGER, "rt") as fh:
        doc = json.load(fh)
    path = tmp_path / "replay.json.gz"
    doc, n = _as_graph_replay(doc, 6, swap=swap)
    with gzip.open(path, "wt") as fh:
        json.dump(doc, fh)
    r = read_kineto(path)
    k = r.kernels
    rep = k[k["correlation"] == 10**9]
    assert len(rep) == n >= 444
    assert set(rep["flops_source"].dropna()) == sources
    if swap:
        attn = rep[rep["category"] == "attention"]
        assert (attn["flops_source"] == "graph-shapes").all()
        assert {json.loads(s)[1][2] for s in attn["op_shapes"]} == {PROMPT + 6}
    costed = rep["flops"].notna()
    assert rep.loc[costed, "op"].notna().all()
    assert rep.loc[costed, "duration_ns"].sum() > 0.95 * rep["duration_ns"].sum()
    got = per_decode_step(r)
    assert got[5] == pytest.approx(decode_step_flops(6), rel=0.01)
    mm = rep[rep["op"] == "aten::mm"]
    assert mm["flops"].sum() == pytest.approx(2.0 * BATCH * (LAYERS * LAYER_PARAMS + DIM * VOCAB), rel=1e-9)


# ---------------------------------------------------------------------------- findings know the mode
OVERHEAD_RULES = ("gpu-idle", "launch-overhead", "short-kernels")


def _advice(report) -> dict[str, str]:
    from perfscope.analysis.findings import run_rules

    return {f.id: f.recommendation for f in run_rules(report) if f.id in OVERHEAD_RULES}


def test_eager_run_findings_recommend_cuda_graphs(eager):
    advice = _advice(eager)
    # launch calls cover a sixth of the idle time; the rest is the host's per-operator work between
    # launches (gaps of ~8 µs), so the run is not called launch-bound (issue 29), but graphs still
    # remove that work: gpu-idle and short-kernels recommend them
    assert set(advice) == {"gpu-idle", "short-kernels"}
    from perfscope.analysis.findings import RULES

    (idle,) = RULES["gpu-idle"](eager)
    assert idle.evidence["idle_cause"] == "host" and idle.evidence["idle_launch_pct"] < 50
    for text in advice.values():
        assert "CUDA graph" in text
        assert "already replays" not in text


def test_graph_run_findings_point_at_what_graphs_leave(graph):
    from perfscope.analysis.findings import run_rules

    findings = {f.id: f for f in run_rules(graph) if f.id in OVERHEAD_RULES}
    assert findings  # the graph run still idles between replays
    for f in findings.values():
        text = f.recommendation
        assert "already replays CUDA graphs (7 replays" in text
        assert "reduce-overhead" not in text and "capture repeated sequences" not in text
        assert "between replays" in text
        assert "nvjet_sm90_tst_128x8_64x12_2x1_v_bz_TNT" in text  # the largest kernel, with its roof share
        assert f.evidence["graph_replays"] == 7
        assert f.evidence["graph_launched_kernels"] == 1386
    # the time between replays, from the replayed kernels themselves
    k = graph.kernels
    rep = k[k["flops_source"].astype("object").fillna("").str.startswith("graph-")]
    spans = rep.groupby("correlation").agg(start=("start_ns", "min"), end=("end_ns", "max")).sort_values("start")
    between = float((spans["start"].to_numpy()[1:] - spans["end"].to_numpy()[:-1]).sum())
    ev = findings["gpu-idle"].evidence
    assert ev["time_between_replays_ns"] == pytest.approx(between)
    assert 0.5 * between < ev["idle_between_replays_ns"] <= between  # sampling kernels run in between
    short = findings["short-kernels"]
    assert short.evidence["graph_launched_short_kernels"] > 0
    # a replayed kernel has no launch of its own: only the eager ones' gaps are launch overhead
    if "launch-overhead" in findings:
        assert findings["launch-overhead"].evidence["launches"] == 1848 - 1386


def test_compiled_manifest_marks_a_graph_run(eager):
    from perfscope.analysis.rules.timeline import graph_mode

    assert not graph_mode(eager).is_graph_run
    compiled = eager.with_manifest(params={**eager.params, "compile": True})
    assert graph_mode(compiled).is_graph_run
    for text in _advice(compiled).values():
        assert "already replays CUDA graphs (compiled: compile=True)" in text


@pytest.mark.parametrize("name, role", [
    ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", "gemm"),
    ("void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, 128, 16, 4, 4, false>", "gemm"),
    ("triton_tem_fused_mm_0", "gemm"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>", "reduce"),
    ("void flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_traits<64>>", "reduce"),
    ("cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_35_16x128x64_1x4x1_cga1x1x1_kernel0_0",
     "attention"),
    ("triton_poi_fused__scaled_dot_product_cudnn_attention__unsafe_view_3", "fused"),
    ("triton_red_fused__fused_rms_norm__to_copy_embedding_mul_0", "fused"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "fused"),
])
def test_kernel_roles(name, role):
    assert kernel_role(name) == role


def test_engine_profile_entry_point_costs_graph_replays(fixtures_dir):
    """``perfscope profile`` builds its tables with ``build_tables`` (session.py): same costs."""
    from perfscope.analysis.readers.kineto.parse import parse_trace
    from perfscope.analysis.readers.kineto.reader import build_tables

    tables, warnings = build_tables(parse_trace(fixtures_dir / GRAPH))
    k = tables["kernels"]
    assert k["flops_source"].astype("object").fillna("").str.startswith("graph-").sum() == 1386
    assert not any("CUDA graph" in w for w in warnings)


def test_replays_without_an_eager_step_stay_missing_with_a_warning(fixtures_dir, tmp_path):
    """No eager step of the model in the trace (only the decode replays): nothing is guessed."""
    with gzip.open(fixtures_dir / GRAPH, "rt") as fh:
        doc = json.load(fh)
    pre = next(e for e in doc["traceEvents"] if e.get("cat") == "user_annotation" and e["name"] == "prefill")
    lo, hi = pre["ts"], pre["ts"] + pre["dur"]
    api = {e["args"]["correlation"]: e["ts"] for e in doc["traceEvents"]
           if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not (
        (e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver") and lo <= e.get("ts", 0) <= hi)
        or (e.get("cat") == "kernel" and lo <= api.get(e["args"].get("correlation"), -1) <= hi))]
    path = tmp_path / "replays_only.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump(doc, fh)
    r = read_kineto(path)
    k = r.kernels
    assert not k["flops_source"].astype("object").fillna("").str.startswith("graph-").any()
    assert any("7 of 7 CUDA graph replays have no eager twin" in w for w in r.warnings)


def _with_steps(report):
    """The report with engine step records on its prefill/decode ranges (llama-3.2-1b, bf16)."""
    import pandas as pd

    rg = report.ranges[report.ranges["name"].isin(["prefill", "decode"])].sort_values("start_ns")
    weights = 2.0 * (LAYERS * LAYER_PARAMS + DIM * VOCAB)
    kv_per_token = 2 * LAYERS * 8 * HEAD_DIM * 2.0  # K and V, 8 KV heads, bf16
    rows = [{"step": i, "phase": r.name, "batch": BATCH, "tokens": BATCH * (PROMPT if r.name == "prefill" else 1),
             "context_len": PROMPT + i, "start_ns": int(r.start_ns), "end_ns": int(r.end_ns),
             "duration_ns": int(r.end_ns - r.start_ns), "weight_bytes": weights,
             "kv_cache_bytes": BATCH * (PROMPT + i) * kv_per_token, "kv_cache_size_bytes": np.nan}
            for i, r in enumerate(rg.itertuples(index=False))]
    return report.replace(steps=pd.DataFrame(rows))


def test_decode_mbu_advice_knows_the_mode(graph, eager):
    from perfscope.analysis.findings import RULES

    (g,) = RULES["decode-mbu"](_with_steps(graph))
    (e,) = RULES["decode-mbu"](_with_steps(eager))
    assert "already replays CUDA graphs (7 replays" in g.recommendation
    assert "reduce-overhead" not in g.recommendation
    assert g.evidence["graph_replays"] == 7
    assert "already replays" not in e.recommendation
    # the eager run: the advice follows the largest kind of gaps inside its decode steps (docs/findings.md,
    # the evidence rule): CUDA graphs for dispatch or launch gaps only, else move the host work
    from perfscope.analysis.idle import GRAPH_KINDS, largest_kind

    kinds: dict[str, float] = {}
    for i in e.items:
        if i.attrs.get("kind"):
            kinds[str(i.attrs["kind"])] = kinds.get(str(i.attrs["kind"]), 0.0) + i.time_ns
    if largest_kind(kinds) in GRAPH_KINDS:
        assert "CUDA graph" in e.recommendation
    else:
        top = next(i for i in e.items if i.kind == "gaps")
        assert "Move or overlap this host work" in e.recommendation and top.attrs["range"] in e.recommendation
        assert "CUDA graph" not in e.recommendation
