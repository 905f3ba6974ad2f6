"""A figure that only says why there is nothing to draw."""

from __future__ import annotations

import plotly.graph_objects as go

from ..text import esc


def message_figure(text: str, kind: str = "message") -> go.Figure:
    """An empty figure that says why there is nothing to draw."""
    fig = go.Figure()
    fig.add_annotation(text=esc(text), xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False,
                       font={"size": 14, "color": "#555"})
    # no styled template: axes are hidden, and copying one costs more than the rest of the figure
    fig.update_layout(template="none", paper_bgcolor="white", plot_bgcolor="white", xaxis={"visible": False},
                      yaxis={"visible": False}, height=260, meta={"kind": kind, "empty": True})
    return fig
