"""Every perfscope figure: pure functions from a Report to a plotly ``Figure``, one module
per subject (roofline, timeline, phases, latency, counters, compare; loadtest, ranks and
sweep for those reports).

The Dash app, the standalone HTML report and the notebook API (``report.roofline()``) all
call these, so a figure looks the same everywhere. Text that comes from a report (kernel
names, range names, device names) is HTML-escaped before it reaches plotly, which renders a
subset of HTML in hover labels, legends and annotations. The data behind the two large
figures lives in :mod:`.roofline_data` and :mod:`.timeline_data` (view-models, tested on
their own). This package's namespace (``__all__``) is what callers use as ``figures.roofline``.
"""

from __future__ import annotations

from ..style import BOUND_COLORS, PHASE_COLORS, PHASE_SYMBOLS
from .compare import COMPARE_TOP, compare
from .counters import counters
from .idle import idle_causes
from .latency import latency_distributions
from .memory import gauges_beside_latency, memory_timeline
from .messages import message_figure
from .phases import phase_breakdown, step_times
from .roofline import roofline
from .timeline import timeline

__all__ = [
    "BOUND_COLORS",
    "COMPARE_TOP",
    "PHASE_COLORS",
    "PHASE_SYMBOLS",
    "compare",
    "counters",
    "gauges_beside_latency",
    "idle_causes",
    "latency_distributions",
    "memory_timeline",
    "message_figure",
    "phase_breakdown",
    "roofline",
    "step_times",
    "timeline",
]
