"""The collectors on a real NVIDIA GPU: NVML sampling a busy GPU, and ncu's two-pass top-N
mode on a tiny torch script. Skipped without CUDA; the ncu test also skips when ncu is absent
or this machine does not let it read GPU performance counters."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from perfscope.collectors import (
    NcuCollector,
    NcuOptions,
    NvmlCollector,
    NvmlOptions,
    NvmlSampler,
)
from perfscope.collectors.ncu import function_base_name
from perfscope.collectors.nvml import METRICS, NvmlSource
from perfscope.errors import CollectorError, ToolNotFoundError

pytestmark = pytest.mark.gpu

WORKLOAD = """
import time, torch
a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    c = torch.relu(a @ b)
torch.cuda.synchronize()
end = time.monotonic() + {seconds}
while time.monotonic() < end:
    for _ in range(20):
        c = torch.relu(a @ b)
    torch.cuda.synchronize()
"""

COUNTER_ERRORS = ("ERR_NVGPUCTRPERM", "LibraryNotLoaded", "driver resource was unavailable",
                  "Failed to initialize the profiler")


def _script(tmp_path: Path, seconds: float) -> list[str]:
    path = tmp_path / "workload.py"
    path.write_text(textwrap.dedent(WORKLOAD.format(seconds=seconds)))
    return [sys.executable, str(path)]


def _nvml_or_skip() -> None:
    source = NvmlSource()
    try:
        source.open()
    except ToolNotFoundError as exc:
        pytest.skip(f"NVML unusable here: {exc}")
    source.close()


def test_nvml_samples_a_busy_gpu_for_one_second() -> None:
    import torch

    _nvml_or_skip()
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    with NvmlSampler(rate_hz=50, devices=[0]) as sampler:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            for _ in range(10):
                a = torch.tanh(a @ a.T * 1e-3)
            torch.cuda.synchronize()
    frame = sampler.to_frame()
    assert len(frame) >= 5 and set(frame["device"]) == {"cuda:0"}
    assert frame["t_ns"].is_monotonic_increasing
    assert frame["gpu_util_pct"].max() > 0
    assert frame["sm_clock_mhz"].max() > 0 and frame["mem_clock_mhz"].max() > 0
    for metric in ("power_w", "temp_c"):
        assert frame[metric].max() > 0 or metric in sampler.unavailable_metrics
    assert sampler.stats.cpu_pct_of_core < 25


def test_nvml_memory_grows_by_what_the_cuda_allocator_reserved() -> None:
    import torch

    _nvml_or_skip()
    torch.cuda.init()
    probe = NvmlSource()
    probe.open([0])
    used = METRICS.index("mem_used_bytes")
    try:
        torch.cuda.synchronize()
        reserved0, nvml0 = torch.cuda.memory_reserved(0), probe.read(0)[used]
        block = torch.empty(4 * 2**30, dtype=torch.uint8, device="cuda:0")
        torch.cuda.synchronize()
        reserved1, nvml1 = torch.cuda.memory_reserved(0), probe.read(0)[used]
    finally:
        probe.close()
    assert block.numel() == 4 * 2**30
    assert nvml1 - nvml0 == pytest.approx(reserved1 - reserved0, abs=64 * 2**20)


def test_nvml_collector_samples_a_gpu_program(tmp_path: Path) -> None:
    _nvml_or_skip()
    capture = NvmlCollector().collect(_script(tmp_path, 1.0), tmp_path / "out",
                                      NvmlOptions(rate_hz=20, stream_stderr=False))
    assert not capture.partial
    frame = pd.read_parquet(capture.files[0])
    assert len(frame) >= 5 and frame["mem_used_bytes"].max() > 0
    assert capture.tool_version and capture.tool_version.startswith("driver ")


def test_ncu_top_n_profiles_the_longest_kernels_of_a_torch_script(tmp_path: Path) -> None:
    ncu_report = pytest.importorskip("ncu_report")
    if not NcuCollector().is_available():
        pytest.skip("ncu is not on PATH")
    options = NcuOptions(top_n=2, launches_per_kernel=2, clock_control="none",
                         first_pass="ncu", stream_stderr=False, timeout_s=240)
    try:
        capture = NcuCollector().collect(_script(tmp_path, 0.0), tmp_path / "out", options)
    except CollectorError as exc:
        if any(marker in str(exc) for marker in COUNTER_ERRORS):
            pytest.skip(f"ncu cannot read GPU counters here: {exc}")
        raise
    top = [k["name"] for k in capture.params["top_kernels"]]
    assert len(top) == 2 and capture.params["clock_control"] == "none"
    assert len(capture.commands) == 3 and "--metrics" in capture.commands[0]  # first pass + one run per kernel
    reports = [p for p in capture.files if p.suffix == ".ncu-rep"]
    assert len(reports) == 2
    for path, name in zip(reports, top):
        report = ncu_report.load_report(str(path))
        actions = [report.range_by_idx(r).action_by_idx(i)
                   for r in range(report.num_ranges()) for i in range(report.range_by_idx(r).num_actions())]
        assert 1 <= len(actions) <= 2  # launches_per_kernel, of this kernel only
        for action in actions:
            assert function_base_name(action.name(ncu_report.IAction.NameBase_DEMANGLED)) == function_base_name(name)
            duration = action.metric_by_name("gpu__time_duration.sum")
            assert duration is not None and duration.as_double() > 0
