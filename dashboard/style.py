"""Colours and marker symbols shared by every figure (bound, phase, kernel category)."""

from __future__ import annotations

BOUND_COLORS = {"memory": "#1f77b4", "compute": "#d62728", "latency": "#ff7f0e", "unknown": "#8c8c8c"}
PHASE_COLORS = {"prefill": "#9467bd", "decode": "#2ca02c", "draft": "#e377c2", "verify": "#ff7f0e", "none": "#8c8c8c"}
PHASE_SYMBOLS = {"prefill": "circle", "decode": "diamond", "draft": "triangle-up", "verify": "star", "none": "square"}
CATEGORY_COLORS = {
    "gemm": "#d62728", "attention": "#ff7f0e", "elementwise": "#1f77b4", "norm": "#17becf",
    "memory": "#7f7f7f", "comm": "#e377c2", "view": "#bcbd22", "other": "#8c564b",
    "reduction": "#393b79", "softmax": "#ffbb78",
    "range": "#c7c7c7", "prefill": PHASE_COLORS["prefill"], "decode": PHASE_COLORS["decode"],
}
