"""Nsight Compute metrics of one profiled launch -> kernel-table fields; report peaks -> roofs.

Shared by the ``.ncu-rep`` and CSV readers, which both hand over a :class:`Launch` whose
metric values are already in base units (ns, bytes, Hz, per second, %). Formulas and metric
names follow FORMATS.md sections 3.2 and 3.3:

- FLOPs per precision from the SASS thread-instruction counters, an FMA counting 2:
  ``add + mul + 2 fma`` (fp64: d*, fp32: f*, fp16: h*, the ncu 2022.3 section convention;
  2025 sections count packed half instructions twice). Totals come from ``.sum`` counters or,
  when only rates were collected, ``.sum.per_cycle_elapsed x smsp__cycles_elapsed.avg.per_second
  x duration``. Tensor work comes from ``sm__ops_path_tensor_*`` (an op counted as one FLOP);
  pipe-tensor instruction counts carry no precision, so a launch with only those gets no FLOP
  total (missing, not partial).
- DRAM bytes from ``dram__bytes.sum`` (or read + write, or the rate x duration).
- Roofs from the report's own ``peak_sustained`` x clock (provenance ``report``).
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from perfscope.datasheets import find_datasheet, is_lpddr
from perfscope.device import DeviceSpec, Roof

from ...costs.operators import category_of
from ...tree import phase_of

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

Value = float | str

DURATION = "gpu__time_duration.sum"
SASS = "sass_thread_inst_executed_op_{op}_pred_on"
FP_OPS = {"fp64": ("dadd", "dmul", "dfma"), "fp32": ("fadd", "fmul", "ffma"), "fp16": ("hadd", "hmul", "hfma")}
SM_CLOCKS = ("sm__cycles_elapsed.avg.per_second", "smsp__cycles_elapsed.avg.per_second",
             "gpc__cycles_elapsed.avg.per_second")
DRAM_CLOCK = "dram__cycles_elapsed.avg.per_second"
TENSOR_OPS = re.compile(r"^sm__ops_path_tensor_(?:op_(?P<op>[a-z]+)_)?src_(?P<src>\w+?)(?:_dst_(?P<dst>\w+?))?"
                        r"(?:_sparsity_(?P<sparsity>on|off))?\.sum$")
"""Tensor-core op counters: per-source totals (``sm__ops_path_tensor_src_bf16_dst_fp32.sum``) and the
per-instruction paths inside them (``sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32_sparsity_off.sum``)."""
TENSOR_PEAK = re.compile(TENSOR_OPS.pattern.removesuffix("$") + r"\.peak_sustained$")
TENSOR_SRC = {"fp16": "fp16", "bf16": "bf16", "tf32": "tf32", "fp64": "fp64", "int8": "int8", "fp8": "fp8",
              "fp4_fp6_fp8": "fp8"}
FMA_PIPE_RENAMED = {"fp16": "fp16_fma"}
"""When the report has a tensor-core roof for a precision, the FMA-pipe roof of that name moves here
(datasheet convention: ``fp16`` is the tensor-core figure; ``fp64`` and ``fp32`` stay non-tensor)."""
PIPE_TENSOR = ("sm__inst_executed_pipe_tensor.sum", "smsp__inst_executed_pipe_tensor.sum")
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")
STALL_SAMPLES = re.compile(r"^smsp__pcsamp_warps_issue_stalled_(\w+?)(?<!_not_issued)$")

EXTRA_METRICS: dict[str, tuple[str, ...]] = {
    "sm_throughput_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed",),
    "memory_throughput_pct": ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",),
    "dram_throughput_pct": ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                            "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    "l1_throughput_pct": ("l1tex__throughput.avg.pct_of_peak_sustained_elapsed",),
    "l2_throughput_pct": ("lts__throughput.avg.pct_of_peak_sustained_elapsed",),
    "achieved_occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "theoretical_occupancy_pct": ("sm__maximum_warps_per_active_cycle_pct",),
    "sm_clock_hz": ("gpc__cycles_elapsed.avg.per_second", *SM_CLOCKS[:2]),
    "dram_clock_hz": (DRAM_CLOCK,),
    "waves_per_sm": ("launch__waves_per_multiprocessor",),
}
"""Extra kernel columns (units in the names) and the metrics that fill them, first found wins. The
throughputs are the GPU Speed Of Light section's, each a % of its unit's peak over the elapsed time
(``l1_throughput_pct`` from the ``_active`` value where only that was collected: :func:`l1_elapsed_pct`)."""
L1_ACTIVE = "l1tex__throughput.avg.pct_of_peak_sustained_active"
SM_ACTIVE_CYCLES = "sm__cycles_active.avg"
SM_ELAPSED_CYCLES = ("sm__cycles_elapsed.avg", "gpc__cycles_elapsed.max")
PIPE_METRIC = re.compile(r"^sm__(?:pipe_(?P<cycles>\w+?)_cycles_active|inst_executed_pipe_(?P<inst>\w+?))"
                         r"\.avg\.pct_of_peak_sustained_(?P<basis>elapsed|active)$")
"""Pipe utilization of the Compute Workload Analysis and SpeedOfLight breakdown sections: the pipe's active
cycles and its executed instructions, each a % of the pipe's peak (Nsight Compute Kernel Profiling Guide,
"Pipelines"; the HighPipeUtilization rule reads the same pair, on elapsed cycles)."""
PIPE_FAMILY = {"fmaheavy": "fma", "fmalite": "fma", "fp16": "fp16", "fp64": "fp64", "alu": "alu", "fma": "fma",
               "xu": "xu", "lsu": "lsu", "uniform": "uniform", "adu": "adu", "cbu": "cbu", "tex": "tex", "tma": "tma"}
"""Nsight Compute pipe name (its first word; ``tensor_*`` are the tensor pipe) -> the kernel column's pipe.
``shared`` is left out: it is the sum of the FP64 and tensor pipes (FP16 too before Hopper), not a pipe."""

FLOP_CONVENTION = (
    "FMA = 2 FLOP; fp64/fp32/fp16 = add + mul + 2 x fma SASS thread instructions (ncu 2022.3 "
    "convention: packed half2 instructions count once); tensor = sm__ops_path_tensor_* ops (one op = "
    "one FLOP: a multiply-add is 2 ops, checked on H200 where the hgmma bf16 ops of a GEMM equal "
    "2*M*N*K), counted once per source precision: the per-source totals "
    "(sm__ops_path_tensor_src_<p>[_dst_<q>][_sparsity_on|off]) when collected, else the sum of the "
    "distinct per-instruction paths (op_hgmma/hmma/..., never a total and its own paths together); "
    "pipe-tensor instruction counts are not converted"
)


@dataclass
class Launch:
    """One profiled kernel launch.

    Attributes:
        id: the launch's ID in the report (0-based, per process).
        name: demangled kernel name.
        short_name: function name without namespace, template arguments or parameters.
        metrics: metric name -> value in base units (float; str for string attributes).
        grid: ``(x, y, z)`` from the launch itself, when the source states it.
        block: ``(x, y, z)`` likewise.
        device: device ordinal or name as the source gives it.
        cc: compute capability (``8.6``) when known.
        nvtx: the NVTX push/pop ranges open around the launch, outermost first (names of a
            non-default domain as ``domain:name``, the way the nsys reader shows them).
    """

    id: int
    name: str
    short_name: str | None
    metrics: dict[str, Value] = field(default_factory=dict)
    grid: str | None = None
    block: str | None = None
    device: str | None = None
    cc: str | None = None
    nvtx: list[str] = field(default_factory=list)

    def num(self, *names: str) -> float | None:
        """The first of ``names`` that has a finite numeric value."""
        for name in names:
            value = self.metrics.get(name)
            if isinstance(value, float) and math.isfinite(value):
                return value
        return None

    def text(self, name: str) -> str | None:
        value = self.metrics.get(name)
        return value if isinstance(value, str) and value else None


# ------------------------------------------------------------------------------ counts
def _op_total(launch: Launch, op: str, seconds: float | None) -> float | None:
    """Executed instructions of one SASS op: a ``.sum`` counter, or its rate x elapsed time."""
    for unit in ("sm", "smsp"):
        total = launch.num(f"{unit}__{SASS.format(op=op)}.sum")
        if total is not None:
            return total
    per_second = launch.num(f"smsp__{SASS.format(op=op)}.sum.per_second")
    if per_second is not None and seconds is not None:
        return per_second * seconds
    per_cycle = launch.num(f"smsp__{SASS.format(op=op)}.sum.per_cycle_elapsed")
    clock = launch.num("smsp__cycles_elapsed.avg.per_second", *SM_CLOCKS)
    if per_cycle is not None and clock is not None and seconds is not None:
        return per_cycle * clock * seconds
    return None


def flops_by_precision(launch: Launch) -> dict[str, float | None]:
    """Measured FLOPs per precision (None where the counters were not collected)."""
    duration = launch.num(DURATION)
    seconds = duration * 1e-9 if duration is not None else None
    out: dict[str, float | None] = {}
    for precision, (add, mul, fma) in FP_OPS.items():
        a, m, f = (_op_total(launch, op, seconds) for op in (add, mul, fma))
        out[precision] = a + m + 2.0 * f if a is not None and m is not None and f is not None else None
    for precision, value in tensor_flops(launch).items():
        out[precision] = (out.get(precision) or 0.0) + value
    return out


def _tensor_key(match: re.Match[str]) -> tuple[str | None, str | None, str | None]:
    return match.group("op"), match.group("dst"), match.group("sparsity")


def _covers(outer: tuple[str | None, ...], inner: tuple[str | None, ...]) -> bool:
    """``outer`` counts a superset of ``inner``'s work: each of its fields is unset or equal."""
    return outer != inner and all(o is None or o == i for o, i in zip(outer, inner))


def tensor_flops(launch: Launch) -> dict[str, float]:
    """Tensor-core FLOPs per precision, each op counted once.

    A precision's counters form a hierarchy: the per-source total (no ``op_``) covers its
    per-instruction paths, a total without ``_sparsity_`` covers the dense and sparse ones. Only
    the counters no other collected counter covers are added, so ``src_bf16_dst_fp32`` alone when
    it was collected, else the distinct ``op_*`` paths (``hgmma`` + ``hmma``, dense + sparse).
    """
    found: dict[str, dict[tuple[str | None, str | None, str | None], float]] = {}
    for name, value in launch.metrics.items():
        match = TENSOR_OPS.match(name)
        precision = TENSOR_SRC.get(match.group("src")) if match else None
        if precision and isinstance(value, float) and math.isfinite(value):
            found.setdefault(precision, {})[_tensor_key(match)] = value  # type: ignore[arg-type]
    out: dict[str, float] = {}
    for precision, counters in found.items():
        keys = list(counters)
        out[precision] = float(sum(v for k, v in counters.items() if not any(_covers(o, k) for o in keys)))
    return out


def flops_total(launch: Launch, by_precision: Mapping[str, float | None]) -> tuple[float | None, str | None]:
    """(total FLOPs, dominant precision); total None when nothing was counted, or when tensor
    instructions ran that no op-path counter converts to FLOPs."""
    known = {p: v for p, v in by_precision.items() if v is not None}
    if not known:
        return None, None
    has_op_path = any(TENSOR_OPS.match(n) for n in launch.metrics)
    if not has_op_path and (launch.num(*PIPE_TENSOR) or 0) > 0:
        return None, None
    total = float(sum(known.values()))
    dominant = max(known, key=lambda p: known[p])  # type: ignore[arg-type, return-value]
    return total, (dominant if known[dominant] else None)


def dram_bytes(launch: Launch) -> float | None:
    """Bytes moved to or from DRAM by the launch."""
    direct = launch.num("dram__bytes.sum")
    if direct is not None:
        return direct
    read, write = launch.num("dram__bytes_read.sum"), launch.num("dram__bytes_write.sum")
    if read is not None and write is not None:
        return read + write
    rate, duration = launch.num("dram__bytes.sum.per_second"), launch.num(DURATION)
    if rate is not None and duration is not None:
        return rate * duration * 1e-9
    return None


LEVEL_METRICS = {
    "l2": ("derived__lts__lts2xbar_bytes.sum", "lts__cycles_elapsed.avg.per_second"),
    "l1": ("derived__l1tex__lsu_writeback_bytes_mem_lgds.sum", "l1tex__cycles_elapsed.avg.per_second"),
}
"""Hierarchical roofline levels as Nsight Compute's ``--set roofline`` / ``full`` sections measure
them (SpeedOfLight_Hierarchical*RooflineChart): the level's byte metric (L2 -> L1 traffic through
the crossbar; L1 writeback of local/global/shared loads), and the clock its ``peak_sustained``
(bytes per cycle) runs at."""
SHARED_WAVEFRONTS = "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"
SHARED_WAVEFRONT_BYTES = 128
"""A shared-memory wavefront moves one 128-byte row of the 32 banks x 4 bytes."""


def level_bytes(launch: Launch, level: str) -> float | None:
    """Bytes the launch moved at ``level`` (``l2``, ``l1``): the metric itself, else its rate x duration."""
    metric = LEVEL_METRICS[level][0]
    direct = launch.num(metric)
    if direct is not None:
        return direct
    rate, duration = launch.num(f"{metric}.per_second"), launch.num(DURATION)
    return rate * duration * 1e-9 if rate is not None and duration is not None else None


def shared_bytes(launch: Launch) -> float | None:
    wavefronts = launch.num(SHARED_WAVEFRONTS)
    return wavefronts * SHARED_WAVEFRONT_BYTES if wavefronts is not None else None


def level_roofs(launches: Sequence[Launch]) -> dict[str, Roof]:
    """L2 and L1 bandwidth roofs: the level's ``peak_sustained`` bytes per cycle x its clock."""
    roofs: dict[str, Roof] = {}
    for level, (metric, clock_metric) in LEVEL_METRICS.items():
        peak = _median([x.num(f"{metric}.peak_sustained") for x in launches])
        clock = _median([x.num(clock_metric) for x in launches])
        if peak and clock:
            roofs[level] = Roof(peak * clock, "report", method=f"{metric}.peak_sustained ({peak:g} B/cycle) x "
                                f"{clock_metric} (Nsight Compute's hierarchical roofline)",
                                clock=f"{level.upper()} clock while profiling, {clock / 1e9:.3f} GHz")
    return roofs


def _pipe_family(raw: str) -> str | None:
    if raw.startswith("tensor"):
        return "tensor"
    if raw.startswith("fma"):
        return "fma"
    return PIPE_FAMILY.get(raw.split("_")[0])


def pipe_utilization(launch: Launch) -> dict[str, float]:
    """Each pipe's % of its peak: the larger of its active cycles and executed instructions, over the
    elapsed time where those were collected (else over the SM's active cycles)."""
    found: dict[tuple[str, str], float] = {}
    for name, value in launch.metrics.items():
        match = PIPE_METRIC.match(name)
        family = _pipe_family(match.group("cycles") or match.group("inst")) if match else None
        if family is None or match is None or not isinstance(value, float) or not math.isfinite(value):
            continue
        key = (family, match.group("basis"))
        found[key] = max(found.get(key, -math.inf), value)
    out: dict[str, float] = {}
    for family in {f for f, _ in found}:
        out[family] = found.get((family, "elapsed"), found.get((family, "active"), math.nan))
    return out


def l1_elapsed_pct(launch: Launch) -> float | None:
    """L1/TEX throughput over the elapsed time: the ``_elapsed`` metric, else the ``_active`` one (what the
    SpeedOfLight section shows, over the cycles the SMs were active) x SM active / elapsed cycles. On the
    committed H200 capture the two agree to 0.01 percentage points; a launch that keeps a few SMs busy
    (70% of L1 while active, 0.2% over the elapsed time) is not L1-bound."""
    direct = launch.num("l1tex__throughput.avg.pct_of_peak_sustained_elapsed")
    if direct is not None:
        return direct
    active, cycles, elapsed = launch.num(L1_ACTIVE), launch.num(SM_ACTIVE_CYCLES), launch.num(*SM_ELAPSED_CYCLES)
    if active is None or cycles is None or not elapsed:
        return None
    return active * cycles / elapsed


def top_stalls(launch: Launch, n: int = 3) -> list[tuple[str, float]]:
    """The ``n`` largest warp-stall reasons: cycles per issued instruction, or sample shares."""
    ratios = {m.group(1): v for name, v in launch.metrics.items()
              if (m := STALL.match(name)) and isinstance(v, float) and math.isfinite(v)}
    if not ratios:
        samples = {m.group(1): v for name, v in launch.metrics.items()
                   if (m := STALL_SAMPLES.match(name)) and isinstance(v, float) and math.isfinite(v)}
        total = sum(samples.values())
        ratios = {k: v / total for k, v in samples.items()} if total else {}
    ranked = sorted(((k, v) for k, v in ratios.items() if k != "selected" and v > 0),
                    key=lambda kv: kv[1], reverse=True)
    return ranked[:n]


# ------------------------------------------------------------------------------ rows
def _dims(launch: Launch, prefix: str) -> str | None:
    axes = [launch.num(f"launch__{prefix}_dim_{a}") for a in "xyz"]
    if all(a is not None for a in axes):
        return "(" + ", ".join(str(int(a)) for a in axes) + ")"  # type: ignore[arg-type]
    return getattr(launch, prefix)


def launch_row(launch: Launch) -> dict[str, object]:
    """Kernel-table fields of one launch (missing values as None / NaN, never 0)."""
    by_precision = flops_by_precision(launch)
    flops, precision = flops_total(launch, by_precision)
    nbytes = dram_bytes(launch)
    static = launch.num("launch__shared_mem_per_block_static")
    dynamic = launch.num("launch__shared_mem_per_block_dynamic")
    device_id = launch.num("launch__device_id")
    path = "/".join(launch.nvtx) or None
    row: dict[str, object] = {
        "name": launch.name,
        "short_name": launch.short_name,
        "category": category_of(None, launch.name),
        "device": f"cuda:{int(device_id)}" if device_id is not None else _device_label(launch.device),
        "stream": launch.num("launch__stream_id"),
        "duration_ns": launch.num(DURATION),
        "grid": _dims(launch, "grid"),
        "block": _dims(launch, "block"),
        "registers_per_thread": launch.num("launch__registers_per_thread"),
        "shared_mem_bytes": static + dynamic if static is not None and dynamic is not None else None,
        "flops": flops,
        "dram_bytes": nbytes,
        "l2_bytes": level_bytes(launch, "l2"),
        "l1_bytes": level_bytes(launch, "l1"),
        "shared_bytes": shared_bytes(launch),
        "flops_source": "ncu" if flops is not None else None,
        "bytes_source": "ncu" if nbytes is not None else None,
        "precision": precision,
        "ncu_id": launch.id,
        "range": path,
        "phase": phase_of(path),
    }
    for precision_name in ("fp64", "fp32", "fp16"):
        row[f"flops_{precision_name}"] = by_precision.get(precision_name)
    for column, names in EXTRA_METRICS.items():
        row[column] = launch.num(*names)
    row["l1_throughput_pct"] = l1_elapsed_pct(launch)
    for pipe, value in pipe_utilization(launch).items():
        row[f"pipe_{pipe}_pct"] = value
    stalls = top_stalls(launch)
    for rank in range(1, 4):
        reason, ratio = stalls[rank - 1] if rank <= len(stalls) else (None, None)
        row[f"stall_top{rank}"], row[f"stall_top{rank}_ratio"] = reason, ratio
    return row


def _device_label(device: str | None) -> str:
    return f"cuda:{device}" if device and device.isdigit() else "cuda"


# ------------------------------------------------------------------------------ roofs
def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def report_roofs(launches: Sequence[Launch]) -> tuple[dict[str, Roof], dict[str, Roof]]:
    """Compute and memory roofs from the report's peak_sustained metrics x measured clocks."""
    compute: dict[str, Roof] = {}
    sm_clock = _median([x.num(*SM_CLOCKS) for x in launches])
    if sm_clock:
        for precision, fma in (("fp64", "dfma"), ("fp32", "ffma"), ("fp16", "hfma")):
            metric = f"sm__{SASS.format(op=fma)}.sum.peak_sustained"
            peak = _median([x.num(metric) for x in launches])
            if peak:
                compute[precision] = Roof(
                    2.0 * peak * sm_clock, "report",
                    method=f"2 x {metric} ({peak:g} inst/cycle) x SM clock",
                    clock=f"SM clock while profiling, {sm_clock / 1e9:.3f} GHz (the clock ncu ran at: base when it locked clocks, the running clock with --clock-control none)")
        tensor = tensor_roofs(launches, sm_clock)
        for precision, renamed in FMA_PIPE_RENAMED.items():
            if precision in tensor and precision in compute:
                compute[renamed] = compute.pop(precision)
        compute.update(tensor)
    memory: dict[str, Roof] = {}
    dram_clock = _median([x.num(DRAM_CLOCK) for x in launches])
    peak_bytes = _median([x.num("dram__bytes.sum.peak_sustained") for x in launches])
    if dram_clock and peak_bytes:
        memory["dram"] = Roof(peak_bytes * dram_clock, "report",
                              method=f"dram__bytes.sum.peak_sustained ({peak_bytes:g} B/cycle) x {DRAM_CLOCK}",
                              clock=f"DRAM clock while profiling, {dram_clock / 1e9:.3f} GHz")
    memory.update(level_roofs(launches))
    return compute, memory


def tensor_roofs(launches: Sequence[Launch], sm_clock: float) -> dict[str, Roof]:
    """Tensor-core roofs per precision from the per-path ``.sum.peak_sustained`` (ops per cycle).

    The dense roof of a precision is its fastest ``_sparsity_off`` path (``op_hgmma`` on Hopper),
    the sparse one (key ``<precision>_sparse``) its fastest ``_sparsity_on`` path; a precision
    without sparsity variants (fp64 DMMA) takes its fastest path as dense. Per-source totals are
    not used alone when paths exist: their peak is the sparse rate. fp64 tensor goes to
    ``fp64_tensor`` (``fp64`` stays the FMA-pipe figure, as on datasheets).
    """
    peaks: dict[tuple[str, str | None], tuple[bool, float, str]] = {}
    for name in {n for x in launches for n in x.metrics if TENSOR_PEAK.match(n)}:
        match = TENSOR_PEAK.match(name)
        precision = TENSOR_SRC.get(match.group("src")) if match else None
        peak = _median([x.num(name) for x in launches])
        if not precision or not peak or match is None:
            continue
        key = (precision, match.group("sparsity"))
        candidate = (match.group("op") is not None, peak, name)  # instruction paths before totals, then fastest
        if key not in peaks or candidate[:2] > peaks[key][:2]:
            peaks[key] = candidate
    roofs: dict[str, Roof] = {}
    clock = f"SM clock while profiling, {sm_clock / 1e9:.3f} GHz (the clock ncu ran at: base when it locked clocks, the running clock with --clock-control none)"
    for (precision, sparsity), (_, peak, name) in sorted(peaks.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        if sparsity is None and any(p == precision and s for p, s in peaks):
            continue  # a total whose dense and sparse paths are known
        dense = sparsity != "on"
        roof_key = (precision if precision != "fp64" else "fp64_tensor") + ("" if dense else "_sparse")
        roofs[roof_key] = Roof(peak * sm_clock, "report",
                               method=f"{name} ({peak:g} ops/cycle, one op = one FLOP) x SM clock",
                               clock=clock, dense=dense if sparsity else None)
    return roofs


def attribute_bandwidth(launches: Sequence[Launch], *, lpddr: bool = False) -> Roof | None:
    """Theoretical DRAM bandwidth from device attributes: memory clock x bus width / 8, times the
    transfers per clock the reported clock leaves out.

    GDDR and HBM report the memory clock of a double-data-rate bus, hence the CUDA Best Practices
    ``2 x clock``; an LPDDR part (GB10's LPDDR5X reports 8,533 MHz on 256 bits) reports its data
    rate already, so the factor is 1 (273 GB/s, not 546). ``lpddr``: the device is known to be
    LPDDR (its datasheet row); an integrated GPU (``device__attribute_integrated`` 1: Jetson, GB10)
    is taken as LPDDR too."""
    khz = _median([x.num("device__attribute_max_mem_frequency_khz") for x in launches])
    bits = _median([x.num("device__attribute_global_memory_bus_width") for x in launches])
    if not khz or not bits:
        return None
    integrated = _median([x.num("device__attribute_integrated") for x in launches]) == 1
    if lpddr or integrated:
        why = "an LPDDR part" if lpddr else "an integrated GPU (device__attribute_integrated 1): LPDDR"
        return Roof(khz * 1e3 * bits / 8.0, "report",
                    method=f"theoretical: device__attribute_max_mem_frequency_khz x "
                    f"device__attribute_global_memory_bus_width / 8 ({why} reports its data rate as the "
                    "clock, so not the 2 x of the CUDA Best Practices formula, which would double it)",
                    clock="max memory clock")
    return Roof(2.0 * khz * 1e3 * bits / 8.0, "report",
                method="theoretical: 2 x device__attribute_max_mem_frequency_khz x "
                "device__attribute_global_memory_bus_width / 8 (CUDA Best Practices formula)",
                clock="max memory clock")


def device_properties(launch: Launch) -> dict[str, object]:
    """Facts about the device from the launch's ``device__attribute_*`` metrics."""
    def num(name: str) -> float | None:
        return launch.num(f"device__attribute_{name}")

    major, minor = num("compute_capability_major"), num("compute_capability_minor")
    props: dict[str, object] = {
        "sm_count": num("multiprocessor_count"),
        "max_clock_hz": (num("max_gpu_frequency_khz") or math.nan) * 1e3,
        "memory_bytes": num("total_memory"),
        "l2_cache_bytes": num("l2_cache_size"),
        "compute_capability": f"{int(major)}.{int(minor)}" if major is not None and minor is not None else launch.cc,
    }
    return {k: v for k, v in props.items() if v is not None and not (isinstance(v, float) and math.isnan(v))}


def device_name(launches: Sequence[Launch]) -> str | None:
    """The device's display name, from the report's attributes or the CSV's Device column."""
    for launch in launches:
        name = launch.text("device__attribute_display_name")
        if name:
            return name
    for launch in launches:
        if launch.device and not launch.device.isdigit():
            return launch.device
    return None


def roofs_spec(name: str | None, launches: Sequence[Launch],
               datasheet: DeviceSpec | None) -> tuple[DeviceSpec | None, list[str]]:
    """The DeviceSpec: report peaks first, then theoretical DRAM bandwidth, then the datasheet."""
    compute, memory = report_roofs(launches)
    warnings: list[str] = []
    sheet = find_datasheet(name, device_properties(launches[0]) if launches else None)
    if "dram" not in memory and is_lpddr(sheet) and datasheet is not None and "dram" in datasheet.memory:
        memory["dram"] = datasheet.memory["dram"]  # an LPDDR part: its datasheet, not 2 x clock x width
    if "dram" not in memory:
        theoretical = attribute_bandwidth(launches, lpddr=is_lpddr(sheet))
        if theoretical:
            memory["dram"] = theoretical
    if not compute:
        if datasheet is not None and "dram" not in memory and "dram" in datasheet.memory:
            memory["dram"] = datasheet.memory["dram"]
        if datasheet is not None and datasheet.compute:
            compute = dict(datasheet.compute)
            warnings.append(f"the report has no peak_sustained metrics: compute roofs are datasheet "
                            f"figures for {datasheet.properties.get('datasheet')} (boost clock)")
        elif datasheet is not None:
            warnings.append(f"the report has no peak_sustained metrics and the datasheet row "
                            f"{datasheet.properties.get('datasheet')} lists no compute figures: compute roofs unknown "
                            "(profile with --set roofline, or pass a device)")
        else:
            warnings.append(f"the report has no peak_sustained metrics and no datasheet lists "
                            f"{name or 'this device (the source names none)'}: compute roofs unknown "
                            "(profile with --set roofline, or pass a device)")
    if not name and not compute and not memory:
        return None, warnings
    props = device_properties(launches[0]) if launches else {}
    return DeviceSpec(name=name or "unknown", kind="cuda", compute=compute, memory=memory,
                      properties=props), warnings
