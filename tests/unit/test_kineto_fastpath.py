"""The Kineto reader's fast paths change no value.

- The block decode (msgspec into small structs, absent raw args sharing one empty value) and the
  event-by-event slow path (orjson dicts turned into the same structs) give the same columns.
- CUDA-graph replays are priced from the nearest eager reference step of their own phase (else the
  nearest prefill): a tiled trace prices every copy's replays as the single trace does, whatever
  the number of copies (the search is a bisection, no longer a sort per replay).
- The eager twin table (integer keys of name, grid and block) keeps its meaning: a (name, grid,
  block) has a twin only when every eager kernel of it carries one known cost.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest

from perfscope.analysis.readers.kineto import parse as kineto_parse
from perfscope.analysis.readers.kineto.graphs import _nearest
from perfscope.analysis.readers.kineto.parse import parse_trace
from perfscope.analysis.readers.kineto.reader import import_kineto

REPO = Path(__file__).resolve().parents[2]
CUDAGRAPH = "h200/h200_llama1b_engine_cudagraph.pt.trace.json.gz"
REAL = ("kineto/hta_negative_queue_length_values_check__rank0.json.gz",
        "kineto/tracelens_h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
        "kineto/kineto_resnet50_v100_2021.pt.trace.json.gz", CUDAGRAPH)


def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_ingest", REPO / "benchmarks" / "ingest.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _same_parse(a, b) -> None:
    assert a.n_events == b.n_events and a.partial == b.partial and a.warnings == b.warnings
    assert list(a.strings) == list(b.strings)
    assert a.sigs == b.sigs
    assert a.cpu.keys() == b.cpu.keys()
    for name in a.cpu:
        np.testing.assert_array_equal(a.cpu[name], b.cpu[name], err_msg=name)
    assert a.cols.keys() == b.cols.keys()
    for kind in a.cols:
        for name in a.cols[kind]:
            np.testing.assert_array_equal(a.cols[kind][name], b.cols[kind][name], err_msg=f"{kind}.{name}")


@pytest.mark.parametrize("rel", REAL)
def test_the_block_decode_equals_the_event_by_event_path(fixtures_dir, monkeypatch, rel):
    fast = parse_trace(fixtures_dir / rel)
    assert fast.count("kernel") > 0
    monkeypatch.setattr(kineto_parse, "FAST", False)  # the plain decoder: every field as it is
    plain = parse_trace(fixtures_dir / rel)
    _same_parse(fast, plain)
    monkeypatch.setattr(kineto_parse, "decode_block", lambda text: None)  # every block read event by event
    slow = parse_trace(fixtures_dir / rel)
    _same_parse(fast, slow)
    assert (fast.cpu["sig"] >= 0).any()  # the raw args (input shapes) were read on both paths


def test_the_fast_decoder_reads_every_phase_and_hands_an_odd_block_to_the_plain_one(fixtures_dir, monkeypatch,
                                                                                   tmp_path):
    """The fast decoder (a union tagged by ``ph``, float ``ts``/``dur``) takes every phase of the
    format; a block it refuses (an event without ``ph``, an unknown phase, a string ``ts``) goes to
    the plain decoder, and the rows are the plain decoder's whichever block the odd event is in."""
    phases = "XBEbnestfPNODMVvRCc()iI"
    events = [{"ph": ph, "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 5, "dur": 1} for ph in phases]
    decoder = kineto_parse._Decoder()
    assert [e.ph for e in decoder(orjson.dumps(events))] == list(phases)
    assert decoder.fast
    for odd in ({"cat": "cpu_op", "name": "x", "ts": 1, "dur": 1}, {"ph": "Q", "cat": "cpu_op"},
                {"ph": "X", "cat": "cpu_op", "name": "x", "ts": "7", "dur": 1}):
        decoder = kineto_parse._Decoder()
        assert decoder(orjson.dumps([*events, odd])) is not None and not decoder.fast
    with gzip.open(fixtures_dir / REAL[0]) as fh:  # 109k events: the odd one lands in a middle block
        doc = orjson.loads(fh.read())
    trace = doc["traceEvents"]
    middle = len(trace) // 2
    trace.insert(middle, {"ph": "X", "cat": "cpu_op", "name": "aten::odd", "pid": 1, "tid": 1,
                          "ts": str(trace[middle].get("ts", 0)), "dur": 2})
    trace.insert(middle + 1, {"cat": "cpu_op", "name": "aten::no_phase", "pid": 1, "tid": 1, "ts": 3, "dur": 2})
    path = tmp_path / "odd.json"
    path.write_bytes(orjson.dumps(doc))
    fast = parse_trace(path)
    assert {"aten::odd", "aten::no_phase"} <= set(fast.strings)
    monkeypatch.setattr(kineto_parse, "FAST", False)
    _same_parse(fast, parse_trace(path))


def test_args_read_per_kind_match_the_plain_and_slow_paths_whatever_their_shape(monkeypatch, tmp_path):
    """The fast decoder keeps ``args`` as raw text and decodes each kind's at once into its own small
    struct: absent, ``null``, ``{}``, a number, a list or full args give the same rows as the plain
    decoder (one struct for every kind) and the event-by-event path, memory events included."""
    shapes = ({"absent": True}, None, {}, 5, [1], {"External id": 7, "correlation": 9, "device": 1, "stream": 3,
              "grid": [2, 1, 1], "block": [64, 1, 1], "bytes": 4096, "Input Dims": [[2, 3]], "Input type": ["float"],
              "Python id": 4, "Python parent id": 2, "kernel": "k", "Process Group Name": "0"})
    cats = ("cpu_op", "user_annotation", "kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver",
            "python_function")
    events: list[dict] = []
    for i, (cat, args) in enumerate((c, a) for c in cats for a in shapes):
        event = {"ph": "X", "cat": cat, "name": f"aten::e{i}" if cat == "cpu_op" else f"e{i}", "pid": 1, "tid": 2,
                 "ts": 10 + i, "dur": 1}
        if not (isinstance(args, dict) and args.get("absent")):
            event["args"] = args
        events.append(event)
    for i, args in enumerate(shapes):
        event = {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 2, "ts": 50 + i}
        if not (isinstance(args, dict) and args.get("absent")):
            event["args"] = {"Bytes": 512, "Total Allocated": 1024, "Addr": 99, "Device Id": 0} if args == shapes[-1] else args
        events.append(event)
    path = tmp_path / "args.json"
    path.write_bytes(orjson.dumps({"traceEvents": events}))
    fast = parse_trace(path)
    assert fast.count("kernel") == len(shapes) and fast.count("mem") == 2  # {} and full args (none of the others)
    monkeypatch.setattr(kineto_parse, "FAST", False)
    _same_parse(fast, parse_trace(path))
    monkeypatch.setattr(kineto_parse, "decode_block", lambda text: None)
    _same_parse(fast, parse_trace(path))


def test_every_copy_of_a_tiled_graph_trace_is_priced_as_the_single_trace(fixtures_dir, tmp_path):
    single = import_kineto(fixtures_dir / CUDAGRAPH).tables["kernels"]
    plain, _, _ = _bench().build(fixtures_dir / CUDAGRAPH, tmp_path, 5, gzip=False)
    tiled = import_kineto(plain).tables["kernels"]
    n = len(single)
    assert len(tiled) == 5 * n
    graph = single["flops_source"].astype("object").str.startswith("graph").fillna(False).to_numpy(bool)
    assert graph.sum() > 1000  # the replays are priced (graph-shapes, graph-scaled, graph-match)
    for k in range(5):  # each copy's rows in start order are the single trace's, priced alike
        copy = tiled.iloc[k * n:(k + 1) * n].reset_index(drop=True)
        for col in ("name", "op", "op_shapes", "flops_source", "category"):
            pd.testing.assert_series_equal(copy[col], single[col], check_names=False)
        np.testing.assert_array_equal(copy["flops"].to_numpy(), single["flops"].to_numpy())
        np.testing.assert_array_equal(copy["dram_bytes"].to_numpy(), single["dram_bytes"].to_numpy())


@pytest.mark.parametrize(("refs", "step", "want"), [
    ([3], 0, 3), ([3], 9, 3), ([1, 5], 3, 1), ([1, 5], 4, 5), ([1, 5], 2, 1), ([1, 5, 9], 9, 9),
    ([1, 5, 9], 7, 5), ([1, 5, 9], 8, 9), ([2, 4], 3, 2)])
def test_the_nearest_reference_step_takes_the_earlier_of_two_as_near(refs, step, want):
    assert _nearest(refs, step) == want
    # the definition it replaces: the first of the ascending refs at the least distance
    assert want == min(refs, key=lambda s: abs(s - step))
