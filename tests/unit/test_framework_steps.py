"""Steps of vLLM, SGLang and hand-marked ranges (analysis/steps.py), on the real traces."""

from __future__ import annotations

import gzip
import itertools
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.readers.finish import Imported, finish
from perfscope.analysis.readers.kineto.reader import read_kineto
from perfscope.analysis.steps import (
    UNKNOWN,
    assign_kernels_to_steps,
    parse_step_label,
    steps_from_ranges,
)
from perfscope.kernel_names import short_kernel_name

B200 = "kineto/tracelens_b200__eager_trace.json.gz"
VLLM_GRAPH = "thirdparty/tracelens_vllm_decode_full/graph_execution.json.gz"
SGLANG = "thirdparty/tracelens_sglang_decode/sglang_Qwen3-8B_decode.json.gz"
STEP_NAME = re.compile(r"execute_|step\[")


def _cpu_annotations(path: Path) -> list[dict]:
    """The file's CPU-side record_function events whose name is a step annotation (independent of
    perfscope's reader: a plain JSON scan)."""
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    return [e for e in events if e.get("cat") == "user_annotation" and e.get("ph") == "X"
            and STEP_NAME.match(e.get("name", ""))]


def _outermost(events: list[dict]) -> int:
    """Annotations not inside another one of the same thread (one step each)."""
    n = 0
    for e in events:
        inside = any(o is not e and o["tid"] == e["tid"] and o["ts"] <= e["ts"]
                     and o["ts"] + o["dur"] >= e["ts"] + e["dur"] for o in events)
        n += not inside
    return n


# ---------------------------------------------------------------------------- labels
def test_vllm_compact_label_of_the_b200_trace() -> None:
    s = parse_step_label("execute_context_1(888_788544)_generation_0(0)")
    assert s is not None and s is not UNKNOWN
    assert (s.framework, s.phase, s.batch, s.tokens, s.prefill_tokens, s.prefill_seqs, s.decode_seqs) == \
        ("vllm", "prefill", 1, 888, 888, 1, 0)
    assert s.context_tokens == 888  # one request: its context is 788544 / 888
    assert s.attention_prefill_share == 1.0


def test_vllm_compact_mixed_step_splits_attention_by_q_times_k() -> None:
    # one prefill of 100 new tokens on a 300-token context (q*k = 30000), 4 decodes on 1000 tokens in all
    s = parse_step_label("execute_context_1(100_30000)_generation_4(4_1000)")
    assert s.phase == "mixed" and s.tokens == 104 and s.prefill_tokens == 100 and s.decode_seqs == 4
    assert s.context_tokens == 300 + 1000
    assert s.attention_prefill_share == pytest.approx(30000 / 31000)


def test_vllm_detailed_label() -> None:
    s = parse_step_label("execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk55086sqsq32sqsk55086)")
    assert (s.phase, s.batch, s.tokens, s.decode_seqs, s.prefill_seqs, s.context_tokens) == \
        ("decode", 32, 32, 32, 0, 55086)
    assert s.attention_prefill_share == 0.0
    mixed = parse_step_label("execute_40_context_1(sq8sk8sqsq64sqsk64)_generation_32(sq32sk5000sqsq32sqsk5000)")
    assert mixed.phase == "mixed" and mixed.prefill_tokens == 8 and mixed.context_tokens == 5008
    assert mixed.attention_prefill_share == pytest.approx(64 / 5064)


def test_vllm_older_label() -> None:
    s = parse_step_label("execute_new_2_cached_6")
    assert (s.phase, s.batch, s.prefill_seqs, s.decode_seqs, s.tokens) == ("mixed", 8, 2, 6, None)
    assert parse_step_label("execute_new_0_cached_6").phase == "decode"
    assert parse_step_label("execute_new_3_cached_0").phase == "prefill"


@pytest.mark.parametrize(("name", "phase", "batch", "tokens"), [
    ("step[EXTEND bs=4 toks=2048]", "prefill", 4, 2048),
    ("step[DECODE bs=32]", "decode", 32, 32),
    ("step[MIXED bs=9 toks=520]", "mixed", 9, 520),
    ("step[TARGET_VERIFY bs=8 toks=32]", "verify", 8, 32),
    ("step[DRAFT_EXTEND bs=8 toks=16]", "draft", 8, 16),
    ("step[IDLE bs=0]", "idle", 0, 0),
])
def test_sglang_labels(name: str, phase: str, batch: int, tokens: int) -> None:
    s = parse_step_label(name)
    assert (s.framework, s.phase, s.batch, s.tokens) == ("sglang", phase, batch, tokens)


def test_hand_marked_label() -> None:
    s = parse_step_label("perfscope.step[decode bs=8 toks=8 ctx=4096]")
    assert (s.framework, s.phase, s.batch, s.tokens, s.context_tokens, s.decode_seqs) == ("user", "decode", 8, 8, 4096, 8)
    assert parse_step_label("perfscope.step[prefill bs=1 toks=17]").prefill_tokens == 17


@pytest.mark.parametrize("name", [
    "execute_context_1(888_78",                     # truncated
    "execute_3_context_1(sq1sk1)_generation_2(sq2)",  # a new detailed form
    "execute_context_x(1)_generation_0(0)",
    "step[WARMUP bs=4]",                            # an unknown SGLang mode
    "step[DECODE bs=3",                              # truncated
    "perfscope.step[sample bs=1]",
    "execute_new_1_cached_" + "9" * 5000,          # huge number: still a step, no crash
])
def test_unknown_or_truncated_labels_are_recognised_as_such(name: str) -> None:
    s = parse_step_label(name)
    assert s is UNKNOWN or (s is not None and s.framework == "vllm")


@pytest.mark.parametrize("name", ["prefill", "decode", "layer.3", "ProfilerStep#4", "execute_model", "", None, 3.5,
                                  "## Call CompiledFxGraph abc ##", "nccl:_all_gather_base"])
def test_other_ranges_are_not_steps(name: object) -> None:
    assert parse_step_label(name) is None


def test_fuzzed_names_never_raise() -> None:
    rng = np.random.default_rng(7)
    alphabet = list("execut_contxgnrainw()[]sqk0123456789 =bsDECOdeEXTNDpfr.")
    for _ in range(3000):
        parse_step_label("".join(rng.choice(alphabet, size=int(rng.integers(0, 60)))))
    for base in ("execute_context_1(888_788544)_generation_0(0)", "step[EXTEND bs=4 toks=2048]",
                 "execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk55086sqsq32sqsk55086)"):
        for cut in range(len(base) + 1):
            parse_step_label(base[:cut])


# ---------------------------------------------------------------------------- real traces
@pytest.mark.parametrize(("rel", "framework", "phase"), [
    (B200, "vllm", "prefill"), (VLLM_GRAPH, "vllm", "decode"), (SGLANG, "sglang", "decode")])
def test_step_count_equals_the_annotations_in_the_file(fixtures_dir: Path, rel: str, framework: str,
                                                       phase: str) -> None:
    path = fixtures_dir / rel
    annotations = _cpu_annotations(path)
    r = read_kineto(path)
    assert len(r.steps) == _outermost(annotations) >= 1
    assert set(r.steps["framework"]) == {framework} and set(r.steps["phase"]) == {phase}
    # every kernel launched inside a step has its step and that step's phase
    k = r.kernels
    assert k["step"].notna().all() and set(k["phase"]) == {phase}
    assert int(r.steps["kernel_time_ns"].sum()) == int(k["duration_ns"].sum())


def test_sglang_two_annotations_are_one_step(fixtures_dir: Path) -> None:
    path = fixtures_dir / SGLANG
    names = [e["name"] for e in _cpu_annotations(path)]
    assert len(names) == 2 and sum(n.startswith("step[") for n in names) == 1
    r = read_kineto(path)
    s = r.steps.iloc[0]
    assert s["batch"] == 32 and s["decode_seqs"] == 32 and s["context_tokens"] == 32785  # sk of the execute_ range
    assert "step[DECODE bs=32]" in s["label"] and s["label"].startswith("execute_32_")
    outer = min(_cpu_annotations(path), key=lambda e: e["ts"])
    assert s["duration_ns"] == pytest.approx(outer["dur"] * 1000, abs=1000)


def test_graph_replayed_kernels_belong_to_the_step_of_their_graph_launch(fixtures_dir: Path) -> None:
    r = read_kineto(fixtures_dir / VLLM_GRAPH)
    s = r.steps.iloc[0]
    # the replayed kernels run on the GPU after the step's CPU window closed, and still are its kernels
    late = r.kernels["start_ns"] > s["end_ns"]
    assert late.sum() > 100 and r.kernels.loc[late, "step"].eq(0).all()


def test_engine_style_reports_keep_their_range_phases() -> None:
    ranges = pd.DataFrame({"id": [0, 1], "name": ["prefill", "decode"], "start_ns": [0, 100], "end_ns": [90, 200]})
    kernels = pd.DataFrame({"name": ["a", "b"], "device": "cuda:0", "start_ns": [10, 110], "end_ns": [20, 120],
                            "duration_ns": [10, 10], "phase": ["prefill", "decode"]})
    r = finish(Imported({"kernels": kernels, "ranges": ranges}))
    assert len(r.steps) == 0 and list(r.kernels["phase"]) == ["prefill", "decode"]


def _synthetic(names: list[str]) -> Imported:
    n = len(names)
    ranges = pd.DataFrame({"id": range(n), "name": names, "start_ns": [i * 1000 for i in range(n)],
                           "end_ns": [i * 1000 + 900 for i in range(n)], "thread": 1, "source": "nvtx"})
    kernels = pd.DataFrame({"name": [f"k{i}" for i in range(2 * n)], "device": "cuda:0",
                            "start_ns": [i * 500 + 50 for i in range(2 * n)],
                            "end_ns": [i * 500 + 450 for i in range(2 * n)], "duration_ns": 400,
                            "correlation": range(2 * n), "flops": 1e6, "dram_bytes": 1e3})
    api = pd.DataFrame({"name": "cudaLaunchKernel", "start_ns": [i * 500 + 10 for i in range(2 * n)],
                        "end_ns": [i * 500 + 20 for i in range(2 * n)], "correlation": range(2 * n)})
    return Imported({"kernels": kernels, "ranges": ranges, "api": api}, origin="synthetic.sqlite")


def test_nvtx_steps_through_the_pipeline() -> None:
    r = finish(_synthetic(["step[EXTEND bs=2 toks=64]", "step[DECODE bs=2]", "step[DECODE bs=2]"]))
    assert list(r.steps["phase"]) == ["prefill", "decode", "decode"]
    assert list(r.kernels["step"]) == [0, 0, 1, 1, 2, 2]
    assert list(r.steps["kernel_time_ns"]) == [800, 800, 800]
    assert list(r.steps["kernel_flops"]) == [2e6] * 3


def test_unknown_labels_warn_once_quoting_one_and_leave_kernels_without_phase() -> None:
    r = finish(_synthetic(["step[DECODE bs=2]", "execute_new_1_cach", "step[WARP bs=1]"]))
    notes = [w for w in r.warnings if "look like step annotations" in w]
    assert len(notes) == 1 and "'execute_new_1_cach'" in notes[0] and notes[0].startswith("2 range(s)")
    assert len(r.steps) == 1
    assert list(r.kernels["phase"].isna()) == [False, False, True, True, True, True]


def test_step_flops_missing_when_under_90_percent_is_costed() -> None:
    steps = steps_from_ranges(pd.DataFrame({"name": ["step[DECODE bs=1]"], "start_ns": [0], "end_ns": [1000],
                                            "thread": [1]})).steps
    kernels = pd.DataFrame({"start_ns": [10, 20], "duration_ns": [850, 150], "flops": [5.0, np.nan],
                            "dram_bytes": [1.0, 2.0]})
    _, s = assign_kernels_to_steps(kernels, steps)
    assert np.isnan(s["kernel_flops"].iloc[0]) and s["kernel_dram_bytes"].iloc[0] == 3.0


# ---------------------------------------------------------------------------- window, outliers, findings
def _serving(step_ns: list[int], *, lead_ns: int = 2_000_000_000, stall_in: int | None = None,
             spacing_ns: dict[int, int] | None = None) -> Imported:
    """A loading phase (kernels of no step) then decode steps of ``step_ns`` each, 10 kernels of
    20 µs per step launched 30 µs apart (``spacing_ns``: other spacings per step); step ``stall_in``
    stalls after its 3rd launch."""
    names, starts, ends, ks, ke, launch = [], [], [], [], [], []
    t = lead_ns
    for i, d in enumerate(step_ns):
        names.append("step[DECODE bs=8]")
        starts.append(t)
        ends.append(t + d)
        at = t + 10_000
        for j in range(10):
            if stall_in == i and j == 3:
                at = t + d - 10 * 30_000  # the host pauses, then launches the rest at the step's end
            launch.append(at)
            ks.append(at + 5_000)
            ke.append(at + 25_000)
            at += (spacing_ns or {}).get(i, 30_000)
        t += d + 50_000
    # model loading: 3 kernels early in the trace, no step around them
    ks, ke, launch = [1_000, 500_000_000, 900_000_000, *ks], [2_000_000, 600_000_000, 950_000_000, *ke], \
        [500, 499_000_000, 899_000_000, *launch]
    n = len(ks)
    kernels = pd.DataFrame({"name": [f"k{i}" for i in range(n)], "device": "cuda:0", "start_ns": ks, "end_ns": ke,
                            "duration_ns": np.subtract(ke, ks), "correlation": range(n), "stream": 7,
                            "flops": 1e6, "dram_bytes": 4e5})
    api = pd.DataFrame({"name": "cudaLaunchKernel", "start_ns": launch, "end_ns": np.add(launch, 4_000),
                        "correlation": range(n), "thread": 1})
    ranges = pd.DataFrame({"id": range(len(names)), "name": names, "start_ns": starts, "end_ns": ends,
                           "thread": 1, "source": "nvtx"})
    return Imported({"kernels": kernels, "api": api, "ranges": ranges}, origin="serving.sqlite")


def test_loading_is_outside_the_inference_window() -> None:
    from perfscope.analysis.findings import RULES

    r = finish(_serving([1_000_000] * 6))
    assert r.steps["outlier"].isna().all() and r.kernels["step"].isna().sum() == 3
    window = RULES["inference-window"](r)
    assert len(window) == 1 and window[0].id == "inference-window"
    first_step_kernel = int(r.kernels.loc[r.kernels["step"] == 0, "start_ns"].min())
    assert window[0].evidence["before_first_step_ns"] == first_step_kernel - 1_000
    idle = RULES["gpu-idle"](r)
    assert len(idle) == 1
    e = idle[0].evidence
    in_steps = r.kernels[r.kernels["step"].notna()]
    span = int(in_steps["end_ns"].max() - in_steps["start_ns"].min())
    assert e["span_ns"] == span  # the 2 s of loading are not idle time
    assert e["busy_ns"] == float(in_steps["duration_ns"].sum())
    assert "inference window" in idle[0].title


def test_a_host_stall_among_steady_steps_is_an_outlier_and_out_of_the_phase_table() -> None:
    from perfscope.analysis.findings import RULES
    from perfscope.analysis.summaries.serving import phase_summary

    r = finish(_serving([1_000_000] * 3 + [20_000_000] + [1_000_000] * 3, stall_in=3))
    out = r.steps["outlier"]
    assert out.notna().sum() == 1 and out.iloc[3].startswith("host stall") and "k" in out.iloc[3]
    ph = phase_summary(r).set_index("phase").loc["decode"]
    assert ph["steps"] == 6 and ph["outlier_steps"] == 1 and ph["tokens"] == 48
    assert ph["kernel_time_s"] == pytest.approx(6 * 10 * 20_000 / 1e9)
    f = RULES["step-outliers"](r)
    assert len(f) == 1 and f[0].evidence["step1"] == 3 and f[0].evidence["step1_cause"].startswith("host stall")
    steady = RULES["steady-state"](r)
    assert steady[0].evidence["group1_steps"] == 6 and steady[0].evidence["group1_p50_ns"] == 1_000_000


def test_a_slow_first_step_is_the_profilers_lead_in() -> None:
    r = finish(_serving([2_000_000] + [1_000_000] * 4, spacing_ns={0: 190_000}))  # slow launches, no pause
    assert r.steps["outlier"].iloc[0].startswith("first step after the profiler started")
    assert r.steps["outlier"].iloc[1:].isna().all()


def test_sglang_host_stall_is_the_steps_stall_not_decodes_bottleneck(fixtures_dir: Path) -> None:
    from perfscope.analysis.findings import run_rules

    r = read_kineto(fixtures_dir / SGLANG)
    findings = run_rules(r)
    ids = [f.id for f in findings]
    assert ids[0] == "step-outliers" and "gpu-idle" not in ids and "decode-mbu" not in ids
    stall = findings[0]
    # the stall: the longest stretch of the step with no launch call, from the trace's own events
    with gzip.open(fixtures_dir / SGLANG) as fh:
        events = json.load(fh)["traceEvents"]
    step = next(e for e in events if e.get("name") == "step[DECODE bs=32]")
    outer = next(e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("execute_"))
    kernel_corr = {e["args"]["correlation"] for e in events if e.get("cat") == "kernel"}
    launches = sorted(e["ts"] for e in events if e.get("cat") == "cuda_runtime"
                      and e.get("args", {}).get("correlation") in kernel_corr
                      and outer["ts"] <= e["ts"] <= outer["ts"] + outer["dur"])
    points = [outer["ts"], *launches, outer["ts"] + outer["dur"]]
    longest_us = max(b - a for a, b in itertools.pairwise(points))
    assert longest_us > 0.9 * step["dur"]
    assert f"{longest_us / 1000:.3g} ms" in stall.title and "host stall" in stall.title
    # the launch that opens the stall, named by its kernel's base name (no template or parameter text)
    start = next(a for a, b in itertools.pairwise(points) if b - a == longest_us)
    corr = next(e["args"]["correlation"] for e in events if e.get("cat") == "cuda_runtime" and e["ts"] == start
                and e.get("args", {}).get("correlation") in kernel_corr)
    kernel = next(e["name"] for e in events if e.get("cat") == "kernel" and e["args"]["correlation"] == corr)
    assert stall.evidence["step1_cause"].endswith(f"after launching {short_kernel_name(kernel)}")
    assert "<" not in stall.evidence["step1_cause"] and "<" in kernel
    assert stall.evidence["step1_kernel_time_ns"] == pytest.approx(
        sum(e["dur"] for e in events if e.get("cat") == "kernel") * 1000, rel=1e-6)
    one = next(f for f in findings if f.id == "steady-state")
    assert one.title.startswith("One decode step") and "num_steps" in one.recommendation


def test_a_phase_whose_every_step_is_an_outlier_has_no_rates(fixtures_dir: Path) -> None:
    """SGLang's one decode step is 99% host stall: the phase row keeps the step's time and tokens
    but gives no throughput, MFU or MBU from it (67.5 tok/s and 0.8% MBU were the stall's)."""
    from perfscope.analysis.summaries.serving import WALL_RATES, phase_notes, phase_summary
    from perfscope.dashboard.html_report import render_html
    from perfscope.text_report import render_text

    report = read_kineto(fixtures_dir / SGLANG)
    table = phase_summary(report)
    row = table.set_index("phase").loc["decode"]
    assert row["outlier_steps"] == 1 and row["tokens"] == 32 and row["wall_s"] > 0.45
    assert all(np.isnan(row[c]) for c in WALL_RATES)
    (note,) = phase_notes(table)  # every output says why
    assert note.startswith("decode: every step is an outlier (1 of 1")
    assert f"note: {note}" in render_text(report) and note in render_html(report)
    # a phase with a steady step keeps its rates (the vLLM graph decode step is not an outlier)
    steady_table = phase_summary(read_kineto(fixtures_dir / VLLM_GRAPH))
    steady = steady_table.set_index("phase").loc["decode"]
    assert steady["outlier_steps"] == 0 and steady["tokens_per_s"] == pytest.approx(32 / steady["wall_s"])
    assert phase_notes(steady_table) == []


def test_phase_bytes_and_mbu_are_missing_not_zero_when_few_kernels_have_a_byte_count(fixtures_dir: Path) -> None:
    """The bytes of an imported trace's phase follow the FLOPs' rule: a sum over under 90% of its kernel
    time is missing, and so are bytes/s and MBU. The A100 trace taken in CUPTI's range-profiler mode has
    no shapes (no op has a byte count but the zero-byte ``aten::empty``/``view``): its phase said
    "0 B/s, MBU 0.0" before. B200's prefill, with every kernel's bytes, keeps its MBU until the bytes of
    the kernels holding a fifth of its time are dropped."""
    from perfscope.analysis.summaries.serving import (
        FLOPS_MIN_COVERAGE,
        flops_coverage,
        phase_notes,
        phase_summary,
    )

    cupti = read_kineto(fixtures_dir / "kineto/hta_cupti_profiler__benchmark_result_924719_1679055439_trace.json.gz")
    (row,) = phase_summary(cupti).to_dict("records")
    assert row["phase"] == "all" and row["mbu_source"] == "kernels"
    assert (cupti.kernels["dram_bytes"].fillna(0) == 0).all() and cupti.kernels["dram_bytes"].notna().any()
    assert all(np.isnan(row[c]) for c in ("dram_bytes", "achieved_bytes_per_s", "mbu"))
    assert "all: bytes/s and MBU n/a: kernel bytes are known for under 90% of its kernel time" in " ".join(
        phase_notes(phase_summary(cupti)))

    r = read_kineto(fixtures_dir / B200)
    k = r.kernels
    pre = (k["phase"] == "prefill").to_numpy()
    before = phase_summary(r).set_index("phase").loc["prefill"]
    assert flops_coverage(k[pre], "dram_bytes") >= FLOPS_MIN_COVERAGE and before["mbu"] > 0
    order = k.index[pre][np.argsort(-k.loc[pre, "duration_ns"].to_numpy())]
    share = k.loc[order, "duration_ns"].cumsum() / k.loc[pre, "duration_ns"].sum()
    nbytes = k["dram_bytes"].copy()
    nbytes[order[: int((share < 0.2).sum()) + 1]] = np.nan
    after = phase_summary(r.replace(kernels=k.assign(dram_bytes=nbytes))).set_index("phase").loc["prefill"]
    assert np.isnan(after["dram_bytes"]) and np.isnan(after["mbu"]) and np.isnan(after["achieved_bytes_per_s"])
    assert after["wall_s"] == before["wall_s"] and after["kernel_time_s"] == before["kernel_time_s"]


def test_prefill_mfu_is_not_claimed_from_a_partial_flop_sum(fixtures_dir: Path) -> None:
    """B200: 20% of the prefill kernel time is a collective without FLOPs. The phase table leaves
    MFU missing, and the prefill-mfu finding says why instead of an MFU from 80% of the FLOPs."""
    from perfscope.analysis.findings import RULES
    from perfscope.analysis.summaries.serving import phase_notes, phase_summary

    r = read_kineto(fixtures_dir / B200)
    assert np.isnan(phase_summary(r).set_index("phase").loc["prefill", "mfu"])
    assert phase_notes(phase_summary(r)) == [
        "prefill: MFU n/a: kernel FLOPs are known for under 90% of its kernel time (collectives have none; "
        "other kernels need recorded shapes)"]
    k = r.kernels[r.kernels["phase"] == "prefill"]
    coverage = 100 * k.loc[k["flops"].notna(), "duration_ns"].sum() / k["duration_ns"].sum()
    (f,) = RULES["prefill-mfu"](r)
    assert f.severity == "info" and f.title.startswith("Prefill MFU not computed")
    assert f.evidence["flops_coverage_pct"] == pytest.approx(coverage) and coverage < 90
    assert f"{coverage:.0f}%" in f.title and "all_reduce" in f.title


def test_mixed_steps_show_their_prefill_and_decode_tokens() -> None:
    from perfscope.analysis.findings import RULES
    from perfscope.analysis.summaries.serving import phase_summary

    imp = _serving([1_000_000] * 6)
    names = ["execute_context_0(0)_generation_8(8_8000)"] * 4 + ["execute_context_1(512_262144)_generation_8(8_8000)"] * 2
    imp = imp.with_tables(ranges=imp.tables["ranges"].assign(name=names))
    r = finish(imp)
    ph = phase_summary(r).set_index("phase")
    assert list(ph.index) == ["decode", "mixed"]
    assert ph.loc["mixed", "prefill_tokens"] == 1024 and ph.loc["mixed", "decode_tokens"] == 16
    assert ph.loc["decode", "tokens"] == 32 and ph.loc["mixed", "framework"] == "vllm"
    mixed = RULES["mixed-steps"](r)
    assert mixed and mixed[0].evidence["mixed_steps"] == 2 and "--max-num-batched-tokens" in mixed[0].recommendation
    assert mixed[0].evidence["attention_prefill_share_mean"] == pytest.approx(262144 / (262144 + 8000))


def test_mixed_steps_items_are_the_mixed_steps_over_a_decode_step() -> None:
    """Two 3 ms mixed steps (512 prefill tokens riding with 8 decodes) beside 1 ms decode steps: the
    finding's items are those two steps, each 2 ms over a decode step, placed on the timeline."""
    from perfscope.analysis.findings import RULES

    imp = _serving([1_000_000] * 4 + [3_000_000] * 2, spacing_ns={4: 290_000, 5: 290_000})
    names = ["execute_context_0(0)_generation_8(8_8000)"] * 4 + ["execute_context_1(512_262144)_generation_8(8_8000)"] * 2
    r = finish(imp.with_tables(ranges=imp.tables["ranges"].assign(name=names)))
    (f,) = RULES["mixed-steps"](r)
    assert f.time_at_stake_ns == pytest.approx(2 * 2_000_000) and f.explained_share == pytest.approx(1.0)
    assert [i.attrs["step"] for i in f.items] == [4, 5] and all(i.time_ns == pytest.approx(2_000_000) for i in f.items)
    mixed = r.steps[r.steps["phase"] == "mixed"]
    assert f.items[0].start_ns == float(mixed["start_ns"].iloc[0])
    assert "512 prefill tokens with 8 decoding sequences waiting on them" in f.items[0].label


def test_launch_bound_decode_names_the_frameworks_knob() -> None:
    """10 x 20 µs kernels launched 45 µs apart in 460 µs steps: most of the idle time inside a step is the
    25 µs of host dispatch between launches, so CUDA graphs are the fix and the framework's knob is named."""
    from perfscope.analysis.findings import RULES

    r = finish(_serving([460_000] * 5, spacing_ns=dict.fromkeys(range(5), 45_000)))
    f = RULES["step-idle"](r)
    assert len(f) == 1 and f[0].evidence["cuda_graphs"] == "no"
    assert f[0].evidence["gpu_idle_pct"] == pytest.approx(100 * (1 - 200_000 / 460_000), abs=3)
    assert f[0].evidence["idle_kind"] == "dispatch"
    assert "--cuda-graph-max-bs" in f[0].recommendation and "--enforce-eager" not in f[0].recommendation
    assert f[0].items and f[0].explained_share > 0.95
    # the advice states the evidence that chose it: the gaps' dispatch share, from the idle slices
    assert "% is the framework's per-operator work between launches" in f[0].recommendation


def test_decode_idle_in_a_long_host_tail_is_not_sent_to_cuda_graphs() -> None:
    """10 x 20 µs kernels in the first 300 µs of 1 ms steps: most of the idle time is the 700 µs the host
    spends in the step after its last launch, code CUDA graphs do not remove: host code in the step's
    range, and no graph advice or knob."""
    from perfscope.analysis.findings import RULES

    r = finish(_serving([1_000_000] * 5))
    (f,) = RULES["step-idle"](r)
    assert f.evidence["gpu_idle_pct"] == pytest.approx(100 * (1 - 200_000 / 1_000_000), abs=3)
    assert f.evidence["idle_kind"] == "host code" and f.evidence["idle_host_code_pct"] > 80
    text = f.recommendation
    assert "--cuda-graph-max-bs" not in text and "reduce-overhead" not in text and "Move or overlap" in text
    assert "step[DECODE bs=N]" in text  # the range the time is in


def test_decode_mbu_per_decode_step_from_the_kernels_bytes() -> None:
    from perfscope.analysis.findings import RULES
    from perfscope.datasheets import gpu_spec

    dev = gpu_spec("NVIDIA H100 80GB HBM3")
    imp = _serving([1_000_000] * 5)
    r = finish(Imported(imp.tables, imp.manifest, dev, origin=imp.origin))
    f = RULES["decode-mbu"](r)
    assert len(f) == 1
    e = f[0].evidence
    bw = dev.peak_bandwidth("dram")
    # 10 kernels x 4e5 bytes per 1 ms step
    assert e["mbu_pct_per_step_p50"] == pytest.approx(100 * 4e6 / 1e-3 / bw)
    assert e["mbu_pct"] == pytest.approx(100 * 4e6 / 1e-3 / bw) and e["mbu_source"] == "kernels"
    assert "kernels' DRAM traffic" in f[0].title
    # the time above the floor is the host after the 10 launches (700 us of each 1 ms step, in no
    # call): the advice moves that host work; CUDA graphs (and SGLang's graph knob) are not advised
    top = f[0].items[0]
    assert top.kind == "gaps" and top.attrs["kind"] == "host code" and top.attrs["range"] == "step[DECODE bs=N]"
    # the idle table runs from the first kernel to the last (nsys's leading/trailing-gap rule): the
    # first step's 15 us before its first kernel and the last step's 695 us after its last are in the
    # stake but in no gap, so they are stated as unexplained. The host's 6 us between launches is
    # per-operator dispatch (docs/idle.md, the host kinds), the 695 us tail (and the next step's 10 us
    # lead, in the same gap) its own code
    assert top.time_ns == pytest.approx(4 * 695_000 + 4 * 10_000, rel=0.01)
    dispatch = [i for i in f[0].items if i.attrs.get("kind") == "dispatch"]
    assert sum(i.time_ns for i in dispatch) == pytest.approx(5 * 9 * 6_000, rel=0.02)
    assert f[0].unexplained_ns == pytest.approx(710_000) and f[0].explained_share < 0.9
    assert any(not i.explains and i.time_ns == pytest.approx(710_000) for i in f[0].items)
    text = f[0].recommendation
    assert "Move or overlap this host work" in text and "step[DECODE bs=N]" in text
    assert "--cuda-graph-max-bs" not in text and "reduce-overhead" not in text and "capture" not in text.lower()


def test_decode_mbu_advises_graphs_when_launch_calls_hold_the_gaps() -> None:
    """The same steps with the host inside launch calls for most of each step (10 launches of 98 us,
    100 us apart): the gaps are launch time, so CUDA graphs and SGLang's own knob are advised."""
    from perfscope.analysis.findings import RULES
    from perfscope.datasheets import gpu_spec

    imp = _serving([1_000_000] * 5, spacing_ns=dict.fromkeys(range(5), 100_000))
    api = imp.tables["api"]
    imp.tables["api"] = api.assign(end_ns=api["start_ns"] + 98_000)
    r = finish(Imported(imp.tables, imp.manifest, gpu_spec("NVIDIA H100 80GB HBM3"), origin=imp.origin))
    f = RULES["decode-mbu"](r)[0]
    launch = sum(i.time_ns for i in f.items if i.attrs.get("kind") == "launch")
    host = sum(i.time_ns for i in f.items if i.attrs.get("kind") in ("dispatch", "cpu compute", "waiting", "host code"))
    assert launch > host > 0
    assert "--cuda-graph-max-bs" in f.recommendation and "CUDA graph" in f.recommendation


def test_mixed_steps_split_attention_by_the_labels_q_times_k() -> None:
    from perfscope.analysis.findings import RULES

    imp = _serving([1_000_000] * 6)
    names = ["execute_context_0(0)_generation_8(8_8000)"] * 4 + ["execute_context_1(512_262144)_generation_8(8_8000)"] * 2
    k = imp.tables["kernels"].copy()
    k["category"] = ["attention" if i % 2 else "gemm" for i in range(len(k))]
    r = finish(imp.with_tables(ranges=imp.tables["ranges"].assign(name=names), kernels=k))
    e = RULES["mixed-steps"](r)[0].evidence
    attn = r.kernels[(r.kernels["category"] == "attention") & r.kernels["step"].isin([4, 5])]
    total = float(attn["duration_ns"].sum())
    assert e["attention_ns"] == total
    assert e["attention_prefill_ns"] == pytest.approx(total * 262144 / (262144 + 8000))


def test_compare_shows_mixed_steps_and_warns_of_an_all_outlier_phase(fixtures_dir: Path) -> None:
    from perfscope.analysis.summaries.compare import compare

    imp = _serving([1_000_000] * 6)
    names = ["execute_context_0(0)_generation_8(8_8000)"] * 4 + ["execute_context_1(512_262144)_generation_8(8_8000)"] * 2
    a = finish(imp.with_tables(ranges=imp.tables["ranges"].assign(name=names)))
    b = read_kineto(fixtures_dir / SGLANG)
    c = compare(a, b)
    assert list(c.by_phase["phase"]) == ["decode", "mixed", "total"]
    assert c.by_phase.set_index("phase").loc["mixed", "tokens_a"] == 1024 + 16
    assert any(v.startswith("B: every decode step is an outlier (host stall") for v in c.verdict)


@pytest.mark.parametrize(("rel", "graphs"), [(VLLM_GRAPH, "CUDA graphs replayed"),
                                              (B200, "kernels launched one by one (no CUDA graphs)")])
def test_one_step_trace_says_whether_cuda_graphs_ran(fixtures_dir: Path, rel: str, graphs: str) -> None:
    from perfscope.analysis.findings import RULES

    f = RULES["steady-state"](read_kineto(fixtures_dir / rel))
    assert len(f) == 1 and f"({graphs})" in f[0].title and "VLLM_TORCH_PROFILER_DIR" in f[0].recommendation


def test_nsys_nvtx_step_ranges_through_the_one_pipeline(fixtures_dir: Path, tmp_path: Path) -> None:
    """The real nsys export with vLLM-style NVTX ranges added around its launch calls."""
    import shutil
    import sqlite3

    from perfscope.analysis.readers.detect import import_file

    db = tmp_path / "steps.sqlite"
    shutil.copy(fixtures_dir / "nsys" / "nvfuser_h100_matmul.sqlite", db)
    con = sqlite3.connect(db)
    calls = con.execute("SELECT r.start, r.end, r.globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN "
                        "CUPTI_ACTIVITY_KIND_KERNEL k ON k.correlationId = r.correlationId ORDER BY r.start").fetchall()
    half = len(calls) // 2
    groups = [calls[:half], calls[half:]]
    labels = ["execute_context_1(64_4096)_generation_0(0)", "execute_new_0_cached_4"]
    for label, g in zip(labels, groups):
        con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, 59, ?, ?)",
                    (g[0][0] - 100, g[-1][1] + 100, label, g[0][2]))
    con.commit()
    n_ranges = con.execute("SELECT count(*) FROM NVTX_EVENTS WHERE text LIKE 'execute_%'").fetchone()[0]
    con.close()
    r = import_file(db)
    assert len(r.steps) == n_ranges == 2
    assert list(r.steps["phase"]) == ["prefill", "decode"] and list(r.steps["framework"]) == ["vllm", "vllm"]
    k = r.kernels
    assert k["step"].notna().all() and list(k.groupby("step").size()) == [half, len(calls) - half]
    assert set(k.loc[k["step"] == 1, "phase"]) == {"decode"}


def test_prefill_mfu_of_vllm_steps_names_the_token_budget() -> None:
    from perfscope.analysis.findings import RULES
    from perfscope.datasheets import gpu_spec

    dev = gpu_spec("NVIDIA H100 80GB HBM3")
    imp = _serving([1_000_000] * 4)
    k = imp.tables["kernels"].assign(precision="bf16")
    names = ["execute_context_2(1024_524288)_generation_0(0)"] * 4
    r = finish(Imported(imp.with_tables(kernels=k, ranges=imp.tables["ranges"].assign(name=names)).tables,
                        imp.manifest, dev, origin=imp.origin))
    f = RULES["prefill-mfu"](r)
    assert len(f) == 1 and f[0].evidence["prefill_tokens"] == 4 * 1024 and f[0].evidence["framework"] == "vllm"
    assert f[0].evidence["flops"] == 4 * 10 * 1e6  # the steps' kernels only, not the loading ones
    assert "--max-num-batched-tokens" in f[0].recommendation


def test_sglang_verify_steps_without_draft_counts_make_no_speculation_claim() -> None:
    from perfscope.analysis.findings import RULES

    imp = _serving([1_000_000] * 4)
    names = ["step[TARGET_VERIFY bs=8 toks=32]", "step[DRAFT_EXTEND bs=8 toks=16]"] * 2
    r = finish(imp.with_tables(ranges=imp.tables["ranges"].assign(name=names)))
    assert list(r.steps["phase"]) == ["verify", "draft", "verify", "draft"]
    # what verifying and drafting cost (info), never an acceptance rate the labels do not give
    found = RULES["speculation"](r)
    assert [f.severity for f in found] == ["info"] and "acceptance_rate" not in found[0].evidence


def test_fuzzed_step_ranges_never_crash_the_pipeline() -> None:
    from perfscope.analysis.findings import run_rules
    from perfscope.analysis.summaries.serving import phase_summary

    rng = np.random.default_rng(21)
    forms = ["step[DECODE bs={a}]", "step[EXTEND bs={a} toks={b}]", "step[MIXED bs={a} toks={b}]", "step[IDLE bs=0]",
             "execute_context_{a}({b}_{c})_generation_{a}({a}_{c})", "execute_new_{a}_cached_{b}",
             "execute_{b}_context_{a}(sq{b}sk{c}sqsq{b}sqsk{c})_generation_0(sq0sk0sqsq0sqsk0)",
             "perfscope.step[mixed bs={a} toks={b} ctx={c}]", "execute_context_{a}(", "step[NEW bs={a}]", "decode"]
    for trial in range(25):
        n = int(rng.integers(1, 12))
        names = [forms[int(rng.integers(len(forms)))].format(a=int(rng.integers(0, 9)), b=int(rng.integers(0, 4096)),
                                                            c=int(rng.integers(0, 10**7))) for _ in range(n)]
        starts = rng.integers(0, 5_000_000, n)
        ends = starts + rng.integers(-1000, 3_000_000, n)  # zero-length, reversed and overlapping ranges too
        imp = _serving([1_000_000] * 3, lead_ns=int(rng.integers(0, 10**6)))
        ranges = pd.DataFrame({"id": range(n), "name": names, "start_ns": starts, "end_ns": ends,
                               "thread": rng.integers(1, 3, n), "source": "nvtx"})
        r = finish(imp.with_tables(ranges=ranges))
        phase_summary(r)
        run_rules(r)
        assert r.kernels["step"].dropna().isin(r.steps["step"]).all()
        assert (r.steps["end_ns"] >= r.steps["start_ns"]).all()


def test_speculative_steps_of_sglang_and_vllm_labels() -> None:
    """SGLang's TARGET_VERIFY / DRAFT_EXTEND and vLLM's decodes of more than one new token per
    request are verify / draft steps with the drafts they check (accepted ones are not in labels)."""
    v = parse_step_label("step[TARGET_VERIFY bs=8 toks=32]")
    assert (v.phase, v.drafted) == ("verify", 24)  # 4 tokens per request: its last token + 3 drafts
    assert parse_step_label("step[DRAFT_EXTEND bs=8 toks=16]").phase == "draft"
    assert parse_step_label("step[DRAFT_EXTEND_V2 bs=8 toks=16]").phase == "draft"
    d = parse_step_label("execute_12_context_0(sq0sk0sqsq0sqsk0)_generation_4(sq12sk400sqsq36sqsk1188)")
    assert (d.phase, d.drafted, d.decode_seqs, d.tokens) == ("verify", 8, 4, 12)
    m = parse_step_label("execute_20_context_1(sq8sk8sqsq64sqsk64)_generation_4(sq12sk400sqsq36sqsk1188)")
    assert (m.phase, m.drafted) == ("mixed", 8)
    c = parse_step_label("execute_context_0(0)_generation_4(12_1188)")
    assert (c.phase, c.drafted, c.context_tokens) == ("verify", 8, None)
    assert parse_step_label("execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk55086sqsq32sqsk55086)"
                            ).drafted is None


def test_framework_speculative_steps_say_their_cost_not_an_acceptance_they_cannot_know() -> None:
    from perfscope.analysis.rules.llm import speculation

    r = finish(_synthetic(["step[EXTEND bs=1 toks=64]", "step[DRAFT_EXTEND bs=1 toks=1]",
                           "step[TARGET_VERIFY bs=1 toks=4]", "step[DRAFT_EXTEND bs=1 toks=1]",
                           "step[TARGET_VERIFY bs=1 toks=4]"]))
    assert list(r.steps["phase"]) == ["prefill", "draft", "verify", "draft", "verify"]
    assert list(r.steps["drafted"].fillna(-1)) == [-1, -1, 3, -1, 3]
    assert set(r.kernels["phase"]) == {"prefill", "draft", "verify"}
    (found,) = speculation(r)
    assert found.severity == "info" and "does not say how many drafts were accepted" in found.title
    assert found.evidence["verify_steps"] == 2 and found.evidence["drafted_tokens"] == 6
