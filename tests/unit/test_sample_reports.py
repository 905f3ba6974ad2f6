"""The committed sample reports load, validate and carry their provenance."""

from __future__ import annotations

import pytest

from perfscope.analysis.summaries.serving import phase_summary
from perfscope.report import Report

NAMES = ["cpu-small-b1-p128-g32.perfscope", "h100-nvfuser-matmul-nsys.perfscope",
         "h100-qwen1.5-0.5b-kineto.perfscope", "cpu-small-compiled-b1-p128-g32.perfscope"]


@pytest.mark.parametrize("name", NAMES)
def test_sample_report_loads(sample_reports_dir, name):
    r = Report.load(sample_reports_dir / name)
    assert len(r.kernels) > 0 and r.device is not None
    roofs = list(r.device.compute.values()) + list(r.device.memory.values())
    assert roofs and all(roof.provenance in ("measured", "datasheet", "report") for roof in roofs)


def test_cpu_sample_is_an_engine_run_with_phases(sample_reports_dir):
    r = Report.load(sample_reports_dir / NAMES[0])
    assert r.manifest["source"]["kind"] == "engine"
    assert set(phase_summary(r)["phase"]) == {"prefill", "decode"}
    gemm = r.kernels[r.kernels["category"] == "gemm"]
    assert (gemm[gemm["phase"] == "decode"]["bound"] == "memory").all()


def test_compiled_cpu_sample_costs_each_decode_step_as_one_kernel(sample_reports_dir):
    """--compile on the CPU, the small model: each decode step is one inductor kernel carrying the
    step's model FLOPs and weight + KV bytes, memory-bound, and not listed as uncosted."""
    r = Report.load(sample_reports_dir / "cpu-small-compiled-b1-p128-g32.perfscope")
    assert r.params["compile"] is True and r.params["decode_matmuls_in_kernels"] is True
    steps = r.steps[r.steps["phase"] == "decode"].sort_values("start_ns")
    step_kernels = r.kernels[r.kernels["flops_source"] == "engine-step"].sort_values("start_ns")
    assert len(step_kernels) == len(steps) == 31
    assert step_kernels["flops"].tolist() == steps["flops"].tolist()
    assert step_kernels["dram_bytes"].tolist() == (steps["weight_bytes"] + steps["kv_cache_bytes"]).tolist()
    assert (step_kernels["bound"] == "memory").all()
    assert not any(name in w for w in r.warnings for name in set(step_kernels["name"]))


def test_imported_samples_name_their_fixture_not_a_local_path(sample_reports_dir, fixtures_dir):
    """The manifests name the file as it was imported (``shared/fixtures/...``, the project's shared
    copy, kept as written): a path relative to the fixtures folder, which tests/fixtures holds."""
    for name in NAMES[1:3]:
        src = Report.load(sample_reports_dir / name).manifest["source"]
        assert src["path"].startswith("shared/fixtures/")
        assert (fixtures_dir / src["path"].removeprefix("shared/fixtures/")).is_file()


def test_phase_flops_are_missing_when_most_kernel_time_has_no_flop_count(sample_reports_dir):
    """MFU is never a sum over part of a phase's kernels: under 90% of kernel time costed -> missing."""
    import numpy as np

    from perfscope.analysis.summaries.serving import FLOPS_MIN_COVERAGE, flops_coverage

    r = Report.load(sample_reports_dir / "cpu-small-b1-p128-g32.perfscope")
    k = r.kernels
    decode = (k["phase"] == "decode").to_numpy()
    before = phase_summary(r).set_index("phase")
    assert flops_coverage(k[decode]) >= FLOPS_MIN_COVERAGE and before.loc["decode", "mfu"] > 0
    # drop the FLOP counts of the longest decode kernels until 20% of decode kernel time is uncosted
    order = k.index[decode][np.argsort(-k.loc[decode, "duration_ns"].to_numpy())]
    share = k.loc[order, "duration_ns"].cumsum() / k.loc[decode, "duration_ns"].sum()
    dropped = order[: int((share < 0.2).sum()) + 1]
    flops = k["flops"].copy()
    flops[dropped] = np.nan
    after = phase_summary(r.replace(kernels=k.assign(flops=flops))).set_index("phase")
    assert flops_coverage(k[decode].assign(flops=flops[decode])) < FLOPS_MIN_COVERAGE
    assert np.isnan(after.loc["decode", "flops"]) and np.isnan(after.loc["decode", "mfu"])
    assert after.loc["decode", "mbu"] == before.loc["decode", "mbu"]  # the engine's bytes still count
    assert after.loc["prefill", "mfu"] == before.loc["prefill", "mfu"]
