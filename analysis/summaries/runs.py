"""Which run to believe: the warm unprofiled passes (the headline) against the profiled run.

An engine report holds two runs of one workload (:mod:`.serving`): warm unprofiled passes, whose
fastest is the headline, and the profiled run, slower by the profiler's overhead. On a busy machine
they can disagree in ways the profiler cannot explain; this module names the case and says which
run to read, once, for every output (the terminal, the HTML, ``--json``, the findings' header):

- ``steady``: the two fastest passes agree within :data:`NOISY_BASELINE` and the profiled run is
  slower than the headline by a plausible overhead;
- ``noisy``: the two fastest passes still disagree by more than :data:`NOISY_BASELINE` after the
  retries the session's time budget allowed: the headline is a range, from the fastest pass to the
  second fastest (:func:`headline_range`);
- ``disturbed``: the profiled run was faster than every warm unprofiled pass by more than the
  noise bound. A profiler only adds time, so those passes were slowed by something else (another
  process); they are not used: the headline falls back to the profiled run, an upper bound;
- ``profiled-slow``: the profiled run took more than :data:`SUSPECT_OVERHEAD` times the headline,
  beyond a profiler's overhead: the headline stands for speed, the profiled run for where the time
  goes (its shares), not for its absolute times.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from perfscope.format import finite as _finite
from perfscope.format import si

if TYPE_CHECKING:
    from perfscope.report import Report

NOISY_BASELINE = 0.10
"""The two fastest warm unprofiled passes further apart than this (relative to the faster) are a
noisy baseline: more passes are run within the time budget, and a disagreement left makes the
headline a range."""
SUSPECT_OVERHEAD = 4.0
"""A profiled run slower than the headline by more than this is more than torch.profiler's overhead
(x1.1-x1.3 on this engine's CPU runs, up to x2-x3 on launch-bound GPU decode): something else slowed
it, or the profiler's own cost dominates the step."""
VERDICTS = ("steady", "noisy", "disturbed", "profiled-slow")


def pass_spread(walls: Sequence[float]) -> float | None:
    """How far apart the two fastest passes are: second fastest / fastest - 1 (None with one pass)."""
    fast = sorted(walls)[:2]
    return fast[1] / fast[0] - 1.0 if len(fast) == 2 and fast[0] > 0 else None


def judge_baseline(profiled_s: float | None, passes_s: Sequence[float]) -> str | None:
    """The verdict (:data:`VERDICTS`) on a profiled run's time and the warm unprofiled passes' times;
    None without a pass or a profiled time."""
    if not passes_s or profiled_s is None or not math.isfinite(profiled_s):
        return None
    base = min(passes_s)
    if base <= 0:
        return None
    if profiled_s < base / (1.0 + NOISY_BASELINE):
        return "disturbed"
    spread = pass_spread(passes_s)
    if spread is not None and spread > NOISY_BASELINE:
        return "noisy"
    if profiled_s > SUSPECT_OVERHEAD * base:
        return "profiled-slow"
    return "steady"


def verdict(p: Mapping[str, Any]) -> str | None:
    """The verdict of a report's params (``report.params``): the one recorded at profile time
    (``baseline_verdict``), else judged from its timings (reports written before it was recorded)."""
    if p.get("baseline_verdict") in VERDICTS:
        return str(p["baseline_verdict"])
    passes = [v for v in (_finite(x) for x in p.get("unprofiled_wall_s_passes") or []) if v is not None]
    return judge_baseline(_finite(p.get("profiled_wall_s")), passes)


def profiler_overhead(p: Mapping[str, Any]) -> str | None:
    """The profiler's overhead in words, the one figure every output gives (``report.params``): the
    timing line and the findings' header: ``profiler overhead x1.21``, or why it was not measured; None
    without warm unprofiled passes."""
    ratio = _finite(p.get("profiler_overhead_ratio"))
    if ratio is None:
        return None
    if not p.get("unprofiled_wall_s_passes"):
        return None  # a report from before the warm passes: its one unprofiled run may have been cold
    if ratio >= 1.0:
        return f"profiler overhead x{ratio:.2f}"
    return ("profiler overhead not measured: the profiled run was faster than the warm unprofiled passes, which "
            "something else slowed")


def headline_range(p: Mapping[str, Any]) -> dict[str, tuple[float, float]] | None:
    """A noisy headline's range (``report.params``) per phase and for the whole run (``all``): (fastest
    pass, second fastest pass) wall seconds; None unless the verdict is ``noisy`` and the passes were kept."""
    rng = p.get("headline_range")
    if verdict(p) != "noisy" or not isinstance(rng, Mapping):
        return None
    out: dict[str, tuple[float, float]] = {}
    for name, pair in rng.items():
        if isinstance(pair, (list, tuple)) and len(pair) == 2:
            lo, hi = _finite(pair[0]), _finite(pair[1])
            if lo is not None and hi is not None:
                out[str(name)] = (lo, hi)
    return out or None


def baseline_note(p: Mapping[str, Any]) -> str | None:
    """Which run to believe and why, in one paragraph (``report.params``); None when the runs agree
    (``steady``) or the report holds one run."""
    which = verdict(p)
    passes = [v for v in (_finite(x) for x in p.get("unprofiled_wall_s_passes") or []) if v is not None]
    prof = _finite(p.get("profiled_wall_s"))
    if which is None or which == "steady" or not passes or prof is None:
        return None
    times = ", ".join(f"{s:.3g}" for s in sorted(passes))
    base = min(passes)
    if which == "disturbed":
        return (f"the warm unprofiled passes ({times} s) were all slower than the profiled run ({prof:.3g} s, "
                f"{base / prof:.2g}x faster). A profiler only adds time, so something else (another process) slowed "
                "those passes: they are not used. Believe the profiled run: its figures are the headline, an upper "
                "bound on the true times. Profile again on a quieter machine for headline figures without the "
                "profiler")
    if which == "noisy":
        spread = pass_spread(passes) or 0.0
        budget = _finite(p.get("baseline_retry_s"))
        tried = f" after {budget:.0f} s of retries" if budget is not None else ""
        fast = sorted(passes)[:2]
        return (f"noisy baseline: {len(passes)} warm unprofiled passes took {min(passes):.3g}-{max(passes):.3g} s; "
                f"the two fastest ({fast[0]:.3g} and {fast[1]:.3g} s) are {spread * 100:.0f}% apart (limit "
                f"{NOISY_BASELINE * 100:.0f}%){tried}: the headline is a range, from the fastest pass (shown) to the "
                "second fastest. Noise only adds time, so the fastest is the nearer to the truth; profile again on a "
                "quieter machine to narrow it")
    return (f"the profiled run ({prof:.3g} s) took {prof / base:.2g}x the warm unprofiled run ({base:.3g} s), more "
            f"than the profiler's usual overhead (under x{SUSPECT_OVERHEAD:.0f}). Believe the headline for how fast "
            "the model runs; read the profiled run for where the time goes (its shares), not for its absolute times")


def _n(value: float, digits: int = 3) -> str:
    return f"{value:,.{digits}f}"


def timing_text(report: Report) -> str | None:
    """Unprofiled vs profiled wall time, the profiler's overhead (the one figure the findings' header
    gives too) and the compile time, in one line every output shows; which run is the headline when the
    passes disagree (a range when noisy). None for a report with no unprofiled timing."""
    from .serving import has_unprofiled

    p = report.params
    prof, base = _finite(p.get("profiled_wall_s")), _finite(p.get("unprofiled_wall_s"))
    if prof is None or base is None or _finite(p.get("profiler_overhead_ratio")) is None:
        return None
    passes = [v for v in (_finite(x) for x in p.get("unprofiled_wall_s_passes") or []) if v is not None]
    if verdict(p) == "disturbed":
        return (f"profiled run {_n(prof)} s (the headline: the {len(passes)} warm unprofiled passes, "
                f"{_n(min(passes))}-{_n(max(passes))} s, were slower and are not used: see the warnings); "
                f"{profiler_overhead(p)}")
    if not has_unprofiled(report):  # a report from before the warm headline: its baseline may have been cold
        return (f"unprofiled run {_n(base)} s, profiled run {_n(prof)} s (a report without the warm unprofiled "
                "run's records: the figures below are the profiled run's, inflated by the profiler; profile "
                "again for warm unprofiled headline figures)")
    rng = (headline_range(p) or {}).get("all")
    line = (f"warm unprofiled run {_n(rng[0])}-{_n(rng[1])} s (headline, a range: the two fastest of "
            f"{len(passes)} passes disagree; the figures below are the fastest's), " if rng else
            f"warm unprofiled run {_n(base)} s (headline; best of {len(passes) or 1}), ")
    basis = f", {p['profiler_overhead_basis']}" if p.get("profiler_overhead_basis") else ""
    line += f"profiled run {_n(prof)} s ({profiler_overhead(p)}{basis})"
    if p.get("compile"):
        comp = _finite(p.get("compile_s"))
        line += (f"; decode compiled, compile {_n(comp, 1)} s in the warm-up (not in TTFT)" if comp is not None
                 else "; decode compiled")
    return line


def range_text(report: Report) -> str | None:
    """A noisy headline's range per phase, in words: the fastest pass's and the second fastest's wall
    time and tokens per second (None unless the headline is a range)."""
    rng = headline_range(report.params)
    if not rng:
        return None
    from .serving import run_steps

    steps = run_steps(report)
    parts = []
    for phase, (lo, hi) in rng.items():
        if phase == "all":
            continue
        tokens = float(steps.loc[steps["phase"] == phase, "tokens"].sum()) if len(steps) else math.nan
        lo, hi = sorted((lo, hi))  # a phase of the second fastest pass can be the faster of the two
        rate = (f" ({si(tokens / hi)}-{si(tokens / lo)} tok/s)" if tokens > 0 and lo > 0 and hi > 0 else "")
        parts.append(f"{phase} {_n(lo * 1e3, 1)}-{_n(hi * 1e3, 1)} ms{rate}")
    if not parts:
        return None
    return ("headline range (between the fastest and the second fastest warm unprofiled pass; the table shows the "
            "fastest): "
            + ", ".join(parts))
