"""Formatting and escaping helpers shared by the figures, the HTML report and the Dash app.

Plotly renders hover text, legend names and annotations as a small subset of HTML, so every
string that comes from a report goes through :func:`esc` before it reaches a figure. Dash
components and the HTML report's table (``textContent``) take raw strings instead.
"""

from __future__ import annotations

import html

from perfscope.format import MISSING, SI_PREFIXES, duration, is_missing, pct, seconds, si

__all__ = ["MISSING", "SI_PREFIXES", "duration", "esc", "is_missing", "pct", "seconds", "si"]


def esc(value: object, limit: int | None = None) -> str:
    """``value`` as text safe to place in plotly text or HTML (``<`` shows as ``<``)."""
    text = "" if is_missing(value) else str(value)
    if limit is not None and len(text) > limit:
        text = text[: max(limit - 1, 1)] + "…"
    return html.escape(text, quote=True)
