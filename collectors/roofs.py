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
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfscope.device import DeviceSpec, Roof
from perfscope.format import dumps

if TYPE_CHECKING:
    from collections.abc import Callable

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


def _best_seconds(fn: Callable[[], Any], sync: Callable[[], None], repeats: int) -> float:
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def _matmul_roof(torch: Any, dtype: Any, n: int, device: str, sync: Callable[[], None],
                 repeats: int) -> tuple[float, str]:
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    seconds = _best_seconds(lambda: torch.mm(a, b, out=out), sync, repeats)
    return 2.0 * n**3 / seconds, f"torch.mm {n}x{n}x{n} {str(dtype).removeprefix('torch.')}, best of {repeats}"


def _bandwidth_roof(torch: Any, nbytes: int, device: str, sync: Callable[[], None],
                    repeats: int) -> tuple[float, str]:
    """Best of three streaming kernels on ``nbytes`` of float32, far larger than the caches:
    a copy (bytes = read + write), a sum (read) and a matrix-vector product (read of the matrix,
    decode's access pattern). The roof is the fastest; the method names which one it was."""
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
    rates = {name: moved / _best_seconds(fn, sync, repeats) for name, (fn, moved) in kernels.items()}
    best = max(rates, key=lambda k: rates[k])
    others = ", ".join(f"{k} {v / 1e9:.1f} GB/s" for k, v in rates.items() if k != best)
    return rates[best], f"{best} of {nbytes >> 20} MiB float32, best of {repeats} (others: {others})"


def measure_cpu(*, repeats: int = REPEATS, sizes: dict[str, int] | None = None,
                copy_bytes: int = CPU_COPY_BYTES) -> DeviceSpec:
    """Measure the CPU's compute roofs (fp32, fp64, bf16) and memory bandwidth now."""
    import torch

    threads = torch.get_num_threads()
    sizes = sizes or CPU_MATMUL_N
    dtypes = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16}
    compute = {}
    for prec, n in sizes.items():
        value, method = _matmul_roof(torch, dtypes[prec], n, "cpu", lambda: None, repeats)
        compute[prec] = Roof(value, "measured", f"{method}, {threads} threads", clock="as running")
    bw, method = _bandwidth_roof(torch, copy_bytes, "cpu", lambda: None, repeats)
    memory = {"dram": Roof(bw, "measured", f"{method}, {threads} threads", clock="as running")}
    return DeviceSpec(
        name=cpu_model(), kind="cpu", compute=compute, memory=memory,
        properties={"threads": threads, "logical_cpus": os.cpu_count(), "torch": torch.__version__,
                    "machine": platform.machine()},
    )


def measure_cuda(index: int = 0, *, repeats: int = REPEATS) -> DeviceSpec:
    """Measure a CUDA GPU's matmul roofs and copy bandwidth; datasheet fills what failed."""
    import torch

    dev = f"cuda:{index}"
    props = torch.cuda.get_device_properties(index)
    sync = torch.cuda.synchronize
    compute: dict[str, Roof] = {}
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        for prec, n in CUDA_MATMUL_N.items():
            torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
            dtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
                     "fp16": torch.float16}[prec]
            value, method = _matmul_roof(torch, dtype, n, dev, sync, repeats)
            compute[prec] = Roof(value, "measured", method + (" (TF32 tensor cores)" if prec == "tf32" else ""),
                                 clock="as running", dense=True if prec != "fp32" else None)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    bw, method = _bandwidth_roof(torch, CUDA_COPY_BYTES, dev, sync, repeats)
    spec = DeviceSpec(
        name=props.name, kind="cuda", compute=compute,
        memory={"dram": Roof(bw, "measured", method, clock="as running")},
        properties={"sm_count": props.multi_processor_count, "memory_bytes": props.total_memory,
                    "compute_capability": f"{props.major}.{props.minor}", "torch": torch.__version__},
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


def device_roofs(device: str = "cpu", *, refresh: bool = False,
                 measure: Callable[[], DeviceSpec] | None = None) -> DeviceSpec:
    """This machine's roofs for ``device`` (``cpu`` or ``cuda[:N]``), measured once and cached.

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
    if path.is_file() and not refresh:
        try:
            spec = DeviceSpec.from_dict(json.loads(path.read_text()))
            return DeviceSpec(spec.name, spec.kind, spec.compute, spec.memory,
                              {**spec.properties, "cached": str(path)})
        except (OSError, ValueError, KeyError):
            pass  # a damaged cache is simply measured again
    spec = measure()
    spec = DeviceSpec(spec.name, spec.kind, spec.compute, spec.memory,
                      {**spec.properties, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(dumps(spec.to_dict()))
        os.replace(tmp, path)
    except OSError:
        pass  # caching is an optimisation; a read-only home still works
    return spec
