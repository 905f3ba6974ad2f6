"""What is live at the peak instant (docs/memory.md, "At an instant"), checked against direct replays.

- every committed snapshot: the live tensors at the peak equal a direct replay's live blocks there,
  and the breakdown by category adds up to the peak's allocated bytes; the MI300X profile_memory
  trace: the breakdown adds up to the allocator's own Total Allocated at its peak;
- a built snapshot whose peak is transient (two 1.07 GB attention-score tensors, freed before the
  end): the largest live tensors at the peak are a replay's, with their op, line and free event, and
  the memory-peak finding names them and the fused attention that would not make them;
- a built snapshot with parameters allocated before the record plus leftovers of other shapes: only
  the parameters are weights (by the model's config), leftovers of the record's activation sizes are
  activations, the rest ``before_recording``, each with its rule;
- a snapshot without ``time_us``: its peak is an event ("event N of M"), never INT64_MIN, no warning.
"""

from __future__ import annotations

import gzip
import json
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.findings import run_rules
from perfscope.analysis.memory import with_steps
from perfscope.analysis.readers.detect import import_file
from perfscope.analysis.readers.snapshot import load_snapshot
from perfscope.analysis.summaries.memory import (
    breakdown,
    by_category,
    instant,
    live_at,
    parse_instant,
    peaks,
)
from perfscope.cli import main
from perfscope.errors import UsageError

from .memory_snapshots import Snapshot, frames, replay

SNAPSHOTS = ["memory/cs336_notHanmin_xl_forward/memory_snapshot_forward.pickle",
             "memory/cs336_notHanmin_xl_forward/memory_snapshot_forward_without_mixed.pickle"]
MI300X = "memory/tracelens_mi300x_normalization_profile_memory/normalization_layer_test.json.gz"
GB = 1 << 30


class _PlainData(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> None:
        raise AssertionError(f"{module}.{name}")


def _plain(path: Path) -> dict:
    with open(path, "rb") as fh:
        return _PlainData(fh).load()


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_live_at_the_peak_is_a_replays(fixtures_dir: Path, name: str) -> None:
    path = fixtures_dir / name
    report = import_file(path)
    (p,) = peaks(report)
    levels, _ = replay(_plain(path))
    assert p["peak_allocated_bytes"] == max(levels) and p["event"] == int(np.argmax(levels))
    _, live = replay(_plain(path), upto=p["event"])
    got = live_at(report, "cuda:0", p["event"])
    assert dict(zip(got["addr"].astype("int64").tolist(), got["size_bytes"].astype("int64").tolist())) == live
    cats = by_category(report, "cuda:0", p["event"])
    assert abs(sum(cats.values()) - p["peak_allocated_bytes"]) <= 0.01 * p["peak_allocated_bytes"]
    assert sum(cats.values()) == p["peak_allocated_bytes"]  # exactly, in fact
    b = p["breakdown"]
    # beside, not inside: reserved, reserved-but-unused and fragmentation are not categories
    assert not {"fragmentation", "reserved"} & set(b["by_category"])
    assert b["reserved_unused_bytes"] == b["reserved_bytes"] - b["allocated_bytes"] >= b["fragmentation_bytes"] > 0
    assert b["at"].startswith(f"event {p['event'] + 1:,} of {p['events']:,}")
    assert b["tensors"][0]["bytes"] == got["size_bytes"].max()
    # the parameters before the record are named by the optimizer states of their shapes, said so
    rules = b["category_rules"]["weights"]
    assert rules == ["parameter-shaped: the record holds an optimizer state or gradient of this size"]


def test_mi300x_breakdown_adds_up_to_total_allocated(fixtures_dir: Path) -> None:
    path = fixtures_dir / MI300X
    with gzip.open(path, "rt") as fh:
        raw = [e["args"] for e in json.load(fh)["traceEvents"] if e.get("name") == "[memory]"]
    report = import_file(path)
    for p in peaks(report):
        dev_type = 0 if p["device"] == "cpu" else 6
        assert p["peak_allocated_bytes"] == max(a["Total Allocated"] for a in raw if a["Device Type"] == dev_type)
        cats = p["breakdown"]["by_category"]
        assert abs(sum(cats.values()) - p["peak_allocated_bytes"]) <= 0.01 * p["peak_allocated_bytes"]
        if p["device"] == "cuda:0":  # what the allocator counted before the trace, and no event names
            assert cats["before_recording"] > 0
            assert p["breakdown"]["category_rules"]["before_recording"] == [
                "in the allocator's total before the record began; no event names it"]


# ---------------------------------------------------------------------------- a transient peak
LLAMA = "/usr/lib/python3.12/site-packages/transformers/models/llama/modeling_llama.py"
SCRIPT = "/home/user/generate.py"


def _transient_peak(time: bool = True) -> Snapshot:
    """Weights from before the record; a 4-layer eager-attention forward whose every layer makes two
    1.07 GB score tensors (QK^T / sqrt(d) by aten::div at modeling_llama.py:330, then the softmax),
    freed before the next layer; the last layer's scores are the peak, and at the end only the
    weights and a small output are live."""
    s = Snapshot(time=time)
    outer = [(SCRIPT, 20, "main")]
    weights = [s.before(200 << 20) for _ in range(12)]
    assert weights
    hidden = s.alloc(32 << 20, frames("embedding", [(LLAMA, 700, "forward"), *outer]))
    for layer in range(4):
        q = s.alloc(32 << 20, frames("mm", [(LLAMA, 310, "forward"), *outer]))
        k = s.alloc(32 << 20, frames("mm", [(LLAMA, 311, "forward"), *outer]))
        scores = s.alloc(GB, frames("bmm", [(LLAMA, 330, "forward"), *outer]))
        scaled = s.alloc(GB + layer * 4096, frames("div_Tensor", [(LLAMA, 330, "forward"), *outer]))
        s.free(scores)
        probs = s.alloc(GB + layer * 4096, frames("_softmax", [(LLAMA, 335, "forward"), *outer]))
        if layer == 3:  # the peak: hidden, q, k, the scaled scores and their softmax
            peak_live = {scaled, probs}
        s.free(scaled)
        out = s.alloc(32 << 20, frames("bmm", [(LLAMA, 340, "forward"), *outer]))
        for a in (q, k, probs):
            s.free(a)
        s.free(hidden)
        hidden = out
    logits = s.alloc(8 << 20, frames("mm", [(LLAMA, 1200, "forward"), *outer]))
    s.free(logits)
    s.peak_live = peak_live  # type: ignore[attr-defined]
    return s


def test_transient_peak_is_what_a_replay_holds_there(tmp_path: Path) -> None:
    s = _transient_peak()
    path = tmp_path / "transient.pickle"
    s.write(path)
    report = import_file(path)
    (p,) = peaks(report)
    levels, live = replay(s.dump(), upto=p["event"])
    assert p["peak_allocated_bytes"] == max(levels) > 2 * GB + 12 * (200 << 20)
    b = p["breakdown"]
    got = live_at(report, "cuda:0", p["event"])
    assert dict(zip(got["addr"].astype("int64"), got["size_bytes"].astype("int64"))) == live
    assert sum(b["by_category"].values()) == p["peak_allocated_bytes"]
    top2 = b["tensors"][:2]
    assert {int(got["addr"].iloc[0]), int(got["addr"].iloc[1])} == s.peak_live  # type: ignore[attr-defined]
    assert [t["op"] for t in top2] == ["aten::div", "aten::_softmax"]  # same size: in the order they were made
    assert top2[0]["source"] == "modeling_llama.py:330 forward" and top2[0]["stack"].endswith("generate.py:20 main")
    assert all(t["role"] == "attention_scores" and not t["still_live"] and t["free_event"] > p["event"]
               for t in top2)
    # the end state is very different from the peak (the old defect showed the end as "held at the peak")
    end = breakdown(report, "cuda:0", p["events"] - 1)
    assert end["allocated_bytes"] <= p["peak_allocated_bytes"] - 2 * GB
    assert not any(t["role"] == "attention_scores" for t in end["tensors"])
    # the finding, in the words of the evidence, with the bytes a fused attention saves
    (f,) = run_rules(report, rules=["memory-peak"])
    assert ("two 1.07 GB attention-score tensors from modeling_llama.py:330 forward (aten::div) and "
            "modeling_llama.py:335 forward (aten::_softmax) are live, freed after the peak") in f.title
    assert "scaled_dot_product_attention" in f.recommendation
    assert f.evidence["attention_scores_saving_bytes"] == sum(t["bytes"] for t in top2)
    tensors = [i for i in f.items if i.kind == "tensor"]
    assert tensors and tensors[0].attrs["bytes"] == top2[0]["bytes"] and "modeling_llama.py:330" in tensors[0].label
    assert tensors[0].explains and tensors[0].attrs["free_event"] == top2[0]["free_event"] + 1
    # logits, KV or weights advice is not given where no such tensor holds the peak
    assert "logits_to_keep" not in f.recommendation and "fp8" not in f.recommendation


def test_instant_a_user_picks(tmp_path: Path) -> None:
    s = _transient_peak()
    path = tmp_path / "t.pickle"
    s.write(path)
    report = import_file(path)
    n = peaks(report)[0]["events"]
    assert instant(report, "cuda:0", event=5) == 5
    t0 = int(report.memory["t_ns"].min())
    assert instant(report, "cuda:0", t_ns=t0 + 7_000 * 3 + 10) == 3  # events are 7 us apart: the last one at or before
    assert parse_instant("event:12") == {"event": 11} and parse_instant("time:1.5ms") == {"t_offset_ns": 1.5e6}
    assert parse_instant("step:2") == {"step": 2} and parse_instant("phase:decode") == {"phase": "decode"}
    assert main(["import", str(path), "--out", str(tmp_path / "r"), "--no-html"]) == 0
    out = subprocess.run([sys.executable, "-W", "error", "-m", "perfscope", "analyze", str(tmp_path / "r.perfscope"),
                          "--memory", "--memory-at", f"event:{n}"], capture_output=True, text=True, check=True).stdout
    assert f"cuda:0 at event {n:,} of {n:,}" in out and "live there, by category" in out
    doc = json.loads(subprocess.run([sys.executable, "-W", "error", "-m", "perfscope", "analyze",
                                     str(tmp_path / "r.perfscope"), "--json", "--memory-at", "time:0.3ms"],
                                    capture_output=True, text=True, check=True).stdout)
    (at,) = doc["memory"]["at"]
    assert at["event"] == instant(report, "cuda:0", t_ns=t0 + 300_000) and at["at"].startswith(f"event {at['event'] + 1}")
    assert sum(at["by_category"].values()) == at["allocated_bytes"]
    # a step or a phase (rows outside every step have none): the highest allocated bytes within it
    steps = pd.DataFrame({"step": [0, 1, 2], "phase": ["prefill", "decode", "decode"],
                          "start_ns": [t0 + 7_000 * 2, t0 + 7_000 * 20, t0 + 7_000 * 10_000],
                          "end_ns": [t0 + 7_000 * 9, t0 + 7_000 * 40, t0 + 7_000 * 10_001]})
    stepped = report.replace(memory=with_steps(report.memory, steps))
    mem = stepped.memory
    assert str(mem["step"].dtype) == "Int64" and mem["step"].isna().any()
    for (lo, hi), pick in (((2, 9), {"step": 0}), ((2, 9), {"phase": "prefill"}), ((20, 40), {"step": 1})):
        rows = mem[(mem["t_ns"] >= t0 + 7_000 * lo) & (mem["t_ns"] <= t0 + 7_000 * hi)]
        best = int(rows["event"].iloc[int(np.argmax(rows["allocated_bytes"].to_numpy("float64", na_value=np.nan)))])
        assert instant(stepped, "cuda:0", **pick) == best
    with pytest.raises(UsageError, match="no memory events in step 2"):
        instant(stepped, "cuda:0", step=2)


# ---------------------------------------------------------------------------- before the record
CONFIG = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 688, "vocab_size": 1000,
          "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def _parameters() -> list[int]:
    """Byte sizes of the tiny Llama's parameters (bf16), as the model allocates them."""
    h, kv, inter, v = 256, 2 * 64, 688, 1000
    layer = [h * h, kv * h, kv * h, h * h, inter * h, inter * h, h * inter, h, h]
    return [2 * n for n in [v * h, *layer * 2, h, v * h]]


def test_before_the_record_only_parameters_are_weights(tmp_path: Path) -> None:
    s = Snapshot()
    params = [s.before(n) for n in _parameters()]
    act = 1 * 128 * 688 * 2  # an MLP activation of the record, made and freed each layer
    leftovers = [s.before(act) for _ in range(3)]  # an earlier run's activations, of the record's shape
    odd = [s.before(777_777) for _ in range(2)]  # nothing in the record has this size
    for layer in range(2):
        a = s.alloc(act, frames("mm", [("/home/user/model.py", 40 + layer, "forward")]))
        s.free(a)
    path = tmp_path / "before.pickle"
    s.write(path)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    out = tmp_path / "r.perfscope"
    assert main(["import", str(path), "--model", str(config), "--out", str(out), "--no-html"]) == 0
    from perfscope.report import Report

    mem = Report.load(out).memory
    pre = mem[mem["preexisting"].astype(bool) & (mem["action"] == "alloc")].set_index(
        mem.loc[mem["preexisting"].astype(bool) & (mem["action"] == "alloc"), "addr"].astype("int64"))
    assert set(pre.index[pre["category"] == "weights"]) == set(params)
    assert (pre.loc[params, "category_rule"] == "its size is that of a parameter of tmp0 (bf16/fp16)").all() or \
        pre.loc[params, "category_rule"].str.startswith("its size is that of a parameter of").all()
    assert (pre.loc[leftovers, "category"] == "activations").all()
    assert pre.loc[leftovers, "category_rule"].str.contains("leftover from before the record").all()
    assert pre.loc[leftovers, "category_rule"].str.contains(r"model\.py:4\d forward", regex=True).all()
    assert (pre.loc[odd, "category"] == "before_recording").all()
    # without the config nothing says what the parameters are: they are before_recording, said so
    plain = import_file(path).memory
    plain_pre = plain[plain["preexisting"].astype(bool) & (plain["action"] == "alloc")]
    assert not (plain_pre["category"] == "weights").any()
    assert (plain_pre["category"] == "before_recording").sum() == len(params) + len(odd)
    assert set(plain_pre.loc[plain_pre["category"] == "before_recording", "category_rule"]) == {
        "allocated before the record began; nothing in the record says what it is"}


# ---------------------------------------------------------------------------- no time_us
def test_snapshot_without_time_us_has_an_event_clock(tmp_path: Path) -> None:
    s = _transient_peak(time=False)
    path = tmp_path / "notime.pickle"
    s.write(path)
    assert "time_us" not in s.events[0]
    run = [sys.executable, "-W", "error", "-m", "perfscope"]
    subprocess.run([*run, "import", str(path), "--out", str(tmp_path / "n.perfscope")], check=True,
                   capture_output=True, text=True)
    doc = subprocess.run([*run, "analyze", str(tmp_path / "n.perfscope"), "--json"], check=True,
                         capture_output=True, text=True)
    assert "Warning" not in doc.stderr and "-9223372036854775808" not in doc.stdout
    payload = json.loads(doc.stdout)
    (p,) = payload["memory"]["peaks"]
    assert payload["memory"]["clock"] == "events" and p["t_ns"] is None
    assert p["at"] == f"event {p['event'] + 1:,} of {p['events']:,}"
    assert p["breakdown"]["tensors"][0]["role"] == "attention_scores"
    text = subprocess.run([*run, "analyze", str(tmp_path / "n.perfscope"), "--memory"], check=True,
                          capture_output=True, text=True).stdout
    assert f"at event {p['event'] + 1:,} of {p['events']:,} (snapshot)" in text and "+" not in text.splitlines()[0]
    finding = next(f for f in payload["findings"] if f["id"] == "memory-peak")
    assert f"event {p['event'] + 1:,} of" in finding["title"]
    assert all(i["start_ns"] is None for i in finding["items"])  # no clock: no place on a time axis


def test_stream_reads_every_layout_the_same(fixtures_dir: Path, tmp_path: Path) -> None:
    """Protocols 2 to 5, the C and the Python pickler, memo or not: one table; the events streamed
    through the sink (never built as one list) in every one."""
    path = fixtures_dir / SNAPSHOTS[1]
    snap = _plain(path)
    want = import_file(path).memory
    for proto, fast, pickler in ((2, False, pickle.Pickler), (4, True, pickle.Pickler), (4, True, pickle._Pickler),
                                 (5, False, pickle.Pickler)):
        out = tmp_path / f"p{proto}{fast}{pickler.__name__}.pickle"
        with open(out, "wb") as f:
            pk = pickler(f, protocol=proto)
            pk.fast = fast
            pk.dump(snap)
        _, got = load_snapshot(out)
        assert type(got.traces[0]) is not list  # a sink: the events were read batch by batch
        mem = import_file(out).memory
        np.testing.assert_array_equal(mem["allocated_bytes"].to_numpy(), want["allocated_bytes"].to_numpy())
        assert (mem["source"].fillna("") == want["source"].fillna("")).all()


def test_list_bytes_inside_a_string_import_right(tmp_path: Path) -> None:
    """A frame name holding the bytes of a list of dicts (``](}(``) in a file written without a memo:
    the sink put there breaks the pickle, and the file is read again as it is."""
    s = _transient_peak()
    s.events[5]["frames"][-1]["name"] = "weird](}(name"
    path = tmp_path / "odd.pickle"
    with open(path, "wb") as f:
        pk = pickle.Pickler(f, protocol=4)
        pk.fast = True
        pk.dump(s.dump())
    assert b"](}(" in path.read_bytes()
    good = tmp_path / "good.pickle"
    s.write(good)
    np.testing.assert_array_equal(import_file(path).memory["allocated_bytes"].to_numpy(),
                                  import_file(good).memory["allocated_bytes"].to_numpy())


def test_the_peak_headline_counts_a_large_group_in_numerals_then_its_size(fixtures_dir: Path) -> None:
    """The forward snapshot's largest group at its peak is 287 optimizer states of one allocator block size:
    the headline reads "287 optimizer states of 41.9 MB each" (a numeral before a size read "287 41.9 MB"),
    and the count and size are a direct replay's (the live blocks of that size at the peak)."""
    from perfscope.format import nbytes

    path = fixtures_dir / SNAPSHOTS[0]
    report = import_file(path)
    (p,) = peaks(report)
    _, live = replay(_plain(path), upto=p["event"])
    (finding,) = [f for f in run_rules(report) if "memory peaks at" in f.title]
    m = re.search(r": ([\d,]+) optimizer states of ([\d.]+ [kMGT]?B) each from ", finding.title)
    assert m, finding.title
    n, size = int(m[1].replace(",", "")), m[2]
    assert n > 12
    sizes = [s for s in live.values() if nbytes(float(s)) == size]
    assert len(sizes) >= n  # the group is the optimizer states among the blocks of that size


@pytest.mark.parametrize(("name", "device"), [("kineto/nanovllm_cpu_kv_attention__forward_10.json.gz", "cuda:0"),
                                              ("kineto/tracelens_h100__gaunernst_bert-small-uncased__1016001.json.gz",
                                               "cuda:0")])
def test_bytes_from_before_the_record_are_said_not_hidden(fixtures_dir: Path, name: str, device: str) -> None:
    """A Kineto memory record counts every allocated byte in its total but records tensors only for what was
    allocated while it ran: nano-vllm's 9.88 GB peak holds KB of recorded tensors (its weights and KV cache came
    before). The finding says how much of the peak no recorded tensor accounts for (the peak minus the live tensors
    at it, computed here from live_at) and how to record it, instead of "no kind of tensor holds enough"."""
    report = import_file(fixtures_dir / name)
    (p,) = [p for p in peaks(report) if p["device"] == device]
    live = live_at(report, device, p["event"])
    unrecorded = p["peak_allocated_bytes"] - float(live["size_bytes"].sum())
    assert unrecorded > 0.5 * p["peak_allocated_bytes"]
    (f,) = [f for f in run_rules(report) if f.id == "memory-peak" and f.title.startswith(device)]
    assert f.evidence["unrecorded_bytes"] == pytest.approx(unrecorded)
    assert "was allocated before the record began" in f.recommendation
    assert "_record_memory_history" in f.recommendation and "No kind of tensor" not in f.recommendation
    (item,) = [i for i in f.items if i.attrs.get("role") == "before_recording" and not i.explains]
    assert item.attrs["bytes"] == pytest.approx(unrecorded)
