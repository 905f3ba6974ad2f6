"""The GEMM size curve: measured on the device after an engine profile, kept in the Report, and read by
``whatif`` for a weight GEMM at new rows on the same device. Times are never asserted against a clock
(they depend on the machine's load): the tests check what was measured, its keys, and that the
projection applies exactly the curve's ratio."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from perfscope.analysis.projection.project import Question, project
from perfscope.analysis.projection.shapes import Dims, gemm_rows
from perfscope.analysis.projection.times import curve_ratio
from perfscope.collectors.gemm_curve import (
    last_cache_bytes,
    measure_gemm_curve,
    row_counts,
    working_set_bytes_of,
)
from perfscope.report import Report
from perfscope.sessions.profile import EngineRun, profile_engine


def test_row_counts_cover_every_small_m_and_end_at_the_runs_largest() -> None:
    assert row_counts(1) == [1]
    assert row_counts(8) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert row_counts(100) == [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64, 96, 100]
    assert row_counts(0) == [1]
    assert row_counts(24, reach=4) == [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64, 96]


def test_measured_curve_has_every_layer_at_every_row_count() -> None:
    """The ladder's decisions (which rows, how many copies, no budget cut) on a clock that advances 1 µs a
    call: the real clock would make them depend on the machine's load (a loaded machine's slow calls cut
    the copies and then the budget)."""
    ticks = itertools.count()
    layers = [torch.nn.Linear(64, 96), torch.nn.Linear(96, 64, bias=False), torch.nn.Linear(64, 96)]
    curve, cut = measure_gemm_curve(layers, 6, reach=1, repeats=1, working_set_bytes=1 << 20,
                                    clock=lambda: next(ticks) * 1e-6)
    assert not cut
    # two distinct layers (the third is the first's shape): 6 row counts each
    assert sorted(set(zip(curve["n"], curve["k"]))) == [(64, 96), (96, 64)]
    assert sorted(curve.groupby(["n", "k"])["m"].apply(list).iloc[0]) == [1, 2, 3, 4, 5, 6]
    assert (curve["dtype"] == "float").all()
    assert (curve["time_ns"] > 0).all() and np.isfinite(curve["time_ns"]).all()
    # copies fill the working set so each call reads its weight from memory: 1 MiB / (96*64*4 B) = 42
    assert set(curve["copies"]) == {(1 << 20) // (96 * 64 * 4)}


def test_working_set_is_four_last_level_caches() -> None:
    """The copies a layer cycles through hold 4x this CPU's last-level cache (64-512 MiB), so each call
    finds its weight evicted (this VM: L3 32 MiB -> 128 MiB)."""
    cpu = torch.device("cpu")
    ws = working_set_bytes_of(cpu)
    assert 64 << 20 <= ws <= 512 << 20
    cache = last_cache_bytes(cpu)
    if cache:
        assert ws == min(512 << 20, max(64 << 20, 4 * cache))


def test_no_layer_gives_an_empty_curve_a_report_accepts() -> None:
    curve, cut = measure_gemm_curve([torch.nn.ReLU()], 8)
    assert not cut and len(curve) == 0
    assert len(Report.build({"kernels": pd.DataFrame(), "gemm_curve": curve}).gemm_curve) == 0


def test_budget_keeps_the_small_rows_of_every_layer() -> None:
    """Rows go up together over all layers: a budget cut loses the large rows, never a layer's M = 1."""
    ticks = itertools.count()
    layers = [torch.nn.Linear(32, 48), torch.nn.Linear(48, 32)]
    # every clock() call advances 1 s; with a 12 s budget only the first row counts fit
    curve, cut = measure_gemm_curve(layers, 64, repeats=1, working_set_bytes=1 << 16,
                                    budget_s=12.0, clock=lambda: float(next(ticks)))
    assert cut
    assert set(curve.loc[curve["m"] == 1, "n"]) == {48, 32}
    assert curve["m"].max() < 64


def test_curve_ratio_interpolates_between_measured_rows_and_never_extrapolates() -> None:
    curve = pd.DataFrame({"n": 8, "k": 4, "dtype": "float", "m": [1, 2, 4, 8], "time_ns": [10.0, 30.0, 40.0, 80.0]})
    n = np.array([8, 8, 8, 8, 9, 8], float)
    k = np.array([4, 4, 4, 4, 4, 4], float)
    dt = np.array(["float", "float", "float", "c10::BFloat16", "float", "float"], object)
    m_old = np.array([1, 1, 2, 1, 1, 4], float)
    m_new = np.array([4, 3, 8, 4, 4, 16], float)
    r = curve_ratio(curve, n, k, dt, m_old, m_new)
    assert r[0] == pytest.approx(4.0)
    assert r[1] == pytest.approx(35.0 / 10.0)  # halfway between M=2 (30) and M=4 (40)
    assert r[2] == pytest.approx(80.0 / 30.0)
    assert np.isnan(r[3]) and np.isnan(r[4]) and np.isnan(r[5])  # other dtype, other weight, past the curve


@pytest.mark.parametrize(("op", "shapes", "types", "expect"), [
    ("aten::linear", [[1, 1, 768], [1280, 768], []], ["float", "float", ""], (1, 4, 1280, 768, "float")),
    ("aten::mm", [[1, 768], [768, 1280]], ["c10::BFloat16", "c10::BFloat16"], (1, 4, 1280, 768, "c10::BFloat16")),
    ("aten::addmm", [[1280], [1, 768], [768, 1280], [], []], ["float", "float", "float", "", ""],
     (1, 4, 1280, 768, "float")),
    ("aten::bmm", [[4, 1, 768], [4, 768, 320]], ["float", "float"], None),
    # the engine's CPU Linear at a few rows on 2 threads: x [rows, K] @ the weight viewed [P, K, N/P]
    ("aten::matmul", [[1, 768], [2, 768, 640]], ["float", "float"], (1, 4, 1280, 768, "float")),
    ("aten::matmul", [[1, 768], [2, 512, 640]], ["float", "float"], None),
])
def test_gemm_rows_reads_m_n_k_whichever_way_the_weight_is_laid_out(op: str, shapes: list, types: list,
                                                                     expect: tuple | None) -> None:
    old, new = Dims(1, 1, 100, 200), Dims(4, 1, 100, 200)
    assert gemm_rows(op, json.dumps(shapes), json.dumps(types), old, new) == expect


@pytest.fixture(scope="module")
def tiny() -> Report:
    # a budget no load reaches (the curve of this model takes well under a second): the test must not
    # depend on the machine's speed
    return profile_engine(EngineRun(model="tiny", batch=1, prompt_len=24, gen_len=4, device="cpu", gemm_curve_s=600.0),
                          baseline=False)


def test_engine_profile_measures_its_own_layers(tiny: Report, tmp_path) -> None:
    curve = tiny.gemm_curve
    gemms = tiny.kernels[tiny.kernels["op"] == "aten::linear"]
    weights = {(s[1][0], s[1][1]) for s in gemms["op_shapes"].map(json.loads)}
    assert set(zip(curve["n"], curve["k"])) == weights  # every linear the run had, none other
    assert curve.groupby(["n", "k"])["m"].max().eq(4 * 24).all()  # up to 4x the prefill's 24 rows
    assert (curve.groupby(["n", "k"])["m"].min() == 1).all()
    assert tiny.params["gemm_curve_cut"] is False
    again = Report.load(tiny.save(tmp_path / "t.perfscope"))
    pd.testing.assert_frame_equal(again.gemm_curve.reset_index(drop=True), curve.reset_index(drop=True),
                                  check_dtype=False)


def test_whatif_applies_the_curve_to_weight_gemms_on_the_same_device(tiny: Report) -> None:
    """A made-up curve (time = 10 + 5 M ns for every weight) makes the expected times exact: each decode
    linear at batch 8 takes its measured time x (10 + 40) / (10 + 5)."""
    curve = tiny.gemm_curve.copy()
    curve["time_ns"] = 10.0 + 5.0 * curve["m"]
    report = tiny.replace(gemm_curve=curve)
    proj = project(report, Question(batch=8))
    k = proj.kernels
    dec = (k["op"] == "aten::linear") & (k["phase"] == "decode")
    assert dec.any() and (k.loc[dec, "projection_rule"] == "size-curve").all()
    want = np.maximum(np.round(k.loc[dec, "measured_duration_ns"].to_numpy() * 50.0 / 15.0), 1)
    np.testing.assert_allclose(k.loc[dec, "duration_ns"].to_numpy(), want, atol=1)
    # the prefill's 8 x 24 = 192 rows are past the curve (96): the family's line, not the curve
    pre = (k["op"] == "aten::linear") & k["op_shapes"].astype(str).str.startswith("[[1,24,")
    assert pre.any() and (k.loc[pre, "projection_rule"] != "size-curve").all()
    assert any("GEMM size curve" in n for n in proj.manifest["projection"]["notes"])
    # another device: the curve is this one's, not read
    other = project(report, Question(gpu="B200", batch=4))
    assert "size-curve" not in set(other.kernels["projection_rule"])


def test_cpu_steps_shrink_and_grow_by_exactly_their_operators_change(tiny: Report) -> None:
    """CPU operators run one after another, each keeping the gap before it: a projected step's length is
    the measured one plus what its operators gained or lost, in both directions (a curve that falls
    with the rows makes every decode linear faster; before, a CPU step could only grow)."""
    curve = tiny.gemm_curve.copy()
    curve["time_ns"] = 1e6 / curve["m"]
    proj = project(tiny.replace(gemm_curve=curve), Question(batch=4))
    k = proj.kernels
    delta = (k["duration_ns"] - k["measured_duration_ns"]).groupby(k["step"]).sum()
    old = tiny.steps.set_index("step")["duration_ns"]
    new = proj.steps.set_index("step")["duration_ns"]
    dec = tiny.steps.loc[tiny.steps["phase"] == "decode", "step"]
    lin = (k["op"] == "aten::linear") & (k["phase"] == "decode")
    assert (k.loc[lin, "duration_ns"] < k.loc[lin, "measured_duration_ns"]).all()  # the curve made them faster
    # to within 10% or 5 µs: where two recorded operators overlap, the timeline runs them in turn;
    # a step whose operators lost time is shorter (how much the other operators grow at batch 4 depends
    # on their measured times, so which steps shrink depends on the machine's load: the identity does not)
    np.testing.assert_allclose((new - old).loc[dec].to_numpy(np.float64), delta.loc[dec].to_numpy(np.float64),
                               rtol=0.1, atol=5000)
    shrunk = delta.loc[dec] < 0
    assert ((new - old).loc[dec][shrunk] < 0).all()


def test_headline_work_follows_the_projected_shapes(tiny: Report) -> None:
    """The headline (unprofiled) steps take the projected FLOPs and bytes, so MFU and MBU are of the new
    work: at batch 4 every prefill op does 4x the FLOPs (the engine's own count, Transformer.step_flops),
    and the headline prefill MFU is the measured one x 4 / the prefill's time ratio."""
    from perfscope.analysis.projection.project import projected_metrics

    proj = project(tiny, Question(batch=4))
    old, new = tiny.steps_unprofiled, proj.steps_unprofiled
    pre_old = old.loc[old["phase"] == "prefill", "flops"].astype(float).sum()
    pre_new = new.loc[new["phase"] == "prefill", "flops"].astype(float).sum()
    assert pre_new == pytest.approx(4 * pre_old, rel=1e-6)
    # the projected report's own prefill FLOPs are those of a run measured at batch 4 (test_whatif_engine)
    m_old, m_new = projected_metrics(tiny), projected_metrics(proj)
    t_ratio = m_new["prefill_wall_s"] / m_old["prefill_wall_s"]
    # (to 1%: where a step lacks the engine's count, MFU reads the kernels' FLOPs, whose ratio is ~4)
    assert m_new["prefill_mfu"] == pytest.approx(m_old["prefill_mfu"] * 4 / t_ratio, rel=0.01)
