"""One import pipeline: every path from a capture to a Report conforms each table once and
classifies the kernels once (analysis/readers/finish.py), and gives the same tables as the file reader.

Counted with a profile hook on the real ``conform`` and ``classify_conformed`` code (nothing is
patched), over real captures: the Kineto, nsys, ncu and NVML fixtures, the engine profile and a
script profile.
"""

from __future__ import annotations

import sys
import textwrap
from collections import Counter
from collections.abc import Callable
from typing import Any

import pandas as pd
import pytest

from perfscope import schema
from perfscope.analysis.costs import roofline
from perfscope.analysis.readers.detect import import_file
from perfscope.device import DeviceSpec
from perfscope.report import Report


def _calls(fn: Callable[[], Any]) -> tuple[Any, Counter[str]]:
    """Run ``fn``; count conform calls per table and classify passes (as ``classify``)."""
    seen: Counter[str] = Counter()
    codes = {schema.conform.__code__: "conform", roofline.classify_conformed.__code__: "classify"}

    def hook(frame: Any, event: str, _arg: Any) -> None:
        if event == "call" and frame.f_code in codes:
            kind = codes[frame.f_code]
            seen[f"{kind}:{frame.f_locals.get('table', 'kernels')}" if kind == "conform" else kind] += 1

    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        result = fn()
    finally:
        sys.setprofile(previous)
    return result, seen


def _once_each(seen: Counter[str]) -> None:
    conformed = {k: n for k, n in seen.items() if k.startswith("conform:")}
    assert conformed and all(n == 1 for n in conformed.values()), seen
    assert seen["classify"] == 1, seen


@pytest.mark.parametrize("name", [
    "kineto/kineto_resnet50_v100_2021.pt.trace.json.gz",
    "kineto/hta_cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "h200/h200_llama1b_engine_cudagraph.pt.trace.json.gz",
    "nsys/aws_t4_softmax.sqlite",
    "ncu/esmm_a10g_roofline_metrics.csv",
])
def test_each_reader_conforms_and_classifies_once(fixtures_dir, name):
    report, seen = _calls(lambda: import_file(fixtures_dir / name))
    _once_each(seen)
    assert seen["conform:kernels"] == 1 and len(report.kernels)


def test_ncu_rep_conforms_and_classifies_once(fixtures_dir):
    pytest.importorskip("ncu_report")
    report, seen = _calls(lambda: import_file(fixtures_dir / "h200" / "h200_engine_gemm_attn_full.ncu-rep"))
    _once_each(seen)
    assert report.kernels["roofline_bound"].isin(["memory", "compute"]).all()
    assert report.kernels["bound"].isin(["memory", "compute", "latency"]).all()  # the measured limiter's


def test_engine_profile_goes_through_the_one_pipeline(tmp_path):
    """`perfscope profile` of the engine: kernels from the trace, steps and requests from the
    engine, all conformed once, kernels classified once, and the kernel table equal to what
    `perfscope import` of the same trace gives."""
    from perfscope.sessions.profile import EngineRun, profile_engine

    cpu = DeviceSpec("cpu", "cpu")  # no roofs: the comparison is about tables, not roofs
    run = EngineRun(model="tiny", batch=1, prompt_len=8, gen_len=3, device="cpu")
    report, seen = _calls(lambda: profile_engine(run, roofs=cpu, keep_trace_dir=tmp_path, baseline=1))
    _once_each(seen)
    assert {"conform:steps", "conform:requests"} <= set(seen)
    # the warm passes are the headline unless this (busy) machine disturbed them: then they are not kept
    # (docs/report-format.md); which one happened depends on the machine's load, not on the pipeline
    disturbed = report.params.get("baseline_verdict") == "disturbed"
    if disturbed:
        assert len(report.steps_unprofiled) == 0
    else:
        assert "conform:steps_unprofiled" in seen and len(report.steps_unprofiled) > 0
    (trace,) = tmp_path.glob("*.json.gz")
    imported = import_file(trace, device=cpu)
    pd.testing.assert_frame_equal(report.kernels, imported.kernels)
    pd.testing.assert_frame_equal(report.ranges, imported.ranges)
    assert report.manifest["source"]["kind"] == "engine" and imported.manifest["source"]["kind"] == "kineto"


def test_script_profile_goes_through_the_one_pipeline(tmp_path):
    from perfscope.sessions.profile import profile_script

    script = tmp_path / "work.py"
    script.write_text(textwrap.dedent("""
        import torch
        x, w = torch.randn(32, 64), torch.randn(64, 16)
        for _ in range(2):
            y = x @ w
    """))
    report, seen = _calls(lambda: profile_script(["python", str(script)], device="cpu",
                                                 roofs=DeviceSpec("cpu", "cpu")))
    _once_each(seen)
    mm = report.kernels[report.kernels["name"] == "aten::matmul"]
    assert len(mm) == 2 and (mm["flops"] == 2 * 32 * 64 * 16).all()


def test_report_build_still_conforms_tables_from_outside():
    """``Report.build`` is the public constructor: it checks tables that did not come through
    the pipeline (``assemble`` is for tables already conformed)."""
    report = Report.build({"kernels": pd.DataFrame({"name": ["k"], "device": ["cuda:0"], "start_ns": [0], "end_ns": [5], "duration_ns": [5.0]})})
    assert report.kernels["duration_ns"].dtype == "int64" and "bound" in report.kernels
    with pytest.raises(ValueError, match="unknown table"):
        Report.assemble({"kernel": pd.DataFrame()})


@pytest.mark.parametrize("shared", [True, False])
def test_factorize_equals_pandas_on_shared_and_distinct_objects(shared):
    """schema.factorize (identity first for shared name objects) gives pd.factorize's answer:
    equal strings in different objects merge, None and NaN are missing, order of first appearance."""
    import numpy as np

    rng = np.random.default_rng(3)
    long = "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8>"
    pool = [long, long.replace("64x64", "128x64"), "elementwise" * 6, None, float("nan")]
    picks = rng.integers(0, len(pool), schema.FACTORIZE_BY_IDENTITY_MIN_ROWS + 7)
    values = [pool[i] for i in picks]  # rows share a few objects, as a reader's string table gives
    if shared:
        values[5] = "".join(list("elementwise" * 6))  # equal text in another object
    else:
        values = ["".join(list(v)) if isinstance(v, str) else v for v in values]  # an object per row
    series = pd.Series(values, dtype="object")
    codes, uniques = schema.factorize(series)
    want_codes, want_uniques = pd.factorize(series, use_na_sentinel=True)
    assert np.array_equal(codes, want_codes) and list(uniques) == list(want_uniques)
