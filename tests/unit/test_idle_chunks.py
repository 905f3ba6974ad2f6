"""The idle classification in chunks of pieces (issue #44: bounded working memory) gives the same table as
in one piece, on real traces whose gaps are cut into many pieces (chunks of 7 pieces: many chunk borders,
each moved to a gap border)."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis import idle as idle_mod
from perfscope.analysis.idle import _chunks, idle_rows


@pytest.mark.parametrize("name", [
    "nsys/nvfuser_h100_matmul.sqlite",
    "h200/h200_llama1b_engine_eager.pt.trace.json.gz",
    "kineto/nanovllm_cpu_kv_attention__forward_10.json.gz",
])
def test_chunked_classification_equals_whole(load, monkeypatch, name: str) -> None:
    report = load(name)
    whole = idle_rows(report)
    monkeypatch.setattr(idle_mod, "_chunk_size", lambda ctx: 7)
    chunked = idle_rows(report)
    assert len(whole) > 7
    pd.testing.assert_frame_equal(chunked, whole)
    stored = report.idle
    pd.testing.assert_series_equal(stored["cause"].astype(object), chunked["cause"].astype(object), check_names=False)


def test_chunks_cut_between_gaps_only() -> None:
    gap = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 3])
    parts = _chunks(gap, 2)
    assert parts[0][0] == 0 and parts[-1][1] == len(gap)
    assert all(hi == lo2 for (_, hi), (lo2, _) in itertools.pairwise(parts))
    for lo, hi in parts:
        assert hi > lo
        assert lo == 0 or gap[lo] != gap[lo - 1]
