"""The Kineto reader on real traces, checked against direct computations on the same JSON."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest

from perfscope.analysis.readers.detect import detect_format, import_file
from perfscope.analysis.readers.kineto.reader import parse_copy_name, read_kineto
from perfscope.errors import InputFormatError
from perfscope.kernel_names import short_kernel_name
from perfscope.report import Report
from tests.conftest import _fixtures_dir

K = "kineto"
QWEN = f"{K}/tracelens_h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
A100 = f"{K}/hta_negative_queue_length_values_check__rank0.json.gz"
OLD = f"{K}/kineto_resnet50_v100_2021.pt.trace.json.gz"
CPU_ONLY = f"{K}/hta_rank_non_gpu__rank_non_gpu.json.gz"


def load_json(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return json.load(fh)


def events(doc, *cats):
    evs = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [e for e in evs if e.get("cat") in cats and e.get("ph", "X") == "X" and "dur" in e]


def _kineto_fixtures() -> list[str]:
    """Every kineto fixture, listed at collection (a missing folder is a collection error)."""
    return sorted(f"{K}/{p.name}" for p in (_fixtures_dir() / K).iterdir())


@pytest.mark.parametrize("rel", _kineto_fixtures())
def test_every_kineto_fixture_imports_with_exact_kernel_counts_and_times(fixtures_dir, rel):
    path = fixtures_dir / rel
    doc = load_json(path)
    kernels = events(doc, "kernel", "Kernel")
    report = import_file(path)
    assert isinstance(report, Report)
    k = report.kernels
    if kernels:
        assert len(k) == len(kernels)
        expected = defaultdict(int)
        for e in kernels:
            expected[e["name"]] += round(e["dur"] * 1000)
        got = k.groupby("name")["duration_ns"].sum().to_dict()
        assert got == dict(expected)
        # NVIDIA devices are cuda:N, AMD ones gpu:N (perfscope.vocab.device_label)
        assert (k["device"].str.startswith("gpu:" if report.device.kind == "rocm" else "cuda:")).all()
    else:
        assert (k["device"] == "cpu").all()
        assert any("no GPU kernel events" in w for w in report.warnings)
    assert (k["duration_ns"] >= 0).all()
    # missing stays missing: no kernel has FLOPs without bytes or a source
    assert (k["flops"].notna() == k["flops_source"].notna()).all()


def test_relative_timestamps_use_base_time(fixtures_dir):
    doc = load_json(fixtures_dir / QWEN)
    base = doc["baseTimeNanoseconds"]
    first = min(e["ts"] for e in events(doc, "kernel"))
    k = read_kineto(fixtures_dir / QWEN).kernels
    assert k["start_ns"].min() == base + round(first * 1000)


def test_kernels_inherit_their_launching_op_and_its_analytic_cost(fixtures_dir):
    doc = load_json(fixtures_dir / QWEN)
    ops = {e["args"]["External id"]: e for e in events(doc, "cpu_op")}
    launch = {e["args"]["correlation"]: e for e in events(doc, "cuda_runtime", "cuda_driver")}
    k = read_kineto(fixtures_dir / QWEN).kernels.set_index("correlation")
    checked = 0
    for e in events(doc, "kernel"):
        rt = launch.get(e["args"]["correlation"])
        op = ops.get(rt["args"].get("External id")) if rt else None
        if not op or op["name"] != "aten::mm":
            continue
        (m, kk), (_, n) = op["args"]["Input Dims"][:2]
        row = k.loc[e["args"]["correlation"]]
        assert row["op"] == "aten::mm"
        assert row["flops"] == pytest.approx(2.0 * m * n * kk)
        assert row["flops_source"] == "analytic"
        checked += 1
    assert checked > 50
    assert (k["bound"].isin(["memory", "compute"])).sum() > 1000


GEMM_INPUTS = {"aten::mm": (0, 1), "aten::addmm": (1, 2)}
"""Where a GEMM op's ``[M, K]`` and ``[K, N]`` operands are in its ``Input Dims``."""


def _gemm_calls(doc) -> dict[int, tuple[str, int]]:
    """Each launch correlation of a 2-D ``aten::mm`` / ``aten::addmm`` call: (the call, its 2*M*N*K)."""
    ext = lambda e: e.get("args", {}).get("External id", e.get("args", {}).get("external id"))
    ops = {ext(e): e for e in events(doc, "cpu_op", "Operator") if e["name"] in GEMM_INPUTS}
    out = {}
    for rt in events(doc, "cuda_runtime", "Runtime", "cuda_driver"):
        op = ops.get(ext(rt))
        if op is None or "correlation" not in rt.get("args", {}):
            continue
        a, b = GEMM_INPUTS[op["name"]]
        dims = op["args"].get("Input Dims", [])
        if len(dims) > b and len(dims[a]) == 2 and len(dims[b]) == 2:
            (m, kk), (_, n) = dims[a], dims[b]
            out[rt["args"]["correlation"]] = (f"{op['name']}@{op['ts']}", 2 * m * n * kk)
    return out


def test_a_gemm_ops_flops_go_to_its_gemm_kernels_not_to_the_copy_it_launches_beside_them(fixtures_dir):
    """``aten::addmm`` launches its bias copy (an element-wise copy kernel) beside its GEMM. Every kernel of a
    2-D mm/addmm call whose own name says element-wise or copy takes its name's category and none of the
    call's FLOPs; the call's other kernels carry all of them, 2*M*N*K from its recorded shapes. Checked on
    every Kineto fixture (cuBLAS on a V100 with split-K, Tensile on an MI250, cuBLAS on an H100)."""
    from perfscope.analysis.costs.operators import category_of

    checked, aside, calls_with_aside = 0, 0, set()
    for rel in _kineto_fixtures():
        doc = load_json(fixtures_dir / rel)
        calls = _gemm_calls(doc)
        if not calls:
            continue
        k = read_kineto(fixtures_dir / rel).kernels
        k = k[k["correlation"].isin(list(calls))]
        by_call: dict[str, list] = defaultdict(list)
        for row in k.itertuples():
            by_call[calls[row.correlation][0]].append(row)
        for call, rows in by_call.items():
            want = calls[rows[0].correlation][1]
            own = [r for r in rows if category_of(None, r.name) not in ("elementwise", "memory")]
            beside = [r for r in rows if r not in own]
            for r in beside:
                assert r.category == category_of(None, r.name) and r.flops != r.flops, (rel, call, r.name)
            assert own, (rel, call)
            assert sum(r.flops for r in own) == pytest.approx(want), (rel, call)
            assert all(r.category == "gemm" for r in own), (rel, call)
            checked += 1
            aside += len(beside)
            calls_with_aside |= {(rel, call)} if beside else set()
    assert checked > 100
    assert aside >= 7 and {rel for rel, _ in calls_with_aside} >= {OLD, f"{K}/hta_amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz"}


def test_split_by_time_gives_kernels_set_aside_nothing_unless_their_whole_op_is_set_aside():
    import numpy as np

    from perfscope.analysis.readers.kineto.ops import split_by_time

    got = split_by_time(np.array([10.0, 10, 10, 6, 6]), np.array([0, 0, 0, 1, 1]), np.array([3.0, 1, 0, 0, 0]),
                        np.array([True, False, True, False, False]))
    # op 0: the two kernels that take share 10 by time (3 : 0); op 1: none takes, so both share it equally
    assert np.isnan(got[1]) and got[[0, 2, 3, 4]].tolist() == [10.0, 0.0, 3.0, 3.0]
    assert split_by_time(np.array([8.0, 8]), np.array([0, 0]), np.array([1.0, 3])).tolist() == [2.0, 6.0]


def test_kernels_without_a_launch_record_stay_unknown(fixtures_dir):
    doc = load_json(fixtures_dir / QWEN)
    launched = {e["args"]["correlation"] for e in events(doc, "cuda_runtime", "cuda_driver")}
    orphans = sum(1 for e in events(doc, "kernel") if e["args"]["correlation"] not in launched)
    k = read_kineto(fixtures_dir / QWEN).kernels
    assert orphans > 0
    assert k["op"].isna().sum() >= orphans
    assert (k.loc[k["op"].isna(), "bound"] == "unknown").all()


def test_transfers_match_the_json(fixtures_dir):
    doc = load_json(fixtures_dir / A100)
    copies = events(doc, "gpu_memcpy")
    sets = events(doc, "gpu_memset")
    t = read_kineto(fixtures_dir / A100).transfers
    assert len(t) == len(copies) + len(sets)
    assert int(t["bytes"].sum()) == sum(e["args"]["bytes"] for e in copies + sets)
    assert (t["kind"] == "memset").sum() == len(sets)
    kinds = defaultdict(int)
    for e in copies:
        kinds[e["name"].split()[1]] += 1
    assert t[t["kind"] != "memset"]["kind"].value_counts().to_dict() == dict(kinds)


def test_2021_capitalised_categories(fixtures_dir):
    doc = load_json(fixtures_dir / OLD)
    r = read_kineto(fixtures_dir / OLD)
    assert len(r.kernels) == len(events(doc, "Kernel"))
    assert len(r.transfers) == len(events(doc, "Memcpy", "Memset"))
    assert len(r.api) == len(events(doc, "Runtime"))
    assert r.kernels["op"].notna().mean() > 0.5


def test_cpu_only_trace_rows_are_non_overlapping_operators(fixtures_dir):
    r = read_kineto(fixtures_dir / CPU_ONLY)
    k = r.kernels
    assert len(k) and (k["device"] == "cpu").all()
    for _, g in k.groupby("thread"):
        g = g.sort_values("start_ns")
        assert (g["start_ns"].to_numpy()[1:] >= g["end_ns"].to_numpy()[:-1]).all()
    assert k["flops"].notna().any()


def test_copy_names_and_short_kernel_names():
    assert parse_copy_name("Memcpy HtoD (Pageable -> Device)") == ("HtoD", "Pageable", "Device", False)
    assert parse_copy_name("Memcpy DtoH (Device -> Pinned)") == ("DtoH", "Device", "Pinned", True)
    assert parse_copy_name("Memset (Device)")[0] == "memset"
    # ROCm's traces name the host side "Host": whether it was pinned is not recorded (it was read as pageable)
    assert parse_copy_name("Memcpy HtoD (Host -> Device)") == ("HtoD", "Host", "Device", None)
    assert short_kernel_name("void at::native::vectorized_elementwise_kernel<4, Foo<int> >(int, Bar)") == \
        "vectorized_elementwise_kernel"
    assert short_kernel_name("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == \
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"


# --------------------------------------------------------------------------- bad input
def test_truncated_trace_keeps_what_was_read(fixtures_dir, tmp_path):
    with gzip.open(fixtures_dir / A100) as fh:
        raw = fh.read()
    cut = tmp_path / "cut.json"
    cut.write_bytes(raw[: len(raw) // 2])
    r = import_file(cut)
    assert r.manifest["partial"] is True
    assert any("truncated" in w for w in r.warnings)
    assert 0 < len(r.kernels) < len(events(json.loads(raw), "kernel"))


def test_truncated_gzip_keeps_what_was_read(fixtures_dir, tmp_path):
    data = (fixtures_dir / A100).read_bytes()
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(data[: len(data) // 2])
    r = import_file(cut)
    assert r.manifest["partial"] is True and len(r.kernels) > 0


@pytest.mark.parametrize("content,match", [
    (b"", "is empty"),
    (b'{"hello": "world"}', "not a trace"),
    (b"\x00\x01\x02garbage", "not recognised"),
    (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, ', "damaged or truncated"),
    (b"\x1f\x8b\x08\x00garbage", "damaged|truncated"),
])
def test_bad_input_gives_one_clear_error(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(InputFormatError, match=match) as info:
        import_file(path)
    assert str(path) in str(info.value)


def test_odd_names_survive_the_round_trip(tmp_path):
    evs = [{"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": i * 10, "dur": 5,
            "args": {"External id": i}} for i, name in enumerate(
        ["aten::mm", "<script>alert(1)</script>", "名前", "bad\ud800surrogate", "x" * 5000])]
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"traceEvents": evs}))
    r = import_file(path)
    saved = Report.load(r.save(tmp_path / "odd.perfscope"))
    assert "<script>alert(1)</script>" in set(saved.kernels["name"])
    assert "名前" in set(saved.kernels["name"])
    assert len(saved.kernels) == 5


def test_detect_format_by_content_not_extension(fixtures_dir, tmp_path):
    renamed = tmp_path / "trace.bin"
    renamed.write_bytes((fixtures_dir / QWEN).read_bytes())
    assert detect_format(renamed) == "kineto"
    assert detect_format(fixtures_dir / "nsys" / "aws_t4_softmax.sqlite") == "nsys-sqlite"
    assert detect_format(fixtures_dir / "ncu" / "esmm_a10g_roofline_set.ncu-rep") == "ncu-rep"
    assert detect_format(fixtures_dir / "ncu" / "esmm_a10g_roofline_metrics.csv") == "ncu-csv"
