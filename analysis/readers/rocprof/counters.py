"""FLOPs per precision and bytes per memory level from AMD hardware counters, per dispatch.

The formulas are rocprof-compute's own roofline formulas, ``calc_ai`` in
``src/utils/roofline_calc.py`` of ROCm/rocprofiler-compute (commit
a63a4cbcb2afc6c67095f8012428370998d31884), applied to each dispatch instead of each kernel:

- VALU FLOPs per precision p in (F16, F32, F64):
  ``64 x (SQ_INSTS_VALU_ADD_p + SQ_INSTS_VALU_MUL_p + 2 x SQ_INSTS_VALU_FMA_p + SQ_INSTS_VALU_TRANS_p)``;
- MFMA FLOPs per precision p in (F16, BF16, F32, F64): ``512 x SQ_INSTS_VALU_MFMA_MOPS_p``, and integer
  ops ``512 x SQ_INSTS_VALU_MFMA_MOPS_I8``;
- total FLOPs: the VALU sum plus the four MFMA floating-point terms (I8 ops kept apart, as the tool does);
- LDS bytes: ``(SQ_LDS_IDX_ACTIVE - SQ_LDS_BANK_CONFLICT) x 4 x lds_banks_per_cu`` (sysinfo);
- vL1D bytes: ``64 x TCP_TOTAL_CACHE_ACCESSES_sum``;
- L2 bytes: ``64 x (TCP_TCC_READ_REQ_sum + TCP_TCC_WRITE_REQ_sum + TCP_TCC_ATOMIC_WITH_RET_REQ_sum +
  TCP_TCC_ATOMIC_WITHOUT_RET_REQ_sum)``;
- HBM bytes, MI200 counters (``TCC_EA_*``): ``32 x RDREQ_32B + 64 x (RDREQ - RDREQ_32B) + 64 x WRREQ_64B
  + 32 x (WRREQ - WRREQ_64B)``; MI300 counters (``TCC_EA0_*`` with ``TCC_BUBBLE``): ``128 x BUBBLE +
  32 x RDREQ_32B + 64 x (RDREQ - BUBBLE - RDREQ_32B) + 32 x (WRREQ - WRREQ_64B) + 64 x WRREQ_64B``.
  The tool picks the formula by ``gpu_model``; here by which counters the file holds (the same choice
  on MI200 and MI300 workloads).

A quantity whose counters are absent stays missing (NaN), never 0. rocprofv3's derived
``FETCH_SIZE`` / ``WRITE_SIZE`` (KiB read from / written to video memory) give HBM bytes where
the raw TCC counters are not collected.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

SOURCE_COMMIT = "a63a4cbcb2afc6c67095f8012428370998d31884"
SOURCE = f"ROCm/rocprofiler-compute src/utils/roofline_calc.py@{SOURCE_COMMIT[:12]} calc_ai"
VALU = ("F16", "F32", "F64")
MFMA = ("F16", "BF16", "F32", "F64")
PRECISION = {"F16": "fp16", "BF16": "bf16", "F32": "fp32", "F64": "fp64", "I8": "int8"}


def _col(df: pd.DataFrame, name: str) -> pd.Series | None:
    return pd.to_numeric(df[name], errors="coerce").astype("float64") if name in df else None


def _sum(df: pd.DataFrame, names: list[str], weights: list[float]) -> pd.Series:
    """Weighted sum of counters; NaN where any of them is absent."""
    cols = [_col(df, n) for n in names]
    if any(c is None for c in cols):
        return pd.Series(np.nan, index=df.index)
    total = pd.Series(0.0, index=df.index)
    for w, c in zip(weights, cols):
        total = total + w * c  # type: ignore[operator]
    return total


def costs_from_counters(df: pd.DataFrame, lds_banks_per_cu: float | None = None) -> pd.DataFrame:
    """Per-dispatch FLOPs and bytes from a table with one row per dispatch and one column per counter.

    Returns a frame on ``df``'s index with ``flops``, ``precision``, ``flops_by_precision`` (JSON),
    ``dram_bytes`` (HBM), ``l2_bytes``, ``l1_bytes`` (vL1D), ``shared_bytes`` (LDS); NaN where counters lack.
    """
    parts: dict[str, pd.Series] = {}
    for p in VALU:
        parts[f"valu_{PRECISION[p]}"] = 64 * _sum(df, [f"SQ_INSTS_VALU_ADD_{p}", f"SQ_INSTS_VALU_MUL_{p}",
                                                       f"SQ_INSTS_VALU_FMA_{p}", f"SQ_INSTS_VALU_TRANS_{p}"],
                                                  [1, 1, 2, 1])
    for p in (*MFMA, "I8"):
        col = _col(df, f"SQ_INSTS_VALU_MFMA_MOPS_{p}")
        parts[f"mfma_{PRECISION[p]}"] = 512 * col if col is not None else pd.Series(np.nan, index=df.index)
    flops_cols = pd.DataFrame(parts)
    floating = flops_cols.drop(columns=["mfma_int8"])
    # the tool's total_flops needs every term (a KeyError skips it); integer MFMA ops are added as "operations"
    total = floating.sum(axis=1).where(floating.notna().all(axis=1))
    out = pd.DataFrame(index=df.index)
    out["flops"] = total + flops_cols["mfma_int8"].fillna(0)
    per_precision = pd.DataFrame({p: flops_cols.filter(like=p).sum(axis=1, min_count=1)
                                  for p in ("fp16", "bf16", "fp32", "fp64", "int8")}).fillna(0)
    out["precision"] = per_precision.idxmax(axis=1).where(per_precision.max(axis=1) > 0)
    out["flops_by_precision"] = [
        json.dumps({k: float(v) for k, v in r.items() if pd.notna(v)}) if any(pd.notna(v) for v in r.values()) else None
        for r in flops_cols.to_dict("records")]
    out["dram_bytes"] = hbm_bytes(df)
    out["l2_bytes"] = 64 * _sum(df, ["TCP_TCC_READ_REQ_sum", "TCP_TCC_WRITE_REQ_sum",
                                     "TCP_TCC_ATOMIC_WITH_RET_REQ_sum", "TCP_TCC_ATOMIC_WITHOUT_RET_REQ_sum"],
                                [1, 1, 1, 1])
    l1 = _col(df, "TCP_TOTAL_CACHE_ACCESSES_sum")
    out["l1_bytes"] = 64 * l1 if l1 is not None else np.nan
    lds = _sum(df, ["SQ_LDS_IDX_ACTIVE", "SQ_LDS_BANK_CONFLICT"], [1, -1])
    out["shared_bytes"] = lds * 4 * float(lds_banks_per_cu) if lds_banks_per_cu else np.nan
    return out


L2_BYTES_PER_CYCLE_PER_CHANNEL = {"gfx90a": 64.0, "gfx940": 128.0, "gfx941": 128.0, "gfx942": 128.0}
"""The L2 peak rocprof-compute's System Speed-of-Light divides by, per channel and cycle (``L2 Cache BW``: a
TCC request moves 128 bytes; MI200's peak is 64 B/cycle per channel, MI300's 128). Archs not listed here get no
L2 share (missing, not guessed)."""
UTILIZATION_SOURCE = ("ROCm/rocprofiler-compute src/rocprof_compute_soc/analysis_configs/<arch>/"
                      "0200_system-speed-of-light.yaml (gfx942 @dab30dd8cc0b, gfx90a @6d22cc88eee1)")


def utilization_from_counters(df: pd.DataFrame, duration_ns: pd.Series, sysinfo: dict[str, str] | None) -> pd.DataFrame:
    """Each unit's % of its peak per dispatch, rocprof-compute's System Speed-of-Light formulas
    (:data:`UTILIZATION_SOURCE`) with one change: the cycles are the dispatch's duration x ``max_sclk``, not
    ``GRBM_GUI_ACTIVE`` / ``num_xcd`` (GRBM_GUI_ACTIVE sums the XCDs, and the MI308X workload's sysinfo says
    ``num_xcd`` 1 for 4 XCDs: its 16 ms FlashMLA dispatch counts 4x its cycles). Per CU and cycle:

    - ``pipe_valu_pct`` = SQ_ACTIVE_INST_VALU, ``pipe_salu_pct`` = SQ_ACTIVE_INST_SCA, ``pipe_vmem_pct`` =
      SQ_ACTIVE_INST_FLAT + SQ_ACTIVE_INST_VMEM, ``pipe_branch_pct`` = SQ_ACTIVE_INST_MISC,
      ``pipe_mfma_pct`` = SQ_VALU_MFMA_BUSY_CYCLES / 4 (four SIMDs);
    - ``l1_throughput_pct`` (vL1D) = TCP_TOTAL_CACHE_ACCESSES_sum (one access a cycle per CU at peak);
    - ``shared_throughput_pct`` (LDS) = (SQ_LDS_IDX_ACTIVE - SQ_LDS_BANK_CONFLICT) x 4 x lds_banks_per_cu / 128 B;
    - ``l2_throughput_pct`` = TCC_REQ_sum x 128 B per L2 channel and cycle at the arch's peak.

    A unit whose counters (or the sysinfo values it needs) are absent stays missing."""
    info = sysinfo or {}

    def num(key: str) -> float:
        try:
            return float(info.get(key) or "nan")
        except ValueError:
            return float("nan")

    cu, sclk, banks, channels = num("cu_per_gpu"), num("max_sclk"), num("lds_banks_per_cu"), num("total_l2_chan")
    cycles = pd.to_numeric(duration_ns, errors="coerce").astype("float64").to_numpy() * sclk * 1e-3
    out = pd.DataFrame(index=df.index)
    per_cu = pd.Series(np.where(cycles > 0, cycles * cu, np.nan), index=df.index)
    for column, names, weight in (("pipe_valu_pct", ["SQ_ACTIVE_INST_VALU"], 1.0),
                                  ("pipe_salu_pct", ["SQ_ACTIVE_INST_SCA"], 1.0),
                                  ("pipe_vmem_pct", ["SQ_ACTIVE_INST_FLAT", "SQ_ACTIVE_INST_VMEM"], 1.0),
                                  ("pipe_branch_pct", ["SQ_ACTIVE_INST_MISC"], 1.0),
                                  ("pipe_mfma_pct", ["SQ_VALU_MFMA_BUSY_CYCLES"], 0.25),
                                  ("l1_throughput_pct", ["TCP_TOTAL_CACHE_ACCESSES_sum"], 1.0)):
        out[column] = 100.0 * weight * _sum(df, names, [1.0] * len(names)) / per_cu
    lds = _sum(df, ["SQ_LDS_IDX_ACTIVE", "SQ_LDS_BANK_CONFLICT"], [1, -1])
    out["shared_throughput_pct"] = 100.0 * lds * 4 * banks / 128.0 / per_cu
    peak = L2_BYTES_PER_CYCLE_PER_CHANNEL.get(str(info.get("gpu_arch") or "").strip())
    l2 = _col(df, "TCC_REQ_sum")
    out["l2_throughput_pct"] = (100.0 * l2 * 128.0 / (pd.Series(cycles, index=df.index) * channels * peak)
                                if l2 is not None and peak else np.nan)
    return out.replace([np.inf, -np.inf], np.nan)


def hbm_bytes(df: pd.DataFrame) -> pd.Series:
    """HBM bytes per dispatch (see the module doc); NaN where the counters lack."""
    if "TCC_EA0_RDREQ_sum" in df or "TCC_BUBBLE_sum" in df:
        return (
            128 * _c(df, "TCC_BUBBLE_sum") + 32 * _c(df, "TCC_EA0_RDREQ_32B_sum")
            + 64 * (_c(df, "TCC_EA0_RDREQ_sum") - _c(df, "TCC_BUBBLE_sum") - _c(df, "TCC_EA0_RDREQ_32B_sum"))
            + 32 * (_c(df, "TCC_EA0_WRREQ_sum") - _c(df, "TCC_EA0_WRREQ_64B_sum"))
            + 64 * _c(df, "TCC_EA0_WRREQ_64B_sum"))
    if "TCC_EA_RDREQ_sum" in df:
        return (32 * _c(df, "TCC_EA_RDREQ_32B_sum") + 64 * (_c(df, "TCC_EA_RDREQ_sum") - _c(df, "TCC_EA_RDREQ_32B_sum"))
                + 64 * _c(df, "TCC_EA_WRREQ_64B_sum") + 32 * (_c(df, "TCC_EA_WRREQ_sum") - _c(df, "TCC_EA_WRREQ_64B_sum")))
    fetch, write = _col(df, "FETCH_SIZE"), _col(df, "WRITE_SIZE")
    if fetch is not None or write is not None:
        both = (fetch if fetch is not None else 0) + (write if write is not None else 0)
        return 1024 * pd.Series(both, index=df.index)
    return pd.Series(np.nan, index=df.index)


def _c(df: pd.DataFrame, name: str) -> pd.Series:
    col = _col(df, name)
    return col if col is not None else pd.Series(np.nan, index=df.index)


def has_cost_counters(df: pd.DataFrame) -> bool:
    return any(c in df for c in ("SQ_INSTS_VALU_FMA_F32", "SQ_INSTS_VALU_MFMA_MOPS_F16", "TCC_EA_RDREQ_sum",
                                 "TCC_EA0_RDREQ_sum", "TCP_TOTAL_CACHE_ACCESSES_sum", "FETCH_SIZE", "WRITE_SIZE"))
