"""The NVML sampler's loop, storage, per-metric guards and collector.

NVML cannot run on this machine (no NVIDIA driver: ``nvmlInit`` raises
NVMLError_LibraryNotFound), so the tests of the sampling loop replace the reading source, and
the tests of the per-metric guards give NvmlSource a stand-in ``pynvml`` module that raises
pynvml's real error classes. The real NVML path is covered by tests/gpu/test_gpu_collectors.py.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pynvml
import pytest

from perfscope.collectors import CaptureInterrupted, NvmlCollector, NvmlOptions, NvmlSampler, nvml
from perfscope.collectors.nvml import METRICS, NvmlSource, counters_frame, visible_devices
from perfscope.errors import ToolNotFoundError, UsageError
from perfscope.schema import column_names

UUIDS = ["GPU-aaaa1111-0000", "GPU-bbbb2222-0000", "GPU-cccc3333-0000"]


class ScriptedSource:
    """Stands in for NVML (which cannot run here): value k of read n is 10*n + k."""

    def __init__(self, labels: Sequence[str] = ("cuda:0", "cuda:1"), fail_after: int | None = None):
        self.labels = list(labels)
        self.fail_after = fail_after
        self.reads = 0
        self.closed = False
        self.unavailable: dict[str, str] = {}
        self.warnings: list[str] = []

    def open(self, devices: Sequence[int] | None) -> list[str]:
        return self.labels

    def read(self, position: int) -> tuple[float, ...]:
        self.reads += 1
        if self.fail_after is not None and self.reads > self.fail_after:
            raise RuntimeError("GPU fell off the bus")
        return tuple(float(10 * self.reads + k) for k in range(len(METRICS)))

    def close(self) -> None:
        self.closed = True


def _wait_reads(source: ScriptedSource, n: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while source.reads < n and time.monotonic() < deadline:
        time.sleep(0.005)


def test_visible_devices_follow_cuda_visible_devices() -> None:
    assert visible_devices(UUIDS, None) == [(0, "cuda:0"), (1, "cuda:1"), (2, "cuda:2")]
    assert visible_devices(UUIDS, "2,0") == [(2, "cuda:0"), (0, "cuda:1")]
    assert visible_devices(UUIDS, "GPU-bbbb") == [(1, "cuda:0")]
    assert visible_devices(UUIDS, "1,7,0") == [(1, "cuda:0")]  # CUDA stops at the bad entry
    assert visible_devices(UUIDS, "GPU-") == []  # ambiguous prefix
    assert visible_devices(UUIDS, "") == []
    assert visible_devices(UUIDS, "0,0") == [(0, "cuda:0")]


def test_sampler_rows_are_the_source_reads_in_schema_order() -> None:
    source = ScriptedSource()
    with NvmlSampler(rate_hz=100, source=source) as sampler:
        _wait_reads(source, 6)
    frame = sampler.to_frame()
    assert list(frame.columns[: len(column_names("counters"))]) == column_names("counters")
    assert len(frame) == source.reads == 2 * sampler.stats.samples
    assert list(frame["device"][:4]) == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    for n, row in enumerate(frame.itertuples(index=False), start=1):
        assert [getattr(row, m) for m in METRICS] == [10.0 * n + k for k in range(len(METRICS))]
    assert source.closed and sampler.error is None


def test_timestamps_are_epoch_ns_anchored_once() -> None:
    source = ScriptedSource(labels=("cuda:0",))
    before = time.time_ns()
    with NvmlSampler(rate_hz=100, source=source) as sampler:
        _wait_reads(source, 4)
    after = time.time_ns()
    t = sampler.to_frame()["t_ns"]
    assert t.is_monotonic_increasing
    assert before <= t.iloc[0] and t.iloc[-1] <= after
    params = sampler.params()
    assert params["clock"] == "unix_epoch_ns" and params["rate_hz"] == 100.0
    assert params["start_time_ns"] == sampler.start_time_ns


def test_counters_frame_converts_perf_counter_to_epoch() -> None:
    rows = [(1_000, 0, tuple(float(k) for k in range(7))), (2_500, 1, (math.nan,) * 7)]
    frame = counters_frame(rows, ["cuda:0", "cuda:3"], start_time_ns=1_700_000_000_000_000_000,
                           start_perf_counter_ns=500)
    assert list(frame["t_ns"]) == [1_700_000_000_000_000_500, 1_700_000_000_000_002_000]
    assert list(frame["device"]) == ["cuda:0", "cuda:3"]
    assert frame["power_w"].iloc[0] == 4.0 and frame.iloc[1][list(METRICS)].isna().all()


def test_thread_stops_cleanly_when_the_body_raises() -> None:
    source = ScriptedSource()
    sampler = NvmlSampler(rate_hz=50, source=source)
    with pytest.raises(ValueError, match="model diverged"), sampler:
        _wait_reads(source, 2)
        raise ValueError("model diverged")
    assert source.closed and sampler._thread is None
    assert len(sampler.to_frame()) == source.reads


def test_a_failing_source_stops_sampling_with_a_warning_not_a_crash() -> None:
    source = ScriptedSource(fail_after=3)
    with NvmlSampler(rate_hz=100, source=source) as sampler:
        _wait_reads(source, 4)
    assert isinstance(sampler.error, RuntimeError)
    assert any("stopped early" in w and "fell off the bus" in w for w in sampler.warnings)
    assert len(sampler.to_frame()) == 3


@pytest.mark.parametrize("rate", [0, -1, 100.5, 1000])
def test_rate_must_be_within_limits(rate: float) -> None:
    with pytest.raises(UsageError, match="rate"):
        NvmlSampler(rate_hz=rate, source=ScriptedSource())


def test_real_nvml_without_a_driver_is_a_clear_tool_not_found() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("NVML works here; this test is for machines without an NVIDIA driver")
    with pytest.raises(ToolNotFoundError) as info:
        NvmlSource().open()
    assert str(info.value).startswith("NVML is not available")
    assert "NVIDIA driver" in str(info.value) and "--nvml" in str(info.value)
    assert not NvmlCollector().is_available()


class StandInNvml:
    """Stands in for the pynvml module (NVML cannot run here) and raises pynvml's real errors."""

    NVMLError = pynvml.NVMLError
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_CLOCK_MEM = pynvml.NVML_CLOCK_MEM
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU

    def __init__(self, uuids: Sequence[str], unsupported_power: bool = True):
        self.uuids = list(uuids)
        self.unsupported_power = unsupported_power
        self.calls: dict[str, int] = {}
        self.temp_failures = 1

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def nvmlInit(self) -> None:
        self._count("init")

    def nvmlShutdown(self) -> None:
        self._count("shutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.159.03"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        return self.uuids[h].encode()

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=90 + h, memory=40 + h)

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        return {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 3201}[clock]

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        self._count("power")
        if self.unsupported_power:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 412_345

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        if self.temp_failures:
            self.temp_failures -= 1
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return 61

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(used=(h + 1) * 2**30, total=141 * 2**30, free=0)


def test_unsupported_metric_is_nan_listed_once_and_not_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stand_in = StandInNvml(UUIDS[:2])
    monkeypatch.setattr(nvml, "_import_pynvml", lambda: stand_in)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    source = NvmlSource()
    assert source.open() == ["cuda:0", "cuda:1"]
    samples = [source.read(p) for _ in range(3) for p in (0, 1)]
    source.close()
    first = dict(zip(METRICS, samples[0], strict=True))
    assert first["gpu_util_pct"] == 90 and first["mem_util_pct"] == 40
    assert first["sm_clock_mhz"] == 1980 and first["mem_clock_mhz"] == 3201
    assert first["mem_used_bytes"] == 2**30
    assert math.isnan(first["power_w"]) and math.isnan(first["temp_c"])  # temp: transient
    assert dict(zip(METRICS, samples[2], strict=True))["temp_c"] == 61
    assert all(math.isnan(s[METRICS.index("power_w")]) for s in samples)
    assert stand_in.calls["power"] == 2  # once per device, then never again
    assert list(source.unavailable) == ["power_w"]
    assert "NVMLError_NotSupported" in source.unavailable["power_w"]
    assert len(source.warnings) == 1 and "temp_c" in source.warnings[0]
    assert source.driver_version == "580.159.03" and stand_in.calls["shutdown"] == 1


def test_power_is_converted_from_milliwatts(monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in = StandInNvml(UUIDS, unsupported_power=False)
    monkeypatch.setattr(nvml, "_import_pynvml", lambda: stand_in)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-cccc,0")
    source = NvmlSource()
    assert source.open([1]) == ["cuda:1"]
    values = dict(zip(METRICS, source.read(0), strict=True))
    assert values["power_w"] == pytest.approx(412.345)
    assert values["gpu_util_pct"] == 90  # NVML device 0 is cuda:1 here


def _collector() -> NvmlCollector:
    return NvmlCollector(source_factory=lambda: ScriptedSource(labels=("cuda:0",)))


def test_collector_keeps_samples_of_a_failing_program(tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text("import sys, time\ntime.sleep(0.2)\nprint('CUDA error', file=sys.stderr)\nsys.exit(3)\n")
    capture = _collector().collect([sys.executable, str(script)], tmp_path / "out",
                                   NvmlOptions(rate_hz=50, stream_stderr=False))
    assert capture.partial and capture.collector == "nvml"
    assert "exited with 3" in capture.warnings[0] and "CUDA error" in capture.warnings[0]
    frame = pd.read_parquet(capture.files[0])
    assert capture.files[0] == tmp_path / "out" / "nvml.parquet" and len(frame) >= 1
    assert list(frame.columns[:9]) == column_names("counters")
    assert capture.params["clock"] == "unix_epoch_ns"


def test_collector_success_is_not_partial(tmp_path: Path) -> None:
    capture = _collector().collect([sys.executable, "-c", "pass"], tmp_path,
                                   NvmlOptions(stream_stderr=False))
    assert not capture.partial and capture.warnings == ()
    assert capture.commands == ((sys.executable, "-c", "pass"),)


def test_collector_ctrl_c_hands_back_the_partial_capture(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    script = tmp_path / "serve.py"
    script.write_text(f"import time\nopen({str(ready)!r}, 'w').write('1')\ntime.sleep(120)\n")

    def interrupt() -> None:
        while not ready.exists():
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=interrupt, daemon=True)
    thread.start()
    with pytest.raises(CaptureInterrupted) as info:
        _collector().collect([sys.executable, str(script)], tmp_path,
                             NvmlOptions(rate_hz=20, stream_stderr=False))
    thread.join()
    capture = info.value.capture
    assert isinstance(info.value, KeyboardInterrupt)
    assert capture.partial and "interrupted" in capture.warnings[0]
    assert capture.files[0].exists()


def test_a_driver_error_while_listing_gpus_shuts_nvml_down(monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in = StandInNvml(UUIDS)

    def lost(h: int) -> bytes:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    stand_in.nvmlDeviceGetUUID = lost  # type: ignore[method-assign]
    monkeypatch.setattr(nvml, "_import_pynvml", lambda: stand_in)
    with pytest.raises(ToolNotFoundError, match="while listing GPUs"):
        NvmlSource().open()
    assert stand_in.calls["shutdown"] == 1
