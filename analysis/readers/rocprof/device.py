"""The AMD device of a capture: from rocprofv3 agent records (JSON ``agents``, rocpd
``rocpd_info_agent.extdata``, ``*_agent_info.csv``), rocprof-compute ``sysinfo.csv`` or a rocminfo
dump; matched to a datasheet row by :func:`perfscope.datasheets.gpu_spec` (name first, then
properties such as the gfx arch, CU count and memory size).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from perfscope.datasheets import ROOFS_FLAG, gpu_spec

if TYPE_CHECKING:
    from perfscope.device import DeviceSpec

GFX = re.compile(r"^gfx(\d{1,2})([0-9a-f])([0-9a-f])$", re.IGNORECASE)


def compute_capability(gfx: str | None) -> str | None:
    """``gfx942`` -> ``9.4``, ``gfx90a`` -> ``9.0``, ``gfx1201`` -> ``12.0``, ``gfx1151`` -> ``11.5``
    (major.minor as Kineto's ``computeMajor``/``computeMinor`` give it on ROCm)."""
    m = GFX.match((gfx or "").strip())
    return f"{int(m.group(1))}.{int(m.group(2), 16)}" if m else None


def _num(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def agent_properties(agent: Mapping[str, Any]) -> dict[str, Any]:
    """One rocprofiler-sdk agent record (any of its spellings) -> perfscope's property vocabulary."""
    low = {str(k).lower(): v for k, v in agent.items()}
    gfx = str(low.get("name") or low.get("gfx_arch") or "")
    if not GFX.match(gfx):
        gfx = next((str(v) for v in low.values() if isinstance(v, str) and GFX.match(v)), "")
    banks = low.get("mem_banks") or []
    memory = max((int(b.get("size_in_bytes") or 0) for b in banks
                  if isinstance(b, Mapping) and b.get("heap_type") not in (0, None)), default=0)
    clock = _num(low.get("max_engine_clk_fcompute"))
    props = {
        "gfx_arch": gfx or None,
        "compute_capability": compute_capability(gfx),
        "sm_count": int(low["cu_count"]) if _num(low.get("cu_count")) else None,
        "simd_per_cu": low.get("simd_per_cu"),
        "wave_size": low.get("wave_front_size"),
        "num_xcc": low.get("num_xcc"),
        "max_clock_hz": clock * 1e6 if clock else None,
        "memory_bytes": memory or None,
        "chip": gfx or None,
    }
    return {k: v for k, v in props.items() if v is not None}


def agent_name(agent: Mapping[str, Any]) -> str:
    low = {str(k).lower(): v for k, v in agent.items()}
    for key in ("product_name", "marketing_name", "model_name", "name"):
        value = str(low.get(key) or "").strip()
        if value:
            return value
    return ""


def agent_spec(agent: Mapping[str, Any] | None, warnings: list[str]) -> DeviceSpec | None:
    """The DeviceSpec of one GPU agent, datasheet roofs where a row matches."""
    if not agent:
        warnings.append("no GPU agent description in the capture: device and roofs unknown; " + ROOFS_FLAG)
        return None
    name = agent_name(agent)
    spec = gpu_spec(name, kind="rocm", properties=agent_properties(agent))
    note_sheet(spec, warnings)
    return spec


def note_sheet(spec: DeviceSpec, warnings: list[str]) -> None:
    if "datasheet" not in spec.properties and spec.compute and spec.properties.get("gfx_arch"):
        warnings.append(f"no datasheet row for {spec.name!r} ({spec.properties['gfx_arch']}): compute roofs derived "
                        f"from the architecture (CUs x clock x FLOPs/CU/clock, provenance 'derived'); memory roofs "
                        f"unknown; {ROOFS_FLAG}")
    elif "datasheet" not in spec.properties:
        arch = spec.properties.get("gfx_arch")
        warnings.append(f"no datasheet roofs for {spec.name!r}{f' ({arch})' if arch else ''}; compute roofs "
                        f"unknown; {ROOFS_FLAG}")


SYSINFO_PROPS = {"cu_per_gpu": "sm_count", "simd_per_cu": "simd_per_cu", "wave_size": "wave_size",
                 "max_sclk": "max_clock_mhz", "max_mclk": "max_memory_clock_mhz", "gpu_l2": "l2_cache_kib",
                 "gpu_l1": "l1_cache_kib", "lds_banks_per_cu": "lds_banks_per_cu", "num_xcd": "num_xcd",
                 "total_l2_chan": "l2_channels", "compute_partition": "compute_partition",
                 "memory_partition": "memory_partition", "rocm_version": "rocm_version"}


def sysinfo_spec(sysinfo: Mapping[str, Any], warnings: list[str]) -> DeviceSpec:
    """rocprof-compute ``sysinfo.csv`` (one row) -> DeviceSpec; its ``hbm_bw`` (GB/s, as the tool
    computes it from the memory clock and bus) is the DRAM roof only where no datasheet gives one."""
    props: dict[str, Any] = {}
    for key, out in SYSINFO_PROPS.items():
        value = sysinfo.get(key)
        if value not in (None, "", "NA"):
            num = _num(value)
            props[out] = (int(num) if num is not None and num.is_integer() else num) if num is not None else value
    gfx = str(sysinfo.get("gpu_arch") or "")
    props["gfx_arch"] = gfx or None
    props["compute_capability"] = compute_capability(gfx)
    if props.get("max_clock_mhz"):
        props["max_clock_hz"] = float(props["max_clock_mhz"]) * 1e6
    if props.get("l2_cache_kib"):
        props["l2_cache_bytes"] = int(float(props["l2_cache_kib"]) * 1024)
    name = str(sysinfo.get("chip_id") or "").strip() or str(sysinfo.get("gpu_model") or "").strip()
    if sysinfo.get("gpu_model") and name != sysinfo.get("gpu_model"):
        props["gpu_model"] = sysinfo.get("gpu_model")
    # sysinfo's hbm_bw is one HBM stack's rate (max_mclk x 16 channels x 32 B: 665.6 GB/s on an MI300X,
    # whose eight stacks give 5.3 TB/s): without the stack count it is no device roof, so it is kept as a
    # property only and the DRAM roof comes from the datasheet row
    hbm = _num(sysinfo.get("hbm_bw"))
    if hbm:
        props["hbm_bw_per_stack_gb_s"] = hbm
    return gpu_spec(name, kind="rocm", properties={k: v for k, v in props.items() if v is not None})


def rocminfo_agents(text: str) -> list[dict[str, Any]]:
    """GPU agents of a ``rocminfo`` dump (rocprof v1 writes one as ``results.sysinfo.txt``)."""
    agents: list[dict[str, Any]] = []
    for block in re.split(r"\n\*{5,}\s*\nAgent \d+\s*\n\*{5,}[^\n]*", text)[1:]:
        fields: dict[str, str] = {}
        for line in block.splitlines():
            m = re.match(r"^\s{2}(\S[^:]*?):\s+(.*\S)\s*$", line)
            if m and m.group(1) not in fields:
                fields[m.group(1)] = m.group(2)
        if fields.get("Device Type", "").upper() != "GPU":
            continue
        clock = re.match(r"(\d+)", fields.get("Max Clock Freq. (MHz)", ""))
        pool = re.search(r"Segment:\s+GLOBAL; FLAGS: COARSE GRAINED\s*\n\s*Size:\s+(\d+)\(0x[0-9a-f]+\) KB", block)
        agents.append({"name": fields.get("Name"), "product_name": fields.get("Marketing Name"),
                       "cu_count": fields.get("Compute Unit"),
                       "max_engine_clk_fcompute": clock.group(1) if clock else None,
                       "wave_front_size": fields.get("Wavefront Size", "").split("(")[0].strip() or None,
                       "mem_banks": [{"heap_type": 1, "size_in_bytes": int(pool.group(1)) * 1024}] if pool else []})
    return agents
