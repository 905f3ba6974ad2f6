"""Compare two reports (A = before, B = after): per phase, per kernel or operator name, and a verdict.

    from perfscope.analysis.compare import compare
    c = compare(before, after)
    c.by_phase, c.by_name, c.verdict

Names are matched by ``short_name`` by default (the full name where the short one is missing or a
parser slip such as ``void``): the kernel name without template arguments or namespace, so ``elementwise_kernel<float>`` in A meets ``elementwise_kernel<bf16>`` in B after a
dtype change, and a kernel whose launch configuration changed stays one row. Operator names
(CPU reports) have no template arguments, so their short name is the name. ``key="name"``
matches exact names; ``key="op"`` groups by the launching framework operator; ``key="module"`` by
the module or range path the kernel ran in (:mod:`.hierarchy`: what got slower in which layer).

Times are totals over each report, not normalised: when A and B ran different amounts of work
(batch, tokens, steps), read the per-phase tokens per second rather than the time deltas.

Which run, which roof: an engine report holds a warm unprofiled run (the headline, the numbers
``analyze`` tells a user to quote) and the profiled run. The phase table compares the headline runs
(``profiled=True``: the profiled runs'); the per-name table compares kernels, which only the profiled
runs have. MFU and MBU of both sides are taken against one roof (``roofs``, else A's when both ran on
the same device): a faster run never shows a lower utilisation because its roof was measured in
another minute. The sides are labelled by their report folders.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.errors import UsageError
from perfscope.format import MISSING, clip, duration, finite, jsonable, signed

from ..intervals import headline_span_ns, profile_span_ns
from .kernels import aggregate_by_name, group_key
from .serving import SUMMARY_PHASES, has_unprofiled, phase_summary
from .tails import compare_tails, tails_verdict

if TYPE_CHECKING:
    from perfscope.device import DeviceSpec
    from perfscope.report import Report

KEYS = ("short_name", "name", "op", "module")
SAME_PCT = 3.0
"""Changes within ±3% are reported as "about the same": run-to-run noise of a profiled run."""
TOP_MOVERS = 3
"""How many names the verdict cites for gains, losses, new, vanished and bound shifts."""

PHASE_COLUMNS = ["phase", "time_a_s", "time_b_s", "delta_s", "delta_pct", "kernel_time_a_s", "kernel_time_b_s",
                 "tokens_a", "tokens_b", "tokens_per_s_a", "tokens_per_s_b", "mfu_a_pct", "mfu_b_pct",
                 "mbu_a_pct", "mbu_b_pct"]
NAME_COLUMNS = ["name", "status", "count_a", "count_b", "time_a_s", "time_b_s", "delta_s", "delta_pct",
                "intensity_a", "intensity_b", "bound_a", "bound_b", "bound_changed", "pct_of_roof_a", "pct_of_roof_b"]


@dataclass(frozen=True)
class Comparison:
    """The difference between two reports.

    Attributes:
        a: label of the baseline report (its folder); b: of the changed one.
        key: what names were matched on (``short_name``, ``name`` or ``op``).
        by_phase: one row per phase (``prefill``, ``decode``, or ``all``) plus ``total``.
        by_name: one row per kernel/operator name, largest absolute time change first;
            ``status`` is ``both``, ``new`` (only in B) or ``vanished`` (only in A).
        verdict: short sentences: overall and per-phase change, biggest movers, bound shifts.
        by_tail: two load tests: how each part of the p99 of TTFT, ITL, TPOT and E2E moved
            (:func:`.tails.compare_tails`); empty otherwise.
        run: the runs the phase table compares: ``headline`` (the warm unprofiled runs where both
            reports hold one), ``profiled``, or ``trace`` (imported traces: one run each).
        roofs: the roof both sides' MFU and MBU are taken against, in words ("" when each side keeps its own).
    """

    a: str
    b: str
    key: str
    by_phase: pd.DataFrame
    by_name: pd.DataFrame
    verdict: list[str]
    by_tail: pd.DataFrame = field(default_factory=pd.DataFrame)
    run: str = "profiled"
    roofs: str = ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (NaN becomes None)."""
        def rows(df: pd.DataFrame) -> list[dict[str, Any]]:
            return [{k: jsonable(v) if not isinstance(v, (bool, np.bool_)) else bool(v) for k, v in r.items()}
                    for r in df.astype("object").where(df.notna(), None).to_dict(orient="records")]
        out = {"a": self.a, "b": self.b, "key": self.key, "run": self.run, "roofs": self.roofs,
               "by_phase": rows(self.by_phase), "by_name": rows(self.by_name), "verdict": list(self.verdict)}
        if len(self.by_tail):  # two load tests: how each part of the p99s moved
            out["tails"] = rows(self.by_tail)
        return out


# ---------------------------------------------------------------------------- per phase
def _phases(report: Report, *, profiled: bool = False) -> pd.DataFrame:
    """The phase rows of the headline run (the warm unprofiled one where the report holds it) or, with
    ``profiled``, of the profiled run; the ``total`` row's wall time is that run's span, its kernel time
    the profiled run's (the only run with kernels)."""
    p = phase_summary(report, profiled=profiled)
    head = not profiled and len(report.steps_unprofiled) > 0
    total = {"phase": "total", "wall_s": (headline_span_ns(report) if head else profile_span_ns(report)) / 1e9,
             "kernel_time_s": float(report.kernels["duration_ns"].sum()) / 1e9,
             "tokens": int(p["tokens"].sum()) if len(p) else 0}
    if len(p) == 1 and p["phase"].iloc[0] == "all":
        p = p.iloc[0:0]
    out = pd.concat([p, pd.DataFrame([total])], ignore_index=True)
    out["tokens_per_s"] = out["tokens"] / out["wall_s"].where(out["wall_s"] > 0)
    out.loc[out["tokens"] <= 0, "tokens_per_s"] = np.nan
    return out.set_index("phase")


def phase_table(a: Report, b: Report, *, profiled: bool = False) -> pd.DataFrame:
    """Wall time, kernel time, tokens, MFU and MBU per phase for A and B, with the time delta: the
    headline runs' (``profiled``: the profiled runs'), each against its report's roofs (give both the
    same roofs for one: :func:`compare` does)."""
    pa, pb = _phases(a, profiled=profiled), _phases(b, profiled=profiled)
    order = [p for p in (*SUMMARY_PHASES, "total") if p in pa.index or p in pb.index]
    pa, pb = pa.reindex(order), pb.reindex(order)
    out = pd.DataFrame({
        "phase": order,
        "time_a_s": pa["wall_s"].to_numpy(np.float64, na_value=np.nan), "time_b_s": pb["wall_s"].to_numpy(np.float64, na_value=np.nan),
        "kernel_time_a_s": pa["kernel_time_s"].to_numpy(np.float64, na_value=np.nan), "kernel_time_b_s": pb["kernel_time_s"].to_numpy(np.float64, na_value=np.nan),
        "tokens_a": pa["tokens"].to_numpy(np.float64, na_value=np.nan), "tokens_b": pb["tokens"].to_numpy(np.float64, na_value=np.nan),
        "tokens_per_s_a": pa["tokens_per_s"].to_numpy(np.float64, na_value=np.nan), "tokens_per_s_b": pb["tokens_per_s"].to_numpy(np.float64, na_value=np.nan),
        "mfu_a_pct": _pct_col(pa, "mfu"), "mfu_b_pct": _pct_col(pb, "mfu"),
        "mbu_a_pct": _pct_col(pa, "mbu"), "mbu_b_pct": _pct_col(pb, "mbu"),
    })
    out["delta_s"] = out["time_b_s"] - out["time_a_s"]
    out["delta_pct"] = out["delta_s"] / out["time_a_s"].where(out["time_a_s"] > 0) * 100.0
    return out[PHASE_COLUMNS]


def _pct_col(p: pd.DataFrame, col: str) -> np.ndarray:
    if col not in p:
        return np.full(len(p), np.nan)
    return pd.to_numeric(p[col], errors="coerce").to_numpy(np.float64, na_value=np.nan) * 100.0


# ---------------------------------------------------------------------------- per name
def _names(report: Report, key: str) -> pd.DataFrame:
    k = report.kernels
    if not len(k):
        return pd.DataFrame(columns=["name", "count", "duration_ns", "arith_intensity", "bound", "pct_of_roof"])
    if key == "short_name":
        group = group_key(k)
    elif key == "module":
        group = module_key(report)
    else:
        group = k[key].astype("object") if key in k else pd.Series(None, index=k.index, dtype="object")
        group = group.where(group.notna(), k["name"])
    agg = aggregate_by_name(k.assign(match_key=group), report.device, key="match_key")
    return agg.set_index("name")


def module_key(report: Report) -> pd.Series:
    """Per kernel: its module or range path (``layer.3/attn``, ``Qwen3Model_0/Qwen3DecoderLayer_3/...``;
    see :mod:`.hierarchy`), or its launching op where it sits in none."""
    from .hierarchy import kernel_paths

    paths, _, _ = kernel_paths(report)
    codes, distinct = pd.factorize(pd.Series(paths, dtype=object))
    text = np.array(["/".join(p) if p else None for p in distinct] + [None], dtype=object)
    k = report.kernels
    group = pd.Series(text[codes], index=k.index, dtype="object")
    fallback = k["op"].astype("object") if "op" in k else k["name"].astype("object")
    return group.where(group.notna(), "(no module) " + fallback.where(fallback.notna(), k["name"]).astype(str))


def name_table(a: Report, b: Report, key: str = "short_name") -> pd.DataFrame:
    """Per kernel/operator name: counts, times, delta, intensity and bound in A and B, and status."""
    na, nb = _names(a, key), _names(b, key)
    names = list(dict.fromkeys([*na.index, *nb.index]))
    na, nb = na.reindex(names), nb.reindex(names)
    in_a, in_b = na["count"].notna().to_numpy(), nb["count"].notna().to_numpy()
    out = pd.DataFrame({
        "name": [str(n) for n in names],
        "status": np.select([in_a & in_b, in_b], ["both", "new"], default="vanished"),
        "count_a": na["count"].fillna(0).to_numpy(np.int64), "count_b": nb["count"].fillna(0).to_numpy(np.int64),
        "time_a_s": na["duration_ns"].fillna(0).to_numpy(np.float64, na_value=np.nan) / 1e9,
        "time_b_s": nb["duration_ns"].fillna(0).to_numpy(np.float64, na_value=np.nan) / 1e9,
        "intensity_a": pd.to_numeric(na["arith_intensity"], errors="coerce").to_numpy(np.float64, na_value=np.nan),
        "intensity_b": pd.to_numeric(nb["arith_intensity"], errors="coerce").to_numpy(np.float64, na_value=np.nan),
        "bound_a": na["bound"].astype("object").to_numpy(), "bound_b": nb["bound"].astype("object").to_numpy(),
        "pct_of_roof_a": pd.to_numeric(na["pct_of_roof"], errors="coerce").to_numpy(np.float64, na_value=np.nan),
        "pct_of_roof_b": pd.to_numeric(nb["pct_of_roof"], errors="coerce").to_numpy(np.float64, na_value=np.nan),
    })
    out["delta_s"] = out["time_b_s"] - out["time_a_s"]
    out["delta_pct"] = out["delta_s"] / out["time_a_s"].where(out["time_a_s"] > 0) * 100.0
    known = out["bound_a"].isin(["memory", "compute"]) & out["bound_b"].isin(["memory", "compute"])
    out["bound_changed"] = known & (out["bound_a"] != out["bound_b"])
    out = out.iloc[np.argsort(-out["delta_s"].abs().to_numpy(), kind="stable")].reset_index(drop=True)
    return out[NAME_COLUMNS]


# ---------------------------------------------------------------------------- verdict
def _change(a_s: float, b_s: float) -> str:
    """``12.3 ms -> 6.76 ms (-45%, 1.82x faster)``."""
    d = (b_s - a_s) / a_s * 100.0 if a_s > 0 else math.nan
    if math.isnan(d):
        return f"{duration(a_s * 1e9)} -> {duration(b_s * 1e9)}"
    if abs(d) < SAME_PCT:
        return f"{duration(a_s * 1e9)} -> {duration(b_s * 1e9)} (about the same, {d:+.1f}%)"
    ratio = a_s / b_s if d < 0 else b_s / a_s
    return f"{duration(a_s * 1e9)} -> {duration(b_s * 1e9)} ({d:+.0f}%, {ratio:.2f}x {'faster' if d < 0 else 'slower'})"


def _overall(by_phase: pd.DataFrame) -> list[str]:
    out = []
    for row in by_phase.itertuples(index=False):
        if math.isnan(row.time_a_s) or math.isnan(row.time_b_s):
            continue
        label = "Overall" if row.phase == "total" else row.phase.capitalize()
        line = f"{label}: {_change(row.time_a_s, row.time_b_s)}"
        if row.tokens_a > 0 and row.tokens_b > 0 and row.tokens_a != row.tokens_b:
            line += (f"; B processed {row.tokens_b / row.tokens_a:.3g}x the tokens, "
                     f"{row.tokens_per_s_a:.4g} -> {row.tokens_per_s_b:.4g} tokens/s")
        for metric in ("mfu", "mbu"):
            va, vb = getattr(row, f"{metric}_a_pct"), getattr(row, f"{metric}_b_pct")
            if not (math.isnan(va) or math.isnan(vb)):
                line += f"; {metric.upper()} {va:.3g}% -> {vb:.3g}%"
        out.append(line + ".")
    return out


def _movers(by_name: pd.DataFrame, key: str) -> list[str]:
    out = []
    gains = by_name[by_name["delta_s"] < 0].nsmallest(TOP_MOVERS, "delta_s")
    losses = by_name[by_name["delta_s"] > 0].nlargest(TOP_MOVERS, "delta_s")
    for label, rows in (("Biggest gains", gains), ("Biggest losses", losses)):
        if len(rows):
            items = ", ".join(f"{_short(r.name)} {'+' if r.delta_s > 0 else ''}{duration(r.delta_s * 1e9)}"
                              f"{' (vanished)' if r.status == 'vanished' else ' (new)' if r.status == 'new' else ''}"
                              for r in rows.itertuples(index=False))
            out.append(f"{label} by {key}: {items}.")
    for status, where in (("new", "only in B"), ("vanished", "only in A")):
        rows = by_name[by_name["status"] == status]
        if len(rows):
            col = "time_b_s" if status == "new" else "time_a_s"
            top = rows.nlargest(TOP_MOVERS, col)
            names = ", ".join(f"{_short(r.name)} ({duration(getattr(r, col) * 1e9)})" for r in top.itertuples(index=False))
            which = f", the {len(top)} with the most time" if len(top) < len(rows) else ""
            out.append(f"{len(rows)} name(s) {where}{which}: {names}.")
    return out


def _bound_shifts(by_name: pd.DataFrame) -> list[str]:
    shifted = by_name[by_name["bound_changed"]].head(TOP_MOVERS)
    return [f"{_short(r.name)} moved from {r.bound_a}- to {r.bound_b}-bound "
            f"(intensity {r.intensity_a:.3g} -> {r.intensity_b:.3g} FLOP/byte)." for r in shifted.itertuples(index=False)]


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def _outlier_note(report: Report, which: str) -> list[str]:
    """A caveat when a report's framework steps of some phase are all outliers (a host stall, the
    profiler's first step): that phase's times then are not a steady state."""
    s = report.steps
    if not len(s) or "outlier" not in s or not s["outlier"].notna().any():
        return []
    notes = []
    for phase, g in s.groupby(s["phase"].astype("object")):
        if g["outlier"].notna().all():
            notes.append(f"{which}: every {phase} step is an outlier ({g['outlier'].dropna().iloc[0]}): its {phase} "
                         "time is not a steady state; compare traces of more steps")
    return notes


def _device_note(a: Report, b: Report) -> list[str]:
    da, db = a.device, b.device
    if da is None or db is None or da.name == db.name:
        return []
    return [f"A ran on {da.name}, B on {db.name}: compare percentages of roof (MFU, MBU), not only times."]


# ---------------------------------------------------------------------------- display
PHASE_VIEW_COLUMNS = ["phase", "A", "B", "change", "tok/s A", "tok/s B", "MFU A", "MFU B", "MBU A", "MBU B"]
NAME_VIEW_COLUMNS = ["name", "status", "n A", "n B", "A", "B", "change", "bound"]
TAIL_VIEW_COLUMNS = ["latency", "part", "A", "B", "change"]


def _fmt(value: Any, spec: str, suffix: str = "") -> str:
    v = finite(value)
    return MISSING if v is None else f"{v:{spec}}{suffix}"


def _seconds(value: Any) -> str:
    v = finite(value)
    return MISSING if v is None else duration(v * 1e9)


def phase_view(c: Comparison) -> pd.DataFrame:
    """The per-phase table as every output shows it (text cells; columns :data:`PHASE_VIEW_COLUMNS`)."""
    rows = [[r.phase, _seconds(r.time_a_s), _seconds(r.time_b_s), _fmt(r.delta_pct, "+.1f", "%"),
             _fmt(r.tokens_per_s_a, ".4g"), _fmt(r.tokens_per_s_b, ".4g"),
             _fmt(r.mfu_a_pct, ".3g", "%"), _fmt(r.mfu_b_pct, ".3g", "%"),
             _fmt(r.mbu_a_pct, ".3g", "%"), _fmt(r.mbu_b_pct, ".3g", "%")]
            for r in c.by_phase.itertuples(index=False)]
    return pd.DataFrame(rows, columns=PHASE_VIEW_COLUMNS, dtype="object")


def tail_view(c: Comparison) -> pd.DataFrame:
    """How each part of the p99 moved (two load tests), as every output shows it (text cells); empty
    when either report has no load-test requests."""
    t = c.by_tail
    if not len(t):
        return pd.DataFrame(columns=TAIL_VIEW_COLUMNS, dtype="object")
    rows = [[f"{r.metric.upper()} p99" + (f" ({r.run_a} -> {r.run_b})" if isinstance(r.run_a, str) and r.run_a != r.run_b
                                          else ""),
             r.part, _seconds(r.p99_a_s), _seconds(r.p99_b_s), signed(_seconds(r.change_s), r.change_s)]
            for r in t.itertuples(index=False)]
    return pd.DataFrame(rows, columns=TAIL_VIEW_COLUMNS, dtype="object")


def _bound_label(value: Any) -> str:
    return value if isinstance(value, str) and value else MISSING


def name_view(c: Comparison, top: int | None = 10) -> pd.DataFrame:
    """The top movers (largest change first) as every output shows them: the CLI, the HTML and the dashboard.

    Text cells; columns :data:`NAME_VIEW_COLUMNS`; ``top=None`` keeps every name.
    """
    rows = []
    for r in (c.by_name if top is None else c.by_name.head(top)).itertuples(index=False):
        a, b = _bound_label(r.bound_a), _bound_label(r.bound_b)
        bound = f"{a} -> {b}" if r.bound_changed else (b if r.status != "vanished" else a)
        rows.append([clip(r.name, 60), r.status, str(r.count_a), str(r.count_b), _seconds(r.time_a_s),
                     _seconds(r.time_b_s), signed(_seconds(r.delta_s), r.delta_s), bound])
    return pd.DataFrame(rows, columns=NAME_VIEW_COLUMNS, dtype="object")


# ---------------------------------------------------------------------------- entry point
def side_labels(a: Report, b: Report) -> tuple[str, str]:
    """How the two sides are named: their report folders (``cpu-small-b1-p128-g32``), with the folders
    above them while the two read the same; the report names without a folder."""
    from perfscope.report import REPORT_SUFFIX

    def label(r: Report, depth: int) -> str:
        if r.path is None:
            return r.name
        parts = [*r.path.resolve().parts[-depth - 1:-1], r.path.name.removesuffix(REPORT_SUFFIX)]
        return "/".join(parts)

    for depth in range(4):
        la, lb = label(a, depth), label(b, depth)
        if la != lb:
            return la, lb
    return f"{label(a, 0)} (A)", f"{label(b, 0)} (B)"


def shared_roofs(a: Report, b: Report) -> DeviceSpec | None:
    """The roof both sides are measured against by default: A's, when both ran on the same device
    (its name and kind); None when they ran on different devices (each keeps its own, and the verdict
    says to compare percentages of roof)."""
    da, db = a.device, b.device
    if da is None or db is None or (da.name, da.kind) != (db.name, db.kind) or not (da.compute or da.memory):
        return None
    return da


def _roof_words(spec: DeviceSpec, whose: str) -> str:
    from perfscope.format import si

    roofs = [f"{k} {si(r.value, 'FLOP/s')}" for k, r in spec.compute.items()][:3]
    roofs += [f"{k} {si(r.value, 'B/s')}" for k, r in spec.memory.items() if k == "dram"]
    return f"{whose} ({spec.name}: {', '.join(roofs)})"


def compare(a: Report, b: Report, *, key: str = "short_name", profiled: bool = False,
            roofs: DeviceSpec | None = None) -> Comparison:
    """Compare report ``a`` (baseline) with report ``b`` (after a change).

    Args:
        a: the baseline.
        b: the changed run.
        key: match kernels/operators by ``short_name`` (default), exact ``name``, or launching ``op``.
        profiled: compare the profiled runs' phases (default: the headline runs', the warm unprofiled
            ones where both reports hold one).
        roofs: the roofs both sides' MFU, MBU and % of roof are taken against (default: A's, when both
            ran on the same device: :func:`shared_roofs`).

    Raises:
        UsageError: an unknown ``key``.
    """
    if key not in KEYS:
        raise UsageError(f"cannot match names by {key!r}", hint=f"use one of {', '.join(KEYS)}")
    spec = roofs or shared_roofs(a, b)
    label_a, label_b = side_labels(a, b)
    ra, rb = (a, b) if spec is None else (a.with_manifest(device=spec.to_dict()), b.with_manifest(device=spec.to_dict()))
    headline = not profiled and has_unprofiled(a) and has_unprofiled(b)
    by_phase = phase_table(ra, rb, profiled=not headline)
    by_name = name_table(ra, rb, key)
    by_tail = compare_tails(a, b)
    run = "headline" if headline else "profiled" if profiled or has_unprofiled(a) or has_unprofiled(b) else "trace"
    said = ("Phases compared on the headline runs (warm, without the profiler; --profiled compares the profiled "
            "runs); kernel times are the profiled runs'." if headline else
            "Phases compared on the profiled runs (kernel times too)." if profiled or has_unprofiled(a)
            or has_unprofiled(b) else "")
    differ = spec is not None and any(d is None or d.to_dict()["compute"] != spec.to_dict()["compute"]
                                      or d.to_dict()["memory"] != spec.to_dict()["memory"] for d in (a.device, b.device))
    where = _roof_words(spec, "the roofs given" if roofs is not None else "A's roofs") if spec is not None and (
        roofs is not None or differ) else ""
    notes = ([said] if said else []) + ([f"MFU, MBU and % of roof of both against one roof: {where}."] if where else [])
    verdict = (notes + _device_note(a, b) + _outlier_note(a, "A") + _outlier_note(b, "B") + _overall(by_phase)
               + _movers(by_name, key) + _bound_shifts(by_name) + tails_verdict(by_tail))
    return Comparison(label_a, label_b, key, by_phase, by_name, verdict, by_tail, run=run, roofs=where)
