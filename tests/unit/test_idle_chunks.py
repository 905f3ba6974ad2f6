"""The idle classification in chunks of pieces (issue #44: bounded working memory) gives the same table as
in one piece, on real traces whose gaps are cut into many pieces (chunks of 7 pieces: many chunk borders,
each moved to a gap border)."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis import idle as idle_mod
from perfscope.analysis.idle import _point_chunks, idle_rows


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


def test_point_chunks_cut_at_gap_starts_only() -> None:
    """The chunks are runs of cut points that share their boundary point, each boundary a gap's start: every
    piece (between neighbouring points) is in exactly one chunk, and a gap's pieces in one (a gap longer than a
    chunk included)."""
    ist = np.array([0, 10, 30, 40])
    ien = np.array([5, 25, 35, 50])
    points = np.array([0, 2, 5, 10, 12, 14, 16, 18, 20, 25, 30, 33, 35, 40, 45, 50])
    for size in (1, 2, 3, 5, 100):
        parts = _point_chunks(points, ist, size)
        assert parts[0][0] == 0 and parts[-1][1] == len(points)
        assert all(hi - 1 == lo2 for (_, hi), (lo2, _) in itertools.pairwise(parts))  # one shared point
        for lo, _hi in parts[1:]:
            assert points[lo] in ist
        pieces = [i for lo, hi in parts for i in range(lo, hi - 1)]
        assert pieces == list(range(len(points) - 1))
        for g in range(len(ist)):
            inside = [k for k, (lo, hi) in enumerate(parts) for i in range(lo, hi - 1)
                      if ist[g] <= points[i] < ien[g]]
            assert len(set(inside)) == 1


def test_track_nested_once_answers_as_nesting_per_search() -> None:
    """A host track is nested once (tree.nesting_levels) and searched per chunk: the innermost interval found
    is the one a brute-force scan finds, with the levels given or made per call."""
    from perfscope.analysis.tree import innermost_at, nesting_levels

    rng = np.random.default_rng(7)
    starts, ends = [], []

    def spans(lo: int, hi: int, depth: int) -> None:  # nested or disjoint, as one thread's operators are
        t = lo
        while depth < 4 and t < hi - 4:
            a = int(rng.integers(t, hi - 2))
            b = int(rng.integers(a + 1, min(hi, a + (hi - lo) // 2 + 2)))
            starts.append(a)
            ends.append(b)
            spans(a, b, depth + 1)
            t = b + int(rng.integers(0, 5))

    spans(0, 10_000, 0)
    s, e = np.array(starts, np.int64), np.array(ends, np.int64)
    x = rng.integers(-10, 10_010, 5000)
    levels = nesting_levels(s, e)
    assert len(levels) > 1
    got = innermost_at(s, e, x, levels)
    np.testing.assert_array_equal(got, innermost_at(s, e, x))
    for xi, g in zip(x.tolist(), got.tolist(), strict=True):
        inside = np.flatnonzero((s <= xi) & (xi < e))
        want = inside[np.argmin(e[inside] - s[inside])] if len(inside) else -1
        assert (g == -1) == (want == -1)
        assert g == want or (e[g] - s[g] == e[want] - s[want] and s[g] <= xi < e[g])


def test_stored_idle_codes_are_the_categoricals_own(load) -> None:
    """The idle table's memoized text codes are its categoricals' codes (int8 / int16, not a second int32 copy: ~0.3
    GB at 5M kernels), with the values and order ``pd.factorize`` gives."""
    from perfscope.schema import column_codes

    idle = load("h200/h200_llama1b_engine_eager.pt.trace.json.gz").idle
    assert len(idle) > 1000
    for c in idle_mod.TEXT_COLUMNS:
        codes, distinct = column_codes(idle, c)
        # the same narrow dtype (pandas 3: the very array; pandas 2.0's conform copies the column, and the codes)
        assert codes.dtype == idle[c].array.codes.dtype, c
        want, uniques = pd.factorize(idle[c].astype(object), use_na_sentinel=True)
        np.testing.assert_array_equal(np.asarray(codes, np.int64), want)
        assert list(distinct) == list(uniques)
