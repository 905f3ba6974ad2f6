"""``perfscope whatif``: a measured Report projected onto another GPU, batch, prompt, context or dtype.

The result is a Report like any other (manifest ``source.kind = "projection"``, naming the measured
report and the question, and a ``projection`` record that every output's title reads), so the
terminal summary, the HTML report, the dashboard, ``compare`` and the Perfetto export all work on it.

Per kernel (vectorised over the kernel table): work at the new shapes (:mod:`.shapes`), time on the
target (:mod:`.times`). Then the timeline is rebuilt step by step: each kernel starts when the host
launched it (its launch call's time, moved with its step) or when the kernel before it ends, whichever
is later, so the host's launches and gaps keep their measured time and a launch-bound decode stays
launch-bound. Steps, requests and the unprofiled run's headline are rebuilt from it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.datasheets import lookup_datasheet, pick_datasheet, sheet_spec
from perfscope.device_models import DeviceModels, device_models, gemm_bmn, shape_classes
from perfscope.errors import UsageError
from perfscope.kv_policy import parse_kv_policy
from perfscope.report import Report, source_info
from perfscope.schema import column_codes

from ..costs.base import itemsize
from ..costs.roofline import classify_conformed
from ..steps import headline_steps, launch_times_ns, step_of
from .devices import (
    BAND_TEXT,
    band_of,
    busy_ns,
    families,
    family_table,
    host_window,
    kernel_bands,
    move,
    resolve_pair,
    wall_ns,
)
from .shapes import LOW_PRECISION_GEMM, TORCH_DTYPES, Dims, gemm_rows, recost
from .times import KNOWN_RULES, Roofs, curve_ratio, project_times

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from perfscope.device import DeviceSpec

LAUNCH_BOUND_BUSY = 0.5
"""A phase whose kernels keep the GPU busy under this share of its wall time is called launch-bound."""


@dataclass(frozen=True)
class Question:
    """What changes. None keeps the measured value."""

    gpu: str | None = None
    batch: int | None = None
    prompt_len: int | None = None
    context: int | None = None
    gen_len: int | None = None
    weights_dtype: str | None = None
    kv_dtype: str | None = None
    draft_len: int | None = None
    kv_policy: str | None = None  # streaming:sink=S,window=W | h2o:budget=B[,recent=R] | quest:budget=B[,page=P]

    def text(self) -> str:
        parts = [f"{k.replace('_', '-')}={v}" for k, v in asdict(self).items() if v is not None]
        return ", ".join(parts) or "nothing changed"

    @property
    def changes_shapes(self) -> bool:
        return any(v is not None for v in (self.batch, self.prompt_len, self.context, self.gen_len,
                                           self.weights_dtype, self.kv_dtype, self.draft_len, self.kv_policy))


def sweep(**values: Sequence[Any] | Any) -> list[Question]:
    """Every combination of the values given per field (``batch=[1, 8, 64]``): one Question each."""
    lists = {k: (list(v) if isinstance(v, (list, tuple)) else [v]) for k, v in values.items() if v is not None}
    keys = list(lists)
    return [Question(**dict(zip(keys, combo))) for combo in itertools.product(*(lists[k] for k in keys))] or [Question()]


def target_device(gpu: str | None, measured: Report) -> DeviceSpec:
    """The device a question names: a report folder (its measured roofs), a datasheet row, or the
    measured report's own device.

    Raises:
        UsageError: the GPU has no datasheet row (one line naming it), or the source has no roofs.
    """
    if gpu is None:
        if measured.device is None:
            raise UsageError(f"{measured.name}: the measured report has no device roofs, so nothing can be projected",
                             hint="re-import it with --roofs NAME")
        return measured.device
    path = Path(gpu)
    if path.is_dir():
        other = Report.load(path)
        if other.device is None:
            raise UsageError(f"--gpu {gpu}: that report has no device roofs", hint="give a GPU name instead")
        return other.device
    try:
        sheet = lookup_datasheet(gpu, "--gpu")
    except UsageError as exc:
        reason = exc.message.split(": ", 1)[-1]
        raise UsageError(f"--gpu {gpu}: {reason}; without the target's roofs nothing is projected",
                         hint="name one row (`perfscope devices --datasheet`), give a report measured on that GPU, "
                         "or add its row to perfscope/datasheets.py") from None
    return sheet_spec(sheet)


def _check_dtypes(q: Question) -> None:
    for flag, value in (("--weights-dtype", q.weights_dtype), ("--kv-dtype", q.kv_dtype)):
        if value is not None and value not in TORCH_DTYPES:
            raise UsageError(f"{flag} {value}: not a dtype the cost model knows",
                             hint=f"one of {', '.join(sorted(TORCH_DTYPES))}")
    parse_kv_policy(q.kv_policy)


def _measured_dims(report: Report) -> tuple[int, int, int]:
    """(batch, prompt length, generated tokens) of the measured run."""
    p = report.params
    steps = report.steps
    def first(values: pd.Series, how: str) -> int | None:  # a step column's max / first known value
        v = pd.to_numeric(values, errors="coerce").dropna()
        return None if not len(v) else int(v.max() if how == "max" else v.iloc[0])

    batch = p.get("batch") or (first(steps["batch"], "max") if len(steps) else None)
    prompt = p.get("prompt_len")
    if prompt is None and len(steps) and (steps["phase"] == "prefill").any():
        # a framework's steps (vLLM's ranges) may not record the context: then no prompt is known
        prompt = first(steps.loc[steps["phase"] == "prefill", "context_len"], "first")
    gen = p.get("gen_len") or p.get("max_new_tokens") or int((steps["phase"] != "prefill").sum() + 1)
    if batch is None or prompt is None:
        raise UsageError(f"{report.name}: the report has no engine steps with batch and prompt length, so a "
                         "batch, prompt or context question cannot be answered",
                         hint="ask only --gpu, or profile with `perfscope profile`")
    return int(batch), int(prompt), int(gen)


def _step_dims(steps: pd.DataFrame, batch: int, prompt: int, gen: int, q: Question) -> tuple[list[Dims], list[Dims]]:
    """Old and new :class:`.shapes.Dims` per step."""
    nb = q.batch or batch
    npmt = q.prompt_len or prompt
    ngen = q.gen_len or gen
    base_ctx = q.context if q.context is not None else npmt
    old_cap = prompt + gen - 1
    new_cap = base_ctx + ngen - 1
    olds, news = [], []
    for phase, ctx, tokens in zip(steps["phase"], steps["context_len"], steps["tokens"]):
        ctx = int(ctx) if pd.notna(ctx) else prompt
        if phase == "prefill":
            olds.append(Dims(batch, prompt, prompt, old_cap))
            news.append(Dims(nb, npmt, npmt, new_cap))
        else:
            ql = max(1, int(tokens) // batch) if pd.notna(tokens) else 1
            nql = q.draft_len + 1 if q.draft_len is not None and phase == "verify" else ql
            olds.append(Dims(batch, ql, ctx, old_cap))
            news.append(Dims(nb, nql, base_ctx + (ctx - prompt) + (nql - ql), new_cap))
    return olds, news


def _n_layer(report: Report) -> int | None:
    """The model's layers: the run's ``n_layer``, else the highest ``layer.N`` range + 1, else None."""
    n = report.params.get("n_layer")
    if isinstance(n, int) and n > 0:
        return n
    paths = report.kernels["range"].astype("object").dropna() if "range" in report.kernels else pd.Series(dtype=object)
    found = paths.str.extract(r"(?:^|/)layer\.(\d+)(?:/|$)")[0].dropna()
    return int(found.astype(int).max()) + 1 if len(found) else None


def _policy_dims(steps: pd.DataFrame, news: list[Dims], q: Question, n_layer: int | None) -> list[Dims]:
    """Under ``--kv-policy`` a decode step attends what the policy keeps or selects: its KV length is the
    policy's mean over the layers (:meth:`perfscope.kv_policy.KVPolicy.read_entries`, Quest's page
    metadata counted as entries), as is a kernel that attends the cache's whole capacity (compiled decode); the
    cache writes cost what they write. Prefill steps are kept (the engine's prefill attends the whole prompt)."""
    policy = parse_kv_policy(q.kv_policy)
    if policy.is_full:
        return news
    layers = n_layer or 1
    out = []
    for phase, d in zip(steps["phase"], news):
        if phase == "prefill":
            out.append(d)
            continue
        n = max(1, round(policy.read_entries(d.context, layers)))
        out.append(Dims(d.batch, d.q_len, n, n))  # a kernel attending the whole cache reads what the policy reads
    return out


def _gemm_dims_at(k: pd.DataFrame, kfam: np.ndarray, gemm: pd.DataFrame) -> np.ndarray:
    """Each GEMM's (batch, M, N) from its measured shapes (:func:`perfscope.device_models.gemm_bmn`), its rows
    scaled to the question's where its weight GEMM's rows change (``gemm``'s ``m_old`` -> ``m_new``)."""
    dims = gemm_bmn(k["op"].to_numpy(object), k["op_shapes"].to_numpy(object), kfam)
    if {"m_old", "m_new"} <= set(gemm.columns) and len(gemm) == len(dims):
        m_old = gemm["m_old"].to_numpy(np.float64, na_value=np.nan)
        m_new = gemm["m_new"].to_numpy(np.float64, na_value=np.nan)
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.where(np.isfinite(m_old) & np.isfinite(m_new) & (m_old > 0), m_new / m_old, 1.0)
        dims[:, 1] = np.ceil(dims[:, 1] * scale)
    return dims


def _new_work(k: pd.DataFrame, step_pos: np.ndarray, olds: list[Dims], news: list[Dims], q: Question
              ) -> tuple[np.ndarray, np.ndarray, pd.Series, np.ndarray, pd.DataFrame]:
    """Per kernel: new FLOPs, new bytes, new precision, whether its op had a formula (recosted), and for a
    GEMM with a 2-D weight its rows before and after and its weight (``m_old``, ``m_new``, ``n``, ``k``,
    ``dtype``: NaN / None for the other kernels)."""
    n = len(k)
    flops = k["flops"].to_numpy(np.float64, na_value=np.nan)
    nbytes = k["dram_bytes"].to_numpy(np.float64, na_value=np.nan)
    prec = k["precision"].astype("object")
    if not q.changes_shapes:
        return flops, nbytes, prec, np.ones(n, bool), pd.DataFrame(index=range(n))
    # one formula call per distinct (op, shapes, dtypes, step sizes): integer codes, no per-kernel Python
    (op_c, op_u), (sh_c, sh_u), (ty_c, ty_u) = (column_codes(k, c) for c in ("op", "op_shapes", "op_input_types"))
    dim_codes, dim_u = pd.factorize(pd.Series([(o, n) for o, n in zip(olds, news)], dtype=object)) if olds \
        else (np.zeros(0, np.int64), np.zeros(0, dtype=object))
    dim_c = np.where(step_pos >= 0, np.asarray(dim_codes, np.int64)[np.maximum(step_pos, 0)] if len(dim_codes) else -1, -1)
    keys = np.stack([op_c, sh_c, ty_c, dim_c], axis=1).astype(np.int64)
    uniq, codes = np.unique(keys, axis=0, return_inverse=True)
    codes = codes.reshape(-1)
    rf = np.full(len(uniq), np.nan)
    rb = np.full(len(uniq), np.nan)
    gm = np.full((len(uniq), 4), np.nan)
    gt = np.full(len(uniq), None, dtype=object)
    for i, (oc, sc, tc, dc) in enumerate(uniq):
        if oc < 0 or sc < 0 or tc < 0 or dc < 0:
            continue
        old_dims, new_dims = dim_u[dc]
        r = recost(op_u[oc], sh_u[sc], ty_u[tc], old_dims, new_dims, weights_dtype=q.weights_dtype,
                   kv_dtype=q.kv_dtype)
        if r is not None:
            rf[i], rb[i] = r
        g = gemm_rows(op_u[oc], sh_u[sc], ty_u[tc], old_dims, new_dims)
        if g is not None:
            gm[i], gt[i] = g[:4], g[4]
    gemm = pd.DataFrame({"m_old": gm[codes, 0], "m_new": gm[codes, 1], "n": gm[codes, 2], "k": gm[codes, 3],
                         "dtype": gt[codes]})
    f_ratio, b_ratio = rf[codes], rb[codes]
    known = ~np.isnan(f_ratio) & ~np.isnan(b_ratio)
    new_f = np.where(known, flops * f_ratio, flops)
    new_b = np.where(known, nbytes * b_ratio, nbytes)
    new_prec = prec
    low = LOW_PRECISION_GEMM.get(q.weights_dtype or "")
    if low:
        is_gemm = (k["category"] == "gemm").to_numpy(bool)
        new_prec = prec.where(~is_gemm, low)
    return new_f, new_b, new_prec, known, gemm


GPU_GAP_NS = 3_000
"""A kernel that started more than this after the GPU's previous kernel ended was waiting for its launch
(the GPU sat idle): its measured start is when the host had it ready. A shorter gap is the GPU's own
time between kernels, kept."""


def _timeline(k: pd.DataFrame, steps: pd.DataFrame, launch: np.ndarray, step_pos: np.ndarray,
              new_dur: np.ndarray, *, host_ops: bool = False, own_gap_ns: float | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """New kernel starts and ends and new step [start, end], in ns from ``origin`` (the first measured
    kernel's start, returned last: epoch nanoseconds as float64 would be 256 ns apart).

    Each kernel starts at max(when the host had it ready, moved with its step; the previous kernel's
    end plus the GPU's own gap before it, up to :data:`GPU_GAP_NS`). Ready is the measured start of a
    kernel the GPU waited for (an idle gap before it), else its launch call plus the median launch
    latency of those (never later than its measured start). Nothing changed gives the measured
    timeline back. A step ends after its last launch and its last kernel, whichever is later, plus the
    host time that followed the later one. ``host_ops``: the rows are CPU operators, run one after
    another on the host: each keeps the gap before it. ``own_gap_ns``: the target GPU's own gap between
    queued kernels (its device model's), taking the place of the measured GPU's. Vectorised per step (a max-plus recurrence
    solved with cumulative sums and maxima), one Python iteration per step, none per kernel."""
    order = np.argsort(k["start_ns"].to_numpy(np.int64), kind="stable")
    # times from the run's first kernel: epoch nanoseconds (~1.7e18) as float64 are 256 ns apart
    origin = int(k["start_ns"].min()) if len(k) else 0
    start = k["start_ns"].to_numpy(np.int64) - origin
    end = k["end_ns"].to_numpy(np.int64) - origin
    launch = np.asarray(launch, np.int64) - origin
    new_start = np.zeros(len(k), np.float64)
    new_end = np.zeros(len(k), np.float64)
    s_start = steps["start_ns"].to_numpy(np.int64) - origin if len(steps) else np.zeros(0, np.int64)
    s_end = steps["end_ns"].to_numpy(np.int64) - origin if len(steps) else np.zeros(0, np.int64)
    n_steps = len(steps)
    # in start order: the gap since the GPU's previous kernel ended, and when each kernel was ready
    so, eo, lo = start[order].astype(np.float64), end[order].astype(np.float64), launch[order].astype(np.float64)
    prev_end = np.concatenate([[-np.inf], np.maximum.accumulate(eo)[:-1]]) if len(order) else eo
    gap = np.where(np.isfinite(prev_end), np.maximum(so - prev_end, 0.0), 0.0)
    if host_ops:
        ready = np.full(len(order), -np.inf)
        gpu_gap = gap
    else:
        idle = gap > GPU_GAP_NS
        latency = float(np.median((so - lo)[idle])) if idle.any() else 0.0
        ready = np.where(idle, so, np.minimum(lo + latency, so))
        gpu_gap = np.minimum(gap, GPU_GAP_NS)
        if own_gap_ns is not None and len(gpu_gap):
            gpu_gap = np.where(np.arange(len(gpu_gap)) > 0, float(own_gap_ns), 0.0)
    seg = step_pos[order]
    # kernels outside every step ride with the step launched before them (or with none: shift 0)
    if n_steps:
        before = np.searchsorted(s_start, launch[order], side="right") - 1
        seg = np.where(seg >= 0, seg, np.where(before >= 0, before, -1))
    new_s_start = s_start.astype(np.float64).copy()
    new_s_end = s_end.astype(np.float64).copy()
    gpu_free = -np.inf
    boundaries = np.flatnonzero(np.diff(seg)) + 1
    groups = np.split(np.arange(len(order)), boundaries)
    shift = 0.0
    last_step = -1
    for g in groups:
        if not len(g):
            continue
        j = int(seg[g[0]])
        if j >= 0 and j != last_step:
            for m in range(last_step + 1, j + 1):  # steps without kernels keep their length and gaps
                prev = new_s_end[m - 1] if m > 0 else s_start[0]
                new_s_start[m] = prev + s_start[m] - (s_end[m - 1] if m > 0 else s_start[0])
                new_s_end[m] = new_s_start[m] + (s_end[m] - s_start[m])
            shift = new_s_start[j] - s_start[j]
            last_step = j
        idx = order[g]
        d = new_dur[idx]
        h = ready[g] + shift
        if host_ops:
            h[0] = so[g[0]] + shift
        # E_i = max(E_{i-1} + gap_i + d_i, h_i + d_i), E_{-1} = gpu_free
        a = np.cumsum(gpu_gap[g] + d)
        e = a + np.maximum(np.maximum.accumulate(h + d - a), gpu_free)
        new_end[idx] = e
        new_start[idx] = e - d
        gpu_free = float(e[-1])
        if j >= 0:  # the step ends after its last launch and its last kernel, plus what followed the later one
            last_launch = float(lo[g].max())
            rem = s_end[j] - max(float(eo[g].max()), last_launch)
            # CPU operators launch nothing: the step ends after its last one (a launch time there is the
            # op's own measured start, which would hold the step at its measured length)
            ready_end = gpu_free if host_ops else max(last_launch + shift, gpu_free)
            new_s_end[j] = max(ready_end + rem, new_s_start[j])
    for m in range(last_step + 1, n_steps):
        prev = new_s_end[m - 1] if m > 0 else s_start[0]
        new_s_start[m] = prev + (s_start[m] - (s_end[m - 1] if m > 0 else s_start[0]))
        new_s_end[m] = new_s_start[m] + (s_end[m] - s_start[m])
    return new_start, new_end, np.stack([new_s_start, new_s_end], axis=1) if n_steps else np.zeros((0, 2)), origin


def _rebuild_requests(requests: pd.DataFrame, steps: pd.DataFrame, new_steps: pd.DataFrame, batch: int,
                      gen: int) -> pd.DataFrame:
    """The engine's requests from the projected steps: one row per sequence of the new batch."""
    if not len(new_steps):
        return requests.iloc[0:0]
    t0 = float(new_steps["start_ns"].min())
    pre = new_steps[new_steps["phase"] == "prefill"]
    dec = new_steps[new_steps["phase"] != "prefill"]
    ttft = ((float(pre["end_ns"].max()) - t0) / 1e9) if len(pre) else math.nan
    tpot = float(dec["duration_ns"].mean()) / 1e9 if len(dec) else math.nan
    if len(requests) and len(steps):  # the measured request times, moved by what the steps gained or lost
        old_pre = steps[steps["phase"] == "prefill"]
        old_dec = steps[steps["phase"] != "prefill"]
        if len(old_pre) and len(pre):
            old_ttft = (float(old_pre["end_ns"].max()) - float(steps["start_ns"].min())) / 1e9
            ttft = float(requests["ttft_s"].mean()) + ttft - old_ttft
        if len(old_dec) and len(dec) and requests["tpot_s"].notna().any():
            tpot = float(requests["tpot_s"].mean()) + tpot - float(old_dec["duration_ns"].mean()) / 1e9
    e2e = ttft + (gen - 1) * tpot if gen > 1 and not math.isnan(tpot) else ttft
    prompt = int(pre["context_len"].iloc[0]) if len(pre) and pd.notna(pre["context_len"].iloc[0]) else None
    return pd.DataFrame({"request_id": range(batch), "prompt_tokens": prompt, "output_tokens": gen,
                         "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e, "itl_mean_s": tpot})


WORK_COLUMNS = ("flops", "weight_bytes", "kv_cache_bytes", "kv_cache_size_bytes")
"""A step's work: the unprofiled run's steps take the profiled steps' projected / measured ratio of each,
per phase (the headline's MFU and MBU read them)."""


def _work_ratios(steps: pd.DataFrame, new_steps: pd.DataFrame) -> dict[tuple[str, str], float]:
    """Per (phase, work column), the projected steps' mean over the measured steps' mean."""
    out: dict[tuple[str, str], float] = {}
    for ph in pd.unique(steps["phase"]):
        old = steps[steps["phase"] == ph]
        new = new_steps[new_steps["phase"] == ph]
        for col in WORK_COLUMNS:
            o = pd.to_numeric(old[col], errors="coerce").mean()
            n = pd.to_numeric(new[col], errors="coerce").mean()
            if pd.notna(o) and pd.notna(n) and o > 0:
                out[(str(ph), col)] = float(n / o)
    return out


def _scale_unprofiled(report: Report, ratio: Mapping[str, float], batch: int, gen: int,
                      shape: tuple[int, int, int, int, int] | None = None,
                      work: Mapping[tuple[str, str], float] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The unprofiled run's steps and requests, each step's time scaled by its phase's projected /
    measured ratio of the profiled run (no kernels were recorded there), and its work (FLOPs, weight and
    KV-cache bytes) by its phase's ratio in ``work``."""
    su = report.steps_unprofiled.copy()
    ru = report.requests_unprofiled.copy()
    if not len(su):
        return su, ru
    r = su["phase"].map(lambda p: ratio.get("prefill" if p == "prefill" else "decode", 1.0)).astype(float)
    dur = su["duration_ns"].astype(float) * r
    start = su["start_ns"].astype(float).iloc[0] + (dur.cumsum() - dur)
    su["start_ns"] = start.round().astype("int64")
    su["duration_ns"] = dur.round().astype("int64")
    su["end_ns"] = su["start_ns"] + su["duration_ns"]
    if shape is not None:  # the new sizes: (measured batch, prompt; new batch, prompt, context)
        ob, op_, nb, np_, nctx = shape
        pre = (su["phase"] == "prefill").to_numpy()
        su["batch"] = nb
        tokens = pd.to_numeric(su["tokens"], errors="coerce").astype(float)
        su["tokens"] = np.where(pre, nb * np_, tokens * nb / max(ob, 1)).round().astype("int64")
        ctx = pd.to_numeric(su["context_len"], errors="coerce").astype(float)
        su["context_len"] = np.where(pre, np_, ctx - op_ + nctx).round()
    for col in WORK_COLUMNS:
        if work and col in su:
            r_w = su["phase"].map(lambda p, c=col: work.get((str(p), c), 1.0)).astype(float)
            su[col] = pd.to_numeric(su[col], errors="coerce").astype(float) * r_w
    if len(ru):
        pre, dec = ratio.get("prefill", 1.0), ratio.get("decode", 1.0)
        ttft = float(ru["ttft_s"].mean()) * pre
        tpot = float(ru["tpot_s"].mean()) * dec if ru["tpot_s"].notna().any() else math.nan
        ru = pd.DataFrame({"request_id": range(batch), "prompt_tokens": ru["prompt_tokens"].iloc[0],
                           "output_tokens": gen, "ttft_s": ttft, "tpot_s": tpot,
                           "e2e_s": ttft + (gen - 1) * tpot if gen > 1 and not math.isnan(tpot) else ttft, "itl_mean_s": tpot})
    return su, ru


def project(report: Report, question: Question, *, models: DeviceModels | None = None) -> Report:
    """``report`` projected as ``question`` asks; a new Report (see the module docstring).

    ``models``: the device models that move a kernel to another GPU (default: the shipped ones,
    :func:`perfscope.device_models.device_models`; the validation passes models fitted without the
    rows it checks).

    Raises:
        UsageError: a question the model cannot answer (unknown GPU, unknown dtype, no steps for a shape
            question), in one line naming what is missing.
    """
    _check_dtypes(question)
    source_dev = report.device
    if source_dev is None:
        raise UsageError(f"{report.name}: the measured report has no device roofs, so nothing can be projected",
                         hint="re-import it with --roofs NAME")
    target_dev = target_device(question.gpu, report)
    src, tgt = Roofs.of(source_dev), Roofs.of(target_dev)
    if not tgt.bytes_per_s:
        raise UsageError(f"{target_dev.name}: no DRAM bandwidth roof, so memory-bound kernels cannot be projected",
                         hint="give a report measured on it, or add the bandwidth to its datasheet row")
    k = report.kernels
    steps = report.steps.sort_values("start_ns", kind="stable").reset_index(drop=True)
    launch = launch_times_ns(k, report.api)
    step_pos = step_of(launch, steps) if len(steps) else np.full(len(k), -1, np.int64)
    warnings: list[str] = []
    work: dict[tuple[str, str], float] = {}
    prompt: int | None
    if question.changes_shapes:
        batch, prompt, gen = _measured_dims(report)
        olds, news = _step_dims(steps, batch, prompt, gen, question)
        totals: list[int] = [d.context for d in news]  # the new KV lengths before a policy keeps or selects
        news = _policy_dims(steps, news, question, _n_layer(report))
    else:
        batch, prompt, gen = (report.params.get("batch") or 1), report.params.get("prompt_len"), \
            (report.params.get("gen_len") or report.params.get("max_new_tokens") or 1)
        olds = news = []
        totals = []
    new_f, new_b, new_prec, recosted, gemm = _new_work(k, step_pos, olds, news, question)
    precision = k["precision"].astype("object")
    missing_prec = sorted({str(p) for p in pd.unique(new_prec.dropna()) if tgt.peak(pd.Series([p]))[0] != tgt.peak(pd.Series([p]))[0]})
    for p in missing_prec:
        warnings.append(f"{tgt.name} has no {p} roof: its {p} kernels are projected by the bandwidth ratio")
    family = (k["op"].astype("object").fillna(k["category"].astype("object")).fillna("?") + "/"
              + precision.fillna("?").astype(str))
    dur_s = k["duration_ns"].to_numpy(np.float64, na_value=np.nan) * 1e-9
    flops0 = k["flops"].to_numpy(np.float64, na_value=np.nan)
    bytes0 = k["dram_bytes"].to_numpy(np.float64, na_value=np.nan)
    tensor = (k["category"] == "gemm").to_numpy(bool)
    times = project_times(dur_s, flops0, bytes0, precision, family, src, tgt, new_flops=new_f, new_bytes=new_b,
                          new_precision=new_prec, fit=question.changes_shapes, tensor=tensor)
    time_s = times["time_s"].to_numpy().copy()
    rule = times["rule"].to_numpy(object).copy()
    pair = resolve_pair(source_dev, target_dev, models if models is not None else device_models())
    kfam = families(k, new_f, new_b, new_prec)
    if pair.moves:
        # each kernel at its new work on the measured GPU (the same-device rules), then moved along its
        # family's curves to the target: the measured GPU's typical time there against the target's
        here = project_times(dur_s, flops0, bytes0, precision, family, src, src, new_flops=new_f, new_bytes=new_b,
                             new_precision=new_prec, fit=question.changes_shapes, tensor=tensor)
        # a GEMM's shape class (a pair correction's class term) at its measured shapes
        classes = (shape_classes(k["op"].to_numpy(object), k["op_shapes"].to_numpy(object), kfam)
                   if pair.uses_classes else None)
        # a GEMM's (batch, M, N) at its new rows (a pair correction's wave term)
        dims = _gemm_dims_at(k, kfam, gemm) if pair.uses_wave else None
        # each kernel's time here at its new work: its distance from its family's curve (a persistence term)
        # and its operator (an op term)
        factor, _ = move(pair, kfam, new_f, new_b, new_prec, classes, dims, here["time_s"].to_numpy(np.float64, na_value=np.nan),
                         k["op"].astype("object").fillna("").to_numpy(object))
        on = np.isfinite(factor) & np.isin(here["rule"].to_numpy(object), KNOWN_RULES)
        time_s = np.where(on, here["time_s"].to_numpy() * factor, time_s)
        rule[on] = "device-model"
        notes_models = pair.notes()
        missing = sorted({str(f) for f in kfam[~on & np.isin(rule, KNOWN_RULES)]})
        if missing:
            notes_models.append(f"no device-model curve for {', '.join(missing)} on {pair.source.device if pair.source else '?'} "
                                f"or {pair.target.device if pair.target else '?'}: those kernels keep their measured "
                                "efficiency (rule efficiency-kept)")
    else:
        notes_models = pair.notes() if question.gpu else []
    curve = report.gemm_curve
    if question.changes_shapes and len(curve) and len(gemm.columns) and not question.weights_dtype \
            and target_dev.name == source_dev.name:
        # the GEMM size curve measured on this device: each weight GEMM keeps its ratio to its curve
        r = curve_ratio(curve, gemm["n"].to_numpy(np.float64, na_value=np.nan), gemm["k"].to_numpy(np.float64, na_value=np.nan),
                        gemm["dtype"].to_numpy(object), gemm["m_old"].to_numpy(np.float64, na_value=np.nan),
                        gemm["m_new"].to_numpy(np.float64, na_value=np.nan))
        on_curve = np.isfinite(r)
        time_s = np.where(on_curve, dur_s * r, time_s)
        rule[on_curve] = "size-curve"
    uncosted = ~np.isin(rule, KNOWN_RULES) | ~recosted
    if question.changes_shapes and len(steps):
        # a kernel without a cost (or whose op has no formula) scales like its step's costed bytes
        ob = k["dram_bytes"].to_numpy(np.float64, na_value=np.nan)
        ok = (step_pos >= 0) & ~uncosted & ~np.isnan(ob) & ~np.isnan(new_b)
        num = np.bincount(step_pos[ok], weights=new_b[ok], minlength=len(steps))
        den = np.bincount(step_pos[ok], weights=ob[ok], minlength=len(steps))
        with np.errstate(divide="ignore", invalid="ignore"):
            step_ratio = np.where(den > 0, num / den, 1.0)
        scale = np.where((step_pos >= 0) & uncosted, step_ratio[np.maximum(step_pos, 0)], 1.0)
        time_s = time_s * scale
    new_dur = np.maximum(np.round(time_s * 1e9), 1.0)
    host_ops = source_dev.kind == "cpu"
    own_gap = pair.target.model.gpu_gap_ns if pair.moves and pair.target is not None else None
    new_start, _new_end, s_win, origin = _timeline(k, steps, launch, step_pos, new_dur, host_ops=host_ops,
                                                   own_gap_ns=own_gap)
    # the band: every kernel at its low, then at its high, and the timeline rebuilt for each
    lo_s, hi_s, validated = kernel_bands(pair, kfam, rule, new_dur * 1e-9)
    lo_dur, hi_dur = np.maximum(np.round(lo_s * 1e9), 1.0), np.maximum(np.round(hi_s * 1e9), 1.0)
    lo_start, _, lo_win, _ = _timeline(k, steps, launch, step_pos, lo_dur, host_ops=host_ops, own_gap_ns=own_gap)
    hi_start, _, hi_win, _ = _timeline(k, steps, launch, step_pos, hi_dur, host_ops=host_ops, own_gap_ns=own_gap)
    vshare = float(new_dur[validated].sum() / new_dur.sum()) if len(k) and new_dur.sum() else 0.0
    host = host_window(report.api, report.ranges, origin)
    m_start = (k["start_ns"].to_numpy(np.int64) - origin).astype(np.float64)
    m_end = (k["end_ns"].to_numpy(np.int64) - origin).astype(np.float64)
    rel_launch = (launch.astype(np.int64) - origin).astype(np.float64)
    whole = {
        "kernels": len(k),
        "kernel_time_s": {"measured": float(k["duration_ns"].sum()) * 1e-9,
                          **band_of(float(new_dur.sum()) * 1e-9, float(lo_dur.sum()) * 1e-9,
                                    float(hi_dur.sum()) * 1e-9, vshare)},
        "busy_s": {"measured": busy_ns(m_start, m_end) * 1e-9,
                   **band_of(busy_ns(new_start, new_start + new_dur) * 1e-9,
                             busy_ns(lo_start, lo_start + lo_dur) * 1e-9, busy_ns(hi_start, hi_start + hi_dur) * 1e-9,
                             vshare)},
        "wall_s": {"measured": wall_ns(m_start, m_end, rel_launch, host) * 1e-9,
                   **band_of(wall_ns(new_start, new_start + new_dur, rel_launch, host, m_end) * 1e-9,
                             wall_ns(lo_start, lo_start + lo_dur, rel_launch, host, m_end) * 1e-9,
                             wall_ns(hi_start, hi_start + hi_dur, rel_launch, host, m_end) * 1e-9,
                             vshare)},
    }
    family_rows = family_table(kfam, k["duration_ns"].to_numpy(np.float64, na_value=np.nan), new_dur, lo_dur, hi_dur, rule, validated)

    kernels = k.copy()
    base = float(k["start_ns"].min()) if len(k) else 0.0
    kernels["start_ns"] = np.round(new_start).astype(np.int64) + origin if len(k) else k["start_ns"]
    kernels["end_ns"] = kernels["start_ns"] + new_dur.astype(np.int64)
    kernels["duration_ns"] = new_dur.astype(np.int64)
    kernels["flops"] = new_f
    kernels["dram_bytes"] = new_b
    kernels["precision"] = new_prec
    kernels["projection_rule"] = np.where(~recosted & question.changes_shapes & (rule == "efficiency-kept"),
                                          "work-kept (op without formula)", rule)
    kernels["measured_duration_ns"] = k["duration_ns"].to_numpy()
    if len(steps):
        kernels["step"] = pd.array(np.where(step_pos >= 0, steps["step"].to_numpy()[np.maximum(step_pos, 0)], 0),
                                   dtype="Int64")
        kernels.loc[step_pos < 0, "step"] = pd.NA
    kernels = classify_conformed(kernels, target_dev)
    del base

    new_steps = steps.copy()
    if len(steps):
        new_steps["start_ns"] = np.round(s_win[:, 0]).astype(np.int64) + origin
        new_steps["end_ns"] = np.round(s_win[:, 1]).astype(np.int64) + origin
        new_steps["duration_ns"] = new_steps["end_ns"] - new_steps["start_ns"]
        n = len(steps)
        hit = step_pos >= 0
        pos = step_pos[hit]
        old_kf = np.bincount(pos, weights=np.nan_to_num(k["flops"].to_numpy(np.float64, na_value=np.nan)[hit]), minlength=n)
        new_kf = np.bincount(pos, weights=np.nan_to_num(new_f[hit]), minlength=n)
        ktime = np.bincount(pos, weights=new_dur[hit], minlength=n)
        new_steps["kernel_time_ns"] = pd.array(np.round(ktime).astype(np.int64), dtype="Int64")
        new_steps["kernel_flops"] = np.where(new_kf > 0, new_kf, np.nan)
        if question.changes_shapes:
            with np.errstate(divide="ignore", invalid="ignore"):
                f_ratio = np.where(old_kf > 0, new_kf / old_kf, np.nan)
            new_steps["batch"] = [d.batch for d in news]
            new_steps["tokens"] = [d.tokens for d in news]
            new_steps["context_len"] = [d.context for d in news]
            w_ratio = (itemsize(TORCH_DTYPES[question.weights_dtype].lower()) / 2.0) if question.weights_dtype else 1.0
            new_steps["weight_bytes"] = steps["weight_bytes"] * w_ratio
            kv_old = steps["kv_cache_bytes"].astype(float)
            kv_ratio = np.array([(n_.batch * n_.context) / max(o.batch * o.context, 1) for o, n_ in zip(olds, news)])
            kvd = (itemsize(TORCH_DTYPES[question.kv_dtype].lower()) / 2.0) if question.kv_dtype else 1.0
            new_steps["kv_cache_bytes"] = kv_old * kv_ratio * kvd
            new_steps["kv_cache_size_bytes"] = steps["kv_cache_size_bytes"].astype(float) * kv_ratio * kvd
            policy = parse_kv_policy(question.kv_policy)
            if not policy.is_full:  # what a sequence holds: the policy's kept entries (Quest: all, and its pages)
                held = np.array([(n_.batch * (policy.held(t) + policy.pages(t))) / max(o.batch * o.context, 1)
                                 for o, n_, t in zip(olds, news, totals)])
                new_steps["kv_cache_size_bytes"] = steps["kv_cache_size_bytes"].astype(float) * held * kvd
                new_steps["kv_entries"] = [float(n_.context) for n_ in news]
            new_steps["flops"] = steps["flops"].astype(float) * f_ratio
            work = _work_ratios(steps, new_steps)
        if question.gen_len is not None and question.gen_len < gen:
            keep = (new_steps["phase"] == "prefill") | (new_steps.groupby("phase").cumcount() < question.gen_len - 1)
            new_steps = new_steps[keep.to_numpy()]
        if question.gen_len is not None and question.gen_len > gen:
            warnings.append(f"--gen-len {question.gen_len}: the measured run has {gen} tokens; the decode steps past "
                            f"them are not in the tables, TPOT and E2E use the projected steps' mean")

    # phase ratios (projected / measured), busy share and launch-bound verdicts
    notes: list[str] = []
    ratio: dict[str, float] = {}
    phases: dict[str, dict[str, float | None]] = {}
    for ph in ("prefill", "decode"):
        m_old = steps["phase"] == ph if len(steps) else pd.Series(dtype=bool)
        if not len(steps) or not m_old.any():
            continue
        idx = np.flatnonzero(m_old.to_numpy())
        old_t = float(steps["duration_ns"].iloc[idx].sum())
        new_t = float((s_win[idx, 1] - s_win[idx, 0]).sum())
        busy = float(np.bincount(step_pos[step_pos >= 0], weights=new_dur[step_pos >= 0],
                                 minlength=len(steps))[idx].sum())
        ratio[ph] = new_t / old_t if old_t > 0 else 1.0
        lo_t = float((lo_win[idx, 1] - lo_win[idx, 0]).sum())
        hi_t = float((hi_win[idx, 1] - hi_win[idx, 0]).sum())
        phases[ph] = {"measured_s": old_t / 1e9, "projected_s": new_t / 1e9,
                      "low_s": lo_t / 1e9 if vshare else None, "high_s": hi_t / 1e9 if vshare else None,
                      "gpu_busy_share": busy / new_t if new_t else math.nan}
        # the verdict is the headline steps' (an outlier step, a host stall at the profiler's start, is not
        # the engine launching: every step an outlier, no verdict)
        steady = headline_steps(steps.iloc[idx]).index.to_numpy()  # steps' index is its positions (reset above)
        s_new = float((s_win[steady, 1] - s_win[steady, 0]).sum())
        s_busy = float(np.bincount(step_pos[step_pos >= 0], weights=new_dur[step_pos >= 0],
                                   minlength=len(steps))[steady].sum())
        if s_new and s_busy / s_new < LAUNCH_BOUND_BUSY:
            notes.append(f"{ph} is launch-bound on {tgt.name} at batch {question.batch or int(batch or 1)}: its kernels "
                         f"keep the GPU busy {s_busy / s_new:.0%} of the "
                         f"time; the host's launches and gaps keep their measured time, so a faster GPU gains little")
    notes.extend(notes_models)
    if question.gpu and not Path(question.gpu).is_dir():
        picked = pick_datasheet(question.gpu, "--gpu")[1]
        if picked:
            notes.insert(0, picked)
    counts = kernels["projection_rule"].value_counts().to_dict()
    if counts.get("size-curve"):
        on = (kernels["projection_rule"] == "size-curve").to_numpy()
        notes.append(f"{int(on.sum())} weight GEMMs ({float(k['duration_ns'][on].sum()) / float(k['duration_ns'].sum()):.0%} "
                     f"of the measured kernel time) are timed by the GEMM size curve measured on {source_dev.name} "
                     f"(rows {int(curve['m'].min())}-{int(curve['m'].max())}): time x curve(new rows) / curve(rows)")
    unknown = ~kernels["projection_rule"].isin(KNOWN_RULES)
    share = float(k["duration_ns"][unknown.to_numpy()].sum()) / float(k["duration_ns"].sum()) if len(k) else 0.0
    if unknown.any():
        mask = unknown.to_numpy()
        label = k["op"].astype("object").where(k["op"].notna(), k["short_name"].astype("object")).fillna(k["name"])
        top = pd.Series(k["duration_ns"].to_numpy(np.float64, na_value=np.nan)[mask], index=label[mask].to_numpy()).groupby(level=0).sum()
        total = float(k["duration_ns"].sum())
        named = ", ".join(f"{str(n)[:48]} ({t / total:.1%})" for n, t in top.nlargest(3).items())
        notes.append(f"no cost formula or no roof for {int(unknown.sum())} kernels ({share:.1%} of the measured kernel "
                     f"time; most: {named}): their time is scaled by a stated rule (docs/whatif.md), not projected "
                     "from their work")

    batch_new = question.batch or int(batch or 1)
    gen_new = question.gen_len or int(gen or 1)
    # requests exist where the measured run had them (an imported framework trace may have steps and none)
    requests = _rebuild_requests(report.requests, steps, new_steps, batch_new, gen_new) \
        if len(steps) and len(report.requests) else report.requests
    shape = None
    if question.changes_shapes and prompt is not None:  # _measured_dims gave the prompt (or raised)
        np_ = question.prompt_len or int(prompt)
        shape = (int(batch), int(prompt), batch_new, np_, question.context if question.context is not None else np_)
    su, ru = _scale_unprofiled(report, ratio, batch_new, gen_new, shape, work)
    policy = parse_kv_policy(question.kv_policy)
    if not policy.is_full and len(su) and "context_len" in su:  # the headline steps attend what the policy reads
        layers = _n_layer(report) or 1
        ctx = pd.to_numeric(su["context_len"], errors="coerce")
        su["kv_entries"] = [float(c) if ph == "prefill" or pd.isna(c) else policy.read_entries(int(c), layers)
                            for ph, c in zip(su["phase"], ctx)]
    if question.gen_len is not None and question.gen_len < gen and len(su):
        su = su[((su["phase"] == "prefill") | (su.groupby("phase").cumcount() < question.gen_len - 1)).to_numpy()]

    params = dict(report.params)
    for key, value in (("batch", question.batch), ("prompt_len", question.prompt_len), ("gen_len", question.gen_len),
                       ("max_new_tokens", question.gen_len), ("context", question.context),
                       ("weights_dtype", question.weights_dtype), ("kv_dtype", question.kv_dtype)):
        if value is not None:
            params[key] = value
    if not policy.is_full:
        from ..summaries.kv_policy import decode_kv

        params["kv_policy"] = policy.text()
        # the measured run is the full cache the projected policy is set against
        if parse_kv_policy(report.params.get("kv_policy")).is_full:
            params["kv_policy_reference"] = {"kv_policy": "full", "measured": True, **decode_kv(report)}
        notes.append(f"--kv-policy {policy.text()}: each decode step's attention is priced at the KV length the policy "
                     "reads (mean over the layers; Quest's page metadata counted as entries); the policy's own "
                     "selection and eviction work is not in the measured run, so it is not projected "
                     "(docs/kv-policies.md has its measured size)")
    if question.batch is not None or question.prompt_len is not None:
        params["prompt_lens"] = [question.prompt_len or prompt] * batch_new
    projection = {
        "measured_report": str(report.path) if report.path else report.name,
        "measured_name": report.name,
        "question": asdict(question),
        "question_text": question.text(),
        "source_device": source_dev.name,
        "target_device": tgt.name,
        "target_roofs": "report" if question.gpu and Path(question.gpu).is_dir() else
                        ("datasheet" if question.gpu else "measured report's"),
        "rules": {"device_model": "another GPU: the time at the new work on the measured GPU x g_target(R_target) / "
                                  "g_measured(R_measured), g = the device model's typical time for the kernel's family "
                                  "at its roof time (perfscope/device_models.json)",
                  "time": "t0 + (F/P + B/BW) / e, e = the kernel's measured efficiency, t0 = half the shortest "
                          "kernel of its family (category/precision)",
                  "unknown_cost": "time x DRAM bandwidth ratio (another GPU) x its step's costed-bytes ratio (new shapes)",
                  "size_curve": "a weight GEMM at new rows on the same device: time x curve(new rows) / curve(rows), "
                                "the report's gemm_curve measured on the device, linear between its rows",
                  "host": "launch times and host gaps kept"},
        "kernel_rules": {str(a): int(b) for a, b in counts.items()},
        "unknown_time_share": share,
        "phases": phases,
        "whole_run": whole,
        "families": family_rows,
        "device_models": pair.to_dict(),
        "band": {"text": BAND_TEXT, "validated_share": vshare, "vendor_pair": pair.vendor_pair,
                 "bands": {b.group: {"q10": b.q10, "q90": b.q90, "rows": b.rows} for b in pair.models.bands
                           if b.pair == pair.vendor_pair} if pair.moves else {}},
        "notes": notes,
    }
    manifest = dict(report.manifest)
    manifest.update({
        "name": f"{report.name} [projected: {question.text()}]",
        "source": source_info("projection", report.path, tool="perfscope whatif", tool_version=None,
                              measured=report.name, question=question.text()),
        "device": target_dev.to_dict(),
        "params": params,
        "warnings": list(report.warnings) + warnings + notes,
        "projection": projection,
    })
    tables = {"kernels": kernels, "ranges": report.ranges.iloc[0:0], "transfers": report.transfers,
              "api": report.api.iloc[0:0], "counters": report.counters.iloc[0:0], "requests": requests,
              "steps": new_steps, "requests_unprofiled": ru, "steps_unprofiled": su}
    return Report.build(tables, manifest, source=f"projection of {report.name}")


def whatif(report: Report, **values: Any) -> list[Report]:
    """Every projection a sweep asks for (``batch=[1, 8]``, ``gpu="B200"``...): one Report per question."""
    return [project(report, q) for q in sweep(**values)]


def projected_metrics(report: Report) -> dict[str, float]:
    """Headline numbers of a (projected) report: TTFT, TPOT, tokens/s, and per phase MFU / MBU."""
    from ..summaries.serving import phase_summary, request_summary

    out: dict[str, float] = {}
    rs = request_summary(report)
    for key in ("ttft_s_mean", "tpot_s_mean", "output_tokens_per_s", "e2e_s_mean"):
        if key in rs:
            out[key] = float(rs[key])
    table = phase_summary(report)
    for row in table.itertuples(index=False):
        out[f"{row.phase}_wall_s"] = float(row.wall_s)
        out[f"{row.phase}_mfu"] = float(row.mfu)
        out[f"{row.phase}_mbu"] = float(row.mbu)
        out[f"{row.phase}_tokens_per_s"] = float(row.tokens_per_s)
    return out


RATE_METRICS = ("tokens_per_s", "mfu", "mbu")
"""Metrics that fall as time grows: a band's low comes from the time's high."""


def metric_bands(report: Report, metrics: Mapping[str, float]) -> dict[str, dict[str, float | None]]:
    """``low`` and ``high`` of each headline metric of a projection: each phase's time in the timelines
    rebuilt with every kernel at its band's low and high (the projection record's ``phases``), over its
    projected time, moves the times of that phase (TTFT, TPOT, its wall time) and, inverted, its rates
    (tokens/s, MFU, MBU); E2E and the output rate take both phases. None where the band was never
    validated."""
    phases = (report.manifest.get("projection") or {}).get("phases") or {}

    def ratio(ph: str, end: str) -> float | None:
        p = phases.get(ph) or {}
        if p.get(end) is None or not p.get("projected_s"):
            return None
        return float(p[end]) / float(p["projected_s"])

    def both(end: str) -> float | None:
        got = [(phases[ph][end], phases[ph]["projected_s"]) for ph in ("prefill", "decode")
               if ph in phases and phases[ph].get(end) is not None]
        return sum(a for a, _ in got) / sum(b for _, b in got) if got and sum(b for _, b in got) else None

    out: dict[str, dict[str, float | None]] = {}
    for key, value in metrics.items():
        if key in ("e2e_s_mean", "output_tokens_per_s"):
            lo, hi = both("low_s"), both("high_s")
        else:
            ph = "prefill" if key.startswith(("ttft", "prefill")) else "decode"
            lo, hi = ratio(ph, "low_s"), ratio(ph, "high_s")
        if lo is None or hi is None or value is None or math.isnan(value):
            out[key] = {"low": None, "high": None}
        elif key.endswith(RATE_METRICS) or key == "output_tokens_per_s":
            out[key] = {"low": value / hi if hi else None, "high": value / lo if lo else None}
        else:
            out[key] = {"low": value * lo, "high": value * hi}
    return out




@dataclass(frozen=True)
class WhatifResult:
    """One projected question: the question, its Report, where it was saved, its headline numbers."""

    question: Question
    report: Report
    path: Path | None
    metrics: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        """The ``whatif --json`` record: every projected number with ``low`` and ``high`` beside it (the
        band; None where it was never validated) and the band's name."""
        proj = self.report.manifest.get("projection") or {}
        return {"question": asdict(self.question), "question_text": self.question.text(),
                "report": None if self.path is None else str(self.path), "target_device": proj.get("target_device"),
                "metrics": self.metrics, "metric_bands": metric_bands(self.report, self.metrics),
                "phases": proj.get("phases"), "whole_run": proj.get("whole_run"), "families": proj.get("families"),
                "band": proj.get("band"), "device_models": proj.get("device_models"), "notes": proj.get("notes"),
                "kernel_rules": proj.get("kernel_rules"), "projected": True}


def check_question(q: Question, report: Report) -> None:
    """Raise the one-line error a question the model cannot answer gets (an unknown dtype or GPU),
    before anything is projected or written."""
    _check_dtypes(q)
    target_device(q.gpu, report)


def measured_metrics(report: Report) -> dict[str, float]:
    """The measured report's headline numbers, as :func:`projected_metrics` gives a projection's."""
    return projected_metrics(report)


__all__ = ["Question", "WhatifResult", "check_question", "measured_metrics", "metric_bands", "project",
           "projected_metrics", "sweep",
           "target_device", "whatif"]
