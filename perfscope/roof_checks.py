"""Can a measured roof be trusted? A roof measured on a busy machine is too low, and every MFU, MBU
and % of roof against it too high.

Each measurement of this machine's roofs (:mod:`perfscope.collectors.roofs`) records, per roof, how it
was taken (``properties["roof_records"]``: the date, the load average before it, the share of its
threads' time the benchmark got, the spread of its repeats). :func:`roof_problems` reads those
records (and, for a GPU, the datasheet's figure) and says why a roof may be too low;
:func:`roof_warnings` is the line every report profiled against such roofs carries.
"""

from __future__ import annotations

import math

from .device import DeviceSpec, Roof

BUSY_CPU_SHARE = 0.8
"""A CPU measurement whose process got under this share of its threads' time (CPU seconds over wall
seconds x threads) ran beside other work: its roofs are low."""
ROOF_SPREAD_MAX = 0.25
"""A roof whose repeats' median is more than this above their best was measured while the machine's
speed moved under it (a quiet machine repeats within a few %; a 0.6 ms bf16 matmul jitters more)."""
FAR_BELOW = 0.7
"""A new measurement under this share of the roof it would replace is not taken: the old (higher)
roof is kept, and the drop said."""
DATASHEET_FAR_BELOW = 0.5
"""A measured GPU roof under this share of the datasheet's figure for the device is flagged (a quiet
H100/H200 measures 0.75-0.9 of its datasheet on these benchmarks)."""


def roofs_by_key(spec: DeviceSpec) -> dict[str, Roof]:
    """A spec's roofs by key: ``fp32``, ``bf16``, ... and ``dram`` (memory levels by their name)."""
    return {**spec.compute, **spec.memory}


def roof_problems(spec: DeviceSpec) -> dict[str, str]:
    """Why each measured roof of ``spec`` may be too low, by roof key (empty: every one was measured
    quietly): measured under load (:data:`BUSY_CPU_SHARE`; the load average is recorded, not judged:
    it still holds this process's own last minute), repeats that spread
    (:data:`ROOF_SPREAD_MAX`), far below the datasheet's figure (:data:`DATASHEET_FAR_BELOW`), or no
    record of how it was measured (a cache written before the records)."""
    records = spec.properties.get("roof_records") or {}
    sheet = _datasheet_roofs(spec)
    out: dict[str, str] = {}
    for key, roof in roofs_by_key(spec).items():
        if roof.provenance != "measured":
            continue
        rec = records.get(key)
        if not isinstance(rec, dict):
            out[key] = "no record of how it was measured"
            continue
        why = []
        share = rec.get("cpu_share")
        if isinstance(share, (int, float)) and share < BUSY_CPU_SHARE:
            why.append(f"under load ({share:.0%} of its {rec.get('threads')} threads' time)")
        spread = rec.get("spread")
        if isinstance(spread, (int, float)) and spread > ROOF_SPREAD_MAX:
            why.append(f"repeats spread {spread:.0%}")
        if key in sheet and roof.value < DATASHEET_FAR_BELOW * sheet[key]:
            why.append(f"{roof.value / sheet[key]:.0%} of the datasheet's figure")
        if why:
            out[key] = ", ".join(why)
    return out


def _datasheet_roofs(spec: DeviceSpec) -> dict[str, float]:
    """The datasheet's figures for a GPU spec's roofs (empty for a CPU or an unknown GPU)."""
    if spec.kind == "cpu":
        return {}
    from perfscope.datasheets import find_datasheet

    sheet = find_datasheet(spec.name)
    if sheet is None:
        return {}
    out = {p: v * 1e12 for p, v in sheet.tflops.items()}
    if sheet.bandwidth_gb_s:
        out["dram"] = sheet.bandwidth_gb_s * 1e9
    return out


def roof_warnings(spec: DeviceSpec | None) -> list[str]:
    """The report warnings of a spec's doubtful roofs (:func:`roof_problems`) in one line, and the drops
    :func:`perfscope.collectors.roofs.merge_roofs` kept out (``roof_notes``)."""
    if spec is None:
        return []
    notes = list(spec.properties.get("roof_notes") or [])
    doubtful = roof_problems(spec)
    if not doubtful:
        return notes
    loads = {(float(r["loadavg_1m"]), r.get("cpus")) for k, r in (spec.properties.get("roof_records") or {}).items()
             if k in doubtful and isinstance(r, dict) and isinstance(r.get("loadavg_1m"), (int, float))}
    load = "".join(f" (load average {x:.2g} on {n} CPUs)" for x, n in loads if math.isfinite(x)) if len(loads) == 1 else ""
    where = "; ".join(f"{key} {why}" for key, why in doubtful.items())
    return notes + [f"roofs of {spec.name} that may be too low, so MFU, MBU and % of roof read high against them: "
                    f"{where}{load}; run `perfscope devices --refresh` on a quiet machine"]
