"""Sweep reports: one row per run (batch size x prompt length) with its roofline and latency.

A sweep report's tables carry ``run``, ``batch_size`` and ``prompt_len`` columns (see
``perfscope.sessions.profile.profile_sweep``). The summary shows decode's intensity rising with batch
(the same weights serve more tokens), TTFT against prompt length, and TPOT / tokens/s against batch
(the throughput-latency curve).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfscope.report import Report

from ..costs.roofline import classify
from .serving import phase_summary, request_summary

SWEEP_COLUMNS = ["run", "batch", "prompt_len", "decode_gemm_intensity", "decode_gemm_flops_per_s",
                 "decode_gemm_bound", "decode_gemm_pct_of_roof", "ttft_s", "tpot_s", "tokens_per_s",
                 "decode_mbu", "prefill_mfu"]


def is_sweep(report: Report) -> bool:
    """True for a report written by ``perfscope sweep``."""
    return bool(report.params.get("sweep")) and "run" in report.kernels.columns


def split_runs(report: Report) -> dict[str, Report]:
    """The sweep's runs as separate reports (same device), keyed by run label, in sweep order."""
    out: dict[str, Report] = {}
    for run in report.params["sweep"]["runs"]:
        label = run["run"]
        tables = {name: report.table(name)[report.table(name)["run"] == label]
                  if "run" in report.table(name).columns else report.table(name).iloc[0:0]
                  for name in ("kernels", "ranges", "transfers", "api", "counters", "requests", "steps",
                               "requests_unprofiled", "steps_unprofiled")}
        out[label] = Report.build(tables, {"device": report.manifest.get("device"),
                                           "params": {"batch": run["batch"], "prompt_len": run["prompt_len"]}})
    return out


def _decode_gemm(run: Report) -> dict[str, float | str]:
    k = run.kernels
    g = k[(k["phase"] == "decode") & (k["category"] == "gemm") & k["flops"].notna() & k["dram_bytes"].notna()]
    if not len(g):
        return {"decode_gemm_intensity": np.nan, "decode_gemm_flops_per_s": np.nan,
                "decode_gemm_bound": "unknown", "decode_gemm_pct_of_roof": np.nan}
    total = pd.DataFrame({"name": ["decode gemm"], "device": [g["device"].iloc[0]], "start_ns": [0],
                          "end_ns": [int(g["duration_ns"].sum())], "duration_ns": [int(g["duration_ns"].sum())],
                          "flops": [g["flops"].sum()], "dram_bytes": [g["dram_bytes"].sum()],
                          "precision": [g["precision"].mode().iloc[0] if g["precision"].notna().any() else None]})
    row = classify(total, run.device).iloc[0]
    return {"decode_gemm_intensity": row["arith_intensity"], "decode_gemm_flops_per_s": row["achieved_flops_per_s"],
            "decode_gemm_bound": row["bound"], "decode_gemm_pct_of_roof": row["pct_of_roof"]}


def sweep_summary(report: Report) -> pd.DataFrame:
    """One row per run: decode GEMM roofline point, TTFT, TPOT, tokens/s, decode MBU, prefill MFU."""
    rows = []
    for label, run in split_runs(report).items():
        phases = phase_summary(run).set_index("phase")
        req = request_summary(run)
        rows.append({
            "run": label, "batch": run.params["batch"], "prompt_len": run.params["prompt_len"],
            **_decode_gemm(run),
            "ttft_s": req.get("ttft_s_mean", np.nan), "tpot_s": req.get("tpot_s_mean", np.nan),
            "tokens_per_s": req.get("throughput_tokens_per_s", np.nan),
            "decode_mbu": phases["mbu"].get("decode", np.nan),
            "prefill_mfu": phases["mfu"].get("prefill", np.nan),
        })
    return pd.DataFrame(rows, columns=SWEEP_COLUMNS)
