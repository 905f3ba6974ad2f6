"""The module -> op -> kernel hierarchy (analysis/summaries/hierarchy.py), checked against truth:
the engine's analytic per-layer FLOPs, a brute-force walk of a with_stack trace's own events,
and a trace without module events. The check op by op against TraceLens's ops_summary.csv (the
SGLang and vLLM CUDA-graph fixtures) is tests/unit/test_hierarchy_tracelens.py."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.readers.kineto.reader import read_kineto
from perfscope.analysis.summaries.hierarchy import (
    hierarchy,
    instance_class,
    kernel_paths,
)
from perfscope.engine.model import ModelArgs
from perfscope.report import Report

ENGINE = "cpu-small-b1-p128-g32.perfscope"
B200 = "kineto/tracelens_b200__eager_trace.json.gz"


@pytest.fixture(scope="module")
def engine(sample_reports_dir: Path) -> Report:
    return Report.load(sample_reports_dir / ENGINE)


@pytest.fixture(scope="module")
def b200(fixtures_dir: Path) -> Report:
    return read_kineto(fixtures_dir / B200)


def _layer_flops(args: ModelArgs, steps: pd.DataFrame) -> float:
    """Analytic FLOPs of one decoder layer over ``steps``: 2 x weights per token, plus attention's
    QK^T and PV (4 x heads x head_dim per token and context slot)."""
    a = args
    weights = (a.dim * (a.n_head + 2 * a.n_kv_head) * a.head_dim + a.n_head * a.head_dim * a.dim
               + a.dim * 2 * a.intermediate_size + a.intermediate_size * a.dim)
    return float(sum(2 * weights * t + 4 * a.n_head * a.head_dim * t * c
                     for t, c in zip(steps["tokens"], steps["context_len"])))


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_engine_layers_collapse_and_carry_the_analytic_flops(engine: Report, phase: str) -> None:
    args = ModelArgs.from_name(engine.params["model"])
    k = engine.kernels
    model_work = engine.replace(kernels=k[k["category"].isin(["gemm", "attention"])])
    tree = hierarchy(model_work, phase=phase)
    assert tree.source == "range" and tree.note is None
    top = tree.nodes[tree.nodes["depth"] == 0]
    layers = top[top["name"].str.startswith("layer")]
    assert len(layers) == 1  # layer.0 .. layer.11 are one row
    row = layers.iloc[0]
    assert row["name"] == f"layer ×{args.n_layer}" and row["instances"] == args.n_layer
    expected = _layer_flops(args, engine.steps[engine.steps["phase"] == phase])
    assert row["flops"] / row["instances"] == pytest.approx(expected, rel=1e-9)
    # attn and mlp under it, once per layer
    kids = tree.nodes[tree.nodes["parent"] == row["node"]]
    assert set(kids["name"]) == {"attn", "mlp"} and set(kids["instances"]) == {args.n_layer}
    assert row["instance_min_ns"] <= row["instance_mean_ns"] <= row["instance_max_ns"]
    assert row["slowest"].startswith("layer.")


def test_engine_tree_time_adds_up_per_node(engine: Report) -> None:
    tree = hierarchy(engine, phase="decode")
    k = engine.kernels
    decode_ns = float(k.loc[k["phase"] == "decode", "duration_ns"].sum())
    assert tree.nodes.loc[tree.nodes["depth"] == 0, "time_ns"].sum() == pytest.approx(decode_ns)
    for node in tree.nodes.sample(40, random_state=0)["node"]:
        mask = tree.kernel_mask(int(node), len(k))
        got = float(tree.nodes.loc[tree.nodes["node"] == node, "time_ns"].iloc[0])
        assert got == pytest.approx(float(k.loc[mask, "duration_ns"].sum()))
        assert (k.loc[mask, "phase"] == "decode").all()
    # the expanded tree has one node per layer
    expanded = hierarchy(engine, phase="decode", collapse=False).nodes
    top = expanded.loc[expanded["depth"] == 0, "name"]
    assert sorted(top[top.str.match(r"layer\.\d+$")]) == sorted(f"layer.{i}" for i in range(12))


def _oracle_modules(path: Path) -> dict[int, str]:
    """Per kernel correlation id: the innermost ``nn.Module`` around its launching cpu_op, found by
    a plain walk of the trace's own events (External id, then time containment on the thread)."""
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    mods: dict[object, list[tuple[float, float, str]]] = {}
    ops_by_ext: dict[int, dict] = {}
    launch_ext: dict[int, int] = {}
    for e in events:
        cat, a = e.get("cat"), e.get("args") or {}
        if cat == "python_function" and str(e.get("name", "")).startswith("nn.Module: "):
            mods.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"], e["name"][len("nn.Module: "):]))
        elif cat == "cpu_op" and "External id" in a:
            ops_by_ext.setdefault(a["External id"], e)
        elif cat == "kernel" and "External id" in a:
            launch_ext[a["correlation"]] = a["External id"]
    out = {}
    for corr, ext in launch_ext.items():
        op = ops_by_ext.get(ext)
        if op is None:
            continue
        around = [m for m in mods.get(op["tid"], []) if m[0] <= op["ts"] and op["ts"] + op["dur"] <= m[1]]
        if around:
            out[corr] = min(around, key=lambda m: m[1] - m[0])[2]
    return out


def test_b200_each_gemm_sits_in_its_module(fixtures_dir: Path, b200: Report) -> None:
    truth = _oracle_modules(fixtures_dir / B200)
    paths, source, note = kernel_paths(b200)
    assert source == "module" and note is None
    k = b200.kernels
    gemm = np.flatnonzero(k["op"].isin(["aten::mm", "aten::addmm", "aten::matmul", "aten::linear"]).to_numpy())
    assert len(gemm) >= 100
    checked = 0
    for i in gemm.tolist():
        corr = int(k["correlation"].iat[i])
        if corr in truth:
            assert paths[i][-1] == truth[corr], k["op"].iat[i]
            checked += 1
    assert checked == len(gemm)
    # per-module kernel time is the sum over its kernels, in the expanded tree
    tree = hierarchy(b200, collapse=False)
    for node in tree.nodes[tree.nodes["level"] == "module"]["node"].head(60):
        mask = tree.kernel_mask(int(node), len(k))
        assert float(tree.nodes.loc[tree.nodes["node"] == node, "time_ns"].iloc[0]) == pytest.approx(
            float(k.loc[mask, "duration_ns"].sum()))


def test_b200_layers_collapse_with_their_spread(b200: Report) -> None:
    nodes = hierarchy(b200).nodes
    blocks = nodes[nodes["name"] == "TransformerBlock ×36"]
    assert len(blocks) == 1 and blocks["instances"].iat[0] == 36
    row = blocks.iloc[0]
    assert row["instance_min_ns"] < row["instance_mean_ns"] < row["instance_max_ns"]
    assert row["instance_mean_ns"] * 36 == pytest.approx(row["time_ns"])
    # the slowest block is named, and is that block's time
    expanded = hierarchy(b200, collapse=False).nodes
    slowest = expanded[expanded["path"].str.endswith(row["slowest"].split("/")[-1])
                       & (expanded["level"] == "module")]
    assert slowest["time_ns"].max() == pytest.approx(row["instance_max_ns"])


def test_trace_without_module_events_or_ranges_is_op_then_kernel(fixtures_dir: Path) -> None:
    report = read_kineto(fixtures_dir / "kineto" / "kineto_docs_h100_before_fix.json")
    assert not (report.ranges.get("source", pd.Series(dtype=object)) == "module").any()
    tree = hierarchy(report)
    assert tree.source == "op" and "with_stack" in str(tree.note)
    assert set(tree.nodes.loc[tree.nodes["depth"] == 0, "level"]) == {"op"}
    assert set(tree.nodes.loc[tree.nodes["depth"] == 1, "level"]) == {"kernel"}
    assert tree.nodes.loc[tree.nodes["depth"] == 0, "time_ns"].sum() == pytest.approx(
        float(report.kernels["duration_ns"].sum()))


def test_missing_costs_stay_missing(b200: Report) -> None:
    nodes = hierarchy(b200).nodes
    low = nodes[nodes["flops_coverage_pct"] < 90]
    assert len(low) and low["flops"].isna().all() and low["dram_bytes"].isna().all()


def test_instance_class() -> None:
    assert instance_class("Qwen3DecoderLayer_35") == "Qwen3DecoderLayer"
    assert instance_class("layer.7") == "layer"
    assert instance_class("Qwen3") == "Qwen3" and instance_class("attn") == "attn"


def test_cli_tree_text_and_json(sample_reports_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from perfscope.cli import main

    path = str(sample_reports_dir / ENGINE)
    assert main(["analyze", path, "--tree", "--depth", "2", "--phase", "decode"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Where the time goes (decode): range -> op -> kernel")
    layer = next(line for line in lines if "layer ×12" in line)
    assert "layer." in layer  # the slowest layer is named
    assert not any(line.startswith("      ") and "aten::" in line for line in lines)  # depth 2: no ops under attn
    assert main(["analyze", path, "--json", "--depth", "1"]) == 0
    tree = json.loads(capsys.readouterr().out)["tree"]
    assert tree["source"] == "range" and set(tree["phases"]) == {"prefill", "decode"}
    top = tree["phases"]["decode"]
    assert {n["depth"] for n in top} == {0}
    layer_node = next(n for n in top if n["name"] == "layer ×12")
    assert layer_node["instances"] == 12 and layer_node["flops"] > 0
    assert main(["analyze", path, "--tree", "--phase", "nope"]) != 0
    err = capsys.readouterr().err
    assert "no kernels of phase 'nope'" in err and "Traceback" not in err


def test_notebook_methods(engine: Report) -> None:
    df = engine.hierarchy(phase="prefill")
    assert list(df.columns)[:3] == ["node", "parent", "depth"]
    fig = engine.hierarchy_figure(phase="prefill")
    assert fig.data[0].type == "icicle" and len(fig.data[0].ids) == len(df)
    assert float(fig.data[0].values[0]) == pytest.approx(float(df["time_ns"].iat[0]))


def test_compare_by_module_names_the_slower_layer(engine: Report) -> None:
    from perfscope.analysis.summaries.compare import compare

    k = engine.kernels
    slow = k["range"].fillna("").str.contains("/layer.3/").to_numpy()
    dur = k["duration_ns"].to_numpy() * np.where(slow, 2, 1)
    b = engine.replace(kernels=k.assign(duration_ns=dur, end_ns=k["start_ns"].to_numpy() + dur))
    c = compare(engine, b, key="module")
    top = c.by_name.head(2)
    assert set(top["name"]) == {"layer.3/attn", "layer.3/mlp"}
    assert float(top["delta_s"].sum()) == pytest.approx(float(k.loc[slow, "duration_ns"].sum()) * 1e-9)
    assert (c.by_name["delta_s"].iloc[2:].abs() < 1e-12).all()


def test_dashboard_tree_tab_filters_roofline_and_table(tmp_path: Path, engine: Report) -> None:
    from perfscope.dashboard import callbacks as cb
    from perfscope.dashboard import ids
    from perfscope.dashboard.store import ReportStore

    engine.save(tmp_path / "e.perfscope")
    store = ReportStore([tmp_path])
    key = store.entries()[0].key
    options, value = cb.on_tree_phases(store, key)
    assert [o["value"] for o in options] == ["all", "prefill", "decode"] and value == "all"
    fig = cb.on_tree(store, key, "tree", "decode")
    assert fig.data[0].type == "icicle"
    assert cb.on_tree(store, key, "overview", "decode") is cb.NO  # only while the tab is shown
    tree = hierarchy(engine, phase="decode")
    mlp = tree.nodes[(tree.nodes["name"] == "mlp")].iloc[0]
    click = {"points": [{"id": str(int(mlp["node"])), "pointNumber": 3, "currentPath": "/"}]}  # as Dash sends it
    roof, rows, columns, note = cb.on_tree_select(store, key, "tree", "decode", click, ids.TREE_FIGURE)
    mask = tree.kernel_mask(int(mlp["node"]), len(engine.kernels))
    assert note.startswith("layer ×12 / mlp") and f"{int(mask.sum()):,} kernels" in note
    assert len(rows) == min(int(mask.sum()), cb.TREE_GRID_ROWS) and {c["field"] for c in columns} >= {"name", "key"}
    keys = [int(r["key"]) for r in rows]  # row indexes into report.kernels
    assert all(str(engine.kernels["range"].iat[i]).endswith("/mlp") for i in keys)
    assert min(engine.kernels["duration_ns"].iloc[keys]) >= np.sort(engine.kernels.loc[mask, "duration_ns"])[-len(keys)]
    names = {str(n) for trace in roof.data if trace.customdata is not None for n in np.asarray(trace.customdata)[:, 0]}
    assert names and names <= set(engine.kernels.loc[mask, "name"].astype(str))
    # a change of phase forgets the click: the whole tree of that phase
    _, _, _, note = cb.on_tree_select(store, key, "tree", "prefill", click, ids.TREE_PHASE)
    assert note.startswith("the whole tree (prefill)")


def test_repeated_layers_expand_on_demand(tmp_path: Path, engine: Report, sample_reports_dir: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """`analyze --tree --expand`, the JSON and the dashboard's "every instance" list each layer;
    a click on one instance selects exactly that layer's kernels."""
    from perfscope.cli import main
    from perfscope.dashboard import callbacks as cb
    from perfscope.dashboard import ids
    from perfscope.dashboard.store import ReportStore

    path = str(sample_reports_dir / ENGINE)
    assert main(["analyze", path, "--tree", "--phase", "decode", "--depth", "1", "--expand"]) == 0
    out = capsys.readouterr().out
    assert "layer ×12" not in out and all(f"layer.{i} " in out for i in range(12))
    assert main(["analyze", path, "--json", "--depth", "1", "--expand"]) == 0
    tree = json.loads(capsys.readouterr().out)["tree"]
    assert tree["collapsed"] is False
    assert sorted(n["name"] for n in tree["phases"]["decode"] if n["name"].startswith("layer.")) == sorted(
        f"layer.{i}" for i in range(12))
    engine.save(tmp_path / "e.perfscope")
    store = ReportStore([tmp_path])
    key = store.entries()[0].key
    fig = cb.on_tree(store, key, "tree", "decode", "expanded")
    assert {f"layer.{i}" for i in range(12)} <= set(fig.data[0].labels)
    expanded = hierarchy(engine, phase="decode", collapse=False).nodes
    layer3 = expanded[(expanded["name"] == "layer.3") & (expanded["depth"] == 0)].iloc[0]
    click = {"points": [{"id": str(int(layer3["node"]))}]}
    _, _, _, note = cb.on_tree_select(store, key, "tree", "decode", click, ids.TREE_FIGURE, "expanded")
    k = engine.kernels
    want = (k["phase"] == "decode").to_numpy() & k["range"].fillna("").str.contains("/layer.3/").to_numpy()
    assert note.startswith("layer.3") and f"{int(want.sum()):,} kernels" in note
    assert float(layer3["time_ns"]) == pytest.approx(float(k.loc[want, "duration_ns"].sum()))
