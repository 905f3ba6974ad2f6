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
