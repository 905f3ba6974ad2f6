"""Roofs of the GPUs that serve LLMs: datasheet figures, matching by name and by device properties,
``import --roofs NAME``, ``devices --datasheet``, placement by precision, and the roofline's roofs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.costs.roofline import classify
from perfscope.analysis.readers.detect import import_file
from perfscope.cli import main
from perfscope.dashboard import figures
from perfscope.dashboard.figures import roofline_data as rd
from perfscope.datasheets import (
    DATASHEETS,
    PRECISIONS,
    Datasheet,
    find_datasheet,
    lookup_datasheet,
    match_datasheet,
    sheet_spec,
)
from perfscope.errors import UsageError

VLLM = "thirdparty/tracelens_vllm_decode_full/graph_execution.json.gz"  # MI300X, empty device name
SGLANG = "thirdparty/tracelens_sglang_decode/sglang_Qwen3-8B_decode.json.gz"  # "AMD Instinct MI300X"
B200 = "kineto/tracelens_b200__eager_trace.json.gz"
A100_BOARD = "kineto/hta_critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz"  # A100-PG509-200
H100_96 = "kineto/kineto_docs_h100_before_fix.json"  # "NVIDIA H100", 132 SMs, 95 GiB: no listed part


def _row(model: str) -> Datasheet:
    return next(s for s in DATASHEETS if s.model == model)


# ------------------------------------------------------------------ figures as the sources print them
@pytest.mark.parametrize(("model", "precision", "dense", "sparse"), [
    ("H100 SXM5 80 GB", "bf16", 989.4, 1978.9),    # H100 whitepaper Table 3
    ("H100 SXM5 80 GB", "fp8", 1978.9, 3957.8),
    ("H100 SXM5 80 GB", "tf32", 494.7, 989.4),
    ("H100 PCIe 80 GB", "bf16", 756.5, 1513.0),    # H100 datasheet: 1,513* with sparsity
    ("H100 NVL 94 GB", "fp8", 1670.5, 3341.0),     # H100 datasheet NVL column: 3,341*
    ("H200 SXM 141 GB", "bf16", 989.5, 1979.0),    # H200 datasheet: 1,979*
    ("H200 NVL 141 GB", "bf16", 835.5, 1671.0),
    ("A100 80 GB SXM4", "bf16", 312.0, 624.0),     # A100 datasheet prints dense | sparse*
    ("A100 80 GB SXM4", "int8", 624.0, 1248.0),
    ("L40S", "fp8", 733.0, 1466.0),
    ("L4", "fp8", 242.5, 485.0),
    ("B200 (HGX, per GPU)", "fp4", 9000.0, 18000.0),   # HGX B200 144 PF sparse FP4 / 8 GPUs
    ("GB200 (NVL72, per Blackwell GPU)", "bf16", 2500.0, 5000.0),  # NVL72 360 PF sparse / 72
    ("GB200 (NVL72, per Blackwell GPU)", "fp4", 10000.0, 20000.0),  # NVL72 1,440 PF sparse / 72
    ("B300 (HGX, per GPU)", "fp4", 13500.0, 18000.0),  # HGX B300 108 PF dense, 144 PF sparse / 8
    ("GB10 (DGX Spark)", "fp4", 500.0, 1000.0),        # "1 PFLOP FP4" is with sparsity
    ("MI300X", "bf16", 1307.4, 2614.9),            # MI300X datasheet
    ("MI300X", "fp8", 2614.9, 5229.8),
    ("MI325X", "fp8", 2614.9, 5229.8),
    ("MI355X", "bf16", 2516.6, 5033.2),
])
def test_dense_and_sparse_figures_as_the_sources_print_them(model: str, precision: str, dense: float,
                                                            sparse: float) -> None:
    sheet = _row(model)
    assert sheet.tflops[precision] == pytest.approx(dense) and sheet.sparse_tflops[precision] == pytest.approx(sparse)


@pytest.mark.parametrize(("model", "gb_s", "fp32"), [
    ("H100 SXM5 80 GB", 3350.0, 66.9), ("H100 PCIe 80 GB", 2000.0, 51.0), ("H100 NVL 94 GB", 3900.0, 60.0),
    ("H200 SXM 141 GB", 4800.0, 67.0), ("H20 96 GB", 4000.0, 44.0), ("A100 40 GB", 1555.0, 19.5),
    ("A100 80 GB PCIe", 1935.0, 19.5), ("A100 80 GB SXM4", 2039.0, 19.5), ("L40S", 864.0, 91.6),
    ("L4", 300.0, 30.3), ("RTX 4090", 1008.0, 82.6), ("RTX 5090", 1792.0, 104.8),
    ("RTX PRO 6000 Blackwell", 1792.0, 125.0), ("GB10 (DGX Spark)", 273.0, None), ("A10G", 600.0, None),
    ("MI300X", 5300.0, 163.4), ("MI325X", 6000.0, 163.4), ("MI355X", 8000.0, 157.3),
    ("MI250X (per GCD)", 1638.4, 23.95),  # MI250X datasheet 3.2768 TB/s and 47.9 TFLOPS per OAM, two GCDs
])
def test_bandwidth_and_vector_fp32(model: str, gb_s: float, fp32: float | None) -> None:
    sheet = _row(model)
    assert sheet.bandwidth_gb_s == pytest.approx(gb_s)
    assert sheet.tflops.get("fp32") == (pytest.approx(fp32) if fp32 is not None else None)


def test_per_device_not_per_board() -> None:
    gb200, b200, mi250x = _row("GB200 (NVL72, per Blackwell GPU)"), _row("B200 (HGX, per GPU)"), _row("MI250X (per GCD)")
    assert gb200.tflops["fp8"] == pytest.approx(720_000 / 72 / 2)  # an NVL72 rack is 72 GPUs
    assert b200.sparse_tflops["fp8"] == pytest.approx(72_000 / 8)  # an HGX board is 8
    assert mi250x.tflops["bf16"] == pytest.approx(383.0 / 2) and mi250x.sm_count == 110  # an OAM is 2 GCDs


def test_dense_is_half_of_with_sparsity_wherever_both_are_printed() -> None:
    for sheet in DATASHEETS:
        assert set(sheet.tflops) <= set(PRECISIONS) and set(sheet.sparse_tflops) <= set(sheet.tflops), sheet.model
        for precision, sparse in sheet.sparse_tflops.items():
            if (sheet.model, precision) == ("B300 (HGX, per GPU)", "fp4"):
                continue  # Blackwell Ultra's FP4 dense rate is printed on its own (108 of 144 PF)
            # 2% for the sheets' own rounding (L40S prints 362.05 | 733)
            assert sheet.tflops[precision] == pytest.approx(sparse / 2, rel=0.02), (sheet.model, precision)
        # bandwidth is absent only where no document found prints it, and the status says so (MI308X)
        assert sheet.source and sheet.status, sheet.model
        assert sheet.bandwidth_gb_s or "removed" in sheet.status, sheet.model


def test_roofs_carry_source_clock_and_density() -> None:
    spec = sheet_spec(_row("MI300X"))
    assert spec.kind == "rocm" and spec.compute["bf16"].dense is True and spec.compute["fp32"].dense is None
    assert "AMD Instinct MI300X accelerator datasheet" in spec.compute["fp8"].method
    assert "2100 MHz boost clock" in spec.compute["fp8"].method
    assert spec.ridge("bf16") == pytest.approx(1307.4e12 / 5300e9)


# ------------------------------------------------------------------ names traces carry
@pytest.mark.parametrize(("name", "model"), [
    ("AMD Instinct MI300X", "MI300X"), ("AMD Instinct MI300X VF", "MI300X"), ("AMD Instinct MI325X", "MI325X"),
    ("AMD Instinct MI355X", "MI355X"), ("AMD Instinct MI250X", "MI250X (per GCD)"),
    ("NVIDIA GB10", "GB10 (DGX Spark)"), ("NVIDIA H100 80GB HBM3", "H100 SXM5 80 GB"),
    ("NVIDIA H100 PCIe", "H100 PCIe 80 GB"), ("NVIDIA H100 NVL", "H100 NVL 94 GB"), ("NVIDIA H200", "H200 SXM 141 GB"),
    ("NVIDIA H200 NVL", "H200 NVL 141 GB"), ("NVIDIA H20", "H20 96 GB"), ("NVIDIA B200", "B200 (HGX, per GPU)"),
    ("NVIDIA B300 SXM6 AC", "B300 (HGX, per GPU)"), ("NVIDIA GB200", "GB200 (NVL72, per Blackwell GPU)"),
    ("NVIDIA L40S", "L40S"), ("NVIDIA L4", "L4"), ("NVIDIA A100-SXM4-40GB", "A100 40 GB"),
    ("NVIDIA A100-SXM4-80GB", "A100 80 GB SXM4"), ("NVIDIA A100 80GB PCIe", "A100 80 GB PCIe"),
    ("NVIDIA A10G", "A10G"), ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("NVIDIA GeForce RTX 5090", "RTX 5090"),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "RTX PRO 6000 Blackwell"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX PRO 6000 Blackwell"),
])
def test_driver_names_of_llm_gpus(name: str, model: str) -> None:
    sheet, how = match_datasheet(name)
    assert sheet is not None and sheet.model == model and how == "name"


@pytest.mark.parametrize("name", ["NVIDIA GeForce RTX 5090 D", "AMD Instinct MI300", "NVIDIA GB300",
                                  "AMD Instinct MI250X/MI250", "NVIDIA H100"])
def test_other_parts_are_not_taken_for_listed_ones(name: str) -> None:
    assert find_datasheet(name) is None


def test_an_empty_name_is_matched_by_device_properties(fixtures_dir: Path) -> None:
    raw = json.loads(__import__("gzip").open(fixtures_dir / VLLM, "rt").read())["deviceProperties"][0]
    assert raw["name"] == "" and raw["numSms"] == 304 and (raw["computeMajor"], raw["computeMinor"]) == (9, 4)
    report = import_file(fixtures_dir / VLLM)
    assert report.device.properties["datasheet"] == "MI300X" and report.device.kind == "rocm"
    assert report.device.properties["datasheet_match"].startswith("device properties (compute capability 9.4, 304")
    assert report.device.name.startswith("MI300X (unnamed in the trace")
    assert any("the trace names no device" in w and "--roofs NAME" in w for w in report.warnings)
    # MI325X has the same die and CU count: its 256 GB tell it apart
    mi325 = {"computeMajor": 9, "computeMinor": 4, "numSms": 304, "totalGlobalMem": 256 * 2**30 - 2**28}
    assert find_datasheet("", mi325).model == "MI325X"


def test_a_board_name_is_matched_within_its_family_by_properties(fixtures_dir: Path) -> None:
    report = import_file(fixtures_dir / A100_BOARD)
    assert report.device.name == "NVIDIA A100-PG509-200" and report.device.properties["datasheet"] == "A100 40 GB"
    assert report.device.peak_bandwidth() == pytest.approx(1555e9)


def test_an_unlisted_part_says_which_flag_to_pass(fixtures_dir: Path) -> None:
    report = import_file(fixtures_dir / H100_96)
    assert not report.device.compute and "datasheet" not in report.device.properties
    note = next(w for w in report.warnings if "no device roofs known for 'NVIDIA H100'" in w)
    assert "132" in note and "95.1 GiB" in note and "--roofs NAME" in note and "devices --datasheet" in note


@pytest.mark.parametrize(("rel", "model"), [(SGLANG, "MI300X"), (B200, "B200 (HGX, per GPU)")])
def test_real_traces_get_their_rows_by_name(fixtures_dir: Path, rel: str, model: str) -> None:
    report = import_file(fixtures_dir / rel)
    assert report.device.properties["datasheet"] == model and report.device.properties["datasheet_match"] == "name"


@pytest.mark.parametrize("rel", [VLLM, SGLANG, B200])
def test_every_costed_kernel_of_the_third_party_traces_is_placed(fixtures_dir: Path, rel: str) -> None:
    k = import_file(fixtures_dir / rel).kernels
    costed = k["flops"].notna() & (k["dram_bytes"] > 0)
    assert costed.any() and k.loc[costed, "bound"].isin(["memory", "compute"]).all()
    assert not k.loc[~(k["flops"].notna() & k["dram_bytes"].notna()), "bound"].isin(["memory", "compute"]).any()


# ------------------------------------------------------------------ --roofs NAME, devices --datasheet
@pytest.mark.parametrize(("query", "model"), [
    ("MI300X", "MI300X"), ("mi300x", "MI300X"), ("H100 SXM5", "H100 SXM5 80 GB"), ("h100-sxm5-80-gb", "H100 SXM5 80 GB"),
    ("GB200", "GB200 (NVL72, per Blackwell GPU)"), ("NVIDIA H100 80GB HBM3", "H100 SXM5 80 GB"), ("B300", "B300 (HGX, per GPU)"),
])
def test_lookup_by_the_name_a_user_types(query: str, model: str) -> None:
    assert lookup_datasheet(query).model == model


def test_an_ambiguous_or_unknown_name_lists_close_ones() -> None:
    with pytest.raises(UsageError, match="more than one") as ambiguous:
        lookup_datasheet("A100 80")  # two rows, neither the family's common part
    assert "'A100 80 GB PCIe'" in str(ambiguous.value) and "'A100 80 GB SXM4'" in str(ambiguous.value)
    with pytest.raises(UsageError, match="no datasheet row") as unknown:
        lookup_datasheet("MI3000X")
    assert "'MI300X'" in str(unknown.value) and "\n" not in str(unknown.value)


def test_import_roofs_name_classifies_against_that_row(fixtures_dir: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.perfscope"
    assert main(["import", str(fixtures_dir / B200), "--out", str(out), "--no-html", "--roofs", "H100 SXM5"]) == 0
    from perfscope.report import Report

    report = Report.load(out)
    assert report.device.properties["datasheet"] == "H100 SXM5 80 GB"
    assert report.device.compute["bf16"].value == pytest.approx(989.4e12)
    placed = report.kernels[report.kernels["bound"].isin(["memory", "compute"])]
    assert len(placed)
    # each kernel against its own precision's roof of that row (the cost model marks fp8 GEMMs fp8)
    for precision, rows in placed.groupby("precision"):
        peak = report.device.peak_flops(str(precision))
        assert (rows["roof_flops_per_s"] <= peak * 1.0001).all(), precision
    assert (placed.loc[placed["precision"] == "bf16", "roof_flops_per_s"] <= 989.4e12 * 1.0001).all()
    capsys.readouterr()
    assert main(["import", str(fixtures_dir / B200), "--out", str(tmp_path / "x"), "--roofs", "H1OO"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--roofs 'H1OO'" in err[0] and "close:" in err[0]


def test_devices_datasheet_lists_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--datasheet", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["model"] for r in rows] == [s.model for s in DATASHEETS]
    mi300x = next(r for r in rows if r["model"] == "MI300X")
    assert mi300x["dense_tflops"]["bf16"] == 1307.4 and mi300x["bandwidth_gb_s"] == 5300.0
    assert mi300x["boost_clock_mhz"] == 2100 and "MI300X accelerator datasheet" in mi300x["source"]
    assert main(["devices", "--datasheet"]) == 0
    text = capsys.readouterr().out
    assert all(s.model in text for s in DATASHEETS) and "1,307.4 (2,615)" in text and "989.4 (1,979)" in text


# ------------------------------------------------------------------ placed against its own precision
def _kernels(dtypes: list[str], flops: float = 1e12, nbytes: float = 1e8, ns: float = 1e6) -> pd.DataFrame:
    n = len(dtypes)
    return pd.DataFrame({"name": [f"gemm_{d}" for d in dtypes], "device": ["cuda:0"] * n, "start_ns": [0] * n,
                         "end_ns": [int(ns)] * n, "duration_ns": [ns] * n, "flops": [flops] * n,
                         "dram_bytes": [nbytes] * n, "dtype": dtypes})


def test_fp8_and_fp4_gemms_meet_their_own_tensor_roofs() -> None:
    out = classify(_kernels(["bfloat16", "float8_e4m3fn", "float4_e2m1fn_x2"]), sheet_spec(_row("B200 (HGX, per GPU)")))
    assert out["precision"].tolist() == ["bf16", "fp8", "fp4"]
    assert out["bound"].tolist() == ["compute"] * 3  # 10,000 FLOP/B is above every ridge
    # achieved 1 PFLOP/s against 2,250 / 4,500 / 9,000 dense TFLOP/s
    assert out["pct_of_roof"].tolist() == pytest.approx([1e15 / 2250e12 * 100, 1e15 / 4500e12 * 100,
                                                         1e15 / 9000e12 * 100])


def test_amd_fnuz_fp8_is_fp8_and_narrow_formats_without_units_take_the_wider_roof() -> None:
    mi300x = sheet_spec(_row("MI300X"))
    out = classify(_kernels(["float8_e4m3fnuz", "float4_e2m1fn_x2"]), mi300x)
    assert out["precision"].tolist() == ["fp8", "fp4"]
    assert out["roof_flops_per_s"].tolist() == pytest.approx([2614.9e12, 2614.9e12])  # MI300X has no FP4 units
    assert mi300x.roof_precision("fp4") == "fp8" and mi300x.roof_precision("int4") == "int8"
    gb10 = sheet_spec(_row("GB10 (DGX Spark)"))  # lists FP4 only: bf16 has no roof, never a narrower one
    out = classify(_kernels(["bfloat16", "float4_e2m1fn_x2"]), gb10)
    assert out["bound"].tolist() == ["unknown", "compute"] and np.isnan(out.loc[0, "roof_flops_per_s"])


def test_the_roofline_draws_and_labels_the_roof_of_every_precision_present(fixtures_dir: Path) -> None:
    report = import_file(fixtures_dir / B200)
    k = report.kernels.copy()
    gemms = k.index[k["precision"].eq("bf16") & k["flops"].gt(0)]
    assert len(gemms) >= 3
    k.loc[gemms[0], "precision"], k.loc[gemms[1], "precision"] = "fp8", "fp4"
    report = report.replace(kernels=classify(k, report.device))
    fig = figures.roofline(report)
    lines = {t.name.split()[0]: t for t in fig.data if t.mode == "lines"}
    for precision, tflops in (("bf16", 2250), ("fp8", 4500), ("fp4", 9000)):
        assert lines[precision].y[0] == pytest.approx(tflops * 1e12)
    tags = next(t for t in fig.data if t.name == "roof labels")  # on the memory slope
    ridges = next(t for t in fig.data if t.name == "ridge points")  # each compute roof's name at its ridge
    assert list(tags.text) == ["DRAM 7.7 TB/s"]
    assert sorted(ridges.text) == ["bf16 2.25 PFLOP/s, ridge 292 FLOP/B", "fp4 9 PFLOP/s, ridge 1,169 FLOP/B",
                                   "fp8 4.5 PFLOP/s, ridge 584 FLOP/B"]
    # fp4 kernels on an H100 sit under its fp8 roof, and the figure says so
    h100 = sheet_spec(_row("H100 SXM5 80 GB"))
    line = next(x for x in rd.roof_lines(h100, ["bf16", "fp4", "fp8"], 0.1, 1e4) if x.label == "fp8")
    assert line.serves == ("fp4",) and "also for fp4 kernels" in rd.roof_label(line)


def test_tables_people_read_show_labels_not_column_names() -> None:
    from perfscope.format import column_label, labelled_rows

    assert column_label("achieved_flops_per_s") == "achieved FLOP/s" and column_label("wall_s") == "wall time"
    assert column_label("mfu") == "MFU (% of peak FLOP/s)" and column_label("ttft_s_p99") == "TTFT p99"
    want = "profiled throughput (all output tokens / run time, tokens/s)"
    assert column_label("profiled_throughput_tokens_per_s") == want
    assert labelled_rows([{"wall_s": "1 s", "mbu": "2%"}]) == [{"wall time": "1 s", "MBU (% of DRAM bandwidth)": "2%"}]


def test_a_cost_models_own_precision_spelling_is_placed_against_the_matching_roof() -> None:
    k = _kernels(["uint8", "uint8", "bfloat16"]).assign(precision=["mxfp4", "fp8", None])
    out = classify(k, sheet_spec(_row("MI355X")))
    assert out["precision"].tolist() == ["fp4", "fp8", "bf16"]
    assert out["roof_flops_per_s"].tolist() == pytest.approx([10066.3e12, 5033.2e12, 2516.6e12])
