"""NVML sampler: GPU utilisation, clocks, power, temperature and memory over time, in a
background thread, stored as the Report's ``counters`` table.

Timestamps: ``t_ns`` is Unix-epoch nanoseconds read on the monotonic ``perf_counter`` clock
and anchored once at start, ``t_ns = start_time_ns + (perf_counter_ns() - start_perf_counter_ns)``
(no jumps when NTP adjusts the wall clock). Both anchors are in the capture's ``params`` so a
trace on another clock (nsys session time, Kineto's base time) can be aligned with it.

Each metric is read separately: one that the GPU or driver does not support becomes NaN and
is listed once in ``unavailable_metrics``; it never stops the sampling.

Equivalent command: ``nvidia-smi --query-gpu=utilization.gpu,utilization.memory,clocks.sm,
clocks.mem,power.draw,temperature.gpu,memory.used --format=csv -lms 100``.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pandas as pd

from perfscope.errors import CollectorError, ToolNotFoundError, UsageError
from perfscope.format import dumps
from perfscope.schema import NVML_PARAMS_KEY, conform

from ._proc import run_tool
from .base import CaptureInterrupted, RawCapture
from .nsys import stderr_echo

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from types import ModuleType, TracebackType

METRICS = ("gpu_util_pct", "mem_util_pct", "sm_clock_mhz", "mem_clock_mhz", "power_w",
           "temp_c", "mem_used_bytes")
MAX_RATE_HZ = 100.0
_PERMANENT = ("NVMLError_NotSupported", "NVMLError_NoPermission", "NVMLError_FunctionNotFound")


def _util(nv: Any, h: Any) -> tuple[float, ...]:
    rates = nv.nvmlDeviceGetUtilizationRates(h)
    return float(rates.gpu), float(rates.memory)


def _sm_clock(nv: Any, h: Any) -> tuple[float, ...]:
    return (float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),)


def _mem_clock(nv: Any, h: Any) -> tuple[float, ...]:
    return (float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),)


def _power(nv: Any, h: Any) -> tuple[float, ...]:
    return (nv.nvmlDeviceGetPowerUsage(h) / 1000.0,)  # mW -> W


def _temp(nv: Any, h: Any) -> tuple[float, ...]:
    return (float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),)


def _mem_used(nv: Any, h: Any) -> tuple[float, ...]:
    return (float(nv.nvmlDeviceGetMemoryInfo(h).used),)


READERS: tuple[tuple[tuple[str, ...], Callable[[Any, Any], tuple[float, ...]]], ...] = (
    (("gpu_util_pct", "mem_util_pct"), _util),
    (("sm_clock_mhz",), _sm_clock),
    (("mem_clock_mhz",), _mem_clock),
    (("power_w",), _power),
    (("temp_c",), _temp),
    (("mem_used_bytes",), _mem_used),
)
"""One NVML call each, in :data:`METRICS` order; a failing call only blanks its own metrics."""


def visible_devices(uuids: Sequence[str], cuda_visible: str | None) -> list[tuple[int, str]]:
    """``(nvml_index, "cuda:N")`` for the GPUs a CUDA program would see.

    Follows ``CUDA_VISIBLE_DEVICES`` (indices or ``GPU-`` UUID prefixes; the list ends at the
    first entry that matches nothing, as in CUDA). Indices are taken in NVML's (PCI bus)
    order, which is CUDA's order for identical GPUs or with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.
    """
    if cuda_visible is None:
        return [(i, f"cuda:{i}") for i in range(len(uuids))]
    chosen: list[int] = []
    for entry in (e.strip() for e in cuda_visible.split(",")):
        index = _match_entry(entry, uuids)
        if index is None or index in chosen:
            break
        chosen.append(index)
    return [(nvml, f"cuda:{cuda}") for cuda, nvml in enumerate(chosen)]


def _match_entry(entry: str, uuids: Sequence[str]) -> int | None:
    if entry.isdigit():
        return int(entry) if int(entry) < len(uuids) else None
    if entry.startswith("GPU-"):
        hits = [i for i, u in enumerate(uuids) if u.startswith(entry)]
        return hits[0] if len(hits) == 1 else None
    return None


class SampleSource(Protocol):
    """Where samples come from: the real GPUs (:class:`NvmlSource`)."""

    unavailable: dict[str, str]
    warnings: list[str]

    def open(self, devices: Sequence[int] | None) -> list[str]:
        """Start; return the labels (``cuda:N``) of the devices :meth:`read` takes by position."""
        ...

    def read(self, position: int) -> tuple[float, ...]:
        """One sample of every metric of :data:`METRICS` (NaN when unavailable)."""
        ...

    def close(self) -> None:
        """Release the library."""
        ...


def _import_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError:
        raise ToolNotFoundError("nvidia-ml-py", "pip install nvidia-ml-py (import name pynvml)") from None
    return pynvml


class NvmlSource:
    """Reads the GPUs through ``pynvml`` (PyPI ``nvidia-ml-py``), each metric guarded."""

    def __init__(self) -> None:
        self.unavailable: dict[str, str] = {}
        self.warnings: list[str] = []
        self.driver_version: str | None = None
        self._nv: Any = None
        self._handles: list[Any] = []
        self._labels: list[str] = []
        self._disabled: list[set[int]] = []

    def open(self, devices: Sequence[int] | None = None) -> list[str]:
        """Initialise NVML and pick the devices (CUDA indices; None: all visible).

        Raises:
            ToolNotFoundError: pynvml is not installed or the NVIDIA driver is absent.
        """
        nv = _import_pynvml()
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise ToolNotFoundError("NVML", f"{exc}: install the NVIDIA driver (libnvidia-ml.so.1), "
                                    "or profile without --nvml") from None
        self._nv = nv
        try:
            self.driver_version = _text(nv.nvmlSystemGetDriverVersion())
            handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
            uuids = [_text(nv.nvmlDeviceGetUUID(h)) for h in handles]
        except nv.NVMLError as exc:
            self.close()
            raise ToolNotFoundError("NVML", f"{exc} while listing GPUs: check the NVIDIA driver "
                                    "(nvidia-smi), or profile without --nvml") from None
        pairs = visible_devices(uuids, os.environ.get("CUDA_VISIBLE_DEVICES"))
        if devices is not None:
            pairs = [pairs[i] for i in devices if 0 <= i < len(pairs)]
        self._handles = [handles[i] for i, _ in pairs]
        self._labels = [label for _, label in pairs]
        self._disabled = [set() for _ in pairs]
        return list(self._labels)

    def read(self, position: int) -> tuple[float, ...]:
        """Every metric of one device; an unsupported one is NaN (and never asked again)."""
        values: list[float] = []
        for group, (names, reader) in enumerate(READERS):
            if group in self._disabled[position]:
                values.extend([math.nan] * len(names))
                continue
            values.extend(self._guarded(position, group, names, reader))
        return tuple(values)

    def _guarded(self, position: int, group: int, names: tuple[str, ...],
                 reader: Callable[[Any, Any], tuple[float, ...]]) -> tuple[float, ...]:
        try:
            return reader(self._nv, self._handles[position])
        except self._nv.NVMLError as exc:
            kind = type(exc).__name__
            if kind in _PERMANENT:
                self._disabled[position].add(group)
                for name in names:
                    self.unavailable.setdefault(name, f"{kind} on {self._labels[position]}")
            elif len(self.warnings) < 20:
                self.warnings.append(f"NVML {'/'.join(names)} on {self._labels[position]}: {exc}")
            return (math.nan,) * len(names)

    def close(self) -> None:
        """Shut NVML down (safe to call twice)."""
        if self._nv is not None:
            self._nv.nvmlShutdown()
            self._nv = None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class SamplerStats:
    """How the sampling thread did.

    Attributes:
        samples: sampling rounds (each reads every device).
        wall_s: seconds the thread ran.
        thread_cpu_s: CPU time of the sampling thread (``time.thread_time``).
        late_ticks: rounds that started after the next one was due (the rate was not kept).
    """

    samples: int
    wall_s: float
    thread_cpu_s: float
    late_ticks: int

    @property
    def cpu_pct_of_core(self) -> float:
        """Thread CPU time as a percentage of one core over the run."""
        return 100.0 * self.thread_cpu_s / self.wall_s if self.wall_s > 0 else math.nan


class NvmlSampler:
    """Samples every visible GPU at ``rate_hz`` in a background thread while in a ``with``.

    Example::

        with NvmlSampler(rate_hz=20) as sampler:
            run_workload()
        counters = sampler.to_frame()      # the Report's counters table
    """

    def __init__(self, rate_hz: float = 10.0, *, devices: Sequence[int] | None = None,
                 source: SampleSource | None = None) -> None:
        if not 0 < rate_hz <= MAX_RATE_HZ:
            raise UsageError(f"NVML sampling rate must be in (0, {MAX_RATE_HZ:g}] Hz, not {rate_hz}")
        self.rate_hz = float(rate_hz)
        self.source: SampleSource = source if source is not None else NvmlSource()
        self._devices = devices
        self._labels: list[str] = []
        self._rows: list[tuple[int, int, tuple[float, ...]]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.stats = SamplerStats(0, 0.0, 0.0, 0)
        self.start_time_ns = 0
        self.start_perf_counter_ns = 0

    def __enter__(self) -> NvmlSampler:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        """Open the source and start the thread (first sample taken at once)."""
        self._labels = self.source.open(self._devices)
        self.start_perf_counter_ns = time.perf_counter_ns()
        self.start_time_ns = time.time_ns()
        self._thread = threading.Thread(target=self._run, name="perfscope-nvml", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and release NVML; idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self.source.close()

    def _run(self) -> None:
        period_ns = int(1e9 / self.rate_hz)
        cpu0, wall0 = time.thread_time_ns(), time.perf_counter_ns()
        samples = late = 0
        due = wall0
        try:
            while not self._stop.is_set():
                self._sample()
                samples += 1
                due += period_ns
                now = time.perf_counter_ns()
                if due < now:
                    late += 1
                    due = now
                self._stop.wait((due - now) / 1e9)
        except BaseException as exc:  # noqa: BLE001 - kept, reported by warnings
            self.error = exc
        finally:
            self.stats = SamplerStats(samples, (time.perf_counter_ns() - wall0) / 1e9,
                                      (time.thread_time_ns() - cpu0) / 1e9, late)

    def _sample(self) -> None:
        t = time.perf_counter_ns()
        for position in range(len(self._labels)):
            self._rows.append((t, position, self.source.read(position)))

    @property
    def unavailable_metrics(self) -> list[str]:
        """Metrics some device could not provide, each listed once."""
        return sorted(self.source.unavailable)

    @property
    def warnings(self) -> list[str]:
        """Transient read errors and an early stop of the thread, one line each."""
        lines = [f"{m} unavailable ({why})" for m, why in sorted(self.source.unavailable.items())]
        lines += self.source.warnings
        if self.error is not None:
            lines.append(f"NVML sampling stopped early: {type(self.error).__name__}: {self.error}")
        return lines

    def params(self) -> dict[str, Any]:
        """The clock anchors and rate, for the manifest."""
        return {"rate_hz": self.rate_hz, "clock": "unix_epoch_ns",
                "start_time_ns": self.start_time_ns,
                "start_perf_counter_ns": self.start_perf_counter_ns,
                "devices": list(self._labels)}

    def to_frame(self) -> pd.DataFrame:
        """The samples as a ``counters`` table (one row per device and sampling round)."""
        return counters_frame(self._rows, self._labels, self.start_time_ns,
                              self.start_perf_counter_ns)


def counters_frame(rows: Sequence[tuple[int, int, tuple[float, ...]]], labels: Sequence[str],
                   start_time_ns: int, start_perf_counter_ns: int) -> pd.DataFrame:
    """Raw ``(perf_counter_ns, device position, values)`` rows as a conformed counters table."""
    values = pd.DataFrame([r[2] for r in rows], columns=list(METRICS), dtype="float64")
    values.insert(0, "device", [labels[r[1]] for r in rows])
    values.insert(0, "t_ns", [start_time_ns + (r[0] - start_perf_counter_ns) for r in rows])
    return conform(values, "counters", source="nvml")


@dataclass(frozen=True)
class NvmlOptions:
    """Settings of an NVML-sampled run.

    Attributes:
        rate_hz: samples per second per GPU (default 10, at most 100).
        devices: CUDA device indices to sample (None: every visible GPU).
        output_base: parquet file name without extension, inside out_dir.
        timeout_s: wall-clock limit for the profiled command.
        stream_stderr: echo the program's stderr while it runs.
    """

    rate_hz: float = 10.0
    devices: tuple[int, ...] | None = None
    output_base: str = "nvml"
    timeout_s: float | None = None
    stream_stderr: bool = True


class NvmlCollector:
    """Runs a command while :class:`NvmlSampler` samples the GPUs; writes ``nvml.parquet``.

    To sample alongside nsys or ncu, wrap their ``collect`` in ``with NvmlSampler(...)``.
    """

    name = "nvml"
    options_type = NvmlOptions

    def __init__(self, source_factory: Callable[[], SampleSource] = NvmlSource) -> None:
        self.source_factory = source_factory

    def is_available(self) -> bool:
        """True when pynvml imports and NVML initialises (an NVIDIA driver is loaded)."""
        try:
            source = self.source_factory()
            source.open(None)
        except ToolNotFoundError:
            return False
        source.close()
        return True

    def command(self, target: Sequence[str], options: NvmlOptions) -> list[str]:
        """The command run under sampling: ``target`` itself (NVML needs no wrapper)."""
        if not target:
            raise UsageError("no command to profile", hint="put it after --, e.g. -- python run.py")
        return list(target)

    def collect(self, target: Sequence[str], out_dir: Path, options: NvmlOptions) -> RawCapture:
        """Run ``target`` while sampling; a failing or interrupted program keeps its samples.

        Raises:
            ToolNotFoundError: NVML or the command is not available.
            CaptureInterrupted: Ctrl-C; its ``capture`` holds the samples so far.
        """
        cmd = self.command(target, options)
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        problems: list[str] = []
        interrupted = False
        with NvmlSampler(options.rate_hz, devices=options.devices,
                          source=self.source_factory()) as sampler:
            try:
                run_tool(cmd, timeout_s=options.timeout_s, on_stderr=stderr_echo(options.stream_stderr))
            except CollectorError as exc:
                problems.append(f"{exc.message}; kept the samples taken so far")
            except KeyboardInterrupt:
                interrupted = True
                problems.append("interrupted (Ctrl-C); kept the samples taken so far")
        path = out_dir / f"{Path(options.output_base).name}.parquet"
        write_samples(sampler.to_frame(), sampler.params(), path)
        capture = _nvml_capture(self.name, path, cmd, sampler, problems)
        if interrupted:
            raise CaptureInterrupted(capture)
        return capture


def write_samples(frame: pd.DataFrame, params: Mapping[str, Any], path: Path) -> None:
    """Write a counters table as Parquet, with the sampler's params (rate, clock anchors) in its
    metadata so that ``perfscope import nvml.parquet`` keeps them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(frame, preserve_index=False)
    meta = {**(table.schema.metadata or {}), NVML_PARAMS_KEY: dumps(params, indent=None).encode()}
    pq.write_table(table.replace_schema_metadata(meta), path)


def _nvml_capture(name: str, path: Path, cmd: Sequence[str], sampler: NvmlSampler,
                  problems: Sequence[str]) -> RawCapture:
    driver = getattr(sampler.source, "driver_version", None)
    return RawCapture(
        collector=name, files=(path,), commands=(tuple(cmd),),
        tool_version=f"driver {driver}" if driver else None, partial=bool(problems),
        warnings=(*problems, *sampler.warnings), unavailable_metrics=tuple(sampler.unavailable_metrics),
        params=sampler.params(),
    )

