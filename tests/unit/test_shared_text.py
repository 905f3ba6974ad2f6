"""Text held once per distinct value (issue #44, the 5M-kernel imports under 4 GB):

- :func:`perfscope.schema.shared_text` turns a pandas string column (pandas 3's Arrow-backed ``str``,
  ``string``) into an object column whose equal rows are one shared ``str``: same values, missing ones None;
- ``conform`` does it for every text column, so a report's tables read the same from a reader, after the
  roofline's classification, and after a save and load;
- the Kineto reader keeps a large table's text as shared objects (the same values as the small-table path);
- the idle table's one-valued number columns (an nsys export's copy bytes, correlation) are held once, its
  text is categorical (codes in order of first appearance), and both read the same as full columns; the
  classification's lean copy of the device work equals ``activity()``'s rows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfscope import schema
from perfscope.analysis import idle as idle_mod
from perfscope.analysis.intervals import activity
from perfscope.analysis.readers.kineto import reader as kineto_reader
from perfscope.schema import conform, shared_text

FIXTURES = ["nsys/nvfuser_h100_matmul.sqlite", "h200/h200_llama1b_engine_eager.pt.trace.json.gz",
            "kineto/nanovllm_cpu_kv_attention__forward_10.json.gz"]


def _values(values: pd.Series) -> list[object]:
    """The values, every missing one as None (NaN in an object column reads back as None)."""
    return [None if v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA else v for v in values.tolist()]


def _shares(values: pd.Series) -> bool:
    """Whether equal non-missing rows of an object column are one object."""
    seen: dict[str, int] = {}
    for v in values.tolist():
        if isinstance(v, str) and seen.setdefault(v, id(v)) != id(v):
            return False
    return True


@pytest.mark.parametrize("dtype", ["string", "string[pyarrow]"])
def test_shared_text_same_values_one_object_per_value(dtype: str) -> None:
    words = ["ampere_sgemm_128x64_nn", None, "void at::native::vectorized_elementwise_kernel<4>", "ampere_sgemm_128x64_nn"]
    text = pd.Series(words * 50, dtype=dtype, index=pd.RangeIndex(10, 210))
    out = shared_text(text)
    assert out.dtype == object
    assert out.index.equals(text.index)
    assert out.tolist() == [w if w is not None else None for w in words * 50]
    assert out.isna().sum() == text.isna().sum() == 50
    assert _shares(out)
    assert len({id(v) for v in out.tolist() if v is not None}) == 2


def test_shared_text_leaves_other_columns() -> None:
    for s in (pd.Series([1, 2, 3]), pd.Series([1.5, np.nan]), pd.Series(["a", None], dtype=object)):
        assert shared_text(s) is s


def test_conform_holds_text_once_and_round_trips(tmp_path, load) -> None:
    report = load("nsys/nvfuser_h100_matmul.sqlite")
    raw = report.kernels.assign(name=report.kernels["name"].astype("string"), op=pd.Series(
        ["aten::mm"] * len(report.kernels), dtype="string"))
    out = conform(raw, "kernels", source="test")
    for col in ("name", "op"):
        assert out[col].dtype == object and _shares(out[col])
        assert out[col].tolist() == raw[col].astype(object).tolist()
    saved = report.save(tmp_path / "r.perfscope")
    loaded = type(report).load(saved)
    for table in ("kernels", "api", "idle"):
        a, b = getattr(report, table), getattr(loaded, table)
        for col in a.columns:
            if a[col].dtype == object or isinstance(a[col].dtype, pd.CategoricalDtype):
                assert b[col].dtype == object or type(b[col].dtype) is type(a[col].dtype), (table, col)
                assert _values(a[col].astype(object)) == _values(b[col].astype(object)), (table, col)


def test_kineto_large_tables_hold_shared_text(monkeypatch, fixtures_dir) -> None:
    path = fixtures_dir / "h200/h200_llama1b_engine_eager.pt.trace.json.gz"
    small = kineto_reader.import_kineto(path).tables
    monkeypatch.setattr(kineto_reader, "SMALL_TABLE", 0)  # every table through the large-table path
    large = kineto_reader.import_kineto(path).tables
    assert set(small) == set(large)
    assert all(large["kernels"][c].dtype == object for c in ("name", "short_name", "grid", "range"))
    for name, df in large.items():
        assert list(df.columns) == list(small[name].columns)
        for col in df.columns:
            if df[col].dtype == object:
                assert _shares(df[col]), (name, col)
            assert _values(df[col].astype(object)) == _values(small[name][col].astype(object)), (name, col)


def test_kineto_columns_built_shared_skip_the_text_pass(monkeypatch, fixtures_dir) -> None:
    """Columns the reader builds shared and clean (``Shared``) are not hashed again by the text pass, and
    the API names' memoized codes made from the string codes are what factorizing the column gives."""
    path = fixtures_dir / "h200/h200_llama1b_engine_eager.pt.trace.json.gz"
    monkeypatch.setattr(kineto_reader, "SMALL_TABLE", 0)
    hashed: list[int] = []
    column = kineto_reader._column
    monkeypatch.setattr(kineto_reader, "_column", lambda v: hashed.append(len(v)) or column(v))
    tables = kineto_reader.import_kineto(path).tables
    api = tables["api"]
    assert len(api) and len(hashed) < sum(len(df.columns) for df in tables.values())
    codes, words = schema.column_codes(api, "name")
    want_codes, want_words = pd.factorize(api["name"], use_na_sentinel=True)
    assert codes.tolist() == want_codes.tolist() and list(words) == list(want_words)
    assert set(api["kind"]) <= {"driver", "runtime"} and _shares(api["kind"]) and _shares(api["name"])


@pytest.mark.parametrize("name", FIXTURES)
def test_idle_one_valued_columns_held_once(load, monkeypatch, name: str) -> None:
    report = load(name)
    whole = idle_mod.idle_rows(report)
    monkeypatch.setattr(schema, "COMPACT_MIN_ROWS", 1)  # every one-valued column held once, however short
    monkeypatch.setattr(idle_mod, "_chunk_size", lambda ctx: 7)  # and joined from many chunks
    held = idle_mod.idle_rows(report)
    pd.testing.assert_frame_equal(held, whole)
    assert len(held) > 7
    for col in ("correlation", "bytes", "pinned"):
        values = held[col].to_numpy(object)
        if len(set(map(repr, values.tolist()))) == 1:  # one value: held once, not per row
            assert schema._isrepeated(held[col]) or not schema.READONLY_OK, col
    for col in idle_mod.TEXT_COLUMNS:  # text: categorical, its codes those column_codes gives
        assert isinstance(held[col].dtype, pd.CategoricalDtype), col
        codes, distinct = pd.factorize(held[col].astype(object), use_na_sentinel=True)
        np.testing.assert_array_equal(held[col].cat.codes.to_numpy(), codes)
        assert list(held[col].cat.categories) == list(distinct)


@pytest.mark.parametrize("name", FIXTURES)
def test_device_work_matches_activity(load, name: str) -> None:
    report = load(name)
    lean = idle_mod._device_work(report)
    full = activity(report)
    assert len(lean) == len(full)
    for col in lean.columns:
        want = full[col].to_numpy(np.float64, na_value=np.nan) if col == "correlation" else full[col].to_numpy(object)
        got = lean[col].to_numpy(np.float64, na_value=np.nan) if col == "correlation" else lean[col].to_numpy(object)
        np.testing.assert_array_equal(got, want)
