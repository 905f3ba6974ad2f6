"""Hierarchical roofline on Nsight Compute captures: L2 and L1 bytes and roofs read from the
``--set full`` / ``roofline`` sections, and the binding level of each kernel."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from perfscope.analysis.readers.detect import import_file
from perfscope.kernel_names import short_kernel_name


def test_prefill_gemm_is_compute_bound_at_every_level(fixtures_dir: Path) -> None:
    report = import_file(fixtures_dir / "h200" / "h200_engine_gemm_attn_full.ncu-rep")
    assert report.device is not None
    for level in ("dram", "l2", "l1"):
        assert report.device.memory[level].provenance == "report"
    # L2 > HBM and L1 > L2, as the memory hierarchy is built
    assert report.device.memory["l1"].value > report.device.memory["l2"].value > report.device.memory["dram"].value
    k = report.kernels
    has = k["l2_bytes"].notna() | k["l1_bytes"].notna()
    assert has.all() and k.loc[has, "bound_level"].notna().all()
    peak = report.device.peak_flops("bf16")
    up = k[k["range"].eq("prefill/layer.0/mlp") & k["category"].eq("gemm")].iloc[0]  # the MLP up-projection
    assert up["bound"] == "compute"
    assert up["level_roof_flops_per_s"] >= peak  # even its slowest level would let it reach the compute roof


def test_decode_gemv_is_hbm_bound(fixtures_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "decode.ncu-rep"
    with gzip.open(fixtures_dir / "h200" / "h200_engine_decode_roofline.ncu-rep.gz") as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    k = import_file(path).kernels
    assert (k["l2_bytes"].notna() | k["l1_bytes"].notna()).all() and k["bound_level"].notna().all()
    gemv = k[k["category"].eq("gemm")]
    assert len(gemv) and gemv["roofline_bound"].eq("memory").all() and gemv["bound_level"].eq("dram").all()
    assert gemv["bound"].eq("latency").all()  # ncu measured no unit at 60% of its peak (L2 40%, DRAM 38%)
    # elementwise kernels that stream from L2 are bound there, not at HBM
    assert k["bound_level"].eq("l2").any()


@pytest.mark.parametrize("level", ["l2", "l1", "shared"])
def test_amd_level_roofs_bind_the_vcopy_kernel_at_hbm(fixtures_dir: Path, level: str) -> None:
    report = import_file(fixtures_dir / "rocprof" / "rocprof_compute_vcopy_MI200")
    assert report.device is not None and report.device.peak_bandwidth(level)
    assert report.kernels["bound_level"].eq("dram").all()  # a stream copy moves each byte once from HBM


def test_finding_names_the_binding_level(fixtures_dir: Path, tmp_path: Path) -> None:
    from perfscope.analysis.findings import RULES

    full = import_file(fixtures_dir / "h200" / "h200_engine_gemm_attn_full.ncu-rep")
    (found,) = RULES["memory-level"](full)
    # the 128x64-tile GEMMs' L2 roof lies below the bf16 peak at their intensity: L2 binds them
    assert "L2" in found.title and found.severity != "info"
    assert all("128x64" in k for k in found.kernels)
    path = tmp_path / "decode.ncu-rep"
    with gzip.open(fixtures_dir / "h200" / "h200_engine_decode_roofline.ncu-rep.gz") as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    (decode,) = RULES["memory-level"](import_file(path))
    # a decode step's small kernels move a few KB: no level is busy, so none is blamed
    assert decode.severity == "info" and decode.evidence["below_every_roof_kernels"] >= 1
    (vcopy,) = RULES["memory-level"](import_file(fixtures_dir / "rocprof" / "rocprof_compute_vcopy_MI200"))
    assert "HBM" in vcopy.title
    # its advice names the kernels that hold the HBM-bound time, from the report's own table
    k = import_file(fixtures_dir / "rocprof" / "rocprof_compute_vcopy_MI200").kernels
    top = k.groupby("name")["duration_ns"].sum().idxmax()
    assert vcopy.recommendation.startswith("Where HBM/DRAM is the lowest roof (most of it in ")
    assert short_kernel_name(str(top))[:40] in vcopy.recommendation


def test_roofline_figure_draws_one_roof_and_one_point_set_per_level(fixtures_dir: Path) -> None:
    from perfscope.dashboard.figures.roofline import roofline

    report = import_file(fixtures_dir / "h200" / "h200_engine_gemm_attn_full.ncu-rep")
    names = [t.name for t in roofline(report).data]
    for level in ("dram", "l2", "l1"):
        assert any(n.startswith(f"{level} ") and "B/s" in n for n in names)  # the level's roof
    levels = {t.name: t for t in roofline(report).data if t.legendgroup == "levels"}
    assert {"L2 intensity", "L1 intensity"} <= set(levels)
    k = report.kernels
    l2 = levels["L2 intensity"]
    assert sorted(l2.x) == pytest.approx(sorted((k["flops"] / k["l2_bytes"]).dropna()))


def test_lowest_roof_advice_names_only_kernels_fewer_bytes_would_shorten(fixtures_dir: Path) -> None:
    """The H100 Qwen trace: 28% of its time is compute-bound at every level (the bf16 sm90 GEMMs). The summary's
    advice, "only fewer bytes from it shorten those kernels", names the memory-bound kernels that hold the HBM-bound
    time, never a GEMM that fewer bytes would not shorten."""
    from perfscope.analysis.findings import RULES

    report = import_file(fixtures_dir / "kineto" / "tracelens_h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    (f,) = RULES["memory-level"](report)
    assert f.evidence["compute_bound_every_level_time_pct"] > 20
    named = f.recommendation.split("(most of it in ", 1)[1].split(")", 1)[0].split(", ")
    k = report.kernels
    short = k["name"].map(lambda n: short_kernel_name(str(n)))
    for name in named:  # a long name is clipped with an ellipsis
        rows = k[short.str.startswith(name.rstrip("…"))]
        assert len(rows) and rows["bound"].eq("memory").any(), name
    assert not any(n.startswith("sm90_xmma_gemm") for n in named)
