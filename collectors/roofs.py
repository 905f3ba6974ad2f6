"""Measure this machine's roofs with torch micro-benchmarks, and cache them per machine.

- Compute roof per dtype: a large square matmul (``torch.mm``), best of several runs,
  FLOPs = 2·N³ (the same convention as the cost model).
- Memory roof: the fastest of three streaming kernels on tensors far bigger than the caches
  (a copy counting read + write bytes, a sum, and a matrix-vector product reading the matrix,
  which is decode's access pattern), best of several runs each.

On CUDA the same is done with torch on the GPU (bf16/fp16/tf32/fp32); a datasheet figure is the
labelled fallback for anything that could not be measured. Results are cached as JSON under
``$PERFSCOPE_CACHE_DIR`` (default ``~/.cache/perfscope``), keyed by the CPU/GPU model, thread count
and torch version, so the measurement runs once per machine.

A roof measured on a busy machine is too low, and every MFU and MBU against it too high. So each
measurement records how it was taken (``properties["roof_records"]``, per roof: the date, the load
average before it, the share of its threads' time the process got, the spread of its repeats), and a
cached roof is reused silently only when it was measured quietly (:func:`roof_problems`). One
measured under load (or with no record: a cache from before the records) is measured again, at most
every :data:`REMEASURE_AFTER_S`; a roof is the best rate measured, so a new measurement far below the
one it replaces keeps the old one and says so; what is still doubtful travels with the roofs as
warnings (:func:`roof_warnings`) into every report profiled against them, and ``perfscope devices``
shows each roof's age and spread.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfscope.device import DeviceSpec, Roof
from perfscope.format import dumps
from perfscope.roof_checks import FAR_BELOW, roof_problems, roofs_by_key

if TYPE_CHECKING:
    from collections.abc import Callable

REMEASURE_AFTER_S = 600.0
"""A doubtful cached roof is measured again on use, but not more often than this: in between it is
reused with its warning."""

CPU_MATMUL_N = {"fp32": 2048, "fp64": 1024, "bf16": 512}
CUDA_MATMUL_N = {"fp32": 8192, "tf32": 8192, "bf16": 8192, "fp16": 8192}
CPU_COPY_BYTES = 256 << 20
CUDA_COPY_BYTES = 2 << 30
REPEATS = 5


def cache_dir() -> Path:
    """Where measured roofs are cached (``$PERFSCOPE_CACHE_DIR`` or ``~/.cache/perfscope``)."""
    env = os.environ.get("PERFSCOPE_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "perfscope"


def cpu_model() -> str:
    """The CPU model name as the OS reports it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


CPU_SIGNATURE_FIELDS = ("vendor_id", "cpu family", "model", "stepping", "flags")
"""``/proc/cpuinfo`` fields that tell one CPU from another where the model name does not: a cloud VM
reports ``AMD EPYC`` on Zen 3 and Zen 4 hosts alike, and moves between them."""


def cpu_signature() -> str:
    """What identifies this CPU beyond its model name (its family, model, stepping and feature
    flags, and the CPUs the OS shows), so that cached roofs are measured again after a VM moves to
    another host; the platform's processor string where ``/proc/cpuinfo`` is absent."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break  # the first processor's block describes them all
            key, _, value = line.partition(":")
            if key.strip() in CPU_SIGNATURE_FIELDS:
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    parts = [fields.get(k, "") for k in CPU_SIGNATURE_FIELDS] if fields else [platform.processor()]
    return "|".join([*parts, str(os.cpu_count())])


def _repeat_seconds(fn: Callable[[], Any], sync: Callable[[], None], repeats: int) -> tuple[list[float], float]:
    """``fn``'s wall time over ``repeats`` runs after one warm-up, in seconds, and the process's CPU
    seconds per wall second over them (the threads' time it got)."""
    fn()
    sync()
    times = []
    cpu0 = time.process_time()
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    cpu = time.process_time() - cpu0
    return times, cpu / sum(times) if sum(times) > 0 else math.nan


def repeat_spread(times: list[float]) -> float:
    """How far the repeats' median is above their best: median / best - 1."""
    ordered = sorted(times)
    best, median = ordered[0], ordered[len(ordered) // 2]
    return median / best - 1.0 if best > 0 else math.nan


def _matmul_roof(torch: Any, dtype: Any, n: int, device: str, sync: Callable[[], None],
                 repeats: int) -> tuple[float, str, float, float]:
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    times, cpu = _repeat_seconds(lambda: torch.mm(a, b, out=out), sync, repeats)
    return (2.0 * n**3 / min(times), f"torch.mm {n}x{n}x{n} {str(dtype).removeprefix('torch.')}, best of {repeats}",
            repeat_spread(times), cpu)


def _bandwidth_roof(torch: Any, nbytes: int, device: str, sync: Callable[[], None],
                    repeats: int) -> tuple[float, str, float, float]:
    """Best of three streaming kernels on ``nbytes`` of float32, far larger than the caches:
    a copy (bytes = read + write), a sum (read) and a matrix-vector product (read of the matrix,
    decode's access pattern). The roof is the fastest; the method names which one it was; the spread
    and the CPU seconds per second are the fastest kernel's repeats'."""
    n = nbytes // 4
    src = torch.ones(n, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    cols = 4096
    mat = src.view(n // cols, cols)
    vec = torch.ones(cols, device=device, dtype=torch.float32)
    kernels = {
        "copy (read + write)": (lambda: dst.copy_(src), 2.0 * n * 4),
        "sum (read)": (lambda: src.sum(), 1.0 * n * 4),
        "matrix-vector product (read)": (lambda: torch.mv(mat, vec), 1.0 * n * 4),
    }
    runs = {name: _repeat_seconds(fn, sync, repeats) for name, (fn, _) in kernels.items()}
    rates = {name: kernels[name][1] / min(t) for name, (t, _) in runs.items()}
    best = max(rates, key=lambda k: rates[k])
    others = ", ".join(f"{k} {v / 1e9:.1f} GB/s" for k, v in rates.items() if k != best)
    return (rates[best], f"{best} of {nbytes >> 20} MiB float32, best of {repeats} (others: {others})",
            repeat_spread(runs[best][0]), runs[best][1])


def measure_cpu(*, repeats: int = REPEATS, sizes: dict[str, int] | None = None,
                copy_bytes: int = CPU_COPY_BYTES) -> DeviceSpec:
    """Measure the CPU's compute roofs (fp32, fp64, bf16) and memory bandwidth now."""
    import torch

    threads = torch.get_num_threads()
    sizes = sizes or CPU_MATMUL_N
    dtypes = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16}
    compute = {}
    spread: dict[str, float] = {}
    share: dict[str, float] = {}  # the share of its threads' time each benchmark got
    for prec, n in sizes.items():
        value, method, spread[prec], cpu = _matmul_roof(torch, dtypes[prec], n, "cpu", lambda: None, repeats)
        compute[prec] = Roof(value, "measured", f"{method}, {threads} threads", clock="as running")
        share[prec] = cpu / threads
    bw, method, spread["dram"], cpu = _bandwidth_roof(torch, copy_bytes, "cpu", lambda: None, repeats)
    share["dram"] = cpu / threads
    memory = {"dram": Roof(bw, "measured", f"{method}, {threads} threads", clock="as running")}
    return DeviceSpec(
        name=cpu_model(), kind="cpu", compute=compute, memory=memory,
        properties={"threads": threads, "logical_cpus": os.cpu_count(), "torch": torch.__version__,
                    "machine": platform.machine(), "roof_spread": spread, "roof_cpu_share": share},
    )


def measure_cuda(index: int = 0, *, repeats: int = REPEATS) -> DeviceSpec:
    """Measure a CUDA GPU's matmul roofs and copy bandwidth; datasheet fills what failed."""
    import torch

    dev = f"cuda:{index}"
    props = torch.cuda.get_device_properties(index)
    sync = torch.cuda.synchronize
    compute: dict[str, Roof] = {}
    spread: dict[str, float] = {}
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        for prec, n in CUDA_MATMUL_N.items():
            torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
            dtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
                     "fp16": torch.float16}[prec]
            value, method, spread[prec], _ = _matmul_roof(torch, dtype, n, dev, sync, repeats)
            compute[prec] = Roof(value, "measured", method + (" (TF32 tensor cores)" if prec == "tf32" else ""),
                                 clock="as running", dense=True if prec != "fp32" else None)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    bw, method, spread["dram"], _ = _bandwidth_roof(torch, CUDA_COPY_BYTES, dev, sync, repeats)
    spec = DeviceSpec(
        name=props.name, kind="cuda", compute=compute,
        memory={"dram": Roof(bw, "measured", method, clock="as running")},
        properties={"sm_count": props.multi_processor_count, "memory_bytes": props.total_memory,
                    "compute_capability": f"{props.major}.{props.minor}", "torch": torch.__version__,
                    "roof_spread": spread},
    )
    return _with_datasheet_fallback(spec)


def _with_datasheet_fallback(spec: DeviceSpec) -> DeviceSpec:
    from perfscope.datasheets import gpu_spec

    return gpu_spec(spec.name, kind=spec.kind, compute=spec.compute, memory=spec.memory, properties=spec.properties)


def _cache_key(kind: str, name: str) -> str:
    import torch

    threads = torch.get_num_threads() if kind == "cpu" else 0
    raw = f"{kind}|{name}|{threads}|{torch.__version__}|{platform.node()}"
    if kind == "cpu":
        raw += f"|{cpu_signature()}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def _measured(measure: Callable[[], DeviceSpec]) -> DeviceSpec:
    """Run ``measure`` and record how each measured roof was taken (``roof_records``): the date, the
    load average before, the CPUs, and where the benchmark reports them the spread of the roof's
    repeats and the share of its threads' time the process got while timing them (CPU roofs)."""
    import torch

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    spec = measure()
    spreads = spec.properties.get("roof_spread") or {}
    shares = spec.properties.get("roof_cpu_share") or {}
    when = _now()
    records = {key: {"measured_at": when, "loadavg_1m": load, "cpus": os.cpu_count(),
                     "threads": torch.get_num_threads() if spec.kind == "cpu" else None,
                     "cpu_share": shares.get(key), "spread": spreads.get(key)}
               for key, roof in roofs_by_key(spec).items() if roof.provenance == "measured"}
    props = {k: v for k, v in spec.properties.items() if k not in ("roof_spread", "roof_cpu_share")}
    return DeviceSpec(spec.name, spec.kind, spec.compute, spec.memory,
                      {**props, "measured_at": when, "roof_records": records})


def roof_age_s(stamp: Any) -> float:
    """Seconds since a roof record's ``measured_at`` (local time); inf when it has none."""
    try:
        return time.time() - time.mktime(time.strptime(str(stamp), "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return math.inf


def merge_roofs(fresh: DeviceSpec, cached: DeviceSpec | None) -> DeviceSpec:
    """A new measurement with the roof it replaces: a roof is the best rate measured on this machine,
    so each keeps the higher of the two; where the new one is far below the old (:data:`FAR_BELOW`)
    the old is kept and the drop said (``roof_notes``)."""
    if cached is None:
        return fresh
    new, old = roofs_by_key(fresh), roofs_by_key(cached)
    records = dict(fresh.properties.get("roof_records") or {})
    old_records = cached.properties.get("roof_records") or {}
    notes, kept = [], {}
    for key, roof in new.items():
        prev = old.get(key)
        if prev is None or prev.provenance != "measured" or roof.value >= prev.value:
            continue
        kept[key] = prev
        if key in old_records:
            records[key] = old_records[key]
        else:
            records.pop(key, None)
        if roof.value < FAR_BELOW * prev.value:
            when = (old_records.get(key) or {}).get("measured_at", "earlier")
            notes.append(f"{key} of {fresh.name} measured now at {roof.value:.3g}, {roof.value / prev.value:.0%} of "
                         f"the {prev.value:.3g} measured {when}: the machine is slower now (busy?); kept {prev.value:.3g}")
    compute = {k: kept.get(k, r) for k, r in fresh.compute.items()}
    memory = {k: kept.get(k, r) for k, r in fresh.memory.items()}
    return DeviceSpec(fresh.name, fresh.kind, compute, memory,
                      {**fresh.properties, "roof_records": records, "roof_notes": notes})


def device_roofs(device: str = "cpu", *, refresh: bool = False,
                 measure: Callable[[], DeviceSpec] | None = None) -> DeviceSpec:
    """This machine's roofs for ``device`` (``cpu`` or ``cuda[:N]``), measured once and cached.

    A cached roof is reused as it is when it was measured quietly; one that may be too low
    (:func:`roof_problems`) is measured again (at most every :data:`REMEASURE_AFTER_S`, else reused
    with its warning), and the new measurement replaces it only where it is higher
    (:func:`merge_roofs`).

    Args:
        device: ``cpu`` or ``cuda``/``cuda:N``.
        refresh: measure again even when a cached result exists.
        measure: the measuring function (default: :func:`measure_cpu` / :func:`measure_cuda`).
    """
    import torch

    if device.startswith("cuda"):
        index = int(device.split(":")[1]) if ":" in device else 0
        name = torch.cuda.get_device_name(index)
        kind = "cuda"
        measure = measure or (lambda: measure_cuda(index))
    else:
        name, kind = cpu_model(), "cpu"
        measure = measure or measure_cpu
    path = cache_dir() / "roofs" / f"{kind}-{_cache_key(kind, name)}.json"
    cached = None
    if path.is_file():
        try:
            cached = DeviceSpec.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError):
            cached = None  # a damaged cache is simply measured again
    if cached is not None and not refresh:
        doubtful = roof_problems(cached)
        if not doubtful or roof_age_s(cached.properties.get("measured_at")) < REMEASURE_AFTER_S:
            return DeviceSpec(cached.name, cached.kind, cached.compute, cached.memory,
                              {**cached.properties, "cached": str(path)})
    spec = merge_roofs(_measured(measure), cached)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(dumps(spec.to_dict()))
        os.replace(tmp, path)
    except OSError:
        pass  # caching is an optimisation; a read-only home still works
    return spec
