"""The code-based text-column helpers give what the pandas operations they replace give."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.summaries.kernels import group_codes, group_key, top_groups
from perfscope.schema import value_mask, value_positions


@pytest.fixture
def kernels() -> pd.DataFrame:
    # short names: usable, degenerate ("void", a number), missing; a full name equal to a short name
    return pd.DataFrame({
        "name": ["ampere_sgemm_128x64(float*)", "void at::kernel<1>()", "gemm", None, "void at::kernel<1>()",
                 "elementwise<float>()", "42 x"],
        "short_name": ["ampere_sgemm_128x64", "void", None, None, "void", "elementwise", "42"],
        "device": ["cuda:1", "cuda:0", "cuda:0", None, "cuda:1", "cuda:0", "cpu"],
        "duration_ns": [5.0, 1.0, 2.0, 3.0, 4.0, 6.0, 7.0],
    })


def test_value_mask_equals_comparison_and_isin(kernels: pd.DataFrame) -> None:
    eq = value_mask(kernels, "device", lambda d: d == "cuda:0")
    assert eq.dtype == bool
    assert eq.tolist() == (kernels["device"] == "cuda:0").tolist()
    isin = value_mask(kernels, "device", lambda d: d in {"cuda:1", "cpu"})
    assert isin.tolist() == kernels["device"].isin(["cuda:1", "cpu"]).tolist()
    missing = value_mask(kernels, "device", lambda d: d is None)
    assert missing.tolist() == kernels["device"].isna().tolist()


def test_value_positions_equal_a_sorted_groupby(kernels: pd.DataFrame) -> None:
    got = [(value, rows.tolist()) for value, rows in value_positions(kernels, "device")]
    expected = [(value, np.flatnonzero(kernels["device"].to_numpy() == value).tolist())
                for value in sorted(kernels["device"].dropna().unique())]
    assert got == expected  # missing devices form no group, as in groupby


def test_group_codes_stand_for_group_key(kernels: pd.DataFrame) -> None:
    codes, names = group_codes(kernels)
    key = group_key(kernels)
    # short name where usable, else the full name; equal strings share one code
    assert key.tolist() == ["ampere_sgemm_128x64", "void at::kernel<1>()", "gemm", None, "void at::kernel<1>()",
                            "elementwise", "42 x"]
    assert [names[c] if c >= 0 else None for c in codes] == key.tolist()
    assert len(set(names[codes[codes >= 0]])) == len(set(codes[codes >= 0]))
    assert codes[1] == codes[4] and codes[3] == -1


def test_top_groups_weighs_the_subset(kernels: pd.DataFrame) -> None:
    rows = np.array([1, 2, 4, 5])
    weights = kernels["duration_ns"].to_numpy()[rows]
    assert top_groups(kernels, rows, weights, n=2) == ("elementwise", "void at::kernel<1>()")
    assert top_groups(kernels, rows, n=1) == ("void at::kernel<1>()",)  # counted: 2 rows against 1
