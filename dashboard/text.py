"""Formatting and escaping helpers shared by the figures, the HTML report and the Dash app.

Plotly renders hover text, legend names and annotations as a small subset of HTML, so every
string that comes from a report goes through :func:`esc` before it reaches a figure. Dash
components and the HTML report's table (``textContent``) take raw strings instead.
"""

from __future__ import annotations

import html
import math
from typing import Any

SI_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def esc(value: object, limit: int | None = None) -> str:
    """``value`` as text safe to place in plotly text or HTML (``<`` shows as ``<``)."""
    text = "" if is_missing(value) else str(value)
    if limit is not None and len(text) > limit:
        text = text[: max(limit - 1, 1)] + "…"
    return html.escape(text, quote=True)


def is_missing(value: object) -> bool:
    """True for None, NaN and pandas' NA."""
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN and pd.NA compare unequal to themselves
    except (TypeError, ValueError):
        return False


def si(value: Any, unit: str = "", digits: int = 3) -> str:
    """``value`` with an SI prefix (``1.23 TFLOP/s``); ``n/a`` when missing."""
    if is_missing(value):
        return "n/a"
    v = float(value)
    if not math.isfinite(v):
        return "n/a"
    for scale, prefix in SI_PREFIXES:
        if abs(v) >= scale:
            return f"{v / scale:.{digits}g} {prefix}{unit}".rstrip()
    return f"{v:.{digits}g} {unit}".rstrip()


def duration(ns: Any) -> str:
    """A duration in ns as text in the largest fitting unit (``1.5 ms``); ``n/a`` when missing."""
    if is_missing(ns):
        return "n/a"
    v = float(ns)
    for scale, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "µs")):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v:.3g} ns"


def pct(value: Any, digits: int = 1) -> str:
    """A percentage as text (``12.3%``); ``n/a`` when missing."""
    if is_missing(value) or not math.isfinite(float(value)):
        return "n/a"
    return f"{float(value):.{digits}f}%"


def seconds(value: Any) -> str:
    """A time in seconds as text in ms or s; ``n/a`` when missing."""
    if is_missing(value):
        return "n/a"
    return duration(float(value) * 1e9)
