"""The one output layer: how numbers read as text, and how values become JSON.

Every output (the terminal summary, ``--json``, the HTML report, the Dash app, figure hover
text, finding titles and manifests) formats through this module, so one number reads the same
everywhere and a value that could not be measured is always shown as :data:`MISSING`.

Text: :func:`si` (``1.23 TFLOP/s``), :func:`duration` (ns in, ``4.56 ms`` out), :func:`seconds`,
:func:`pct`, :func:`nbytes` (powers of 1000, ``537 MB``), :func:`number` (fixed digits with
thousands separators). JSON: :func:`jsonable` turns a value into plain JSON types and
:func:`dumps` writes it; NaN and infinities become ``null``.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import PurePath
from typing import Any

import numpy as np

MISSING = "n/a"
"""The one marker for a value that could not be measured or does not apply."""

SI_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
DURATION_UNITS = ((1e9, "s"), (1e6, "ms"), (1e3, "µs"))


def is_missing(value: object) -> bool:
    """True for None, NaN and pandas' NA/NaT."""
    if value is None or type(value).__name__ in ("NAType", "NaTType"):
        return True
    try:
        return bool(value != value)  # noqa: PLR0124 - NaN and NaT compare unequal to themselves
    except (TypeError, ValueError):
        return False


def finite(value: Any) -> float | None:
    """``value`` as a float, or None when it is missing, not a number, or infinite."""
    if is_missing(value):
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def si(value: Any, unit: str = "", digits: int = 3) -> str:
    """``value`` with an SI prefix: ``1.23e12, 'FLOP/s'`` -> ``1.23 TFLOP/s``; :data:`MISSING` when missing."""
    v = finite(value)
    if v is None:
        return MISSING
    for scale, prefix in SI_PREFIXES:
        if abs(v) >= scale:
            return f"{v / scale:.{digits}g} {prefix}{unit}".rstrip()
    return f"{v:.{digits}g} {unit}".rstrip()


def duration(ns: Any, digits: int = 3) -> str:
    """A duration given in ns, in the largest fitting unit: ``850 ns``, ``12.3 µs``, ``4.56 ms``, ``1.23 s``."""
    v = finite(ns)
    if v is None:
        return MISSING
    for scale, unit in DURATION_UNITS:
        if abs(v) >= scale:
            return f"{v / scale:.{digits}g} {unit}"
    return f"{v:.{digits}g} ns"


def seconds(value: Any, digits: int = 3) -> str:
    """A time given in seconds, as :func:`duration` writes it."""
    v = finite(value)
    return MISSING if v is None else duration(v * 1e9, digits)


def banded(value: Any, low: Any, high: Any, fmt: Callable[[Any], str] | None = None) -> str:
    """A projected number with its band: ``18.4 ms (15.1-21.9 ms)``; ``18.4 ms (unvalidated)`` where the
    band is missing (``fmt``: how one number is written, :func:`seconds` by default)."""
    write = fmt or seconds
    if finite(value) is None:
        return MISSING
    if finite(low) is None or finite(high) is None:
        return f"{write(value)} (unvalidated)"
    lo, hi = write(low), write(high)
    lo_num, _, lo_unit = lo.partition(" ")
    span = f"{lo_num}-{hi}" if lo_unit == hi.partition(" ")[2] else f"{lo}-{hi}"
    return f"{write(value)} ({span})"


def pct(value: Any, digits: int = 1) -> str:
    """A percentage (already in percent): ``12.3%``; :data:`MISSING` when missing. A value that is
    not zero but would round to it keeps two significant digits (``0.016%``, not ``0.0%``: decode's
    MFU on a big GPU is measured, small, and not zero)."""
    v = finite(value)
    if v is None:
        return MISSING
    if v != 0 and abs(v) < 0.5 * 10 ** -digits:
        return f"{v:.2g}%"
    return f"{v:.{digits}f}%"


def nbytes(n: Any) -> str:
    """A byte count in powers of 1000: ``512 B``, ``16.4 kB``, ``537 MB``, ``1.2 GB``."""
    return si(n, "B")


def number(value: Any, scale: float = 1.0, digits: int = 1) -> str:
    """``value / scale`` with ``digits`` decimals and thousands separators (``12,345.6``)."""
    v = finite(value)
    return MISSING if v is None else f"{v / scale:,.{digits}f}"


def signed(text: str, value: Any) -> str:
    """``text`` with a leading ``+`` when ``value`` is positive (deltas: ``+1.2 ms``)."""
    v = finite(value)
    return "+" + text if v is not None and v > 0 else text


def clip(text: Any, width: int) -> str:
    """``text`` as a string of at most ``width`` characters (``…`` marks a cut); :data:`MISSING` when missing."""
    s = MISSING if is_missing(text) else str(text)
    return s if len(s) <= width else s[: max(width - 1, 1)] + "…"


_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""Characters a terminal acts on instead of showing: C0 controls but tab and newline (ESC starts
``ESC]0;title BEL``, ``ESC[2J``, ``ESC]8;;url`` hyperlinks; CR overwrites the line), DEL, the C1
controls (a one-character CSI/OSC), and the bidirectional overrides that reorder what is shown."""


def terminal_text(text: Any) -> str:
    """``text`` safe to print on a terminal: every control character (:data:`_CONTROL`) shown as
    its escape (``\\x1b``, ``\\u202e``), so a trace's names cannot set the window title, clear
    the screen or hide a link; idempotent. Every terminal output goes through it."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}",
                        str(text))


def by_column(column: str, value: Any) -> str:
    """Format a metric by its column's unit suffix (``_ns``, ``_s``, ``_pct``, ``_per_s``, ``_bytes``)."""
    if is_missing(value):
        return MISSING
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        return str(value)
    rules = (("_ns", duration), ("_pct", pct), ("flops_per_s", lambda v: si(v, "FLOP/s")),
             ("bytes_per_s", lambda v: si(v, "B/s")), ("tokens_per_s", lambda v: si(v, "tok/s")),
             ("_per_s", lambda v: si(v, "/s")), ("_bytes", lambda v: si(v, "B")), ("flops", lambda v: si(v, "FLOP")),
             ("_s", seconds),
             ("mfu", lambda v: pct(v * 100 if v <= 1 else v)), ("mbu", lambda v: pct(v * 100 if v <= 1 else v)))
    base = re.sub(r"_(mean|median|min|max|std|p\d+)$", "", column.lower())
    for suffix, fmt in rules:
        if base.endswith(suffix):
            return fmt(value)
    return f"{value:,.4g}" if isinstance(value, float) else f"{value:,}"


COLUMN_LABELS: dict[str, str] = {
    "phase": "phase", "steps": "steps", "tokens": "tokens", "wall_s": "wall time", "kernel_time_s": "GPU kernel time",
    "flops": "kernel FLOPs", "dram_bytes": "kernel DRAM bytes", "model_flops": "model FLOPs",
    "model_bytes": "model bytes", "achieved_flops_per_s": "achieved FLOP/s", "achieved_bytes_per_s": "achieved DRAM B/s",
    "tokens_per_s": "tokens/s", "precision": "precision", "mfu": "MFU (% of peak FLOP/s)",
    "mbu": "MBU (% of DRAM bandwidth)", "mfu_source": "MFU from", "mbu_source": "MBU from", "timing": "timing",
    "requests": "requests", "output_tokens": "output tokens", "prompt_tokens": "prompt tokens",
    "prompt_tokens_unknown": "requests with an uncounted prompt", "wall_share_pct": "share of wall time",
    "prefill_tokens": "prefill tokens", "decode_tokens": "decode tokens", "outlier_steps": "outlier steps",
    "throughput_tokens_per_s": "throughput (all output tokens / run time, tokens/s)",
    "user_tokens_per_s": "decode speed per user (1 / mean TPOT, tokens/s)",
}
"""Human labels of metric columns, for tables people read (HTML, dashboard); a label names the unit
where the cell's text does not (``MFU (% of peak FLOP/s)``); a time's cell carries its own unit."""

_LABEL_WORDS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "end-to-end", "p50": "p50", "p99": "p99",
                "mean": "mean", "profiled": "profiled", "s": "", "per": "per"}


def column_label(column: str) -> str:
    """The label a reader sees for a metric column: :data:`COLUMN_LABELS`, else the name's words
    (``ttft_s_p99`` -> ``TTFT p99``; ``profiled_tpot_s_mean`` -> ``profiled TPOT mean``)."""
    if column in COLUMN_LABELS:
        return COLUMN_LABELS[column]
    if column.startswith("profiled_") and column[9:] in COLUMN_LABELS:
        return "profiled " + COLUMN_LABELS[column[9:]]
    words = [_LABEL_WORDS.get(w, w) for w in column.split("_")]
    return " ".join(w for w in words if w) or column


def labelled_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows keyed by :func:`column_label` of each column instead of its internal name."""
    return [{column_label(str(k)): v for k, v in row.items()} for row in rows]


_EVIDENCE_WORDS = {**_LABEL_WORDS, "mfu": "MFU", "mbu": "MBU", "dram": "DRAM", "kv": "KV", "gpu": "GPU",
                   "cpu": "CPU", "s": "s"}


def evidence_label(key: str) -> str:
    """The label a reader sees for an evidence key: its unit words dropped where the formatted value
    says the unit (``prefill_time_ns`` -> ``prefill time``: the value reads ``2.36 s``;
    ``dram_roof_bytes_per_s`` -> ``DRAM roof``; ``mbu_pct`` -> ``MBU``), ``tokens_per_s`` as
    ``tokens/s``, other words spelled out (``kernels_per_step`` -> ``kernels per step``)."""
    words = key.split("_")
    if words[-2:] == ["per", "s"] and len(words) > 2:
        unit = words[-3]
        words = words[:-3] + (["tokens/s"] if unit == "tokens" else [] if unit in ("bytes", "flops") else [unit, "/s"])
    elif words[-1] == "s" and len(words) > 1:
        words = words[:-1]
    words = [w for w in words if w not in ("ns", "pct")]
    return " ".join(_EVIDENCE_WORDS.get(w, w) for w in words).replace(" /s", "/s") or key


def evidence_rows(evidence: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A finding's evidence as (label, formatted value) rows: each value formatted by its key's unit,
    each key shown as :func:`evidence_label` (no internal name whose unit suffix the value contradicts)."""
    return [(evidence_label(str(k)), by_column(str(k), v)) for k, v in evidence.items()]


EVIDENCE_ITEMS_SHOWN = 4
"""Items of a finding each output lists one by one (the largest first); the rest are counted in one line."""


def evidence_share(time_at_stake_ns: Any, explained_ns: Any, rule_share: float) -> str | None:
    """What share of a finding's time at stake its items explain, in words: ``explains 96% of its
    time at stake`` at or above ``rule_share`` (the evidence rule, docs/findings.md), else that
    share and the time left unexplained (``explains 62% of its time at stake; 1.20 ms (38%)
    unexplained``); None when the finding has no time at stake or no timed item."""
    stake, done = finite(time_at_stake_ns), finite(explained_ns)
    if stake is None or not stake > 0 or done is None:
        return None
    share = min(done / stake, 1.0)
    text = f"explains {100 * share:.0f}% of its time at stake"
    if share >= rule_share:
        return text
    left = stake - min(done, stake)
    return f"{text}; {duration(left)} ({100 * (1 - share):.0f}%) unexplained"


def evidence_item(item: Any, time_at_stake_ns: Any) -> tuple[str, str, str]:
    """One item of a finding as (share of the time at stake, cause, label): ``('50%', 'known',
    '665 ms in 35,212 gaps ...')``; an item that is not a time (a counter) has an empty share."""
    t, stake = finite(getattr(item, "time_ns", None)), finite(time_at_stake_ns)
    share = f"{100 * t / stake:.0f}%" if t is not None and stake is not None and stake > 0 else ""
    return share, "known" if getattr(item, "explains", False) else "unknown", str(getattr(item, "label", ""))


def counted(n: float, noun: str) -> str:
    """``n`` and its noun, plural unless ``n`` is 1: ``1 gap``, ``3 gaps``, ``2 launches``, ``1,204 kernel groups``
    (``-es`` after s, x, ch and sh)."""
    return f"{n:,.0f} {noun if n == 1 else noun + ('es' if noun.endswith(('s', 'x', 'ch', 'sh')) else 's')}"


def evidence_more(items: Sequence[Any], shown: int) -> str | None:
    """The line for the items past the first ``shown``: ``+ 9 more items (120 ms)``; None when none."""
    rest = list(items)[shown:]
    if not rest:
        return None
    t = sum(v for v in (finite(getattr(i, "time_ns", None)) for i in rest) if v is not None)
    return f"+ {counted(len(rest), 'more item')}" + (f" ({duration(t)})" if t > 0 else "")


# ---------------------------------------------------------------------------- JSON
def jsonable(value: Any) -> Any:
    """``value`` as plain JSON types, recursively.

    NaN, infinities, None, pandas' NA and NaT become None; numpy scalars and arrays, pandas
    Series/DataFrames (as records), Timestamps, datetimes and dates (ISO 8601), paths, enums,
    dataclasses, mappings (keys as strings), lists, tuples and sets become their JSON form.
    Any other type is a programming error and raises ``TypeError`` naming it: output never
    silently holds an object's ``repr``.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if type(value).__name__ in ("NAType", "NaTType"):
        return None
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    return _jsonable_array_like(value)


def _jsonable_array_like(value: Any) -> Any:
    if is_missing(value):
        return None
    module = type(value).__module__.split(".")[0]
    if module == "numpy":
        return jsonable(value.tolist())  # scalars give a Python scalar, arrays nested lists
    if module == "pandas":
        if hasattr(value, "to_dict") and hasattr(value, "columns"):
            return jsonable(value.to_dict(orient="records"))
        if hasattr(value, "tolist"):
            return jsonable(value.tolist())
        if hasattr(value, "isoformat"):  # Timestamp
            return value.isoformat()
        if hasattr(value, "total_seconds"):  # Timedelta
            return jsonable(value.total_seconds())
    if hasattr(value, "to_dict"):  # perfscope records (Finding, Comparison, DeviceSpec ...)
        return jsonable(value.to_dict())
    raise TypeError(f"not JSON serialisable: {type(value).__module__}.{type(value).__name__}")


def dumps(value: Any, *, indent: int | None = 2, sort_keys: bool = False) -> str:
    """``value`` as JSON text through :func:`jsonable` (strict JSON: never ``NaN``)."""
    return json.dumps(jsonable(value), indent=indent, sort_keys=sort_keys, allow_nan=False)


def records(df: Any) -> list[dict[str, Any]]:
    """DataFrame rows as JSON-ready dicts."""
    out: list[dict[str, Any]] = jsonable(df.to_dict(orient="records"))
    return out
