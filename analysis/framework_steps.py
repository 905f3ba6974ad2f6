"""Steps of other people's inference: vLLM, SGLang and hand-marked step ranges -> the steps table.

A pure step of the import pipeline (:func:`.finish.finish` calls :func:`with_framework_steps`):
the ``record_function`` / NVTX ranges whose names are a framework's step annotation become rows
of ``steps`` (schema 1.2), and each kernel gets the ``step`` and ``phase`` of the step whose time
window holds its LAUNCH (the runtime call that queued it, found by correlation id in ``api``; for
a CUDA/HIP graph replay that is the ``cudaGraphLaunch`` / ``hipGraphLaunch`` call), not its GPU
time, which may run past the step's end. Kernels without a known launch call use their start.

Forms understood (docs/framework-steps.md has them as the frameworks emit them):

- vLLM V1 ``execute_context_{n}({q}_{qk})_generation_{m}({q}_{qk})``: requests prefilling (n)
  and decoding (m), and per group the sum of new tokens and of new tokens times context;
- vLLM V1 ``execute_{T}_context_{n}(sq..sk..sqsq..sqsk..)_generation_{m}(sq..sk..sqsq..sqsk..)``:
  T scheduled tokens, per group the sums of query lengths (sq), key lengths (sk), sq² and sq·sk;
- vLLM V1 (older) ``execute_new_{n}_cached_{m}``: newly scheduled and already running requests;
- SGLang ``step[MODE bs=B toks=T]`` (EXTEND, DECODE, MIXED, TARGET_VERIFY, DRAFT_EXTEND, IDLE...);
- perfscope's own ``perfscope.step[PHASE bs=B toks=T ctx=C]`` (``perfscope.annotate.step``).

Ranges nested on one thread (SGLang's ``execute_...`` around its ``step[...]``) are one step: the
outermost range's window, the most specific label's fields (user, then SGLang, then vLLM) with the
others filling what it lacks. A range that looks like a step annotation but matches no form leaves
its kernels without a phase, with one warning quoting one such label.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace

import numpy as np
import pandas as pd

FLOPS_MIN_COVERAGE = 0.9
"""Share of a step's kernel time that costed kernels must cover for its FLOPs / bytes (the rule of
:mod:`.serving`): a partial sum would understate the step's work without saying so."""

GPU_RANGE_SOURCES = ("gpu_annotation", "gpu_user_annotation")
"""Range sources that are the GPU-side copy of a CPU annotation (Kineto's ``gpu_user_annotation``):
not steps of their own."""

_NUM = r"(\d+)"
VLLM_COMPACT = re.compile(r"execute_context_(\d+)\(([\d_]*)\)_generation_(\d+)\(([\d_]*)\)")
VLLM_DETAILED = re.compile(
    r"execute_(\d+)_context_(\d+)\(sq(\d+)sk(\d+)sqsq(\d+)sqsk(\d+)\)"
    r"_generation_(\d+)\(sq(\d+)sk(\d+)sqsq(\d+)sqsk(\d+)\)")
VLLM_OLD = re.compile(r"execute_new_(\d+)_cached_(\d+)")
SGLANG = re.compile(r"step\[([A-Z_]+)((?:\s+[a-z_]+=\d+)*)\s*\]")
USER = re.compile(r"perfscope\.step\[(prefill|decode|mixed)((?:\s+[a-z_]+=\d+)*)\s*\]")
LOOKS_LIKE_STEP = re.compile(r"execute_(?:\d|context|new|generation|cached)|step\[|perfscope\.step")
"""Names that claim to be a step annotation: when no form above matches, they are reported."""

SGLANG_PHASES = {"EXTEND": "prefill", "PREBUILT_EXTEND": "prefill", "DECODE": "decode",
                 "MIXED": "mixed", "TARGET_VERIFY": "verify", "DRAFT_EXTEND": "draft",
                 "DRAFT_EXTEND_V2": "draft", "IDLE": "idle", "SPLIT_PREFILL": "prefill"}
"""SGLang's ForwardMode names (``forward_batch_info.py``) -> phase. IDLE is a forward with no
sequences (data-parallel attention ranks without work)."""

SPECIFICITY = {"user": 0, "sglang": 1, "vllm": 2}
"""Which label of nested ones gives a merged step its fields first (lower first)."""


@dataclass(frozen=True)
class StepLabel:
    """What one step annotation says (None: the label does not tell)."""

    framework: str
    phase: str
    batch: int | None = None
    tokens: int | None = None
    prefill_tokens: int | None = None
    prefill_seqs: int | None = None
    decode_seqs: int | None = None
    context_tokens: int | None = None
    attention_prefill_share: float | None = None

    def filled_from(self, other: StepLabel) -> StepLabel:
        """This label with the fields it lacks taken from ``other`` (its framework and phase kept)."""
        missing = {f.name: getattr(other, f.name) for f in fields(self)
                   if getattr(self, f.name) is None and getattr(other, f.name) is not None}
        return replace(self, **missing)


UNKNOWN = StepLabel("unknown", "unknown")
"""A name that looks like a step annotation but matches no known form."""


def _phase(prefill_seqs: int, decode_seqs: int) -> str:
    if prefill_seqs and decode_seqs:
        return "mixed"
    return "prefill" if prefill_seqs else "decode" if decode_seqs else "idle"


def _sums(text: str) -> tuple[int | None, int | None]:
    """vLLM's compact ``{q}_{qk}`` group string: (sum of new tokens, sum of new tokens x context)."""
    parts = [int(p) for p in text.split("_") if p]
    return (parts[0] if parts else None), (parts[1] if len(parts) > 1 else None)


def _share(prefill_qk: int | None, decode_qk: int | None) -> float | None:
    if prefill_qk is None or decode_qk is None or prefill_qk + decode_qk <= 0:
        return None
    return prefill_qk / (prefill_qk + decode_qk)


def _vllm_compact(m: re.Match[str]) -> StepLabel:
    n, m_gen = int(m.group(1)), int(m.group(3))
    pq, pqk = _sums(m.group(2))
    dq, dqk = _sums(m.group(4))
    pqk, dqk = (0 if n == 0 else pqk), (0 if m_gen == 0 else dqk)  # an empty group prints as "(0)"
    # one prefilling request: its context is its qk / q; decode requests have q = 1 each, so their
    # qk sum is their context sum. Several prefilling requests: their contexts are not recoverable.
    pctx = pqk // pq if n == 1 and pq and pqk is not None else 0 if n == 0 else None
    dctx = dqk if m_gen and dq == m_gen and dqk is not None else 0 if m_gen == 0 else None
    tokens = pq + dq if pq is not None and dq is not None else None
    return StepLabel("vllm", _phase(n, m_gen), batch=n + m_gen, tokens=tokens,
                     prefill_tokens=pq, prefill_seqs=n, decode_seqs=m_gen,
                     context_tokens=pctx + dctx if pctx is not None and dctx is not None else None,
                     attention_prefill_share=_share(pqk, dqk))


def _vllm_detailed(m: re.Match[str]) -> StepLabel:
    g = [int(x) for x in m.groups()]
    total, n, psq, psk, _, psqsk, m_gen, _dsq, dsk, _, dsqsk = g
    return StepLabel("vllm", _phase(n, m_gen), batch=n + m_gen, tokens=total, prefill_tokens=psq,
                     prefill_seqs=n, decode_seqs=m_gen, context_tokens=psk + dsk,
                     attention_prefill_share=_share(psqsk, dsqsk))


def _vllm_old(m: re.Match[str]) -> StepLabel:
    new, cached = int(m.group(1)), int(m.group(2))
    # "cached" requests are those scheduled before: decoding, or continuing a chunked prefill
    return StepLabel("vllm", _phase(new, cached), batch=new + cached, prefill_seqs=new, decode_seqs=cached)


def _keys(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"([a-z_]+)=(\d+)", text)}


def _sglang(m: re.Match[str]) -> StepLabel:
    mode = m.group(1)
    phase = SGLANG_PHASES.get(mode)
    if phase is None:
        return UNKNOWN
    kv = _keys(m.group(2))
    bs, toks = kv.get("bs"), kv.get("toks")
    if phase == "decode":
        return StepLabel("sglang", phase, batch=bs, tokens=toks if toks is not None else bs, decode_seqs=bs,
                         prefill_tokens=0, prefill_seqs=0)
    if phase == "prefill":
        return StepLabel("sglang", phase, batch=bs, tokens=toks, prefill_tokens=toks, prefill_seqs=bs, decode_seqs=0)
    if phase == "idle":
        return StepLabel("sglang", phase, batch=bs if bs is not None else 0, tokens=toks if toks is not None else 0)
    return StepLabel("sglang", phase, batch=bs, tokens=toks)


def _user(m: re.Match[str]) -> StepLabel:
    phase, kv = m.group(1), _keys(m.group(2))
    bs, toks = kv.get("bs"), kv.get("toks")
    one = {"prefill": {"prefill_tokens": toks, "prefill_seqs": bs, "decode_seqs": 0},
           "decode": {"prefill_tokens": 0, "prefill_seqs": 0, "decode_seqs": bs}, "mixed": {}}[phase]
    return StepLabel("user", phase, batch=bs, tokens=toks, context_tokens=kv.get("ctx"), **one)


_FORMS = ((USER, _user), (SGLANG, _sglang), (VLLM_DETAILED, _vllm_detailed), (VLLM_COMPACT, _vllm_compact),
          (VLLM_OLD, _vllm_old))


def parse_step_label(name: object) -> StepLabel | None:
    """The step a range name announces; :data:`UNKNOWN` when it looks like a step annotation of
    no known form (a new format, a truncated name); None when it is not a step annotation."""
    if not isinstance(name, str):
        return None
    text = name.strip()
    for pattern, build in _FORMS:
        m = pattern.fullmatch(text)
        if m:
            try:
                return build(m)
            except (ValueError, ZeroDivisionError, OverflowError):
                return UNKNOWN
    return UNKNOWN if LOOKS_LIKE_STEP.match(text) else None


# ---------------------------------------------------------------------------- ranges -> steps
@dataclass(frozen=True)
class FrameworkSteps:
    """Steps read from a report's ranges, and what could not be read."""

    steps: pd.DataFrame
    unknown_labels: tuple[str, ...] = ()

    @property
    def warnings(self) -> list[str]:
        if not self.unknown_labels:
            return []
        n = len(self.unknown_labels)
        return [f"{n} range(s) look like step annotations but match no known form, e.g. "
                f"{self.unknown_labels[0][:120]!r}: their kernels have no phase (docs/framework-steps.md "
                "lists the forms read)"]


STEP_FIELDS = ("framework", "phase", "batch", "tokens", "prefill_tokens", "prefill_seqs", "decode_seqs",
               "context_tokens", "attention_prefill_share")


def steps_from_ranges(ranges: pd.DataFrame) -> FrameworkSteps:
    """The framework steps among ``ranges`` (columns name, start_ns, end_ns, thread, source), one
    row per outermost step range of a thread, in start order, ``step`` numbered from 0."""
    if not len(ranges) or "name" not in ranges:
        return FrameworkSteps(pd.DataFrame())
    names = ranges["name"]
    codes, distinct = pd.factorize(names.astype("object"))
    parsed = [parse_step_label(n) for n in distinct]
    kinds = np.array([0 if p is None else 2 if p is UNKNOWN else 1 for p in parsed] + [0], dtype=np.int8)
    kind = kinds[codes]  # codes of missing names are -1: the appended 0
    if "source" in ranges:
        gpu = ranges["source"].isin(GPU_RANGE_SOURCES).to_numpy()
        kind = np.where(gpu, 0, kind)
    unknown = tuple(dict.fromkeys(str(distinct[c]) for c in codes[kind == 2]))
    rows = np.flatnonzero(kind == 1)
    if not len(rows):
        return FrameworkSteps(pd.DataFrame(), unknown)
    labels = [parsed[c] for c in codes[rows]]
    start = ranges["start_ns"].to_numpy(np.int64)[rows]
    end = ranges["end_ns"].to_numpy(np.int64)[rows]
    thread = (pd.to_numeric(ranges["thread"], errors="coerce").fillna(-1).to_numpy(np.int64)[rows]
              if "thread" in ranges else np.zeros(len(rows), np.int64))
    text = names.to_numpy(dtype=object)[rows]
    return FrameworkSteps(_merge_nested(labels, start, end, thread, text), unknown)


def _merge_nested(labels: Sequence[StepLabel], start: np.ndarray, end: np.ndarray, thread: np.ndarray,
                  text: np.ndarray) -> pd.DataFrame:
    """One row per outermost step range (per thread); nested step ranges merge into it."""
    order = np.lexsort((-end, start, thread))
    groups: list[list[int]] = []
    open_end, open_thread = -1, None
    for i in order.tolist():
        if groups and thread[i] == open_thread and end[i] <= open_end:
            groups[-1].append(i)
            continue
        groups.append([i])
        open_end, open_thread = end[i], thread[i]
    rows = []
    for g in groups:
        best = sorted(g, key=lambda i: (SPECIFICITY.get(labels[i].framework, 9), g.index(i)))
        label = labels[best[0]]
        for i in best[1:]:
            label = label.filled_from(labels[i])
        outer = g[0]
        rows.append({**{f: getattr(label, f) for f in STEP_FIELDS}, "label": " / ".join(str(text[i]) for i in g),
                     "start_ns": int(start[outer]), "end_ns": int(end[outer])})
    steps = pd.DataFrame(rows).sort_values("start_ns", kind="stable").reset_index(drop=True)
    steps.insert(0, "step", np.arange(len(steps), dtype=np.int64))
    steps["duration_ns"] = steps["end_ns"] - steps["start_ns"]
    for col in ("batch", "tokens", "prefill_tokens", "prefill_seqs", "decode_seqs", "context_tokens"):
        steps[col] = pd.array(pd.to_numeric(steps[col], errors="coerce"), dtype="Int64")
    steps["attention_prefill_share"] = pd.to_numeric(steps["attention_prefill_share"], errors="coerce").astype("float64")
    return steps


# ---------------------------------------------------------------------------- kernels -> steps
def launch_times_ns(kernels: pd.DataFrame, api: pd.DataFrame | None) -> np.ndarray:
    """Per kernel, the start of its launch call (``api`` row of the same correlation id: the
    launch, or the graph launch of a replayed kernel); the kernel's own start where none is known
    (CPU operator rows, traces without runtime calls)."""
    own = kernels["start_ns"].to_numpy(np.int64)
    if api is None or not len(api) or "correlation" not in kernels or "correlation" not in api:
        return own.copy()
    calls = api[api["correlation"].notna()]
    ids = calls["correlation"].to_numpy(np.float64)
    order = np.argsort(ids, kind="stable")
    ids, call_start = ids[order], calls["start_ns"].to_numpy(np.int64)[order]
    corr = pd.to_numeric(kernels["correlation"], errors="coerce").to_numpy(np.float64, na_value=np.nan)
    if not len(ids):
        return own.copy()
    at = np.clip(np.searchsorted(ids, corr), 0, len(ids) - 1)  # the first call of an id (stable sort)
    hit = ids[at] == corr
    return np.where(hit, call_start[at], own)


def step_of(launch_ns: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """Position in ``steps`` of the step whose [start, end] holds each launch time, -1 for none.

    Steps are taken in start order; where windows overlap (steps of several threads) a launch
    goes to the latest-starting step that holds it."""
    if not len(steps):
        return np.full(len(launch_ns), -1, np.int64)
    s = steps["start_ns"].to_numpy(np.int64)
    e = steps["end_ns"].to_numpy(np.int64)
    order = np.argsort(s, kind="stable")
    at = np.searchsorted(s[order], launch_ns, side="right") - 1
    ok = at >= 0
    pos = np.where(ok, order[np.maximum(at, 0)], -1)
    inside = ok & (launch_ns <= e[np.maximum(pos, 0)])
    return np.where(inside, pos, -1)


def assign_kernels_to_steps(kernels: pd.DataFrame, steps: pd.DataFrame,
                            api: pd.DataFrame | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Kernels with the ``step`` and ``phase`` of the step they were launched in, and steps with
    ``kernel_time_ns``, ``kernel_flops`` and ``kernel_dram_bytes`` summed from their kernels.

    Inputs are not modified. A kernel launched in no step keeps its phase (e.g. the reference
    engine's range-path phase) and has no step. FLOPs (bytes) of a step are missing when kernels
    with known FLOPs (bytes) cover under :data:`FLOPS_MIN_COVERAGE` of its kernel time.
    Any source with a steps table (HF ``generate()``, hand-marked) can call this.
    """
    pos = step_of(launch_times_ns(kernels, api), steps)
    out_k = kernels.copy()
    hit = pos >= 0
    step_ids = steps["step"].to_numpy(np.int64)
    step_col = pd.array(np.where(hit, step_ids[np.maximum(pos, 0)], 0), dtype="Int64")
    step_col[~hit] = pd.NA
    out_k["step"] = step_col
    phase = (kernels["phase"].astype("object").to_numpy(copy=True) if "phase" in kernels
             else np.full(len(kernels), None, dtype=object))
    phase[hit] = steps["phase"].astype("object").to_numpy()[pos[hit]]
    out_k["phase"] = phase
    out_s = steps.copy()
    n = len(steps)
    dur = kernels["duration_ns"].to_numpy(np.float64)
    p = pos[hit]
    time_ns = np.bincount(p, weights=dur[hit], minlength=n)
    out_s["kernel_time_ns"] = pd.array(np.where(np.bincount(p, minlength=n) > 0, time_ns, np.nan), dtype="Int64") \
        if n else pd.array([], dtype="Int64")
    for col, dst in (("flops", "kernel_flops"), ("dram_bytes", "kernel_dram_bytes")):
        if col not in kernels:
            out_s[dst] = np.nan
            continue
        v = pd.to_numeric(kernels[col], errors="coerce").to_numpy(np.float64)[hit]
        known = ~np.isnan(v)
        total = np.bincount(p[known], weights=v[known], minlength=n)
        covered = np.bincount(p[known], weights=dur[hit][known], minlength=n)
        ok = (time_ns > 0) & (covered >= FLOPS_MIN_COVERAGE * time_ns)
        out_s[dst] = np.where(ok, total, np.nan)
    return out_k, out_s


def with_framework_steps(tables: Mapping[str, pd.DataFrame]) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """The import pipeline's step: ``tables`` with ``steps`` read from the ranges and the kernels'
    step and phase, plus warnings. Tables that already hold steps (the reference engine's, a load
    test's) or have no ranges are returned as they are."""
    out = dict(tables)
    if len(out.get("steps", ())) or not len(out.get("ranges", ())):
        return out, []
    found = steps_from_ranges(out["ranges"])
    if not len(found.steps):
        return out, found.warnings
    kernels = out.get("kernels")
    steps = found.steps
    if kernels is not None and len(kernels):
        kernels, steps = assign_kernels_to_steps(kernels, steps, out.get("api"))
        out["kernels"] = kernels
    out["steps"] = steps
    return out, found.warnings


__all__ = ["UNKNOWN", "FrameworkSteps", "StepLabel", "assign_kernels_to_steps", "launch_times_ns",
           "parse_step_label", "step_of", "steps_from_ranges", "with_framework_steps"]
