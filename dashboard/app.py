"""The Dash app factory and server entry point (``perfscope dashboard``).

``create_app(paths)`` builds a fresh app each call (no module-level app), serving only the
reports found under ``paths``. ``serve`` binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import dash

from .callbacks import register_callbacks
from .layout import build_layout
from .store import ReportStore

if TYPE_CHECKING:
    import os
    from collections.abc import Sequence

ASSETS = Path(__file__).resolve().parent / "assets"
DEFAULT_ROOTS = ("runs", "sample_reports")


def create_app(paths: Sequence[str | os.PathLike[str]] = DEFAULT_ROOTS) -> dash.Dash:
    """A Dash app over the reports under ``paths`` (folders, or report folders themselves)."""
    store = ReportStore(paths)
    app = dash.Dash(__name__, assets_folder=str(ASSETS), assets_ignore=r"standalone_.*", title="perfscope",
                    serve_locally=True)
    app.layout = lambda: build_layout(store.entries())
    register_callbacks(app, store)
    app.server.config["PERFSCOPE_STORE"] = store
    return app


def serve(paths: Sequence[str | os.PathLike[str]], *, host: str = "127.0.0.1", port: int = 8050,
          debug: bool = False) -> None:
    """Run the dashboard server until interrupted."""
    create_app(paths).run(host=host, port=port, debug=debug)
