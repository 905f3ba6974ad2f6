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
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .tree import PHASES

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

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
SGLANG = re.compile(r"step\[([A-Z][A-Z0-9_]*)((?:\s+[a-z_]+=\d+)*)\s*\]")
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
    drafted: int | None = None
    """Speculative verify: draft tokens checked in the step (accepted ones are not in the labels)."""

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
    drafted = dq - m_gen if m_gen and dq is not None and dq > m_gen else None
    if drafted is not None:
        dctx = None  # decode contexts are the qk sum only for one new token per request
    phase = _phase(n, m_gen) if drafted is None else "mixed" if n else "verify"
    return StepLabel("vllm", phase, batch=n + m_gen, tokens=tokens,
                     prefill_tokens=pq, prefill_seqs=n, decode_seqs=m_gen,
                     context_tokens=pctx + dctx if pctx is not None and dctx is not None else None,
                     attention_prefill_share=_share(pqk, dqk), drafted=drafted)


def _vllm_detailed(m: re.Match[str]) -> StepLabel:
    g = [int(x) for x in m.groups()]
    total, n, psq, psk, _, psqsk, m_gen, dsq, dsk, _, dsqsk = g
    drafted = dsq - m_gen if m_gen and dsq > m_gen else None  # decoding requests checking draft tokens
    phase = _phase(n, m_gen) if drafted is None else "mixed" if n else "verify"
    return StepLabel("vllm", phase, batch=n + m_gen, tokens=total, prefill_tokens=psq,
                     prefill_seqs=n, decode_seqs=m_gen, context_tokens=psk + dsk,
                     attention_prefill_share=_share(psqsk, dsqsk), drafted=drafted)


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
    drafted = toks - bs if phase == "verify" and toks is not None and bs is not None and toks > bs else None
    return StepLabel("sglang", phase, batch=bs, tokens=toks, drafted=drafted)


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
               "context_tokens", "attention_prefill_share", "drafted")


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
    backwards = ranges["end_ns"].to_numpy(np.float64, na_value=np.nan) < ranges["start_ns"].to_numpy(np.float64, na_value=np.nan)
    rows = np.flatnonzero((kind == 1) & ~backwards)  # a range ending before it starts is damage, not a step
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
    for col in ("batch", "tokens", "prefill_tokens", "prefill_seqs", "decode_seqs", "context_tokens", "drafted"):
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
    ids = pd.to_numeric(api["correlation"], errors="coerce").to_numpy(np.float64, na_value=np.nan)
    known = ~np.isnan(ids)  # numeric columns only: slicing the api table would copy its names
    ids, call_start = ids[known], api["start_ns"].to_numpy(np.int64)[known]
    order = np.argsort(ids, kind="stable")
    ids, call_start = ids[order], call_start[order]
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


def assign_kernels_to_steps(kernels: pd.DataFrame, steps: pd.DataFrame, api: pd.DataFrame | None = None, *,
                            launch_ns: np.ndarray | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Kernels with the ``step`` and ``phase`` of the step they were launched in, and steps with
    ``kernel_time_ns``, ``kernel_flops`` and ``kernel_dram_bytes`` summed from their kernels.

    Inputs are not modified. A kernel launched in no step keeps its phase (e.g. the reference
    engine's range-path phase) and has no step. FLOPs (bytes) of a step are missing when kernels
    with known FLOPs (bytes) cover under :data:`FLOPS_MIN_COVERAGE` of its kernel time.
    Any source with a steps table (HF ``generate()``, hand-marked) can call this; ``launch_ns``
    (from :func:`launch_times_ns`) saves finding the launch calls again.
    """
    pos = step_of(launch_times_ns(kernels, api) if launch_ns is None else launch_ns, steps)
    hit = pos >= 0
    step_ids = steps["step"].to_numpy(np.int64)
    step_col = pd.arrays.IntegerArray(np.where(hit, step_ids[np.maximum(pos, 0)], 0), ~hit)
    phase = (kernels["phase"].astype("object").to_numpy(copy=True) if "phase" in kernels
             else np.full(len(kernels), None, dtype=object))
    phase[hit] = steps["phase"].astype("object").to_numpy()[pos[hit]]
    # a new frame over the same columns (no copy of the other columns' data), two of them new
    cols = {c: kernels[c] for c in kernels.columns}
    cols["step"] = pd.Series(step_col, index=kernels.index)
    cols["phase"] = pd.Series(phase, index=kernels.index, dtype="object")
    out_k = pd.DataFrame(cols, index=kernels.index, copy=False)
    out_s = steps.copy()
    n = len(steps)
    dur = kernels["duration_ns"].to_numpy(np.float64, na_value=np.nan)
    p = pos[hit]
    time_ns = np.bincount(p, weights=dur[hit], minlength=n)
    out_s["kernel_time_ns"] = pd.array(np.where(np.bincount(p, minlength=n) > 0, time_ns, np.nan), dtype="Int64") \
        if n else pd.array([], dtype="Int64")
    for col, dst in (("flops", "kernel_flops"), ("dram_bytes", "kernel_dram_bytes")):
        if col not in kernels:
            out_s[dst] = np.nan
            continue
        v = pd.to_numeric(kernels[col], errors="coerce").to_numpy(np.float64, na_value=np.nan)[hit]
        known = ~np.isnan(v)
        total = np.bincount(p[known], weights=v[known], minlength=n)
        covered = np.bincount(p[known], weights=dur[hit][known], minlength=n)
        ok = (time_ns > 0) & (covered >= FLOPS_MIN_COVERAGE * time_ns)
        out_s[dst] = np.where(ok, total, np.nan)
    return out_k, out_s


# ---------------------------------------------------------------------------- steps of any engine
PHASE_WORDS = re.compile(r"(?<![a-z])(" + "|".join((*PHASES, "mixed")) + r")(?![a-z])", re.IGNORECASE)
"""A phase's name as a word of a range's name (``decode``, ``decode_step_12``, ``Prefill chunk``; not ``decoder``)."""


def phase_in_name(name: str) -> str | None:
    """The phase a range's name states (:data:`PHASE_WORDS`): its one phase word, None with none or with
    different ones (``prefill_and_decode``)."""
    found = {w.lower() for w in PHASE_WORDS.findall(name)}
    return found.pop() if len(found) == 1 else None


@dataclass(frozen=True)
class StepRule:
    """Which ranges are steps when no framework marks them (``--steps REGEX``), and their phase
    (``--phase-of REGEX=PHASE``: the first whose regex finds a match in the range's name; else the phase
    the name states, :func:`phase_in_name`)."""

    pattern: re.Pattern[str]
    phases: tuple[tuple[re.Pattern[str], str], ...] = ()

    @classmethod
    def parse(cls, steps: str, phase_of: Sequence[str] = ()) -> StepRule:
        """From the command line's text; raises UsageError naming the bad part."""
        from perfscope.errors import UsageError

        def compiled(text: str, what: str) -> re.Pattern[str]:
            try:
                return re.compile(text)
            except re.error as exc:
                raise UsageError(f"{what} {text!r} is not a regular expression ({exc})",
                                 hint="e.g. --steps '^token_\\d+_processing$'") from None
        phases = []
        for item in phase_of:
            regex, sep, phase = item.rpartition("=")
            if not sep or not regex or not phase.strip():
                raise UsageError(f"--phase-of {item!r}: give REGEX=PHASE", hint="e.g. --phase-of '^token_0_=prefill'")
            phases.append((compiled(regex, "--phase-of"), phase.strip()))
        return cls(compiled(steps, "--steps"), tuple(phases))

    def label(self, name: str) -> StepLabel:
        """The step a matching range stands for: framework ``user``, the phase --phase-of gives (else the
        one its name states, :func:`phase_in_name`; None when neither does), and batch / tokens from named
        groups ``batch`` / ``tokens`` of the regex."""
        phase = next((p for rx, p in self.phases if rx.search(name)), None) or phase_in_name(name)
        m = self.pattern.search(name)
        groups = m.groupdict() if m else {}

        def num(key: str) -> int | None:
            v = groups.get(key)
            return int(v) if v is not None and str(v).isdigit() else None
        return StepLabel("user", phase, batch=num("batch"), tokens=num("tokens"))  # type: ignore[arg-type]


def user_steps_from_ranges(ranges: pd.DataFrame, rule: StepRule) -> FrameworkSteps:
    """One ``user`` step per outermost host range (per thread) whose name ``rule`` matches."""
    if not len(ranges):
        return FrameworkSteps(pd.DataFrame())
    names = ranges["name"].astype("object")
    codes, distinct = pd.factorize(names)
    hit = np.array([rule.pattern.search(str(n)) is not None for n in distinct] + [False])[codes]
    if "source" in ranges:
        hit &= ~ranges["source"].isin(GPU_RANGE_SOURCES).to_numpy()
    hit &= ranges["end_ns"].to_numpy(np.float64, na_value=np.nan) >= ranges["start_ns"].to_numpy(np.float64, na_value=np.nan)
    rows = np.flatnonzero(hit)
    if not len(rows):
        return FrameworkSteps(pd.DataFrame())
    text = names.to_numpy(dtype=object)[rows]
    labels = [rule.label(str(n)) for n in text]
    thread = (pd.to_numeric(ranges["thread"], errors="coerce").fillna(-1).to_numpy(np.int64)[rows]
              if "thread" in ranges else np.zeros(len(rows), np.int64))
    return FrameworkSteps(_merge_nested(labels, ranges["start_ns"].to_numpy(np.int64)[rows],
                                        ranges["end_ns"].to_numpy(np.int64)[rows], thread, text))


PROPOSE_MIN_REPEATS = 2
"""A range name (digits aside) proposed as the step must occur at least twice..."""
PROPOSE_MIN_LAUNCH_SHARE = 0.5
"""...and its ranges must hold at least half of the GPU work's launches."""
PROPOSE_SKIP = re.compile(r"^ProfilerStep#")
"""torch.profiler's own step marks: the profiler's schedule, not the engine's step."""


def _template(name: str) -> str:
    """The regex of a range name with each digit run made ``\\d+``: ``^token_\\d+_processing$``."""
    parts = re.split(r"(\d+)", name)
    return "^" + "".join(r"\d+" if p.isdigit() else re.escape(p).replace("\\ ", " ").replace("\\#", "#") for p in parts) + "$"


def propose_steps(ranges: pd.DataFrame, launch_ns: np.ndarray) -> tuple[str, str, int] | None:
    """A range name that repeats as the outermost range around the GPU work (``token_12_processing``,
    ``decode_step``, ``iteration 7``, ``forward``): (the regex for ``--steps``, one example name, how
    many ranges match), or None. ``launch_ns``: the GPU work's launch times (:func:`launch_times_ns`).

    Host ranges only (not nn.Module calls, not the GPU-side copies, not ProfilerStep#N); among the
    names whose ranges hold at least half of the launches, the outermost (least nested) one wins,
    then the one with more ranges."""
    if not len(ranges) or not len(launch_ns):
        return None
    r = ranges
    if "source" in r:
        src = r["source"].astype("object")
        r = r[~src.isin([*GPU_RANGE_SOURCES, "module"]).to_numpy(bool)]
    r = r[~r["name"].astype(str).str.match(PROPOSE_SKIP).to_numpy(bool)]
    if not len(r):
        return None
    templates = r["name"].astype(str).map(_template)
    launches = np.sort(np.asarray(launch_ns, np.int64))
    depth = pd.to_numeric(r["depth"], errors="coerce") if "depth" in r else pd.Series(0, index=r.index)
    best: tuple[float, int, str, str, int] | None = None
    phased = []  # (key, phase) of the names that state a phase and whose ranges hold launches: the best's siblings
    for template, g in r.groupby(templates, sort=False):
        ms, me = _merged_windows(g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64))
        inside = np.searchsorted(ms, launches, side="right") - 1
        held = int(((inside >= 0) & (launches <= me[np.maximum(inside, 0)])).sum())
        d = float(depth.loc[g.index].median()) if depth.loc[g.index].notna().any() else 0.0
        key = (d, -len(g), str(template), str(g["name"].iloc[0]), len(g))
        if held and (phase := phase_in_name(key[3])):
            phased.append((key, phase))
        if len(g) < PROPOSE_MIN_REPEATS or held < PROPOSE_MIN_LAUNCH_SHARE * len(launches):
            continue
        if best is None or key[:2] < best[:2]:
            best = key
    if best is None:
        return None
    phase = phase_in_name(best[3])
    others = [k for k, p in phased if k[0] == best[0] and p != phase] if phase else []
    if not others:
        return best[2], best[3], best[4]
    # the other phases' ranges at the same depth are steps too (an engine's one `prefill` beside its `decode`s),
    # fewest ranges first
    keys = sorted([best, *others], key=lambda k: (k[4], k[3]))
    return "^(?:" + "|".join(k[2][1:-1] for k in keys) + ")$", best[3], sum(k[4] for k in keys)


def _merged_windows(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    first = np.ones(len(s), bool)
    first[1:] = s[1:] > np.maximum.accumulate(e)[:-1]
    idx = np.flatnonzero(first)
    return s[idx], np.maximum.reduceat(e, idx)


PROPOSAL_PREFIX = "no step annotations found; the range"


def proposal_note(found: tuple[str, str, int]) -> str:
    """The import's note proposing ``found`` (:func:`propose_steps`) as the steps."""
    regex, example, n = found
    return (f"{PROPOSAL_PREFIX} {example!r} repeats ({n} ranges matching {regex}) as the "
            f"outermost range around the GPU work: import with --steps '{regex}' to make each one a step "
            "(a step's phase is the one its name states, prefill, decode, mixed, draft or verify; else add "
            "--phase-of REGEX=PHASE to name it: none is guessed)")


def with_framework_steps(tables: Mapping[str, pd.DataFrame],
                         rule: StepRule | None = None) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """The import pipeline's step: ``tables`` with ``steps`` read from the ranges and the kernels'
    step and phase, plus warnings. Tables that already hold steps (the reference engine's, a load
    test's) or have no ranges are returned as they are. With ``rule`` (``--steps``), the ranges it
    matches are the steps instead (framework ``user``). Without one, and with no framework's
    annotation, a repeating outermost range is proposed in a note (:func:`propose_steps`)."""
    out = dict(tables)
    given = out.get("steps")
    if rule is None and given is not None and len(given):
        return _with_given_steps(out), []
    if not len(out.get("ranges", ())):
        return out, []
    found = steps_from_ranges(out["ranges"]) if rule is None else user_steps_from_ranges(out["ranges"], rule)
    if not len(found.steps):
        kernels = out.get("kernels")
        if rule is not None:
            return out, [f"--steps {rule.pattern.pattern!r} matches no range: no steps"]
        if kernels is not None and len(kernels) and not found.warnings:
            proposal = propose_steps(out["ranges"], launch_times_ns(kernels, out.get("api")))
            if proposal is not None:
                return out, [proposal_note(proposal)]
        return out, found.warnings
    kernels = out.get("kernels")
    steps = found.steps
    if kernels is not None and len(kernels):
        launch_ns = launch_times_ns(kernels, out.get("api"))
        kernels, steps = assign_kernels_to_steps(kernels, steps, launch_ns=launch_ns)
        steps = flag_outliers(steps, kernels, launch_ns)
        out["kernels"] = kernels
    out["steps"] = steps
    return out, found.warnings


RECORDED_FRAMEWORKS = ("hf",)
"""Steps recorded in-process on the trace's timeline (transformers ``generate()``'s hooks) whose kernels are put in their steps here; the reference engine's and a
load test's steps keep their own phase assignment (range paths) unchanged."""


def _with_given_steps(out: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    steps, kernels = out["steps"], out.get("kernels")
    if ("framework" not in steps or not steps["framework"].isin(RECORDED_FRAMEWORKS).all()
            or kernels is None or not len(kernels)
            or ("step" in kernels and kernels["step"].notna().any())):
        return out
    launch_ns = launch_times_ns(kernels, out.get("api"))
    kernels, steps = assign_kernels_to_steps(kernels, steps, launch_ns=launch_ns)
    out["kernels"], out["steps"] = kernels, flag_outliers(steps, kernels, launch_ns)
    return out


# ---------------------------------------------------------------------------- outliers
HOST_STALL_SHARE = 0.5
"""A step stalled on the host when its longest stretch without a launch call is at least half its
wall time (and its kernels' time is under half of it)..."""
HOST_STALL_MIN_NS = 1_000_000
"""...and at least 1 ms (shorter pauses are Python between launches, the steady state of eager code)."""
STEADY_MIN_STEPS = 3
"""Steps of one phase and batch size needed to call one of them slow against the others."""
FIRST_STEP_SLOW = 1.5
"""The first step is the profiler's lead-in when it takes 1.5x the median of its phase and batch..."""
SLOW_STEP = 3.0
"""...and any step is an outlier at 3x that median."""


def host_gaps(steps: pd.DataFrame, step_pos: np.ndarray, launch_ns: np.ndarray) -> pd.DataFrame:
    """Per step: the longest stretch of its window without a launch of one of its kernels
    (``gap_ns``, ``gap_start_ns``; the window's start and end bound the first and last stretch)."""
    n = len(steps)
    inside = step_pos >= 0
    t = np.concatenate([launch_ns[inside], steps["start_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64)])
    g = np.concatenate([step_pos[inside], np.arange(n), np.arange(n)])
    order = np.lexsort((t, g))
    t, g = t[order], g[order]
    same = g[1:] == g[:-1]
    gap = np.where(same, np.diff(t), -1)
    if not len(gap):
        return pd.DataFrame({"gap_ns": np.zeros(n, np.int64), "gap_start_ns": steps["start_ns"].to_numpy(np.int64)})
    best = pd.Series(gap).groupby(g[:-1]).idxmax().reindex(range(n))
    at = best.to_numpy()
    ok = ~np.isnan(at)
    idx = np.where(ok, at, 0).astype(np.int64)
    return pd.DataFrame({"gap_ns": np.where(ok, gap[idx], 0).clip(0), "gap_start_ns": np.where(ok, t[idx], 0)})


def flag_outliers(steps: pd.DataFrame, kernels: pd.DataFrame, launch_ns: np.ndarray) -> pd.DataFrame:
    """Steps with ``outlier`` set where a step is kept out of the headline numbers, and why:

    - ``host stall``: the host launched nothing for most of the step (the longest launch-free
      stretch is >= :data:`HOST_STALL_SHARE` of the wall time and >= 1 ms) and the kernels ran for
      under half of it; with :data:`STEADY_MIN_STEPS` or more steps of its phase and batch, only
      when the step is also slow against them (a host-bound steady state is not an outlier);
    - ``first step after the profiler started``: step 0, >= 1.5x the median of its phase and batch;
    - ``slow step``: >= 3x that median.
    """
    out = steps.copy()
    if not len(out):
        return out
    pos = step_of(launch_ns, steps)
    gaps = host_gaps(steps, pos, launch_ns)
    wall = out["duration_ns"].to_numpy(np.float64, na_value=np.nan)
    ktime = pd.to_numeric(out["kernel_time_ns"], errors="coerce").to_numpy(np.float64, na_value=np.nan)
    key = out["phase"].astype("object").astype(str) + "/" + out["batch"].astype("object").astype(str)
    size = key.map(key.value_counts()).to_numpy()
    median = out.groupby(key)["duration_ns"].transform("median").to_numpy(np.float64, na_value=np.nan)
    ratio = np.where(median > 0, wall / median, np.nan)
    names = kernels.get("name")
    if names is not None and "short_name" in kernels:  # a kernel by its base name where it has one
        names = kernels["short_name"].astype("object").where(kernels["short_name"].notna(), names)
    reasons: list[str | None] = []
    for i in range(len(out)):
        gap = float(gaps["gap_ns"].iloc[i])
        stall = (gap >= HOST_STALL_SHARE * wall[i] and gap >= HOST_STALL_MIN_NS
                 and not (np.nan_to_num(ktime[i]) >= 0.5 * wall[i]))
        steady = size[i] >= STEADY_MIN_STEPS
        why = None
        if stall and (not steady or ratio[i] >= FIRST_STEP_SLOW):
            before = _launched_before(pos, i, launch_ns, int(gaps["gap_start_ns"].iloc[i]), names)
            why = (f"host stall: no launch for {gap / 1e6:.3g} ms ({100 * gap / wall[i]:.0f}% of the step)"
                   + (f" after launching {before}" if before else " from the step's start"))
        elif steady and i == 0 and ratio[i] >= FIRST_STEP_SLOW:
            why = f"first step after the profiler started ({ratio[i]:.1f}x the median of its phase and batch)"
        elif steady and ratio[i] >= SLOW_STEP:
            why = f"slow step ({ratio[i]:.1f}x the median of its phase and batch)"
        reasons.append(why)
    out["outlier"] = pd.Series(reasons, index=out.index, dtype="object")
    return out


def _launched_before(pos: np.ndarray, step: int, launch_ns: np.ndarray, t_ns: int,
                     names: pd.Series | None) -> str | None:
    """The kernel of ``step`` whose launch opens the stretch starting at ``t_ns`` (its base name where the
    kernels carry one, first 60 characters)."""
    if names is None:
        return None
    hit = np.flatnonzero((pos == step) & (launch_ns == t_ns))
    if not len(hit):
        return None
    return str(names.iloc[int(hit[-1])])[:60]



# ---------------------------------------------------------------------------- the inference window
def has_framework_steps(steps: pd.DataFrame) -> bool:
    """True when ``steps`` came from a framework's annotations (vLLM, SGLang, HF, by hand), not
    from perfscope's engine (whose reports keep their own measured span)."""
    if not len(steps) or "framework" not in steps:
        return False
    fw = steps["framework"]
    return bool((fw.notna() & (fw.astype("object") != "engine")).any())


def headline_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """The steps headline numbers are measured on: those without an ``outlier`` reason (none when
    every step is an outlier: then nothing is steady, and the ``step-outliers`` finding says why)."""
    if "outlier" not in steps or not len(steps):
        return steps
    return steps[steps["outlier"].isna()]


def step_windows(steps: pd.DataFrame, kernels: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The merged time windows of ``steps``: each from its start to its end or to the end of the
    last kernel launched in it, whichever is later (the GPU finishes a step's work after the CPU
    range closes). The earliest step's window starts at its first kernel when that is later: what
    the GPU ran before it (the previous, unprofiled step) is not in the trace, so that lead is not
    known to be idle (the leading-gap rule of ``nsys analyze``'s gpu_gaps)."""
    start = steps["start_ns"].to_numpy(np.int64).copy()
    end = steps["end_ns"].to_numpy(np.int64).copy()
    if len(kernels) and "step" in kernels and len(start):
        k = kernels[kernels["step"].notna()]
        if len(k):
            by_step = k.groupby(k["step"].astype("int64")).agg(first=("start_ns", "min"), last=("end_ns", "max"))
            ids = steps["step"].astype("int64").to_numpy()
            last = by_step["last"].reindex(ids).to_numpy(np.float64, na_value=np.nan)
            end = np.where(np.isnan(last), end, np.maximum(end, np.nan_to_num(last).astype(np.int64)))
            first_k = by_step["first"].reindex(ids).to_numpy(np.float64, na_value=np.nan)
            i = int(np.argmin(start))
            if not np.isnan(first_k[i]):
                start[i] = min(max(start[i], int(first_k[i])), end[i])
    if not len(start):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return _merged_windows(start, end)


def inference_windows(steps: pd.DataFrame, kernels: pd.DataFrame,
                      transfers: pd.DataFrame | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The inference window as merged (starts, ends): from the first step's start to the last
    step's end (the GPU's last kernel of it when later), the outlier steps' windows cut out.

    Its ends follow the leading/trailing-gap rule of ``nsys analyze``'s gpu_gaps: it starts at the
    first GPU work (kernel launched in a step, or copy) from the first step's start on, and ends at
    the last such work's end (what the GPU did before, or after, is not the steps' work). Empty
    when every step is an outlier."""
    if not len(steps):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    ws, we = step_windows(steps, kernels.iloc[:0])
    lo0, hi0 = int(ws[0]), int(we[-1])
    starts_w, ends_w = [], []
    if len(kernels) and "step" in kernels and kernels["step"].notna().any():
        k = kernels[kernels["step"].notna()]
        starts_w.append(int(k["start_ns"].min()))
        ends_w.append(int(k["end_ns"].max()))
    if transfers is not None and len(transfers):
        t = transfers[(transfers["start_ns"] >= lo0) & (transfers["start_ns"] <= hi0)]
        if len(t):
            starts_w.append(int(t["start_ns"].min()))
            ends_w.append(int(t["end_ns"].max()))
    lo = max(lo0, min(starts_w)) if starts_w else lo0
    hi = max(ends_w) if ends_w else hi0
    bad = steps[steps["outlier"].notna()] if "outlier" in steps else steps.iloc[:0]
    if len(bad) == len(steps):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if not len(bad):
        return np.array([lo], np.int64), np.array([max(hi, lo)], np.int64)
    os_, oe = step_windows(bad, kernels.iloc[:0])
    os_, oe = np.concatenate([os_, np.array([lo])]), np.concatenate([oe, np.array([lo])])
    order = np.argsort(os_, kind="stable")
    cuts_s, cuts_e = os_[order], oe[order]
    starts, ends, at = [], [], lo
    for s_, e_ in zip(cuts_s.tolist(), cuts_e.tolist()):
        if s_ > at:
            starts.append(at)
            ends.append(min(s_, hi))
        at = max(at, e_)
    if at < hi:
        starts.append(at)
        ends.append(hi)
    keep = [k for k in range(len(starts)) if ends[k] > starts[k]]
    return np.array([starts[k] for k in keep], np.int64), np.array([ends[k] for k in keep], np.int64)


__all__ = [
    "UNKNOWN",
    "FrameworkSteps",
    "StepLabel",
    "StepRule",
    "assign_kernels_to_steps",
    "flag_outliers",
    "has_framework_steps",
    "headline_steps",
    "host_gaps",
    "inference_windows",
    "launch_times_ns",
    "parse_step_label",
    "propose_steps",
    "step_of",
    "step_windows",
    "steps_from_ranges",
    "user_steps_from_ranges",
    "with_framework_steps",
]
