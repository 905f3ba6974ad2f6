"""``perfscope export``: the Perfetto protobuf read back with Perfetto's own schema (the
``perfetto`` package's ``perfetto_trace_pb2``) and the Chrome JSON read back as JSON hold exactly
the report's kernels (count and total time), ranges, steps and counter samples; secrets in a
trace's metadata never reach the report or an export."""

from __future__ import annotations

import gzip
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from perfscope.cli import main
from perfscope.collectors.nvml import METRICS, counters_frame
from perfscope.dashboard.export.perfetto import export_trace
from perfscope.errors import OutputExistsError
from perfscope.report import Report

pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")

ENGINE = "cpu-small-b1-p128-g32.perfscope"


@pytest.fixture(scope="module")
def engine(sample_reports_dir: Path) -> Report:
    """The engine sample with 50 NVML samples on two devices (known values) attached."""
    report = Report.load(sample_reports_dir / ENGINE)
    t0 = int(report.kernels["start_ns"].min())
    rows = [(k * 10_000_000, k % 2, tuple(float(k * 10 + m) if m != 4 or k % 5 else math.nan
                                          for m in range(len(METRICS)))) for k in range(50)]
    return report.replace(counters=counters_frame(rows, ["cuda:0", "cuda:1"], start_time_ns=t0, start_perf_counter_ns=0))


def _read_pftrace(path: Path) -> dict:
    trace = pb.Trace.FromString(path.read_bytes())
    tracks, names, slices, open_, counters = {}, {}, Counter(), {}, Counter()
    durations: dict[str, int] = Counter()
    args: list[dict] = []
    for p in trace.packet:
        if p.HasField("track_descriptor"):
            tracks[p.track_descriptor.uuid] = (p.track_descriptor.name, p.track_descriptor.parent_uuid)
        for n in p.interned_data.event_names:
            names[n.iid] = n.name
        if not p.HasField("track_event"):
            continue
        ev = p.track_event
        if ev.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            open_.setdefault(ev.track_uuid, []).append((p.timestamp, names[ev.name_iid]))
            args.append({a.name: (a.string_value or a.int_value or a.double_value) for a in ev.debug_annotations}
                        | {"_track": ev.track_uuid, "_name": names[ev.name_iid]})
        elif ev.type == pb.TrackEvent.TYPE_SLICE_END:
            start, _ = open_[ev.track_uuid].pop()
            group = tracks[tracks[ev.track_uuid][1]][0]
            slices[group] += 1
            durations[group] += p.timestamp - start
        elif ev.type == pb.TrackEvent.TYPE_COUNTER:
            counters[tracks[ev.track_uuid][0]] += 1
    assert all(not v for v in open_.values())  # every slice closed
    return {"tracks": tracks, "slices": slices, "durations": durations, "counters": counters, "args": args,
            "names": set(names.values())}


def test_pftrace_holds_exactly_the_reports_kernels_and_counters(engine: Report, tmp_path: Path) -> None:
    out = tmp_path / "engine.pftrace"
    stats = export_trace(engine, out)
    got = _read_pftrace(out)
    k = engine.kernels
    groups = {name for name, parent in got["tracks"].values() if not parent}
    kernel_group = next(g for g in groups if g.startswith("kernels"))
    assert got["slices"][kernel_group] == len(k) == stats.kernels
    assert got["durations"][kernel_group] == int(k["duration_ns"].sum())
    assert got["names"] >= set(k["name"].astype(str))
    assert got["slices"]["host"] == len(engine.ranges)
    assert got["slices"]["engine"] == len(engine.steps) + engine.steps["phase"].ne(engine.steps["phase"].shift()).sum()
    # counter samples: every non-missing value, one track per device and metric
    c = engine.counters
    expected = {f"{d} {m}": int(c.loc[c["device"] == d, m].notna().sum()) for d in ("cuda:0", "cuda:1") for m in METRICS}
    assert dict(got["counters"]) == {name: n for name, n in expected.items() if n}
    assert sum(got["counters"].values()) == stats.counter_samples == int(c[list(METRICS)].notna().sum().sum())
    # a kernel's args: phase, step, module path, costs; nothing invented for missing values
    first_layer = next(a for a in got["args"] if a.get("module") == "layer.3/attn" and a.get("phase") == "decode")
    assert {"flops", "dram_bytes", "op", "bound", "flop_per_byte"} <= set(first_layer)
    kernel_tracks = {u for u, (_, parent) in got["tracks"].items() if parent and got["tracks"][parent][0] == kernel_group}
    kernel_args = [a for a in got["args"] if a["_track"] in kernel_tracks]
    assert len(kernel_args) == len(k)
    assert sum("step" in a for a in kernel_args) == int(k["step"].notna().sum())
    assert sum("flops" in a for a in kernel_args) == int(k["flops"].notna().sum())
    assert sum("pct_of_roof" in a for a in kernel_args) == int(k["pct_of_roof"].notna().sum())


def test_chrome_json_has_the_same_counts(engine: Report, tmp_path: Path) -> None:
    out = tmp_path / "engine.json"
    export_trace(engine, out, format="chrome")
    doc = json.loads(out.read_text())
    events = doc["traceEvents"]
    kernels = [e for e in events if e["ph"] == "X" and e["cat"] == "kernel"]
    assert len(kernels) == len(engine.kernels)
    assert sum(e["dur"] for e in kernels) * 1000 == pytest.approx(float(engine.kernels["duration_ns"].sum()), rel=1e-9)
    assert sum(1 for e in events if e["ph"] == "C") == int(engine.counters[list(METRICS)].notna().sum().sum())
    assert sum(1 for e in events if e["ph"] == "X" and e["cat"] == "range") == len(engine.ranges)
    assert min(e["ts"] for e in kernels) >= 0
    steps = [e for e in kernels if "step" in e["args"]]
    assert {e["args"]["step"] for e in steps} <= set(engine.steps["step"].astype(int))


def test_gpu_report_streams_and_launch_calls(fixtures_dir: Path, tmp_path: Path) -> None:
    report = Report.load(fixtures_dir / "h200" / "h200_llama1b_b1_p2048_g64.perfscope")
    out = tmp_path / "h200.pftrace"
    export_trace(report, out)
    got = _read_pftrace(out)
    kernel_tracks = {name for name, parent in got["tracks"].values()
                     if parent and got["tracks"][parent][0].startswith("kernels")}
    expected = {f"{d} stream {int(s)}" for d, s in report.kernels[["device", "stream"]].drop_duplicates().itertuples(index=False)}
    assert kernel_tracks == expected
    kernel_group = next(n for n, p in got["tracks"].values() if not p and n.startswith("kernels"))
    assert got["slices"][kernel_group] == len(report.kernels)
    assert got["slices"]["host"] == len(report.ranges) + len(report.api)


def test_export_refuses_to_overwrite_and_the_cli_reports(engine: Report, tmp_path: Path, sample_reports_dir: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.pftrace"
    out.write_bytes(b"keep")
    with pytest.raises(OutputExistsError):
        export_trace(engine, out)
    assert out.read_bytes() == b"keep"
    assert main(["export", str(sample_reports_dir / ENGINE), "-o", str(out)]) != 0
    assert "Traceback" not in capsys.readouterr().err
    assert main(["export", str(sample_reports_dir / ENGINE), "-o", str(out), "--force", "--format", "chrome"]) == 0
    assert f"{len(engine.kernels):,} kernel slices" in capsys.readouterr().out
    json.loads(out.read_text())


SECRETS = ("hf_PERFSCOPEtestSECRET0123456789", "AKIAPERFSCOPETESTKEY9", "sk-perfscope-test-secret-value")


def test_secrets_in_trace_metadata_reach_no_report_and_no_export(fixtures_dir: Path, tmp_path: Path) -> None:
    """A trace whose metadata holds an environment block with tokens and keys (the TraceLens H100
    traces have one; its HF token was redacted in the fixture, so real-looking ones are put back)."""
    with gzip.open(fixtures_dir / "kineto" / "tracelens_h100__gaunernst_bert-small-uncased__1016001.json.gz") as f:
        doc = json.load(f)
    text = json.dumps(doc)
    assert "<redacted>" in text
    env = {"HF_TOKEN": SECRETS[0], "AWS_ACCESS_KEY_ID": SECRETS[1], "OPENAI_API_KEY": SECRETS[2]}
    text = text.replace('"<redacted>"', json.dumps(SECRETS[0]))
    doc = json.loads(text)
    doc["metadata"]["environment"] = env
    doc["distributedInfo"] = {"backend": "nccl", "env": env}
    trace = tmp_path / "with_secrets.json"
    trace.write_text(json.dumps(doc))
    assert all(s in trace.read_text() for s in SECRETS)
    report_dir = tmp_path / "r.perfscope"
    assert main(["import", str(trace), "--out", str(report_dir)]) == 0
    report = Report.load(report_dir)
    outputs = [export_trace(report, tmp_path / "t.pftrace").path, export_trace(report, tmp_path / "t.json", format="chrome").path,
               report.to_html(tmp_path / "r.html")]
    files = [p for p in report_dir.rglob("*") if p.is_file()] + outputs
    assert len(files) >= 4
    for path in files:
        data = path.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in data, f"{secret} reached {path.name}"
    assert len(report.kernels) == 60 and np.isfinite(report.kernels["duration_ns"]).all()


@pytest.mark.parametrize("fmt", ["perfetto", "chrome"])
def test_lean_folder_read_writes_the_same_trace(fixtures_dir: Path, tmp_path: Path, fmt: str) -> None:
    """``perfscope export FOLDER`` reads the folder lean (lean_report); the file is the one the
    loaded Report gives."""
    from perfscope.analysis.findings import run_rules
    from perfscope.dashboard.export.perfetto import lean_report

    folder = fixtures_dir / "h200" / "h200_llama1b_b1_p2048_g64.perfscope"
    a = export_trace(Report.load(folder), tmp_path / "a", format=fmt)
    b = export_trace(lean_report(folder), tmp_path / "b", format=fmt, findings=run_rules(Report.load(folder)))
    assert a.slices == b.slices and a.kernel_time_ns == b.kernel_time_ns and a.slices["finding"] > 0
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()
    # a lean report alone has no findings (the rules read the whole report)
    assert "finding" not in export_trace(lean_report(folder), tmp_path / "c", format=fmt).slices


def test_findings_track_marks_each_items_places(fixtures_dir: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The findings' evidence on the timeline: one track per finding under ``findings``, one slice
    per place of each timed item (a gap, the largest gaps of a group), at the item's place, named
    ``id: label``, with its share of the stake and whether its cause is known; the CLI writes it
    for a report folder too, and not with --no-findings."""
    from perfscope.analysis.findings import run_rules

    folder = fixtures_dir / "h200" / "h200_llama1b_b1_p2048_g64.perfscope"
    report = Report.load(folder)
    found = run_rules(report)
    places = {(f"{f.id}: {i.label}", int(s), int(max(e, s))) for f in found for i in f.items for s, e in i.places()}
    assert any(name.startswith("decode-mbu: ") for name, _, _ in places)
    export_trace(report, tmp_path / "t.pftrace")
    got = _read_pftrace(tmp_path / "t.pftrace")
    assert got["slices"]["findings"] == len(places)
    tracks = {name for name, parent in got["tracks"].values() if parent and got["tracks"][parent][0] == "findings"}
    assert any(t.startswith("decode-mbu: Decode runs at") for t in tracks)
    marks = [a for a in got["args"] if a["_name"].split(":")[0] in {f.id for f in found} and "cause" in a]
    assert len(marks) == len(places) and {a["cause"] for a in marks} <= {"known", "unknown"}
    chrome = tmp_path / "t.json"
    export_trace(report, chrome, format="chrome")
    events = [e for e in json.loads(chrome.read_text())["traceEvents"] if e.get("cat") == "finding"]
    origin = json.loads(chrome.read_text())["otherData"]["origin_ns"]
    got_places = sorted((e["name"], e["ts"]) for e in events)  # us from the origin
    want = sorted((n, (s - origin) / 1000.0) for n, s, _ in places)
    assert [n for n, _ in got_places] == [n for n, _ in want]
    assert np.allclose([t for _, t in got_places], [t for _, t in want], atol=1.0)
    capsys.readouterr()
    assert main(["export", str(folder), "-o", str(tmp_path / "cli.pftrace")]) == 0
    assert f"{len(places):,} finding slices" in capsys.readouterr().out
    assert main(["export", str(folder), "-o", str(tmp_path / "none.pftrace"), "--no-findings"]) == 0
    assert "finding slices" not in capsys.readouterr().out


def test_a_multi_rank_report_has_one_track_group_per_rank(fixtures_dir: Path, tmp_path: Path) -> None:
    """``perfscope import --ranks`` reports: each rank's streams, host threads, steps and idle causes
    under a group ``rank N (device)``, read lean from the rank partitions; every kernel of each rank
    on its rank's tracks."""
    from perfscope.analysis.ranks.tiling import SyncJob, load_trace, write_sync_job
    from perfscope.dashboard.export.perfetto import lean_report
    from tests.unit.ranks_support import B200, multi_rank_report

    files = write_sync_job(load_trace(fixtures_dir / B200), tmp_path / "t",
                           SyncJob(world_size=3, group_size=3, drop_python=True))
    report = multi_rank_report(files)
    folder = tmp_path / "job.perfscope"
    for name in ("kernels", "ranges", "api", "steps", "idle"):  # partitioned by rank, as the import writes them
        for rank, part in report.table(name).groupby("rank"):
            dest = folder / name / f"rank={int(rank)}" / "part-0.parquet"
            dest.parent.mkdir(parents=True)
            part.drop(columns="rank").to_parquet(dest, index=False)
    from perfscope.analysis.readers.kineto.reader import read_kineto

    device = read_kineto(files[0]).manifest["device"]  # the import keeps the first rank's device
    (folder / "manifest.json").write_text(json.dumps({**report.manifest, "name": "job", "device": device}, default=str))
    out = tmp_path / "job.pftrace"
    stats = export_trace(lean_report(folder), out)
    got = _read_pftrace(out)
    groups = {name for name, parent in got["tracks"].values() if not parent}
    assert {"rank 0 (NVIDIA B200)", "rank 1 (NVIDIA B200)", "rank 2 (NVIDIA B200)"} <= groups
    per_rank = report.kernels.groupby("rank").size()
    for rank in range(3):
        assert got["slices"][f"rank {rank} (NVIDIA B200)"] >= per_rank[rank]
    kernel_tracks = {name for name, parent in got["tracks"].values() if parent and "stream" in name}
    assert kernel_tracks == {"cuda:0 stream 7"}  # one stream per rank, under each rank's group
    assert stats.kernels == len(report.kernels)
    steps = [t for t, (name, parent) in got["tracks"].items() if name == "steps"]
    assert len(steps) == 3
