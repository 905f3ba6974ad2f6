"""The bound from the measured limiter (issue 39, item 3): the unit with the highest share of its peak sets a
kernel's bound, its findings and their advice; ``latency`` when no unit reaches Nsight Compute's 60%.

Checked on the committed H200 and A10G Nsight Compute captures, the MI308X rocprof-compute workload, and ncu
CSVs built here in the real long format of ``tests/fixtures/ncu/esmm_a10g_roofline_metrics.csv``: one with the
H800 RNG kernel the issue reports (SM 70%, integer ALU pipe 57%, DRAM 19%), one where nothing reaches 60%.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest

from perfscope.analysis.costs.limiter import LATENCY_PCT, bound_label, measured_limiters
from perfscope.analysis.findings import RULES, run_rules
from perfscope.analysis.readers.detect import import_file
from perfscope.analysis.readers.ncu.reader import read_ncu_csv

IDENTITY = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
            "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]
RNG = ("void at::native::(anonymous namespace)::distribution_elementwise_grid_stride_kernel<float, (int)4, "
       "at::native::templates::cuda::uniform_and_transform<float, float, at::CUDAGeneratorImpl *>>(long, "
       "at::PhiloxCudaState, T3, T4)")
ADD = ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_add<float>, "
       "std::array<char *, (unsigned long)3>>(int, T2, T3)")
SM_CLOCK, DRAM_CLOCK = 1.755e9, 1.593e9
FFMA_PER_CYCLE, DRAM_BYTES_PER_CYCLE = 16896, 2103  # H800 SXM: 132 SMs x 128 FP32 lanes; 3.35 TB/s of HBM3
DRAM_BW = DRAM_BYTES_PER_CYCLE * DRAM_CLOCK


def _metrics(duration_ns: float, dram_bytes: float, ffma: int, fmul: int, fadd: int,
             units: dict[str, float]) -> list[tuple[str, str, str]]:
    """(metric, unit, value) rows of one launch, as ncu --csv --metrics prints them (thousands separators)."""
    rows = [("dram__bytes.sum", "byte", f"{dram_bytes:,.0f}"), ("gpu__time_duration.sum", "nsecond", f"{duration_ns:,.0f}"),
            ("sm__sass_thread_inst_executed_op_fadd_pred_on.sum", "inst", f"{fadd:,}"),
            ("sm__sass_thread_inst_executed_op_ffma_pred_on.sum", "inst", f"{ffma:,}"),
            ("sm__sass_thread_inst_executed_op_fmul_pred_on.sum", "inst", f"{fmul:,}"),
            ("sm__sass_thread_inst_executed_op_ffma_pred_on.sum.peak_sustained", "inst/cycle", f"{FFMA_PER_CYCLE:,}"),
            ("dram__bytes.sum.peak_sustained", "byte/cycle", f"{DRAM_BYTES_PER_CYCLE:,}"),
            ("sm__cycles_elapsed.avg.per_second", "cycle/second", f"{SM_CLOCK:,.0f}"),
            ("dram__cycles_elapsed.avg.per_second", "cycle/second", f"{DRAM_CLOCK:,.0f}")]
    return rows + [(name, "%", f"{value:.2f}") for name, value in units.items()]


def _rng_units() -> dict[str, float]:
    """What the issue's Nsight Compute report of PyTorch's RNG kernel on an H800 shows: SM 69.8%, the integer
    ALU pipe 57%, DRAM 19%; the L1 share as the SpeedOfLight section prints it (active) with the cycles."""
    return {"sm__throughput.avg.pct_of_peak_sustained_elapsed": 69.8,
            "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": 21.3,
            "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": 19.0,
            "lts__throughput.avg.pct_of_peak_sustained_elapsed": 17.6,
            "l1tex__throughput.avg.pct_of_peak_sustained_active": 23.0,
            "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active": 57.1,
            "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active": 57.3,
            "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active": 31.0,
            "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active": 12.4,
            "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active": 6.1}


def _latency_units() -> dict[str, float]:
    """An elementwise add whose busiest unit (L2) is at 45%: no unit reaches 60%."""
    return {"sm__throughput.avg.pct_of_peak_sustained_elapsed": 12.0,
            "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": 45.0,
            "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": 41.0,
            "lts__throughput.avg.pct_of_peak_sustained_elapsed": 45.0,
            "l1tex__throughput.avg.pct_of_peak_sustained_elapsed": 30.0,
            "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_elapsed": 8.0,
            "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_elapsed": 2.0}


def build_csv(path: Path, launches: list[tuple[str, list[tuple[str, str, str]], tuple[str, str]]]) -> Path:
    buf = io.StringIO()
    out = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
    out.writerow(IDENTITY)
    for i, (name, metrics, (block, grid)) in enumerate(launches):
        for metric, unit, value in metrics:
            out.writerow([str(i), "4242", "python3", "127.0.0.1", name, "1", "7", block, grid, "0", "9.0",
                          "Command line profiler metrics", metric, unit, value])
    path.write_text(buf.getvalue())
    return path


# the RNG kernel writes 2^26 floats (268 MB) at 19% of the 3.35 TB/s: its time follows
RNG_BYTES = 4 * 2**26
RNG_NS = RNG_BYTES / (0.19 * DRAM_BW) * 1e9
ADD_BYTES = 3 * 4 * 2**22  # reads two 2^22-float tensors, writes one, at 41% of DRAM
ADD_NS = ADD_BYTES / (0.41 * DRAM_BW) * 1e9


def rng_launch() -> tuple[str, list[tuple[str, str, str]], tuple[str, str]]:
    metrics = _metrics(RNG_NS, RNG_BYTES, ffma=2**26, fmul=2**26, fadd=0, units=_rng_units())
    # SM Active Cycles / Elapsed Cycles: the L1 share over the elapsed time comes from them
    metrics += [("sm__cycles_active.avg", "cycle", "700,000"), ("sm__cycles_elapsed.avg", "cycle", "740,000")]
    return RNG, metrics, ("(256, 1, 1)", "(1056, 1, 1)")


def add_launch() -> tuple[str, list[tuple[str, str, str]], tuple[str, str]]:
    return ADD, _metrics(ADD_NS, ADD_BYTES, ffma=0, fmul=0, fadd=2**22, units=_latency_units()), \
        ("(128, 1, 1)", "(8192, 1, 1)")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_csv(tmp_path_factory.mktemp("ncu") / "h800_rng.csv", [rng_launch(), add_launch()])


# ---------------------------------------------------------------------------- the H800 RNG kernel (built CSV)
def test_alu_pipe_limits_the_rng_kernel_not_dram(built: Path) -> None:
    report = read_ncu_csv(built)
    rng, add = report.kernels.iloc[0], report.kernels.iloc[1]
    # the roofline reading: 0.75 FLOP/B, far below the ridge, 19% of the DRAM roof
    assert rng["roofline_bound"] == "memory" and rng["pct_of_roof"] == pytest.approx(19.0, rel=1e-3)
    # the measured one: the SM at 69.8% is the busiest unit, its busiest pipe the ALU at 57.3%
    assert (rng["bound"], rng["limiter"]) == ("compute", "alu")
    assert rng["limiter_pct"] == pytest.approx(69.8) and rng["pipe_alu_pct"] == pytest.approx(57.3)
    assert bound_label(rng["bound"], rng["limiter"]) == "compute (alu)"
    assert rng["l1_throughput_pct"] == pytest.approx(23.0 * 700_000 / 740_000)  # over the elapsed time
    # the point stays where its FLOPs and bytes put it
    assert rng["arith_intensity"] == pytest.approx(3 * 2**26 / RNG_BYTES)
    assert (add["bound"], add["limiter"], add["limiter_pct"]) == ("latency", "l2", pytest.approx(45.0))


def test_rng_kernel_is_in_no_memory_bound_finding_and_gets_instruction_mix_advice(built: Path) -> None:
    report = read_ncu_csv(built)
    findings = run_rules(report)
    memory = [f for f in findings if f.id in ("memory-below-roof", "memory-level")]
    assert not any("distribution_elementwise" in str(f.kernels) for f in memory)
    (compute,) = [f for f in findings if f.id == "compute-below-roof"]
    assert len(compute.kernels) == 1 and "distribution_elementwise_grid_stride_kernel" in compute.kernels[0]
    assert "instruction mix" in compute.recommendation and "integer" in compute.recommendation
    assert "coalesc" not in compute.recommendation  # the DRAM advice the evidence does not support
    (item,) = compute.items
    assert item.kind == "kernel" and item.explains and item.attrs["limiter"] == "alu"
    assert item.attrs["limiter_pct"] == pytest.approx(69.8) and item.attrs["pipe_alu_pct"] == pytest.approx(57.3)
    assert item.attrs["bound"] == "compute (alu)"
    assert item.start_ns == 0 and item.end_ns == pytest.approx(RNG_NS, abs=1)
    assert item.time_ns == pytest.approx(compute.time_at_stake_ns) and compute.explained_share == 1.0


def test_nothing_at_60_percent_is_latency_bound(built: Path) -> None:
    report = read_ncu_csv(built)
    (latency,) = RULES["latency-bound"](report)
    assert latency.kernels == ("vectorized_elementwise_kernel",)
    (item,) = latency.items
    assert item.attrs["limiter"] == "l2" and item.attrs["limiter_pct"] == pytest.approx(45.0)
    assert item.time_ns == pytest.approx(ADD_NS * (1 - 0.45), rel=1e-3) and latency.explained_share == 1.0
    assert "more parallel work" in latency.recommendation
    # the roofline would call it memory-bound at 41% of DRAM: it is in neither roof finding
    assert RULES["memory-below-roof"](report) == []
    assert latency.evidence["threshold_pct_of_peak"] == LATENCY_PCT == 60.0


def test_analyze_and_json_say_compute_alu_and_that_the_readings_disagree(built: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from perfscope.cli import main

    assert main(["analyze", str(built)]) == 0
    text = capsys.readouterr().out
    assert "compute (alu) 70%" in text and "latency (l2 45%)" in text
    assert "measured limiter disagrees" in text and "put it memory-bound" in text
    assert main(["analyze", str(built), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (compute,) = [f for f in out["findings"] if f["id"] == "compute-below-roof"]
    assert compute["items"][0]["attrs"]["limiter"] == "alu" and compute["explained_share"] == 1.0


def test_roofline_hover_says_the_measured_limiter_disagrees(built: Path) -> None:
    from perfscope.dashboard.figures.roofline import roofline

    fig = roofline(read_ncu_csv(built))
    hovers = [c[7] for t in fig.data if t.customdata is not None for c in t.customdata]
    rng = next(h for h in hovers if "compute (alu)-bound" in h)
    assert "put it memory-bound" in rng and "disagrees with the roofline" in rng
    assert any("2 marker(s)" in a.text for a in fig.layout.annotations)


# ---------------------------------------------------------------------------- committed captures
def test_h200_prefill_gemms_read_their_limiters(load) -> None:
    k = load("h200/h200_engine_gemm_attn_full.ncu-rep").kernels
    up = k[k["short_name"].str.contains("coopA")].iloc[0]  # the MLP up-projection: tensor pipe 79% of peak
    assert (up["bound"], up["limiter"]) == ("compute", "tensor") and up["limiter_pct"] == pytest.approx(79.24, abs=0.01)
    down = k.iloc[4]  # the down projection: L2 at 67%, its SM at 59%
    assert (down["bound"], down["limiter"], down["bound_level"]) == ("memory", "l2", "l2")
    # the QKV GEMMs fill 0.97 waves and reach no unit's 60%: latency, as ncu's own rule says (Small Grid)
    qkv = k[k["short_name"].str.contains("96x128")]
    assert qkv["bound"].eq("latency").all() and (qkv["limiter_pct"] < LATENCY_PCT).all()
    assert set(k["roofline_bound"]) == {"compute"}


def test_h200_l1_over_the_elapsed_time_from_the_active_share(fixtures_dir: Path) -> None:
    """Where only the ``_active`` L1 share was collected (the SpeedOfLight table, the roofline set), it times the
    SM active / elapsed cycles; checked against the ``_elapsed`` metric of the full set on every launch."""
    ncu_report = pytest.importorskip("ncu_report")
    from perfscope.analysis.readers.ncu.metrics import l1_elapsed_pct
    from perfscope.analysis.readers.ncu.reader import _actions

    launches = _actions(ncu_report, ncu_report.load_report(str(fixtures_dir / "h200" / "h200_engine_gemm_attn_full.ncu-rep")))
    for launch in launches:
        measured = launch.metrics.pop("l1tex__throughput.avg.pct_of_peak_sustained_elapsed")
        assert l1_elapsed_pct(launch) == pytest.approx(measured, abs=0.01)


def test_a10g_blocktiling_sgemm_is_lsu_bound(load) -> None:
    r = load("ncu/esmm_a10g_roofline_set.ncu-rep")
    (f,) = RULES["compute-below-roof"](r)
    assert f.items[0].attrs["bound"] == "compute (lsu)" and "LSU pipe" in f.recommendation
    assert "tensor cores" not in f.recommendation  # an FP32 SGEMM on the LSU: vectorised loads, register reuse


def test_mi308x_rng_kernel_is_valu_bound_not_memory_bound(load) -> None:
    """rocprof-compute's counters of the same PyTorch RNG kernel (normal_) on an MI308X: the VALU is its busiest
    unit, so it is compute (valu), with the instruction-mix advice, and in no memory-bound finding."""
    r = load("rocprof/aiter_fmla_MI308X_rocprof_compute")
    k = r.kernels
    rng = k[k["name"].str.contains("distribution_elementwise")]
    assert len(rng) == 2 and rng["bound"].eq("compute").all() and rng["limiter"].eq("valu").all()
    findings = run_rules(r)
    assert not any("distribution_elementwise" in str(f.kernels) for f in findings if f.id == "memory-below-roof")
    (compute,) = [f for f in findings if f.id == "compute-below-roof"]
    assert "instruction mix" in compute.recommendation and compute.items[0].attrs["limiter"] == "valu"


def test_no_group_in_a_memory_and_a_compute_finding_at_once(load, built: Path) -> None:
    reports = [load("h200/h200_engine_gemm_attn_full.ncu-rep"), load("ncu/esmm_a10g_roofline_set.ncu-rep"),
               load("rocprof/aiter_fmla_MI308X_rocprof_compute"), read_ncu_csv(built)]
    for report in reports:
        findings = run_rules(report)
        memory = {g for f in findings if f.id in ("memory-below-roof", "memory-level") for g in f.kernels}
        compute = {g for f in findings if f.id == "compute-below-roof" for g in f.kernels}
        latency = {g for f in findings if f.id == "latency-bound" for g in f.kernels}
        assert not memory & compute and not latency & (memory | compute)


def test_kernel_findings_explain_their_time_or_say_how_much_not(load, built: Path) -> None:
    """The evidence rule on the measured captures: each kernel finding's items explain at least 90% of its time
    at stake, or it states the share left unexplained."""
    for report in (load("h200/h200_engine_gemm_attn_full.ncu-rep"), load("ncu/esmm_a10g_roofline_set.ncu-rep"),
                   read_ncu_csv(built)):
        for f in run_rules(report, rules=["memory-below-roof", "compute-below-roof", "latency-bound", "memory-level",
                                          "occupancy-stalls", "roof-exceeded"]):
            if f.severity == "info" and not f.items:
                continue
            assert f.items, f.id
            share = f.explained_share
            assert math.isnan(share) or share >= 0.9 or f.unexplained_ns > 0, f.id


def test_the_limiter_of_a_row_without_units_is_unknown() -> None:
    import pandas as pd

    limiter, share = measured_limiters(pd.DataFrame({"sm_throughput_pct": [float("nan"), 30.0],
                                                     "dram_throughput_pct": [float("nan"), 30.0]}))
    assert limiter[0] is None and math.isnan(share[0])
    assert limiter[1] == "dram" and share[1] == 30.0  # a tie goes to the memory level (outermost first)


def test_import_file_reads_the_built_csv_like_the_reader(built: Path) -> None:
    assert import_file(built).kernels["limiter"].tolist() == ["alu", "l2"]


def test_busiest_pipe_matches_nsight_computes_own_high_pipe_utilization_rule(fixtures_dir: Path) -> None:
    """Nsight Compute's HighPipeUtilization rule (stored in the report) names the highest-utilized pipeline
    "based on elapsed cycles"; the busiest ``pipe_*_pct`` of each launch has the same share (its ``Shared``
    pipe, the sum of the FP64 and tensor pipes, equals the tensor pipe in these GEMMs)."""
    import re

    ncu_report = pytest.importorskip("ncu_report")
    k = import_file(fixtures_dir / "h200" / "h200_engine_gemm_attn_full.ncu-rep").kernels
    pipes = [c for c in k.columns if c.startswith("pipe_")]
    ctx = ncu_report.load_report(str(fixtures_dir / "h200" / "h200_engine_gemm_attn_full.ncu-rep"))
    checked = 0
    for i in range(ctx.range_by_idx(0).num_actions()):
        for rule in ctx.range_by_idx(0).action_by_idx(i).rule_results_as_dicts():
            if rule.get("rule_identifier") != "HighPipeUtilization":
                continue
            message = rule["rule_message"]["message"]
            stated = re.search(r"highest-utilized pipeline \(([\d.]+)%\) based on elapsed cycles", message)
            focus = [m["value"] for m in rule.get("focus_metrics") or [] if "pipe" in m["name"]]
            share = float(stated.group(1)) if stated else (focus[0] if focus else None)
            if share is None:
                continue
            assert k.loc[i, pipes].max() == pytest.approx(share, abs=0.05)
            checked += 1
    assert checked == 6
