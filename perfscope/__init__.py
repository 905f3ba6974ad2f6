"""perfscope: where does the time go, what bounds each kernel, and what to fix first.

Public API (imported lazily, so ``import perfscope`` stays cheap)::

    report = perfscope.load("runs/x.perfscope")   # or a trace / export to import
    report.kernels                                  # pandas DataFrame
    report.roofline()                               # plotly Figure
    report.to_html("report.html")
    with perfscope.profile() as run: model(x)       # then run.report
    @perfscope.annotate("step")                     # NVTX + record_function range
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

_here = os.path.dirname(os.path.abspath(__file__))
_root = os.path.dirname(_here)
if not os.path.isdir(os.path.join(_here, "analysis")) and os.path.isdir(os.path.join(_root, "analysis")):
    # A source checkout (`python -m perfscope` in the repository root imports this folder, not the
    # install): collectors/, analysis/ and dashboard/ sit beside it, as the install maps them.
    __path__.append(_root)

from ._version import __version__
from .annotate import annotate  # eager: the submodule of the same name must not shadow the function
from .errors import PerfscopeError

if TYPE_CHECKING:
    from .api import load, profile
    from .report import Report

__all__ = ["PerfscopeError", "Report", "__version__", "annotate", "load", "profile"]

_LAZY = {
    "load": ("perfscope.api", "load"),
    "profile": ("perfscope.api", "profile"),
    "Report": ("perfscope.report", "Report"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'perfscope' has no attribute {name!r}")
