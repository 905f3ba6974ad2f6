"""The Kineto reader at scale: tiled traces, block boundaries, fallbacks, bounded memory, nesting.

Every expectation comes from an independent reading of the same file (``json.loads`` and a
plain scan of its events) or from a direct stack walk, never from the reader itself.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import tracemalloc
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.readers.kineto import events as kineto_json
from perfscope.analysis.readers.kineto.parse import parse_trace
from perfscope.analysis.readers.kineto.reader import read_kineto
from perfscope.analysis.tree import nest
from perfscope.report import Report

REPO = Path(__file__).resolve().parents[2]
BERT = "kineto/tracelens_h100__gaunernst_bert-small-uncased__1016001.json.gz"
A100 = "kineto/hta_negative_queue_length_values_check__rank0.json.gz"
CPU_ONLY = "kineto/hta_cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
TABLES = ("kernels", "ranges", "transfers", "api")


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_ingest", REPO / "benchmarks" / "ingest.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _doc(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def _kernel_totals(doc: dict[str, Any]) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and e.get("ph") == "X":
            totals[e["name"]] += round(e["dur"] * 1000)
    return dict(totals)


def _same_tables(a: Report, b: Report) -> None:
    for name in TABLES:
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_dtype=True)


# ---------------------------------------------------------------------------- tiling
def test_a_tiled_trace_reads_as_its_copies(fixtures_dir, tmp_path):
    bench = _bench()
    plain, packed, n = bench.build(fixtures_dir / BERT, tmp_path, 3)
    doc = _doc(plain)
    assert n == len(doc["traceEvents"])
    single = read_kineto(fixtures_dir / BERT)
    tiled = read_kineto(plain)
    assert tiled.manifest["params"]["events"] == n
    assert len(tiled.kernels) == 3 * len(single.kernels) == sum(
        1 for e in doc["traceEvents"] if e.get("cat") == "kernel")
    got = tiled.kernels.groupby("name")["duration_ns"].sum().to_dict()
    assert got == _kernel_totals(doc)
    # the links survive tiling: each copy links (and costs) its kernels as the original does
    assert tiled.kernels["op"].notna().sum() == 3 * single.kernels["op"].notna().sum()
    assert tiled.kernels["flops"].sum() == pytest.approx(3 * single.kernels["flops"].sum())
    assert len(tiled.api) == 3 * len(single.api)
    _same_tables(tiled, read_kineto(packed))


# ---------------------------------------------------------------------------- blocks
@pytest.mark.parametrize("block", [4096, 777])
def test_block_size_does_not_change_the_report(fixtures_dir, monkeypatch, block):
    whole = read_kineto(fixtures_dir / BERT)
    monkeypatch.setattr(kineto_json, "BLOCK", block)
    _same_tables(read_kineto(fixtures_dir / BERT), whole)


def _trace(events: list[dict[str, Any]], **meta: Any) -> dict[str, Any]:
    return {"schemaVersion": 1, **meta, "traceEvents": events, "traceName": "t"}


def _ops(names: list[str]) -> list[dict[str, Any]]:
    return [{"ph": "X", "cat": "cpu_op", "name": n, "pid": 1, "tid": 1, "ts": 10 * i, "dur": 5,
             "args": {"External id": i, "Input Dims": [[2, 2], [{"a": "}, {"}]]}} for i, n in enumerate(names)]


def test_separators_inside_strings_and_nested_objects_are_not_cuts(tmp_path, monkeypatch):
    names = [f"op{i} }}, {{ \"x\": 1 }}] , [ }}]" for i in range(400)]
    path = tmp_path / "tricky.json"
    path.write_text(json.dumps(_trace(_ops(names))))
    monkeypatch.setattr(kineto_json, "BLOCK", 512)
    r = read_kineto(path)
    assert sorted(r.kernels["name"]) == sorted(names)
    assert r.manifest["partial"] is False


def test_values_the_fast_decoder_refuses_cost_only_their_own_event(tmp_path, monkeypatch):
    events = _ops([f"aten::op{i}" for i in range(300)])
    text = json.dumps(_trace(events))
    # NaN, a lone surrogate escape and a float beyond double range: legal for Python's json
    text = text.replace('"aten::op7"', '"aten::op7\\ud800"').replace('"ts": 100,', '"ts": NaN,')
    text = text.replace('"dur": 5, "args": {"External id": 20,', '"dur": 1e400, "args": {"External id": 20,')
    path = tmp_path / "odd.json"
    path.write_text(text)
    monkeypatch.setattr(kineto_json, "BLOCK", 2048)
    r = read_kineto(path)
    expected = json.loads(text)["traceEvents"]
    finite = [e for e in expected if np.isfinite(e["ts"]) and np.isfinite(e["dur"])]
    assert len(finite) == len(expected) - 2 and len(r.kernels) == len(finite)
    assert "aten::op7\ufffd" in set(r.kernels["name"])  # the lone surrogate is replaced, not fatal
    assert any("2 events" in w and "ts/dur" in w for w in r.warnings)
    assert r.manifest["partial"] is False


def test_events_after_a_large_head_go_through_ijson(fixtures_dir, tmp_path):
    doc = _doc(fixtures_dir / BERT)
    padded = {"padding": "p" * (kineto_json.HEAD_KEEP + 1024), **doc}
    path = tmp_path / "padded.json"
    path.write_text(json.dumps(padded))
    _same_tables(read_kineto(path), read_kineto(fixtures_dir / BERT))


def test_metadata_after_the_events_is_read(fixtures_dir):
    doc = _doc(fixtures_dir / CPU_ONLY)
    keys = list(doc)
    assert keys.index("baseTimeNanoseconds") > keys.index("traceEvents")  # written after the array
    trace = parse_trace(fixtures_dir / CPU_ONLY)
    assert trace.meta["baseTimeNanoseconds"] == doc["baseTimeNanoseconds"]
    first = min(e["ts"] for e in doc["traceEvents"] if e.get("cat") == "cpu_op")
    k = read_kineto(fixtures_dir / CPU_ONLY).kernels
    assert k["start_ns"].min() == doc["baseTimeNanoseconds"] + round(first * 1000)


def test_parsing_holds_far_less_than_the_json_object_tree(fixtures_dir, tmp_path):
    text = gzip.decompress((fixtures_dir / A100).read_bytes())
    path = tmp_path / "a100.json"
    path.write_bytes(text)
    tracemalloc.start()
    try:
        tree = json.loads(text)
        _, tree_peak = tracemalloc.get_traced_memory()
        del tree
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        trace = parse_trace(path)
        _, parse_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert trace.n_events == len(json.loads(text)["traceEvents"])
    assert parse_peak - base < (tree_peak - base) / 4


# ---------------------------------------------------------------------------- nesting
def _stack_walk(groups, starts, ends, kinds):
    """The textbook stack walk: innermost earlier interval of the group containing each one."""
    order = sorted(range(len(starts)), key=lambda i: (groups[i], starts[i], -ends[i], kinds[i]))
    parent = [-1] * len(starts)
    stack: list[int] = []
    current = None
    for i in order:
        if groups[i] != current:
            stack, current = [], groups[i]
        while stack and not (starts[stack[-1]] <= starts[i] and ends[i] <= ends[stack[-1]]):
            stack.pop()
        parent[i] = stack[-1] if stack else -1
        stack.append(i)
    return parent


def _first_of_kind(parent, kinds, kind):
    out = []
    for i in range(len(parent)):
        p = parent[i]
        while p >= 0 and kinds[p] != kind:
            p = parent[p]
        out.append(p)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_vectorised_nesting_equals_the_stack_walk(seed):
    rng = np.random.default_rng(seed)
    n = 3000
    groups = rng.integers(0, 4, n)
    starts = rng.integers(0, 2000, n)
    ends = starts + rng.integers(0, 300, n) * (rng.random(n) < 0.9)
    kinds = rng.integers(0, 3, n)
    names = np.array([f"r{i}" for i in range(n)], dtype=object)
    got = nest(groups, starts, ends, kinds, lambda pos: names[pos], range_kind=0, op_kind=1)
    parent = _stack_walk(groups.tolist(), starts.tolist(), ends.tolist(), kinds.tolist())
    assert got.parent.tolist() == parent
    assert got.op_ancestor.tolist() == _first_of_kind(parent, kinds.tolist(), 1)
    ranges = _first_of_kind(parent, kinds.tolist(), 0)
    assert got.range_parent.tolist() == ranges
    depth = []
    for i in range(n):  # ranges around each interval, counted up the chain
        p, d = ranges[i], 0
        while p >= 0:
            d, p = d + 1, ranges[p]
        depth.append(d)
    assert got.range_depth(np.arange(n)).tolist() == depth


@pytest.mark.parametrize("n", [0, 1, 2])
def test_nesting_of_none_one_and_two_intervals(n):
    groups, kinds = np.zeros(n, dtype="int32"), np.ones(n, dtype="int8")
    starts, ends = np.arange(n, dtype="int64"), np.full(n, 10, dtype="int64")  # the second inside the first
    got = nest(groups, starts, ends, kinds, lambda pos: pos, range_kind=0, op_kind=1)
    assert got.parent.tolist() == [-1, 0][:n]
    assert got.op_ancestor.tolist() == [-1, 0][:n]
    assert got.range_parent.tolist() == [-1] * n
    assert got.parent.dtype == np.int64


def test_the_api_name_codes_the_report_holds_are_the_columns_own(fixtures_dir):
    """A large api table (33,924 calls): the name codes the report holds after its import (seeded by the
    reader's text-column pass, carried through conform, read by the idle classification) are exactly a
    fresh factorization of the column."""
    from perfscope.memo import memo_peek
    from perfscope.schema import CODES_KEY, column_codes

    report = read_kineto(fixtures_dir / A100)
    assert len(report.api) >= 20_000
    assert memo_peek(report.api, f"{CODES_KEY}name") is not None
    codes, distinct = column_codes(report.api, "name")
    fresh_codes, fresh = pd.factorize(report.api["name"].astype(object), use_na_sentinel=True)
    assert np.array_equal(codes, fresh_codes)
    assert list(distinct) == list(fresh)
    assert all(isinstance(d, str) for d in distinct) and len(distinct) > 1


def test_the_text_column_pass_seeds_only_codes_that_hold():
    """``_text_columns`` memoizes the factorization it made for the columns asked (not others), and not
    where cleaning made two texts one (two lone surrogates both become U+FFFD)."""
    from perfscope.analysis.readers.kineto.reader import SMALL_TABLE, _text_columns
    from perfscope.memo import memo_peek
    from perfscope.schema import CODES_KEY

    n = SMALL_TABLE + 5
    pool = np.array(["cudaLaunchKernel", "cudaMemcpyAsync", None, "cuda\u00e9"], dtype=object)
    names = pool[np.arange(n) % len(pool)]
    df = pd.DataFrame({"name": pd.Series(names, dtype=object), "kind": pd.Series(names[::-1], dtype=object),
                       "start_ns": np.arange(n)})
    out = _text_columns(df, ("name",))
    codes, distinct = memo_peek(out, f"{CODES_KEY}name")
    fresh_codes, fresh = pd.factorize(out["name"], use_na_sentinel=True)
    assert np.array_equal(codes, fresh_codes) and list(distinct) == list(fresh)
    assert memo_peek(out, f"{CODES_KEY}kind") is None  # not asked for
    lone = np.array(["a\ud800", "a\udc00", "b"], dtype=object)[np.arange(n) % 3]
    merged = _text_columns(pd.DataFrame({"name": pd.Series(lone, dtype=object), "start_ns": np.arange(n)}), ("name",))
    assert set(merged["name"]) == {"a\ufffd", "b"}
    assert memo_peek(merged, f"{CODES_KEY}name") is None  # its codes would name one text twice
