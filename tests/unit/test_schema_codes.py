"""Column codes known without hashing text (issue #44, imports at the speed of the read):

- the idle table's text columns get their codes from the idle classification, and conform carries them
  to the stored table: they equal ``pd.factorize`` of the stored columns, on real nsys and Kineto fixtures;
- a cut of a table (:func:`subset`, :func:`rows_where`) takes its parent's codes renumbered, the same as
  factorizing the cut; a cut that keeps every row is the table itself.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfscope.memo import memo_peek
from perfscope.schema import CODES_KEY, column_codes, recode, rows_where, subset

IDLE_TEXT = ("device", "cause", "host_kind", "range", "api", "op", "op_shapes", "function", "wait")


def _same_as_factorize(table: pd.DataFrame, column: str) -> None:
    codes, distinct = column_codes(table, column)
    want_codes, want = pd.factorize(table[column], use_na_sentinel=True)
    np.testing.assert_array_equal(codes, want_codes)
    assert list(distinct) == list(want)


@pytest.mark.parametrize("name", [
    "nsys/nvfuser_h100_matmul.sqlite",
    "nsys/aws_t4_softmax.sqlite",
    "h200/h200_llama1b_engine_eager.pt.trace.json.gz",
    "kineto/nanovllm_cpu_kv_attention__forward_10.json.gz",
])
def test_stored_idle_table_has_its_codes_from_the_classification(load, name: str) -> None:
    idle = load(name).idle
    assert len(idle)
    for col in IDLE_TEXT:
        assert memo_peek(idle, CODES_KEY + col) is not None, col  # seeded, not hashed on first use
        _same_as_factorize(idle, col)


@pytest.mark.parametrize("name", ["nsys/nvfuser_h100_matmul.sqlite", "h200/h200_llama1b_engine_eager.pt.trace.json.gz"])
def test_cuts_take_their_parents_codes(load, name: str) -> None:
    idle = load(name).idle
    host = (idle["cause"] == "host").to_numpy(bool)
    assert host.any() and not host.all()
    cut = subset(idle, host)
    pd.testing.assert_frame_equal(cut, idle[host])
    for col in IDLE_TEXT:
        _same_as_factorize(cut, col)
    device = str(idle["device"].iloc[0])
    assert rows_where(idle, "device", device) is idle  # one device: no copy
    assert len(rows_where(idle, "device", "cuda:99")) == 0


def test_recode_renumbers_in_order_of_first_appearance_and_keeps_missing() -> None:
    distinct = np.array(["a", "b", "c", "d"], dtype=object)
    codes, used = recode(np.array([3, -1, 1, 3, -1, 0]), distinct)
    assert codes.tolist() == [0, -1, 1, 0, -1, 2]
    assert used.tolist() == ["d", "b", "a"]
    text = pd.Series(["d", None, "b", "d", None, "a"], dtype=object)
    want_codes, want = pd.factorize(text, use_na_sentinel=True)
    assert codes.tolist() == want_codes.tolist() and used.tolist() == list(want)


def _stride0(series: pd.Series) -> bool:
    a = series.array
    data = getattr(a, "_ndarray", getattr(a, "_data", None))
    return isinstance(data, np.ndarray) and data.strides == (0,)


def test_missing_columns_cost_nothing_and_read_as_missing_after_a_save(tmp_path) -> None:
    """An nsys export has no counters and no host operators: those kernel columns are all missing, held as
    one repeated missing value, and read back from the saved report exactly as before (NaN, <NA>, None)."""
    import sys
    from pathlib import Path

    from perfscope.analysis.readers.nsys.reader import read_nsys_sqlite
    from perfscope.report import Report
    from perfscope.schema import READONLY_OK, compact_missing

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from ingest_nsys import FIXTURE, build  # the real export's kernels and launch calls, replicated

    build(FIXTURE, tmp_path / "big.sqlite", 5000)
    report = read_nsys_sqlite(tmp_path / "big.sqlite")
    k = report.kernels
    assert len(k) >= 4096  # long enough to be compacted
    held_once = [c for c in k.columns if _stride0(k[c])]
    missing = {"flops", "op", "op_shapes", "arith_intensity", "step"}
    assert all(k[c].isna().all() for c in missing)
    # held once where pandas reads a read-only view (>= 2.2); in full before (pandas 2.0's hashing refuses one)
    assert missing <= set(held_once) if READONLY_OK else not held_once
    # the rest held once have one value in every row (the export's one device): schema._one_value
    one_valued = [c for c in held_once if not k[c].isna().all()]
    assert ("device" in one_valued if READONLY_OK else not one_valued)
    for c in one_valued:
        assert k[c].nunique(dropna=False) == 1, c
    assert not any(_stride0(k[c]) for c in ("name", "start_ns"))
    report.save(tmp_path / "r.perfscope")
    back = Report.load(tmp_path / "r.perfscope")
    for c in held_once:
        if c in one_valued:
            assert back.kernels[c].astype(object).tolist() == k[c].astype(object).tolist(), c
            continue
        assert back.kernels[c].isna().all(), c
        assert back.kernels[c].dtype == k[c].dtype, c
    pd.testing.assert_frame_equal(back.kernels[["name", "start_ns", "duration_ns"]], k[["name", "start_ns", "duration_ns"]],
                                  check_dtype=False)  # text reads back as pandas 3 str
    # a full-length missing column (a report saved before) compacts the same way, and a known one does not
    full = pd.DataFrame({"x": np.full(5000, np.nan), "y": np.arange(5000.0), "z": [None] * 5000})
    out = compact_missing(full)
    assert (_stride0(out["x"]) and _stride0(out["z"]) if READONLY_OK else not _stride0(out["x"])) and not _stride0(out["y"])
    pd.testing.assert_frame_equal(out, full)
