"""The per-report memo (:mod:`perfscope.memo`), re-exported for the dashboard modules."""

from __future__ import annotations

from perfscope.memo import memo, memo_size

__all__ = ["memo", "memo_size"]
