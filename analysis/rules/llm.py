"""LLM phase rules over the engine's steps: decode far from its bandwidth floor (MBU), prefill far
from its speed of light (MFU), and the KV cache's share of decode traffic as the context grows.

A decode step must read every weight once and the KV cache of every sequence, so its floor is
``(weight_bytes + kv_cache_bytes) / DRAM roof``; MBU is that floor over the measured step time.
Imported traces without step annotations have no steps, so these rules stay silent on them; a
framework's steps (vLLM, SGLang, ...) have no model bytes, so their bytes are their kernels'
(``kernel_dram_bytes``), and outlier steps are left out. Step times, the numbers each finding
quotes and its time at stake all come from one run, the one the finding names (``run``): the
headline (the warm unprofiled run when the report holds it: the profiler inflates every launch),
else the profiled run or the trace. What only the profiled run measures (kernel coverage, its
kernels and idle gaps as evidence items) is put on the stake's run as shares of its own stake
(``evidence.on_stake_clock``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfscope.format import duration, nbytes
from perfscope.format import pct as fmt_pct

from ..idle import GRAPH_KINDS, HOST_KINDS, graphs_help, kind_totals, largest_kind
from ..steps import FLOPS_MIN_COVERAGE, has_framework_steps, headline_steps, step_windows
from ..summaries.serving import phase_summary, run_steps
from ._base import (
    Finding,
    Item,
    collect_advice,
    headline_run,
    info,
    is_cpu_report,
    merge_intervals,
    pct,
    ranked,
)
from ._gaps import idle_advice, idle_items, kind_advice
from .evidence import (
    idle_within,
    kernel_items,
    largest_kernel,
    on_stake_clock,
    step_items,
    time_in,
    unexplained,
)
from .matmul_units import faster_matrix, no_faster_matrix_text
from .timeline import SHORT_KERNEL_NS, compiled_cpu_run, graph_advice, graph_mode

if TYPE_CHECKING:
    from perfscope.device import DeviceSpec
    from perfscope.report import Report

DECODE_MBU_LOW_PCT = 50.0
"""Decode MBU that makes a finding. Serving engines reach 60-90% of HBM bandwidth on decode
(llm-analysis suggests up to 0.9 memory efficiency); below half, something other than reading
the weights and KV cache (launch overhead, slow kernels) sets the step time."""
KERNEL_COVER_LOW_PCT = 50.0
"""When kernels (operators) cover under half of the decode wall time, the step is overhead-bound."""
PREFILL_SOL_LOW_PCT = 50.0
"""Prefill speed-of-light share that makes a finding: half of max(FLOPs / compute roof,
bytes / DRAM roof). llm-analysis suggests up to 0.7 FLOPS efficiency for inference."""
KV_SHARE_HIGH_PCT = 25.0
"""KV-cache share of decode bytes at the last step that makes a finding: from a quarter on, shrinking
the cache (GQA, FP8 KV) cuts decode time by that share when decode is bandwidth-bound."""


def _phase_steps(report: Report, phase: str, *, profiled: bool = False) -> pd.DataFrame:
    """The phase's steps of the headline run, outlier steps (host stalls, the profiler's first
    step) left out: they are reported apart (``step-outliers``)."""
    s = headline_steps(run_steps(report, profiled=profiled))
    return s[(s["phase"] == phase) & (s["end_ns"] > s["start_ns"])]


def _model_bytes(steps: pd.DataFrame) -> pd.Series:
    """Bytes each step must read: the model's weights + KV cache (engine steps), else the summed
    DRAM bytes of the step's kernels (framework steps: from the kernels' costs)."""
    model = steps["weight_bytes"] + steps["kv_cache_bytes"]
    if "kernel_dram_bytes" in steps:
        model = model.where(model.notna(), steps["kernel_dram_bytes"])
    return model


def _idle_in_steps(report: Report, prof: pd.DataFrame) -> pd.DataFrame:
    """The ``idle`` table's slices inside the profiled steps ``prof`` (none without steps)."""
    if not len(prof):
        return idle_within(report, np.zeros(0, np.int64), np.zeros(0, np.int64))
    return idle_within(report, *step_windows(prof, report.kernels))


def _run_of(report: Report) -> str:
    """``gpu``, ``cpu`` (an eager CPU run) or ``compiled-cpu`` (:func:`.timeline.compiled_cpu_run`)."""
    return "compiled-cpu" if compiled_cpu_run(report) else "cpu" if is_cpu_report(report) else "gpu"


def _gap_advice(idle: pd.DataFrame, items: list[Item], run: str, graph_run: str | None = None) -> str:
    """The idle advice (:func:`._gaps.idle_advice`, in the words of a ``run`` on the GPU or the CPU) for the
    gaps inside a phase's steps; with no gap there, the advice for time of unknown cause."""
    cpu = run != "gpu"
    return (idle_advice(idle, items, cpu=cpu, compiled_cpu=run == "compiled-cpu", graph_run=graph_run)[0]
            or kind_advice("unknown", 100.0, items, idle, cpu=cpu))


def _kernel_cover_pct(report: Report, steps: pd.DataFrame, phase: str) -> float:
    """Share of the phase's wall time during which some kernel (operator) of that phase runs."""
    k = report.kernels[report.kernels["phase"] == phase]
    wall = float(steps["duration_ns"].sum())
    if not len(k) or wall <= 0:
        return math.nan
    ms, me = merge_intervals(k["start_ns"].to_numpy(), k["end_ns"].to_numpy())
    return pct(float((me - ms).sum()), wall)


def _checked_steps(report: Report, phase: str, rule: str, what: str) -> tuple[pd.DataFrame, list[Finding] | None]:
    """The phase's steps, and what the rule should return instead when its inputs are missing:
    nothing without steps (an imported trace), an info finding without step bytes or a DRAM roof."""
    steps = _phase_steps(report, phase)
    return steps, ([] if not len(steps) else _missing_inputs(report, steps, rule, what))


def _missing_inputs(report: Report, steps: pd.DataFrame, rule: str, what: str) -> list[Finding] | None:
    """An info finding when the steps or roofs a rule needs are absent; None when all is there."""
    if _model_bytes(steps).isna().all():
        if has_framework_steps(steps):
            return [info(rule, f"{what} not computed: the kernels of these {len(steps)} step(s) have DRAM bytes "
                         f"for under {100 * FLOPS_MIN_COVERAGE:.0f}% of their time",
                         "Profile with operator shapes (torch.profiler record_shapes=True) and an eager step beside "
                         "CUDA-graph replays (their costs come from the eager twin), or measure the kernels with "
                         "Nsight Compute.")]
        return [info(rule, f"{what} not computed: the engine steps carry no weight/KV-cache bytes",
                     "Profile with perfscope's engine (perfscope profile) so each step records the bytes it reads.")]
    dev = report.device
    if dev is None or not dev.peak_bandwidth("dram"):
        return [info(rule, f"{what} not computed: no DRAM roof for this device",
                     "Measure the roofs on this machine (perfscope devices) or pass a device spec.")]
    return None


def decode_mbu(report: Report) -> list[Finding]:
    """Decode steps far below their bandwidth floor (MBU under half)."""
    steps, missing = _checked_steps(report, "decode", "decode-mbu", "Decode MBU")
    if missing is not None:
        return missing
    dev = report.device
    assert dev is not None
    bw = float(dev.peak_bandwidth("dram") or math.nan)
    steps = steps[_model_bytes(steps).notna()]
    nbytes = _model_bytes(steps).to_numpy(np.float64, na_value=np.nan)
    dur = steps["duration_ns"].to_numpy(np.float64, na_value=np.nan)
    floor_ns = nbytes / bw * 1e9
    mbu = pct(float(nbytes.sum()) / (dur.sum() * 1e-9), bw)
    if not mbu < DECODE_MBU_LOW_PCT:
        return []
    prof = _phase_steps(report, "decode", profiled=True)
    prof = prof[_model_bytes(prof).notna()]
    at_stake = float(np.clip(dur - floor_ns, 0, None).sum())  # the same steps' time above their floor
    cover = _kernel_cover_pct(report, _phase_steps(report, "decode", profiled=True), "decode")
    ops_per_step = float((report.kernels["phase"] == "decode").sum()) / len(steps)
    evidence: dict[str, float | int | str] = {
        "decode_steps": len(steps), "decode_time_ns": float(dur.sum()), "mean_step_ns": float(dur.mean()),
        "mean_bytes_per_step": float(nbytes.mean()), "mean_floor_ns_per_step": float(floor_ns.mean()),
        "mbu_pct": mbu, "dram_roof_bytes_per_s": bw, "dram_roof_provenance": dev.memory["dram"].provenance,
        "batch": int(steps["batch"].median()), "tokens_per_s": float(steps["tokens"].sum() / (dur.sum() * 1e-9)),
        "kernels_per_step": ops_per_step,
    }
    if not math.isnan(cover):
        evidence["kernel_cover_pct"] = cover
    if has_framework_steps(steps):  # per decode step: the kernels' bytes over the step's time
        per_step = nbytes / (dur * 1e-9) / bw * 100.0
        evidence.update(mbu_source="kernels", framework=str(steps["framework"].dropna().iloc[0]),
                        mbu_pct_per_step_p50=float(np.median(per_step)), mbu_pct_per_step_min=float(per_step.min()),
                        mbu_pct_per_step_max=float(per_step.max()))
    what = "of its kernels' DRAM traffic" if has_framework_steps(steps) else "of weights + KV cache"
    title = (f"Decode runs at {mbu:.2g}% of DRAM bandwidth (MBU): {duration(float(dur.mean()))} per step vs a "
             f"{duration(float(floor_ns.mean()))} floor for {nbytes.mean() / 1e6:.3g} MB {what}")
    # the items are measured on the profiled run (its kernels and idle gaps); on the stake's clock
    prof_stake = float(np.clip(prof["duration_ns"].to_numpy(np.float64, na_value=np.nan) - _model_bytes(prof).to_numpy(np.float64, na_value=np.nan)
                               / bw * 1e9, 0, None).sum())
    idle = _idle_in_steps(report, prof)
    items = on_stake_clock(_decode_items(report, prof, idle, bw), at_stake, prof_stake)
    gap_ns, kernel_ns = time_in(items, ("gap", "gaps")), time_in(items, ("kernel", "kernels"))
    items += unexplained(at_stake - gap_ns - kernel_ns, f"{duration(at_stake - gap_ns - kernel_ns)} of the stake no "
                         "item holds: step time outside the idle table's gaps (before the first kernel, after the "
                         "last) or kernel time the kernels' own byte counts do not place")
    evidence.update(idle_in_steps_ns=gap_ns, kernel_time_above_roof_ns=kernel_ns)
    totals = kind_totals(idle)
    mode = graph_mode(report)
    graph = graph_advice(report, mode, graphs=graphs_help(totals)) if mode.is_graph_run else None
    if graph:
        evidence.update(mode.evidence())
    mode_of_run = _run_of(report)
    fix = largest_kind(totals) if gap_ns >= kernel_ns else "kernels"
    advice = _decode_advice(cover, float(floor_ns.mean()), ops_per_step, graph, mode_of_run, fix=fix, items=items,
                            idle=idle)
    if has_framework_steps(steps) and fix in GRAPH_KINDS:
        from .knobs import framework_of, knob

        advice += knob(framework_of(steps), "graphs", graphs=mode.is_graph_run)
    return [ranked(report, "decode-mbu", title, evidence, advice, at_stake, ranges=("decode",), items=tuple(items),
                   run=headline_run(report))]


def _decode_items(report: Report, prof: pd.DataFrame, idle: pd.DataFrame, bw: float) -> list[Item]:
    """What the decode steps' time above their floor is: the device idle inside the steps (``idle``, their
    slices of the ``idle`` table, by kind and subject: :func:`._gaps.idle_items`) and the kernels' time
    above their own DRAM floor (bytes / roof; a kernel without bytes holds its whole time, of unknown cause)."""
    if not len(prof):
        return []
    items = idle_items(idle, where=" inside decode steps")
    k = report.kernels
    pos = np.flatnonzero((k["phase"] == "decode").to_numpy(bool))
    if len(pos):
        dur = k["duration_ns"].to_numpy(np.float64, na_value=np.nan)[pos]
        kb = pd.to_numeric(k["dram_bytes"], errors="coerce").to_numpy(np.float64, na_value=np.nan)[pos] if "dram_bytes" in k \
            else np.full(len(pos), np.nan)
        known = np.isfinite(kb)
        above = np.where(known, np.clip(dur - np.nan_to_num(kb) / bw * 1e9, 0, None), dur)

        def describe(g: pd.DataFrame) -> str:
            b = pd.to_numeric(g["dram_bytes"], errors="coerce") if "dram_bytes" in g else pd.Series(dtype="float64")
            t = float(g["duration_ns"].sum())
            if not b.notna().any() or not t > 0:
                return ""
            return f"above its DRAM floor (it reads {nbytes(float(b.sum()))} at {fmt_pct(pct(float(b.sum()) / (t * 1e-9), bw))} of the roof)"

        items += kernel_items(k, pos, above, explains=known, describe=describe)
    return items


def _decode_advice(cover: float, floor_ns: float, ops_per_step: float, graph: str | None, run: str, *,
                   fix: str | None, items: list[Item], idle: pd.DataFrame) -> str:
    """What to change first; ``run`` is ``gpu``, ``cpu`` (eager) or ``compiled-cpu``; ``fix`` is the kind
    (:data:`..idle.KINDS`) holding the most of the gaps ``idle`` inside the steps, or ``kernels`` when the
    kernels' own time above their floor is the larger part (None: neither holds any)."""
    launch_bound = floor_ns < ops_per_step * SHORT_KERNEL_NS
    host_gaps = run != "gpu" and fix in (*GRAPH_KINDS, *HOST_KINDS)  # on a CPU the gaps between operators are dispatch
    if run == "compiled-cpu" and launch_bound and host_gaps:
        head = (f"Decode is already compiled (compile=True), and the step's bandwidth floor ({duration(floor_ns)}) "
                "is still shorter than the fixed host cost of a step (the compiled call's guard check and launch "
                "code, per-token Python such as sampling): the model is too small for this CPU and that overhead "
                "sets the step time. Keep per-token work inside the compiled step.")
    elif run == "compiled-cpu":
        head = ("Decode is already compiled (compile=True): its kernels read the weights below the bandwidth "
                "roof. Check that every core works (torch.get_num_threads(), no other busy process) and the "
                "compiled kernels against the roof (memory-below-roof).")
    elif run == "cpu" and launch_bound and host_gaps:
        head = (f"The step's bandwidth floor ({duration(floor_ns)}) is shorter than dispatching its "
                f"{ops_per_step:.0f} operators at {SHORT_KERNEL_NS / 1000:.0f} µs each: the model is too small for "
                "this CPU and per-operator overhead sets the step time. Compile the decode step (perfscope "
                "profile --compile, or torch.compile) so it runs as a few fused kernels.")
    elif run == "cpu":
        head = ((f"Operators run only {cover:.0f}% of each decode step: the rest is Python and dispatch overhead. "
                 if host_gaps else "The decode operators read the weights slowly. ")
                + "Compile the decode step (perfscope profile --compile, or torch.compile): inductor fuses each "
                "layer's matrix-vector products into loops that stream the weights (this engine's 125M model "
                "decodes at about 0.8 of a streaming read compiled against 0.56 eager on a 2-vCPU VM, "
                "benchmarks/RESULTS.md).")
    elif fix == "kernels":
        top = largest_kernel(items)
        head = ("The decode kernels themselves read memory slowly" + (f" (the most time above its floor: {top})"
                                                                       if top else "")
                + ": check them against the bandwidth roof (memory-below-roof) and use fused decode attention "
                "and GEMV kernels tuned for small batches.")
    elif graph is None and launch_bound and fix in GRAPH_KINDS:
        head = (f"The step's bandwidth floor ({duration(floor_ns)}) is shorter than launching its "
                f"{ops_per_step:.0f} kernels/operators at {SHORT_KERNEL_NS / 1000:.0f} µs each: the model is too "
                "small for this device and per-kernel overhead sets the step time. Capture the step in a CUDA "
                "graph or compile it (torch.compile) so it runs as few launches.")
    else:  # the gaps' kinds, largest first; a graph run is told what its replays leave instead of graphs
        head = _gap_advice(idle, items, run, graph)
    return (head + " Then raise the batch: the weights are read once per step for every sequence in it, so "
                   "tokens per second grow almost linearly until the KV cache dominates; quantized weights "
                   "(int8/fp8/int4) lower the floor itself.")


def prefill_mfu(report: Report) -> list[Finding]:
    """Prefill far from its speed of light: max(FLOPs / compute roof, bytes / DRAM roof)."""
    steps, missing = _checked_steps(report, "prefill", "prefill-mfu", "Prefill MFU")
    if missing is not None:
        return missing
    k = report.kernels[report.kernels["phase"] == "prefill"]
    costed = k[k["flops"].notna()]
    if not len(costed):
        return [info("prefill-mfu", "Prefill MFU not computed: no FLOPs for the prefill kernels",
                     collect_advice(report, "Capture with operator shapes (torch.profiler record_shapes=True) or "
                                         "with {counters}."))]
    coverage = float(costed["duration_ns"].sum()) / float(k["duration_ns"].sum() or 1.0)
    if coverage < FLOPS_MIN_COVERAGE:  # a partial FLOP sum would understate MFU without saying so
        uncosted = k[k["flops"].isna()].groupby("name")["duration_ns"].sum().sort_values(ascending=False)
        top = ", ".join(f"{str(n)[:60]} ({100 * t / float(k['duration_ns'].sum()):.0f}%)"
                        for n, t in uncosted.head(2).items())
        return [info("prefill-mfu", f"Prefill MFU not computed: FLOPs are known for {100 * coverage:.0f}% of the "
                     f"prefill kernel time (under {100 * FLOPS_MIN_COVERAGE:.0f}%); without FLOPs: {top}",
                     "The phase table leaves MFU missing for the same reason. Collectives keep their FLOPs "
                     "missing by design; for other kernels, profile with operator shapes "
                     "(torch.profiler record_shapes=True) or measure them with Nsight Compute.",
                     flops_coverage_pct=100 * coverage)]
    dev = report.device
    assert dev is not None
    precision = str(costed.groupby(costed["precision"].fillna("fp32"))["flops"].sum().idxmax())
    peak = dev.peak_flops(precision) or math.nan
    bw = float(dev.peak_bandwidth("dram") or math.nan)
    wall = float(steps["duration_ns"].sum())
    flops = float(costed["flops"].sum())
    nbytes = float(_model_bytes(steps).sum())
    compute_ns, memory_ns = flops / peak * 1e9, nbytes / bw * 1e9
    sol_pct = pct(max(compute_ns, memory_ns), wall)
    if not sol_pct < PREFILL_SOL_LOW_PCT:
        return []
    mfu = pct(flops / (wall * 1e-9), peak)
    # the MFU the phase table shows (one source: the same FLOPs, model or kernels, over the same wall time)
    table = phase_summary(report).set_index("phase")
    mfu_source = "kernels"
    if "prefill" in table.index and math.isfinite(float(table.loc["prefill", "mfu"])):
        mfu, mfu_source = float(table.loc["prefill", "mfu"]) * 100.0, str(table.loc["prefill", "mfu_source"])
    evidence: dict[str, float | int | str] = {
        "prefill_steps": len(steps), "prefill_tokens": int(steps["tokens"].sum()), "prefill_time_ns": wall,
        "flops": flops, "flops_coverage_pct": pct(float(costed["duration_ns"].sum()), float(k["duration_ns"].sum())),
        "precision": precision, "compute_roof_flops_per_s": float(peak), "mfu_pct": mfu, "mfu_from": mfu_source,
        "model_bytes": nbytes, "mbu_pct": pct(nbytes / (wall * 1e-9), bw),
        "bound": "compute" if compute_ns >= memory_ns else "memory", "speed_of_light_pct": sol_pct,
    }
    at_stake = wall - max(compute_ns, memory_ns)  # the same steps' time above their speed of light
    title = (f"Prefill reaches {fmt_pct(mfu)} MFU ({flops / wall:.3g} of {peak / 1e9:.3g} GFLOP/s {precision}); "
             f"{sol_pct:.2g}% of its speed of light ({evidence['bound']}-bound)")
    prof = _phase_steps(report, "prefill", profiled=True)
    idle = _idle_in_steps(report, prof)
    items = on_stake_clock(_prefill_items(report, idle, k, bw), at_stake,
                           float(prof["duration_ns"].sum()) - max(compute_ns, memory_ns))
    gap_ns, kernel_ns = time_in(items, ("gap", "gaps")), time_in(items, ("kernel", "kernels"))
    evidence.update(idle_in_steps_ns=gap_ns, kernel_time_above_light_ns=kernel_ns)
    items += unexplained(at_stake - gap_ns - kernel_ns, f"{duration(at_stake - gap_ns - kernel_ns)} of the stake no "
                         "item holds: step time outside the idle table's gaps, or the part of the kernels' own speeds "
                         "of light that the phase's (the larger of its FLOP and byte totals) does not count")
    if gap_ns > kernel_ns:
        advice = _gap_advice(idle, items, _run_of(report))
    else:
        advice = _prefill_advice(items, k, precision, report.device)
    if has_framework_steps(steps):
        from .knobs import framework_of, knob

        fw = framework_of(steps)
        evidence["framework"] = fw
        advice += knob(fw, "batch_tokens")
    return [ranked(report, "prefill-mfu", title, evidence, advice,
                    at_stake, ranges=("prefill",), items=tuple(items), run=headline_run(report))]


def _prefill_items(report: Report, idle: pd.DataFrame, k: pd.DataFrame, bw: float) -> list[Item]:
    """What the prefill's time above its speed of light is: the device idle inside its steps (``idle``, by
    kind and subject) and each kernel's time above its own speed of light (max of FLOPs / its precision's
    roof and bytes / the DRAM roof; a kernel with neither holds its whole time, of unknown cause)."""
    dev = report.device
    items = idle_items(idle, where=" inside prefill steps")
    if not len(k) or dev is None:
        return items
    pos = np.flatnonzero(report.kernels.index.isin(k.index))
    kk = report.kernels.iloc[pos]
    dur = kk["duration_ns"].to_numpy(np.float64, na_value=np.nan)
    fl = pd.to_numeric(kk["flops"], errors="coerce").to_numpy(np.float64, na_value=np.nan)
    by = pd.to_numeric(kk["dram_bytes"], errors="coerce").to_numpy(np.float64, na_value=np.nan) if "dram_bytes" in kk \
        else np.full(len(kk), np.nan)
    roofs = kk["precision"].astype("object").fillna("fp32").map(
        lambda p: float(dev.peak_flops(str(p)) or math.nan)).to_numpy(np.float64, na_value=np.nan)
    light = np.fmax(fl / roofs * 1e9, by / bw * 1e9)
    known = np.isfinite(light)
    above = np.where(known, np.clip(dur - np.nan_to_num(light), 0, None), dur)

    def describe(g: pd.DataFrame) -> str:
        b = str(g["bound"].dropna().astype(str).mode().iloc[0]) if "bound" in g and g["bound"].notna().any() else ""
        r = pd.to_numeric(g["pct_of_roof"], errors="coerce") if "pct_of_roof" in g else pd.Series(dtype="float64")
        at = f" at {fmt_pct(float(np.average(r.fillna(0), weights=g['duration_ns'])))} of its roof" \
            if r.notna().any() else ""
        return f"above its speed of light ({b}-bound{at})" if b else "above its speed of light"

    return items + kernel_items(report.kernels, pos, above, explains=known, describe=describe)


def _prefill_advice(items: list[Item], k: pd.DataFrame, precision: str, device: DeviceSpec | None) -> str:
    """Advice for prefill kernels below their speed of light, from what the largest kernel items are."""
    top = largest_kernel(items)
    kinds = [i for i in items if i.kind in ("kernel", "kernels") and i.explains]
    cats = {str(i.attrs.get("category")) for i in sorted(kinds, key=lambda i: -i.time_ns)[:3]}
    names = " ".join(str(i.attrs.get("name", "")) for i in kinds).lower()
    parts = ["Prefill should be compute-bound GEMM work; its kernels run below their speed of light"
             + (f" (the most time above it: {top})" if top else "") + "."]
    if "gemm" in cats:
        parts.append("Give it larger GEMMs: batch prompts together, longer chunks in chunked prefill.")
    if "attention" in cats or "softmax" in names or "bmm" in names:
        parts.append("Use a fused attention kernel (SDPA/flash) instead of materialised scores.")
    if precision in ("fp32", "tf32"):
        faster = faster_matrix(device)
        parts.append(f"It computes in {precision}: a tensor-core precision ({faster}) raises the roof itself." if faster
                     else f"It computes in {precision}, and {no_faster_matrix_text(device)}: a lower precision would "
                     "not raise the roof here.")
    if len(parts) == 1:
        parts.append("Check those kernels against their roof (memory-below-roof, compute-below-roof).")
    return " ".join(parts)


def kv_cache_share(report: Report) -> list[Finding]:
    """The KV cache's share of decode bytes, first to last step, when it has grown past a quarter."""
    steps = _phase_steps(report, "decode")
    steps = steps[steps["weight_bytes"].notna() & steps["kv_cache_bytes"].notna()].sort_values("step")
    if not len(steps):
        return []
    share = steps["kv_cache_bytes"] / _model_bytes(steps) * 100.0
    first, last = steps.iloc[0], steps.iloc[-1]
    if not share.iloc[-1] >= KV_SHARE_HIGH_PCT:
        return []
    dev = report.device
    bw = dev.peak_bandwidth("dram") if dev else None
    at_stake = float(steps["kv_cache_bytes"].sum()) / bw * 1e9 if bw else math.nan
    evidence: dict[str, float | int | str] = {
        "first_step_kv_share_pct": float(share.iloc[0]), "last_step_kv_share_pct": float(share.iloc[-1]),
        "first_context_len": int(first["context_len"]) if pd.notna(first["context_len"]) else -1,
        "last_context_len": int(last["context_len"]) if pd.notna(last["context_len"]) else -1,
        "last_kv_cache_bytes": float(last["kv_cache_bytes"]), "last_weight_bytes": float(last["weight_bytes"]),
        "batch": int(last["batch"]), "kv_read_time_at_roof_ns": at_stake,
    }
    title = (f"KV cache is {share.iloc[-1]:.0f}% of decode traffic at context {evidence['last_context_len']} "
             f"x batch {evidence['batch']} (from {share.iloc[0]:.0f}% at context {evidence['first_context_len']})")
    kv = steps["kv_cache_bytes"].to_numpy(np.float64, na_value=np.nan)
    items = step_items(steps, kv / bw * 1e9 if bw else np.full(len(steps), np.nan), placed=_placed(report),
                       describe=lambda r: (f"reads {nbytes(float(r['kv_cache_bytes']))} of KV cache at context "
                                           f"{r['context_len']} ({100 * float(r['kv_cache_bytes']) / float(r['kv_cache_bytes'] + r['weight_bytes']):.0f}% of its bytes)"))
    advice = ("Decode traffic is shifting from weights to the KV cache as contexts grow. Shrink what each step "
              "reads: an FP8/INT8 KV cache halves it, grouped-query or multi-query attention divides it by the "
              "query-per-KV-head ratio, paged attention avoids reading padded slots, and sliding-window or "
              "prefix-shared caches cap it. Larger batches stop paying off once the KV cache dominates.")
    return [ranked(report, "kv-cache-share", title, evidence, advice,
                    at_stake, ranges=("decode",), items=tuple(items), run=headline_run(report))]


def _placed(report: Report) -> bool:
    """Whether the headline run's steps lie on the report's timeline (the kernels' clock): they do
    unless the report holds a separate unprofiled run, whose steps have their own clock."""
    return not len(report.steps_unprofiled)


SPEC_PAID_SPEEDUP = 1.0
"""Speculative decoding pays when a generated token costs less than on a plain decode step."""


def _intensity(report: Report, steps: pd.DataFrame) -> float:
    """Model FLOPs per byte of a step: 2 x parameters x tokens over the weight + KV bytes it reads."""
    n_params = report.params.get("n_params")
    nbytes = float(_model_bytes(steps).mean()) if len(steps) else math.nan
    if not n_params or not nbytes > 0:
        return math.nan
    return 2.0 * float(n_params) * float(steps["tokens"].mean()) / nbytes


def _verify_cost(report: Report, verify: pd.DataFrame, draft: pd.DataFrame) -> list[Finding]:
    """A framework's speculative steps whose labels say no accepted counts (SGLang's TARGET_VERIFY,
    vLLM's multi-token decodes): what drafting and verifying cost, and that acceptance is not in the
    trace."""
    if not len(verify):
        return []
    verify_ns, draft_ns = float(verify["duration_ns"].sum()), float(draft["duration_ns"].sum())
    drafted = pd.to_numeric(verify["drafted"], errors="coerce")
    evidence: dict[str, float | int | str] = {
        "verify_steps": len(verify), "draft_steps": len(draft), "verify_time_ns": verify_ns, "draft_time_ns": draft_ns,
        "drafted_tokens": int(drafted.sum()) if drafted.notna().any() else math.nan,
        "verify_step_ns": verify_ns / len(verify), "draft_ns_per_verify_step": draft_ns / len(verify)}
    return [dataclasses.replace(info(
        "speculation", f"Speculative decoding: {len(verify)} verify steps ({duration(verify_ns)}) and {len(draft)} draft "
        f"steps ({duration(draft_ns)}); the trace does not say how many drafts were accepted", "Acceptance decides "
        "whether speculation pays: read it from the server's metrics (vLLM spec_decode acceptance, SGLang accept "
        "length) and compare tokens/s with speculation off.", **evidence), run=headline_run(report))]


def speculation(report: Report) -> list[Finding]:
    """Whether speculative decoding paid: tokens per verify step against the verify step's (and the
    draft's) cost, compared with a plain decode step of the same run (or its bandwidth floor)."""
    steps = report.steps
    if not len(steps) or "drafted" not in steps.columns or not (steps["phase"] == "verify").any():
        return []
    verify, draft, decode = (_phase_steps(report, p) for p in ("verify", "draft", "decode"))
    known = "accepted" in verify.columns and verify["accepted"].notna().any()
    if not len(verify) or verify["drafted"].isna().all() or not known:
        return _verify_cost(report, verify, draft)
    spec = report.params.get("speculation") or {}
    method = str(spec.get("method", "speculative")) if isinstance(spec, dict) else "speculative"
    drafted, accepted = float(verify["drafted"].sum()), float(verify["accepted"].sum())
    emitted = accepted + len(verify)
    verify_ns, draft_ns = float(verify["duration_ns"].sum()), float(draft["duration_ns"].sum())
    # the whole speculative decode: drafts, verifies and the plain steps where the draft was empty
    per_token_ns = (verify_ns + draft_ns + float(decode["duration_ns"].sum())) / (emitted + len(decode))
    evidence: dict[str, float | int | str] = {
        "method": method, "verify_steps": len(verify), "drafted_tokens": int(drafted),
        "accepted_tokens": int(accepted), "acceptance_rate": accepted / drafted if drafted else math.nan,
        "mean_accepted_len": accepted / len(verify), "tokens_per_verify_step": emitted / len(verify),
        "verify_step_ns": verify_ns / len(verify), "draft_ns_per_verify_step": draft_ns / len(verify),
        "draft_time_ns": draft_ns, "verify_time_ns": verify_ns, "ns_per_token_speculative": per_token_ns,
        "verify_flop_per_byte": _intensity(report, verify), "decode_flop_per_byte": _intensity(report, decode),
    }
    if len(decode):
        step_ns = float(decode["duration_ns"].median())
        basis = "the run's plain decode steps (median)"
    else:
        dev = report.device
        bw = float(dev.peak_bandwidth("dram") or math.nan) if dev else math.nan
        step_ns = float(_model_bytes(verify).mean()) / bw * 1e9 if bw > 0 else math.nan
        basis = "a one-token step's DRAM floor (no plain decode step in this run)"
    cost_ratio = verify_ns / len(verify) / step_ns
    tokens_per_verify = emitted / len(verify)
    speedup = step_ns / per_token_ns
    evidence.update(decode_step_ns=step_ns, decode_basis=basis, verify_cost_vs_decode=cost_ratio,
                    speedup_vs_decode=speedup)
    acceptance = accepted / drafted * 100 if drafted else math.nan
    head = (f"{tokens_per_verify:.2f} tokens per verify step (acceptance {acceptance:.0f}%) at "
            f"{cost_ratio:.2g}x a decode step")
    if not len(decode) and not speedup >= SPEC_PAID_SPEEDUP:
        return [dataclasses.replace(info(
            "speculation", f"Speculative decoding ({method}): {head} floor; whether it paid is not known without a "
            "plain decode step to compare", "Profile the same prompts without --speculative and compare decode "
            "tokens/s (perfscope compare).", **evidence), run=headline_run(report))]
    items = _speculation_items(report, verify, draft, step_ns, accepted)
    if speedup >= SPEC_PAID_SPEEDUP:
        title = f"Speculative decoding ({method}) paid: {head}: {speedup:.2f}x plain decode's tokens/s"
        advice = ("Keep it. A longer draft pays while acceptance stays high and the verify step stays memory-bound "
                  "(its cost barely grows with k+1 tokens per weight read); watch the acceptance rate per prompt.")
        return [Finding("speculation", "low", title, evidence, advice, 0.0, ranges=("verify",), items=tuple(items),
                        run=headline_run(report))]
    at_stake = (per_token_ns - step_ns) * (emitted + len(decode))  # on the run the steps above come from
    title = f"Speculative decoding ({method}) did not pay: {head}: {speedup:.2f}x plain decode's tokens/s"
    verify_extra = sum(i.time_ns for i in items if i.attrs.get("part") == "verify")
    draft_cost = sum(i.time_ns for i in items if i.attrs.get("part") == "draft")
    if verify_extra >= draft_cost:
        why = ("Each verify step costs more than the tokens it yields: on this device a (k+1)-token forward is not "
               "free (the step is compute- or overhead-bound, not weight-read-bound). Shorten --draft-len, or "
               "speculate only where the hardware reads weights far slower than it computes (a GPU at batch 1).")
    else:
        why = ("The draft costs too much for what it gets accepted: use a cheaper draft (ngram lookup) or one that "
               "agrees more often (more self-draft layers), and keep speculation for prompts whose answer repeats "
               "its input (rewrite, edit, summarise, code).")
    return [ranked(report, "speculation", title, evidence, why, at_stake, ranges=("verify", "draft"),
                   items=tuple(items), run=headline_run(report))]


def _speculation_items(report: Report, verify: pd.DataFrame, draft: pd.DataFrame, step_ns: float,
                       accepted: float) -> list[Item]:
    """What speculation cost over plain decoding: the draft steps (a plain decoder runs none), each
    verify step's time above a plain decode step, and what the accepted tokens saved (plain decode
    steps not run: a metric, no time of the cost)."""
    placed = _placed(report)
    drafts = step_items(draft, draft["duration_ns"].to_numpy(np.float64, na_value=np.nan), placed=placed, top=3,
                        describe=lambda r: "drafting")
    verifies = step_items(verify, np.clip(verify["duration_ns"].to_numpy(np.float64, na_value=np.nan) - step_ns, 0, None),
                          placed=placed, top=3,
                          describe=lambda r: f"above a plain decode step ({duration(step_ns)})"
                          + (f", {int(r['accepted'])} of {int(r['drafted'])} drafts accepted"
                             if pd.notna(r.get("accepted")) and pd.notna(r.get("drafted")) else ""))
    out = [dataclasses.replace(i, attrs={**i.attrs, "part": part})
           for part, group in (("draft", drafts), ("verify", verifies)) for i in group]
    if math.isfinite(step_ns) and accepted > 0:
        out.append(Item("metric", f"{int(accepted):,} accepted tokens saved {int(accepted):,} plain decode steps "
                        f"({duration(accepted * step_ns)}), which the cost above is set against",
                        attrs={"accepted_tokens": int(accepted), "saved_ns": accepted * step_ns}))
    return out



def _largest_positive(*values: float) -> float:
    """The profiled run's stake for items put on the headline's clock: the larger of the step's and the
    attention's change, so the attention item never holds more than the whole stake (when the profiled
    step moved less than its attention, the rest of the step moved the other way). NaN: none is positive."""
    ok = [v for v in values if math.isfinite(v) and v > 0]
    return max(ok) if ok else math.nan


def kv_policy(report: Report) -> list[Finding]:
    """What a KV-cache policy (``--kv-policy``) saved in decode against the full cache measured in the same
    session (:mod:`perfscope.analysis.summaries.kv_policy`): the stake is the saving (or the loss) on the
    headline run's decode steps; the items are the decode attention kernels of both profiled runs (put on
    the stake's clock) and the KV held per sequence."""
    from ..summaries.kv_policy import kv_policy_summary, step_saving_ns

    s = kv_policy_summary(report)
    if s is None:
        return []
    own, ref = s["policy_run"], s.get("full_cache") or {}
    if not own.get("decode_steps"):
        return []
    name = s["policy"]
    entries, ctx = own.get("kv_entries_mean", math.nan), own.get("context_len_last", math.nan)
    kv, full_kv = own.get("kv_bytes_per_step", math.nan), s.get("full_kv_bytes_per_step", math.nan)
    evidence: dict[str, float | int | str] = {
        "kv_policy": name, "decode_steps": int(own["decode_steps"]), "kv_entries_per_step": entries,
        "context_len_last": ctx, "kv_bytes_per_step": kv, "full_kv_bytes_per_step": full_kv,
        "kv_bytes_saved_pct": s.get("kv_bytes_saved_pct", math.nan), "decode_step_ns": own.get("step_ns", math.nan),
        "decode_mbu_pct": 100.0 * own.get("mbu", math.nan),
        "attention_ns_per_step": own.get("attention_ns_per_step", math.nan),
    }
    for key in ("kv_bytes_per_sequence", "full_kv_bytes_per_sequence", "sequences_fit_ratio", "sequence_tokens"):
        if key in s:
            evidence[key] = s[key]
    reads = (f"decode reads {entries:.0f} KV entries per sequence and layer (context {ctx:.0f}): "
             f"{nbytes(kv)} vs {nbytes(full_kv)} of K/V per step")
    held = (f"{nbytes(s['kv_bytes_per_sequence'])} of KV per {s['sequence_tokens']}-token sequence vs "
            f"{nbytes(s['full_kv_bytes_per_sequence'])} with the full cache: {s['sequences_fit_ratio']:.1f}x the "
            "sequences fit in the same memory") if "sequences_fit_ratio" in s else ""
    run = headline_run(report)
    if not ref.get("step_ns"):
        return [dataclasses.replace(info(
            "kv-policy", f"KV policy {name}: {reads}; no full-cache run to time against",
            "Profile without --no-baseline: the full cache then runs beside the policy, pass for pass, and the "
            "saving is measured on the same clock.", **evidence), run=run)]
    saved = step_saving_ns(s)
    n = int(own["decode_steps"])
    evidence.update(full_decode_step_ns=ref["step_ns"], full_attention_ns_per_step=ref.get("attention_ns_per_step",
                    math.nan), full_decode_mbu_pct=100.0 * ref.get("mbu", math.nan), saved_ns_per_step=saved,
                    decode_speedup=s.get("step_ns_speedup", math.nan))
    # the kernels are the profiled runs': their saving per step, over the profiled decode steps
    prof_steps = int((report.steps["phase"] == "decode").sum()) if len(report.steps) else 0
    attn_saved = (ref.get("attention_ns_per_step", math.nan) - own.get("attention_ns_per_step", math.nan)) * prof_steps
    prof_saved = (ref.get("profiled_step_ns", math.nan) - own.get("profiled_step_ns", math.nan)) * prof_steps
    attn = (f"{own.get('attention_ns_per_step', math.nan) / 1e6:.3g} ms per step vs "
            f"{ref.get('attention_ns_per_step', math.nan) / 1e6:.3g} ms with the full cache")
    attrs = {"kv_bytes_per_step": kv, "full_kv_bytes_per_step": full_kv, "kv_entries_per_step": entries,
             "steps": prof_steps}
    metric = [Item("metric", held, attrs={"kv_bytes_per_sequence": s["kv_bytes_per_sequence"],
                                          "full_kv_bytes_per_sequence": s["full_kv_bytes_per_sequence"]})] if held else []
    quality = ("What it costs in quality is not in a profile: measure it on your prompts against the full cache "
               "(benchmarks/kv_policies.py: logit error, top-1 agreement and greedy match).")
    stake = abs(saved) * n  # on the headline run's decode steps
    if saved > 0:
        items = [Item("kernels", f"decode attention (the cache's reads and writes, the policy's selection): {attn}",
                      time_ns=attn_saved, attrs=attrs)] if attn_saved > 0 else []
        items = on_stake_clock(items, stake, _largest_positive(prof_saved, attn_saved))
        items += unexplained(stake - time_in(items, ("kernels",)), "decode time saved outside the attention kernels "
                             "(or the two runs' step times moving apart on a loaded machine)")
        title = (f"KV policy {name} saved {saved / 1e6:.3g} ms per decode step "
                 f"({s.get('step_ns_speedup', math.nan):.2f}x the full cache's speed): {reads}")
        advice = "The policy pays here: decode reads fewer KV bytes. " + (held + ". " if held else "") + quality
        f = ranked(report, "kv-policy", title, evidence, advice, stake, ranges=("decode",),
                   items=tuple(items + metric), run=run)
        return [dataclasses.replace(f, severity="info")]  # a saving, not something to fix
    items = [Item("kernels", f"the policy's cache work in decode (selection, eviction, attention): {attn}",
                  time_ns=-attn_saved, attrs=attrs)] if attn_saved < 0 else []
    items = on_stake_clock(items, stake, _largest_positive(-prof_saved, -attn_saved))
    items += unexplained(stake - time_in(items, ("kernels",)), "decode time lost outside the attention kernels "
                         "(or the two runs' step times moving apart on a loaded machine)")
    title = (f"KV policy {name} did not pay: decode steps took {-saved / 1e6:.3g} ms longer than with the full "
             f"cache; {reads}")
    advice = ("At this context and batch the K/V a step reads is small next to the weights, and selecting and "
              "evicting entries costs more than the reads it saves. Keep the full cache here; a policy pays where "
              "the KV cache dominates decode traffic (long contexts, large batches: see kv-cache-share). "
              + (held + ", which still counts for capacity. " if held else "") + quality)
    return [ranked(report, "kv-policy", title, evidence, advice, stake, ranges=("decode",), items=tuple(items + metric),
                   run=run)]
