"""The committed sample reports load, validate and carry their provenance."""

from __future__ import annotations

import pytest

from perfscope.analysis.serving import phase_summary
from perfscope.report import Report

NAMES = ["cpu-small-b1-p128-g32.perfscope", "h100-nvfuser-matmul-nsys.perfscope",
         "h100-qwen1.5-0.5b-kineto.perfscope"]


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


def test_imported_samples_name_their_fixture_not_a_local_path(sample_reports_dir):
    for name in NAMES[1:]:
        src = Report.load(sample_reports_dir / name).manifest["source"]
        assert src["path"].startswith("shared/fixtures/")
