"""What-if across vendors (issue 41): the device models fitted from public measurements
(perfscope/device_models.json, analysis/projection/devicefit.py), their held-out error and bands, the
whole-run output of a trace without steps, and the GPU names a user types.

Which data fits and which checks: :func:`devicefit.cross_validate` splits every measured key (a table's
shape, a trace's op and input shapes) into four folds by a hash of the key; each fold's pair rows are
projected by models fitted on the other three only. The bands of :func:`test_bands_hold_the_truth...`
are taken from three folds' held-out rows and checked on the fourth fold's held-out rows, each fold in turn, so
neither the fit nor the band ever saw the rows they are checked on."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.projection import devicefit as dfit
from perfscope.analysis.projection.project import Question, project
from perfscope.cli import main
from perfscope.datasheets import lookup_datasheet, pick_datasheet
from perfscope.device_models import (
    FAMILIES,
    DeviceModels,
    device_models,
    kernel_family,
    spec_identity,
)
from perfscope.errors import UsageError
from perfscope.report import Report

BERT_H100 = "kineto/tracelens_h100__gaunernst_bert-small-uncased__1016001.json.gz"
H200_RUN = "h200/h200_llama1b_b1_p2048_g64.perfscope"
BERT_MI300X = "crossgpu/tracelens_h100_vs_mi300/mi300__gaunernst_bert-small-uncased__1016001.json.gz"


@pytest.fixture(scope="module")
def observations(fixtures_dir) -> pd.DataFrame:
    return dfit.all_observations(fixtures_dir)


@pytest.fixture(scope="module")
def held_out(observations: pd.DataFrame) -> pd.DataFrame:
    return dfit.cross_validate(observations)


@pytest.fixture(scope="module")
def without_bert(observations: pd.DataFrame) -> DeviceModels:
    """Models fitted by the shipped procedure (its terms and settings picked inside the data) on every dataset
    but BERT-small's pair: fitted once for the tests that project BERT-small with models that never saw it."""
    return dfit.fit(observations[observations["dataset"] != "tracelens bert-small"])


@pytest.fixture(scope="module")
def bert(fixtures_dir) -> Report:
    from perfscope.api import load

    return load(fixtures_dir / BERT_H100)


def test_shipped_models_are_the_fit_of_the_committed_data(observations: pd.DataFrame, fixtures_dir) -> None:
    """device_models.json is what `python benchmarks/whatif_crossgpu.py --write` fits now (stale data fails)."""
    shipped = device_models()
    refit = dfit.fit(observations, dfit.launch_costs(dfit.trace_reports(fixtures_dir)))
    assert set(shipped.devices) == set(refit.devices) >= {"A100 80 GB SXM4", "H100 SXM5 80 GB", "A40", "MI210",
                                                          "MI300X", "B200 (HGX, per GPU)", "H200 SXM 141 GB"}
    for name, model in refit.devices.items():
        mine = shipped.devices[name]
        assert set(mine.curves) == set(model.curves), name
        for fam, curve in model.curves.items():
            assert np.allclose(mine.curves[fam].a, curve.a, atol=1e-3), (name, fam)
            assert mine.curves[fam].floor_ns == pytest.approx(curve.floor_ns, abs=0.1)
            assert set(curve.sources) <= set(shipped.sources), "every source is named"
    assert set(shipped.priors) == set(refit.priors)
    assert set(shipped.pairs) == set(refit.pairs) >= {"MI210 -> A100 80 GB SXM4", "H100 SXM5 80 GB -> MI300X"}
    for pair, per in refit.pairs.items():
        assert set(shipped.pairs[pair]) == set(per), pair
        for fam, corr in per.items():
            assert np.allclose(shipped.pairs[pair][fam].a, corr.a, atol=1e-3), (pair, fam)
            assert shipped.pairs[pair][fam].rows == corr.rows


def test_every_family_has_a_place_and_kernels_land_in_them() -> None:
    fam = kernel_family(["gemm", "gemm", "attention", "attention", "attention", "norm", "softmax", "memory", "comm",
                         "elementwise", "other"],
                        ["bf16", "fp8", "bf16", "bf16", "bf16", None, "fp16", None, None, "bf16", None],
                        np.array([1e9, 1e9, 4e9, 1e6, 1e6, 1, 1, 0, 0, 1, 1.0]),
                        np.array([1e6, 1e6, 1e6, 1e6, 1e6, 1, 1, 1, 1, 1, 1.0]),
                        ["", "", "", "", "prefill", "", "", "", "", "", ""])
    assert list(fam) == ["gemm-bf16", "gemm-fp8", "attention-prefill", "attention-decode", "attention-prefill",
                         "reduction", "reduction", "copy", "collective", "elementwise", "other"]
    assert set(fam) <= set(FAMILIES)


def test_a_device_without_a_model_takes_its_generations_and_says_so() -> None:
    models = device_models()
    own = models.resolve(("MI300X", "amd", "amd-gfx94"))
    assert own is not None and not own.stand_in and own.model.device == "MI300X"
    sheet = lookup_datasheet("MI325X")
    from perfscope.device_models import sheet_identity

    stand = models.resolve(sheet_identity(sheet))
    assert stand is not None and stand.stand_in and stand.model.device == "MI300X"
    assert "MI325X has no measured device model" in stand.note and "same generation" in stand.note
    assert models.resolve(None) is None


def test_held_out_error_meets_the_goals_on_nvidia_pairs_and_beats_both_baselines(held_out: pd.DataFrame) -> None:
    table = dfit.error_table(held_out)
    nv = table[(table["pair"] == "nvidia->nvidia")].set_index("group")
    assert nv.loc["gemm", "model_median"] <= 15.0 and nv.loc["attention", "model_median"] <= 20.0
    assert nv.loc["other", "model_median"] <= 20.0
    assert nv["beats_both"].all()
    per_pair = table[table["table"].str.startswith("ALL ") & table["pair"].str.contains(" -> ")]
    a100_mi210 = per_pair[per_pair["pair"] == "A100 80 GB SXM4 -> MI210"].set_index("group")
    assert a100_mi210["beats_both"].all(), a100_mi210  # both families, both baselines
    assert a100_mi210.loc["gemm", "model_median"] <= 15.0
    h100_mi300x = per_pair[per_pair["pair"] == "H100 SXM5 80 GB -> MI300X"].set_index("group")
    assert h100_mi300x["beats_both"].all(), h100_mi300x  # GEMMs, attention, other
    # the way back too: the MI210's large norms and GELUs onto the A100 (17 rows; 22.5% behind the roof
    # baseline's 20.7% before the pair corrections), and the MI300X's kernels onto the H100
    mi210_a100 = per_pair[per_pair["pair"] == "MI210 -> A100 80 GB SXM4"].set_index("group")
    assert mi210_a100["beats_both"].all(), mi210_a100
    assert mi210_a100.loc["other", "model_median"] <= 20.0 and mi210_a100.loc["gemm", "model_median"] <= 15.0
    mi300x_h100 = per_pair[per_pair["pair"] == "MI300X -> H100 SXM5 80 GB"].set_index("group")
    assert mi300x_h100["beats_both"].all()
    # the other families onto the MI300X meet the goal on 518 rows (llama3_2's element-wise tables joined: 409)
    assert h100_mi300x.loc["other", "rows"] >= 500 and h100_mi300x.loc["other", "model_median"] <= 20.0
    # H100 <-> MI300X, four folds (docs/whatif.md): GEMMs 15.2% H100 -> MI300X (the goal is 15: this bound guards
    # the measured figure against getting worse, it is not the goal) and 13.7% back on 122 held-out rows each way;
    # other 16.7 / 18.7%; attention 14.7% onto the MI300X and 18.4% back, on 12 (21.4% onto the MI300X before
    # projections stopped at the target's floor: one row, the NSFW classifier's 10 us attention, 26.7 -> 12.5%)
    assert h100_mi300x.loc["gemm", "model_median"] <= 16.0 and mi300x_h100.loc["gemm", "model_median"] <= 15.0
    assert mi300x_h100.loc["other", "model_median"] <= 20.0
    assert h100_mi300x.loc["attention", "rows"] >= 10 and mi300x_h100.loc["attention", "model_median"] <= 20.0
    assert h100_mi300x.loc["attention", "model_median"] <= 20.0
    # vidur's `add` (259 rows per pair): the A100 and H100 run PyTorch's add near their bandwidth and vLLM's own
    # elementwise kernels at about half of it, the A40 all of them at its bandwidth; 41-71% off every way the
    # A40 is in before the op term, which the pair's measured `aten::add` rows now carry
    add = table[table["table"] == "vidur llama-2-7b add"].set_index("pair")
    assert len(add) == 6 and (add["model_median"] <= 20.0).all(), add[["rows", "model_median"]]


def test_bands_hold_the_truth_on_rows_they_were_not_taken_from(held_out: pd.DataFrame) -> None:
    """Fit: the other three folds. Bands: the other three folds' held-out rows (three fits, so the bands see how
    much the fits differ). Check: the fold's own held-out rows, each fold in turn."""
    fold = held_out["fold"].to_numpy()
    assert sorted(set(fold)) == list(range(dfit.OUTER_FOLDS)) == [0, 1, 2, 3]
    for k in range(dfit.OUTER_FOLDS):
        cov = dfit.coverage(held_out, fold != k)
        overall = cov.iloc[-1]
        assert overall["group"] == "ALL" and overall["rows"] > 16_000
        # 83.3, 83.4, 80.7 and 82.6% (docs/whatif.md, Bands); with the rows' sampling margin alone (before the
        # floor bound), 81.7, 82.1, 79.0 and 80.3%: the NVIDIA GEMM band moves with the fit by more than its rows'
        # sampling
        assert overall["inside_pct"] >= 80.0, cov
    assert all(b.q10 < 0 < b.q90 for b in device_models().bands)


def test_the_band_margin_grows_with_the_variation_between_fits() -> None:
    """:func:`devicefit.between_fits`: the spread across folds of the share of rows beyond a band's end, less its
    sampling part; nothing with one fold or small folds; a band widens by it."""
    rng = np.random.default_rng(0)
    fold = np.repeat(np.arange(4), 1000)
    same = rng.random(4000) < 0.1  # every fold 10% beyond: the spread is sampling alone
    assert dfit.between_fits(same, fold) == pytest.approx(0.0, abs=2e-4)
    shares = np.array([0.05, 0.10, 0.15, 0.10])  # the fits differ: 5, 10, 15, 10% beyond
    differ = np.concatenate([rng.random(1000) < p for p in shares])
    v = dfit.between_fits(differ, fold)
    assert v == pytest.approx(np.var(shares, ddof=1), rel=0.5)
    assert dfit.between_fits(differ, np.zeros(4000, np.int64)) == 0.0  # one fold: nothing to compare
    small = np.repeat(np.arange(4), dfit.BETWEEN_MIN_ROWS - 1)
    assert dfit.between_fits(np.arange(len(small)) % 3 == 0, small) == 0.0
    lo, hi = dfit.band_levels(4000)
    wide_lo, wide_hi = dfit.band_levels(4000, (v, v), 4)
    assert wide_lo < lo < 0.1 and 0.9 < hi < wide_hi
    margin = dfit.BAND_MARGIN_SE * np.sqrt(0.09 / 4000 + v * 1.25)
    assert wide_lo == pytest.approx(0.1 - margin) and wide_hi == pytest.approx(0.9 + margin)


def test_a_trace_without_steps_gets_its_whole_run_and_families(bert: Report, fixtures_dir) -> None:
    from perfscope.api import load

    assert not len(bert.steps)
    p = project(bert, Question(gpu="MI300X"))
    rec = p.manifest["projection"]
    whole, fams = rec["whole_run"], rec["families"]
    for key in ("kernel_time_s", "busy_s", "wall_s"):
        v = whole[key]
        assert v["measured"] > 0 and v["projected"] > 0 and v["band"]
    kt = whole["kernel_time_s"]
    assert kt["measured"] == pytest.approx(bert.kernels["duration_ns"].sum() * 1e-9)
    assert kt["projected"] == pytest.approx(p.kernels["duration_ns"].sum() * 1e-9)
    assert kt["low"] < kt["projected"] < kt["high"]
    assert sum(f["projected_s"] for f in fams) == pytest.approx(kt["projected"])
    assert sum(f["measured_s"] for f in fams) == pytest.approx(kt["measured"])
    assert sum(f["share"] for f in fams) == pytest.approx(1.0)
    assert {f["family"] for f in fams} == {"gemm-bf16", "attention-prefill", "elementwise", "reduction", "copy"}
    assert all(f["rule"] == "device-model" for f in fams)
    # the MI300X measured the same model: its total lies inside the stated band
    truth = load(fixtures_dir / BERT_MI300X).kernels["duration_ns"].sum() * 1e-9
    assert kt["low"] <= truth <= kt["high"]


def test_whole_model_timesformer_within_15_percent_of_the_measured_mi300x(fixtures_dir) -> None:
    w = dfit.whole_model(device_models(), fixtures_dir, ["tracelens timesformer"]).iloc[0]
    assert abs(w.error_pct) <= 15.0, w
    assert w.low_s <= w.measured_s <= w.high_s


def test_whatif_cli_prints_the_whole_run_with_bands_and_json_has_low_high(fixtures_dir, capsys) -> None:
    assert main(["whatif", str(fixtures_dir / BERT_H100), "--gpu", "MI300X,B200"]) == 0
    out = capsys.readouterr().out
    assert "the run has no steps: the whole run" in out
    for word in ("kernel time", "busy time", "wall time", "gemm-bf16", "device-model", "p10-p90",
                 "nvidia->amd", "nvidia->nvidia"):
        assert word in out
    # every family of BERT-small has a band on the MI300X (attention since llama3_2's 9 pairs: 12 held-out rows)
    assert "(unvalidated)" not in out
    assert main(["whatif", str(fixtures_dir / BERT_H100), "--gpu", "MI300X", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    p = doc["projections"][0]
    kt = p["whole_run"]["kernel_time_s"]
    assert kt["low"] < kt["projected"] < kt["high"] and kt["band"].startswith("p10-p90")
    fams = {f["family"]: f for f in p["families"]}
    for fam in ("gemm-bf16", "attention-prefill"):
        assert fams[fam]["low_s"] < fams[fam]["projected_s"] < fams[fam]["high_s"], fams[fam]
    # kernels of unknown work (the H200 engine run's `other`, onto a B200) have no band: null, and said so
    assert main(["whatif", str(fixtures_dir / H200_RUN), "--gpu", "B200", "--json"]) == 0
    fams = {f["family"]: f for f in json.loads(capsys.readouterr().out)["projections"][0]["families"]}
    assert fams["other"]["low_s"] is None and fams["other"]["band"] == "unvalidated"


def test_stepped_run_metrics_carry_bands(fixtures_dir, capsys) -> None:
    assert main(["whatif", str(fixtures_dir / "h200/h200_llama1b_b1_p2048_g64.perfscope"), "--gpu", "B200",
                 "--batch", "8", "--json"]) == 0
    p = json.loads(capsys.readouterr().out)["projections"][0]
    b = p["metric_bands"]
    ttft = p["metrics"]["ttft_s_mean"]
    assert b["ttft_s_mean"]["low"] < ttft < b["ttft_s_mean"]["high"]
    rate = p["metrics"]["decode_tokens_per_s"]
    assert b["decode_tokens_per_s"]["low"] <= rate <= b["decode_tokens_per_s"]["high"]
    assert p["phases"]["prefill"]["low_s"] < p["phases"]["prefill"]["projected_s"] < p["phases"]["prefill"]["high_s"]


def test_same_gpu_is_the_measured_run_and_unvalidated(bert: Report) -> None:
    p = project(bert, Question(gpu="H100 SXM5"))
    rec = p.manifest["projection"]
    assert rec["whole_run"]["kernel_time_s"]["projected"] == pytest.approx(rec["whole_run"]["kernel_time_s"]["measured"],
                                                                           rel=1e-6)
    assert rec["whole_run"]["kernel_time_s"]["band"] == "unvalidated"
    assert rec["whole_run"]["kernel_time_s"]["low"] is None


def test_models_fitted_without_a_pair_still_project_it(without_bert: DeviceModels, bert: Report) -> None:
    """The validation's own path: project() with models fitted on other data (here: without BERT's pair)."""
    models = without_bert
    assert isinstance(models, DeviceModels)
    p = project(bert, Question(gpu="MI300X"), models=models)
    assert p.manifest["projection"]["whole_run"]["kernel_time_s"]["projected"] > 0
    assert (p.kernels["projection_rule"] == "device-model").all()


def test_the_target_gpu_gap_replaces_the_measured_one(fixtures_dir) -> None:
    from perfscope.api import load

    models = device_models()
    h100, mi = models.devices["H100 SXM5 80 GB"], models.devices["MI300X"]
    assert h100.gpu_gap_ns and mi.gpu_gap_ns is not None and h100.launch_ns and mi.launch_ns
    assert mi.gpu_gap_ns < h100.gpu_gap_ns  # ROCm's timestamps of queued kernels abut
    measured = load(fixtures_dir / dfit.PAIR_TRACES["tracelens timesformer"][0])
    p = project(measured, Question(gpu="MI300X"))
    k = p.kernels.sort_values("start_ns")
    gaps = k["start_ns"].to_numpy()[1:] - k["end_ns"].to_numpy()[:-1]
    queued = gaps[gaps < 3_000]  # a kernel queued behind the one before (not waiting for its launch)
    assert len(queued) > 300 and np.mean(np.abs(queued - round(mi.gpu_gap_ns)) <= 1) > 0.95



# ----------------------------------------------------------------------------- floors and the AMD data
def test_whole_model_bert_small_onto_the_mi300x_inside_its_band_and_guarded(without_bert: DeviceModels,
                                                                            fixtures_dir) -> None:
    """BERT-small's H100 trace onto the MI300X, against the MI300X's own trace: with the shipped models (fitted
    on every dataset) and with models fitted without BERT-small's pair. The issue's goal (within 15%) is missed
    since llama3_2's element-wise tables joined (+10.5 / +15.1% before): its MI300X training step ran small
    element-wise kernels at a median 6.5 us where BERT-small's took 3.1 us, and the MI300X's curve follows the
    run of most rows (docs/whatif.md). The bounds guard the measured +19.3 / +22.2%; they are not the goal. (The
    shipped figure was +17.7% before projections stopped at the target's floor: its four attention kernels now
    project at the MI300X's floor, 109 us for 114 measured where they were 103, so less of the element-wise
    kernels' excess, 79.5 us for 47.7, is offset.)"""
    shipped = dfit.whole_model(device_models(), fixtures_dir, ["tracelens bert-small"]).iloc[0]
    assert 0 < shipped.error_pct <= 21.0, shipped
    assert shipped.low_s <= shipped.measured_s <= shipped.high_s
    w = dfit.whole_model(without_bert, fixtures_dir, ["tracelens bert-small"]).iloc[0]
    assert 0 < w.error_pct <= 24.0, w


def test_the_projection_record_names_the_pair_corrections_it_applied(bert: Report) -> None:
    rec = project(bert, Question(gpu="MI300X")).manifest["projection"]["device_models"]
    corr = rec["pair_corrections"]
    # the terms the shipped fit's inner cross-validation picked for each family group
    picked = {g: v["choice"] for g, v in device_models().pair_selection.items()}
    assert corr["gemm-bf16"]["choice"] == picked["gemm"] and corr["elementwise"]["choice"] == picked["other"]
    assert corr["elementwise"]["axis"] == "roof"
    assert corr["gemm-bf16"]["rows"] >= 20 and "tracelens gemms" in corr["gemm-bf16"]["sources"]
    # a pair never measured together (H100 -> B200) moves by the curves alone
    assert project(bert, Question(gpu="B200")).manifest["projection"]["device_models"]["pair_corrections"] == {}


def test_a_pair_correction_holds_its_ends_and_runs_along_a_gemms_intensity() -> None:
    from perfscope.device_models import (
        INTENSITY_LO,
        INTENSITY_STEP,
        N_BINS,
        PairCorrection,
        pair_axis_name,
    )

    # log factor 0.4 at FLOP/byte 1 (knot 4), falling linearly to 0 at 10 (knot 8): measured between 1 and 10
    a = tuple(0.4 * min(1.0, max(0.0, (8 - k) / 4)) for k in range(N_BINS))
    corr = PairCorrection("intensity", a, 0.0, 1.0, 12)
    assert INTENSITY_LO + 4 * INTENSITY_STEP == 0.0 and pair_axis_name("gemm-bf16") == "intensity"
    flops = np.array([1e6, 10 ** 0.5 * 1e6, 1e7, 1e9, 1e5, 1e6])
    nbytes = np.array([1e6, 1e6, 1e6, 1e6, 1e6, 0.0])
    f = corr.factor(np.ones(6), flops, nbytes)
    # at 1, halfway, at 10; past the measured range the end value holds (100 -> 10, 0.1 -> 1); no bytes: none
    assert f == pytest.approx([np.exp(0.4), np.exp(0.2), 1.0, 1.0, np.exp(0.4), 1.0])
    assert corr.factor(np.ones(2))[0] == 1.0  # a GEMM of unknown work keeps the curves' ratio
    roof = PairCorrection("roof", tuple(-0.1 * (k - 10) for k in range(N_BINS)), -6.0, -4.0, 5)
    assert pair_axis_name("reduction") == "roof"
    # knot 10 is 1e-5 s: factor 1 there, exp(-0.2) at 1e-4 s, held at exp(-0.2) past the measured 1e-4 s
    assert roof.factor(np.array([1e-5, 1e-4, 1e-2, 1e-6, 1e-8])) == pytest.approx(
        [1.0, np.exp(-0.2), np.exp(-0.2), np.exp(0.2), np.exp(0.2)])
    again = PairCorrection.from_dict(corr.to_dict())
    assert again.axis == "intensity" and again.factor(np.ones(1), flops[:1], nbytes[:1])[0] == pytest.approx(np.exp(0.4), rel=1e-4)


def test_pair_corrections_recover_what_two_gpus_do_beyond_their_curves(observations: pd.DataFrame) -> None:
    """Planted: on the TraceLens GEMM tables, each MI300X time is the H100's moved by the curves alone, times
    1.6 for a GEMV-like GEMM (under 2 FLOP/byte) and 0.8 for a square one (over 100). The pair correction
    fitted on those rows recovers both, and a projection through the models carries it."""
    models = device_models()
    obs = observations[observations["dataset"] == "tracelens gemms"].copy()
    rows = dfit.pairs_of(obs)
    rows = rows[(rows["device_s"] == "H100 SXM5 80 GB") & (rows["family"] == "gemm-bf16")]
    base = dfit.project_pairs(rows, models, corrected=False)
    ai = rows["flops_s"].to_numpy() / rows["bytes_s"].to_numpy()
    planted = np.where(ai < 2, 1.6, np.where(ai > 100, 0.8, 1.0))
    t_new = dict(zip(rows["key"], base * planted))
    mi = (obs["device"] == "MI300X").to_numpy()
    obs.loc[mi, "time_s"] = [t_new.get(k, t) for k, t in zip(obs.loc[mi, "key"], obs.loc[mi, "time_s"])]
    fitted = dfit.pair_corrections(obs, models)["H100 SXM5 80 GB -> MI300X"]["gemm-bf16"]
    assert fitted.axis == "intensity" and fitted.rows == int(np.isfinite(base).sum())
    gemv = fitted.factor(np.ones(1), np.array([1e6]), np.array([1e6]))[0]
    square = fitted.factor(np.ones(1), np.array([5e8]), np.array([1e6]))[0]
    assert gemv == pytest.approx(1.6, rel=0.1) and square == pytest.approx(0.8, rel=0.1)
    with_corr = DeviceModels(models.devices, models.bands, models.sources, models.validation, models.fitted_by,
                             models.priors, {"H100 SXM5 80 GB -> MI300X": {"gemm-bf16": fitted}})
    moved = dfit.project_pairs(rows, with_corr)
    ok = np.isfinite(base) & ((ai < 1.5) | (ai > 300))
    assert np.median(np.abs(moved[ok] / (base[ok] * planted[ok]) - 1)) < 0.1


def test_floors_of_two_gpus_are_of_one_kind_of_measurement() -> None:
    """A kernel moved between two GPUs meets floors read from the same kind of measurement on both."""
    from perfscope.device_models import Curve, pair_floors_ns

    a = (0.0,) * 21
    h100 = Curve(a, (0,) * 21, -7.0, -2.0, 5056.0, 10, trace_floor_ns=5056.0, table_floor_ns=2477.0)
    mi300 = Curve(a, (0,) * 21, -7.0, -2.0, 5010.0, 10, trace_floor_ns=5010.0)
    a100 = Curve(a, (0,) * 21, -7.0, -2.0, 2454.0, 10, table_floor_ns=2454.0)
    assert pair_floors_ns(h100, mi300) == (5056.0, 5010.0)  # traces on both
    assert pair_floors_ns(h100, a100) == (2477.0, 2454.0)  # tables on both (the A100 has no traced bf16 GEMM)
    assert pair_floors_ns(a100, h100, "table") == (2454.0, 2477.0)
    assert pair_floors_ns(a100, mi300) == (2454.0, 5010.0)  # no common kind: each its own
    # the floor changes the time only below the curve
    assert h100.time_s(np.array([0.0]), 2477.0)[0] == pytest.approx(2477e-9)
    assert h100.time_s(np.array([0.0]))[0] == pytest.approx(5056e-9)


def test_a_projection_never_goes_under_the_targets_floor() -> None:
    """The pair's correction is fitted along work or time and could carry a short kernel under the shortest the
    target was ever measured to run (H100 -> MI300X attention: 9-15 us kernels projected at 17-28 us where the
    MI300X's shortest prefill attention took 27 us). A projection stops at the target's floor, scaled by the
    kernel's own ratio to the source's floor where it ran under it (another harness's shorter kernels)."""
    from perfscope.analysis.projection.times import device_model_ratio
    from perfscope.device_models import floor_bound_s, pair_floors_ns

    assert floor_bound_s(np.array([20e-6, 5e-6, 0.0]), 10_000.0, 30_000.0) == pytest.approx([30e-6, 15e-6, 0.0])
    assert np.isnan(floor_bound_s(np.array([1e-6]), math.nan, 30_000.0)).all()
    models = device_models()
    h100, mi300x = models.devices["H100 SXM5 80 GB"], models.devices["MI300X"]
    fam = "attention-prefill"
    fl_s, fl_t = pair_floors_ns(models.curve(h100, fam)[0], models.curve(mi300x, fam)[0])
    t_src = np.geomspace(0.5 * fl_s, 400 * fl_s, 40) * 1e-9  # H100 kernels from under its floor to ~4 ms
    roof_s = t_src * 0.3  # a share of the datasheet roof a short attention reaches
    n = len(t_src)
    ratio, used = device_model_ratio(np.full(n, fam, object), roof_s, roof_s * 0.8, h100, mi300x, models,
                                     flops=roof_s * 900e12, nbytes=np.full(n, 1e6), source_time_s=t_src,
                                     op=np.full(n, "aten::_flash_attention_forward", object))
    assert (used == fam).all() and np.isfinite(ratio).all()
    bound = floor_bound_s(t_src, fl_s, fl_t)
    assert (t_src * ratio >= bound * (1 - 1e-12)).all()
    # the shortest are held at the bound (the curves and the shipped correction alone put them under it)
    assert np.allclose(t_src[:3] * ratio[:3], bound[:3])
    # without the source's time there is no bound, and the same kernels keep the curves' and correction's ratio
    free, _ = device_model_ratio(np.full(n, fam, object), roof_s, roof_s * 0.8, h100, mi300x, models,
                                 flops=roof_s * 900e12, nbytes=np.full(n, 1e6))
    assert np.isfinite(free).all()


def test_the_held_out_check_takes_the_projections_own_step(observations: pd.DataFrame) -> None:
    """The held-out check (``devicefit.project_pairs``) and ``perfscope whatif`` (``device_model_ratio``) move a
    kernel by one function (``perfscope.device_models.curve_step``), then the pair's correction and the floor
    bound: on one run's kernels, BERT-small on the H100 projected onto the MI300X with the shipped models, the two
    paths give the same time for every kernel of every family (its curves, floors, persistence, run level and
    operator terms all in play)."""
    from perfscope.analysis.projection.times import device_model_ratio

    models = device_models()
    rows = dfit.pairs_of(observations[observations["dataset"] == "tracelens bert-small"])
    rows = rows[(rows["device_s"] == "H100 SXM5 80 GB") & (rows["device_t"] == "MI300X")].reset_index(drop=True)
    assert len(rows) >= 10 and rows["family"].nunique() >= 4
    checked = dfit.project_pairs(rows, models)
    t_s = rows["time_s_s"].to_numpy(np.float64)
    dims = np.column_stack([rows[c].to_numpy(np.float64, na_value=np.nan) for c in ("gemm_b_s", "gemm_m_s", "gemm_n_s")])
    ratio, used = device_model_ratio(rows["family"].to_numpy(object), rows["roof_s_s"].to_numpy(np.float64),
                                     rows["roof_s_t"].to_numpy(np.float64), models.devices["H100 SXM5 80 GB"],
                                     models.devices["MI300X"], models, flops=rows["flops_s"].to_numpy(np.float64),
                                     nbytes=rows["bytes_s"].to_numpy(np.float64),
                                     shape_class=rows["shape_class_s"].to_numpy(object), dims=dims,
                                     source_time_s=t_s, op=rows["op_s"].to_numpy(object))
    assert (used != "").all() and np.isfinite(checked).all()
    assert t_s * ratio == pytest.approx(checked, rel=1e-12)
    # and neither is the curves' ratio alone: the corrections and the bound moved these kernels
    base = dfit.project_pairs(rows, models, corrected=False)
    assert not np.allclose(base, checked, rtol=1e-3)


def test_fitted_floors_come_from_small_kernels_of_their_kind() -> None:
    models = device_models()
    h100 = models.devices["H100 SXM5 80 GB"].curves["gemm-bf16"]
    # aiconfigurator's tuned GEMMs (a table: 2.5 us) run under the eager traces' smallest GEMM (2.8 us, OWLv2's bmm)
    assert 2000.0 < h100.table_floor_ns < h100.trace_floor_ns < 6000.0
    assert h100.floor_ns == h100.trace_floor_ns
    mi_attn = models.devices["MI300X"].curves["attention-prefill"]
    # the MI300X's traced prefill attentions: BERT-small's (27 us) and a torch.compile run's 3.7 ms one, whose
    # work takes the MI300X 0.9 ms at its peaks: no floor (dfit.FLOOR_ROOF_S)
    assert mi_attn.floor_ns < 100_000.0
    assert "tracelens-mi300x-compile" in models.devices["MI300X"].sources


def test_tracelens_gemm_pairs_are_priced_from_their_shapes(fixtures_dir) -> None:
    """The GEMMs of three more models on H100 and MI300X (TraceLens's perf reports): each op's work is
    perfscope's cost formula of its shapes, 2·B·M·N·K, and each shape is its own key."""
    from perfscope.analysis.projection import crossgpu

    (src, tgt, rows), = crossgpu.tracelens_gemms(fixtures_dir / "crossgpu")
    assert (src, tgt) == ("h100", "mi300x") and len(rows) == 27 + 80 and rows["shape"].is_unique
    want = {"[[8944, 1024], [1024, 2816]]": 2 * 8944 * 1024 * 2816,
            "[[16, 5185, 64], [16, 64, 5185]]": 2 * 16 * 5185 * 64 * 5185,
            "[[1024], [5185, 1024], [1024, 1024], [], []]": 2 * 5185 * 1024 * 1024}
    for dims, flops in want.items():
        row = rows[rows["shape"].str.endswith(dims)]
        assert len(row) == 1 and row["flops"].iloc[0] == pytest.approx(flops, rel=1e-3), dims
    # llama3_2 lists one shape once per layout (its strides), and on the H100 each twice more: cuBLAS ran a
    # CUTLASS sm80 kernel for a fifth of the calls (172.8 us); the pair reads the row of most calls (nvjet)
    llama = "llama3_2__e2e_comparative|aten::mm|[[12864, 1280], [1280, 1280]]|"
    want_us = {"[[1280, 1], [1, 1280]]": (59.74365234375, 96.501953125),
               "[[1280, 1], [1280, 1]]": (60.47998046875, 96.68212890625)}
    for strides, (h100_us, mi300x_us) in want_us.items():
        row = rows[rows["shape"] == llama + strides]
        assert len(row) == 1 and row["flops"].iloc[0] == 2 * 12864 * 1280 * 1280
        assert row["t_src_s"].iloc[0] == pytest.approx(h100_us * 1e-6) and row["t_tgt_s"].iloc[0] == pytest.approx(mi300x_us * 1e-6)
    obs = dfit.table_observations(fixtures_dir / "crossgpu")
    mine = obs[obs["dataset"] == "tracelens gemms"]
    assert mine["key"].nunique() == 107 and set(mine["device"]) == {"H100 SXM5 80 GB", "MI300X"}
    assert dfit.TRACES >= {"tracelens gemms"}  # kernels timed by a profiler: their floors are traces'


def test_tracelens_family_pairs_are_priced_from_their_shapes(fixtures_dir) -> None:
    """The other ops of the same perf reports (attention, elementwise, norm, copies): each op's work is
    perfscope's cost formula of its shapes (an add of N elements: N FLOPs and 3N x 2 bytes in bf16; a flash
    attention of B, H, S, D: 4·B·H·S²·D FLOPs without a mask, about half with a causal one), its family is the
    one a trace's kernel of that op gets, and the rows left out are counted by reason and op."""
    from perfscope.analysis.projection import crossgpu

    rows, left = crossgpu.tracelens_family_rows(fixtures_dir / "crossgpu")
    (src, tgt, same), = crossgpu.tracelens_families(fixtures_dir / "crossgpu")
    assert (src, tgt) == ("h100", "mi300x") and len(same) == len(rows) == 53 + 30 + 409
    n = 16 * 559 * 1024  # Qwen's residual add, [16, 559, 1024] + [16, 559, 1024] in bf16
    add = rows[rows["shape"].str.contains(r"aten::add\|\[\[16, 559, 1024\], \[16, 559, 1024\]", regex=True)]
    assert len(add) == 1 and add["flops"].iloc[0] == n and add["bytes"].iloc[0] == 3 * n * 2
    assert add["table"].iloc[0] == "tracelens elementwise" and add["t_src_s"].iloc[0] == pytest.approx(17.856e-6, rel=1e-4)
    # llama3_2: one call ran cuDNN's SDPA on the H100 and the memory-efficient one on the MI300X (a mask of
    # other broadcast dims): the two pair by their query, key and value, priced from the H100's inputs
    cross = rows[rows["shape"].str.startswith("llama3_2__e2e_comparative|aten::_scaled_dot_product_cudnn_attention|"
                                              "[[2, 32, 151, 128], [2, 32, 6404, 128]")]
    assert len(cross) == 1 and cross["flops"].iloc[0] == 4 * 2 * 32 * 151 * 6404 * 128  # no causal flag
    assert cross["t_src_s"].iloc[0] == pytest.approx(321.43896484375e-6)
    assert cross["t_tgt_s"].iloc[0] == pytest.approx(679.583984375e-6)
    llama = rows[rows["run"].eq("llama3_2__e2e_comparative")]
    assert llama["table"].value_counts().to_dict() == {"tracelens elementwise": 268, "tracelens copy": 141,
                                                       "tracelens reduction": 21, "tracelens attention-prefill": 9}
    # its element-wise tables: an fp32 mul of two [2, 32, 6404, 128] tensors reads two and writes one; a
    # broadcast one reads the [.., 1] operand once; a bf16 -> fp32 copy_ reads 2 and writes 4 bytes an element
    n = 2 * 32 * 6404 * 128
    key = "llama3_2__e2e_comparative|aten::mul|[[2, 32, 6404, 128], [2, 32, 6404, {}]]|['float', 'float']"
    (mul,) = llama[llama["shape"].str.startswith(key.format(128))].itertuples()
    assert (mul.flops, mul.bytes, mul.family) == (n, 3 * n * 4, "elementwise")
    assert (mul.t_src_s, mul.t_tgt_s) == pytest.approx((206.095458984375e-6, 164.4619140625e-6))
    (bcast,) = llama[llama["shape"].str.startswith(key.format(1))].itertuples()
    assert (bcast.flops, bcast.bytes) == (n, (2 * n + n // 128) * 4)
    (cast,) = llama[llama["shape"].str.startswith("llama3_2__e2e_comparative|aten::copy_|[[2, 32, 6404, 128], "
                                                  "[2, 32, 6404, 128], []]|['float', 'c10::BFloat16'")].itertuples()
    assert (cast.bytes, cast.family) == (n * (4 + 2), "copy")
    sdpa = rows[rows["op"] == "aten::_scaled_dot_product_flash_attention"]
    sdpa = sdpa.set_index(sdpa["shape"].str.split("_").str[0])
    b, h, s, d = 4, 12, 197, 64  # Falconsai's ViT: no mask
    assert sdpa.loc["Falconsai", "flops"] == 4 * b * h * s * s * d
    b, h, s, d = 16, 16, 559, 64  # Qwen: causal, the diagonal included
    assert sdpa.loc["Qwen", "flops"] == pytest.approx(4 * b * h * s * (s + 1) / 2 * d, rel=1e-9)
    assert set(sdpa["table"]) == {"tracelens attention-prefill"}
    assert set(rows["table"]) == {"tracelens attention-prefill", "tracelens elementwise", "tracelens reduction",
                                  "tracelens copy"}
    assert left == {"no kernel timed: aten::mul": 2, "no kernel timed: aten::add": 1, "no kernel timed: aten::copy_": 5,
                    "no kernel timed: aten::add_": 1, "no kernel timed: aten::sigmoid": 1, "no kernel timed: aten::max": 2,
                    "host transfer: aten::copy_": 14 + 11, "parent of a priced op: aten::layer_norm": 7,
                    "no cost formula: aten::convolution": 1, "no cost formula: aten::linalg_norm": 2,
                    "no cost formula: aten::native_layer_norm_backward": 2}
    obs = dfit.table_observations(fixtures_dir / "crossgpu")
    mine = obs[obs["dataset"] == "tracelens families"]
    assert mine["key"].nunique() == 492 and set(mine["family"]) == {"attention-prefill", "elementwise", "reduction", "copy"}
    assert dfit.TRACES >= {"tracelens families"}


# ----------------------------------------------------------------------------- GPU names a user types
def test_a_family_name_takes_its_most_common_part_and_names_the_others() -> None:
    sheet, note = pick_datasheet("H100", "--gpu")
    assert sheet.model == "H100 SXM5 80 GB"
    assert note is not None and "--gpu H100" in note and "'H100 PCIe 80 GB'" in note and "'H100 NVL 94 GB'" in note
    assert pick_datasheet("H100 SXM5 80 GB")[1] is None  # a full name: nothing to say
    assert pick_datasheet("A100")[0].model == "A100 80 GB SXM4"
    with pytest.raises(UsageError, match="more than one"):
        pick_datasheet("A100 80")


@pytest.mark.parametrize(("query", "model", "noted"), [
    ("MI300", "MI300X", "the others are 'MI300A'"),  # the APU is the other MI300
    ("H20", "H20 96 GB", None),  # a whole word: not the H200 rows it also begins
    ("MI250", "MI250 (per GCD)", None), ("MI355", "MI355X", None), ("B300", "B300 (HGX, per GPU)", None),
])
def test_a_name_is_the_part_its_words_name(query: str, model: str, noted: str | None) -> None:
    sheet, note = pick_datasheet(query, "--gpu")
    assert sheet.model == model
    assert (note is None) if noted is None else (noted in str(note))


@pytest.mark.parametrize(("query", "close"), [
    ("RTX 4070", "'RTX 4070 Ti'"),  # a Ti (or SUPER) is another product
    ("RTX 4060", "'RTX 4060 Ti 16 GB', 'RTX 4060 Ti 8 GB'"),
    ("L40", "'L40S'"),  # the L40 is another part than the L40S the table lists
])
def test_a_name_of_a_part_the_table_lacks_is_refused_not_taken_for_its_sibling(query: str, close: str) -> None:
    with pytest.raises(UsageError, match="no datasheet row is that part") as refused:
        pick_datasheet(query, "--gpu")
    assert close in str(refused.value)


@pytest.mark.parametrize("argv", [
    ["capacity", "--model", "llama-3.2-1b", "--gpu", "H100", "--context", "4096"],
    ["whatif", "BERT", "--gpu", "H100"],
])
def test_every_command_taking_a_gpu_name_says_which_part(argv: list[str], fixtures_dir, capsys) -> None:
    argv = [str(fixtures_dir / BERT_H100) if a == "BERT" else a for a in argv]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert "took 'H100 SXM5 80 GB', the most common H100 part" in out.out + out.err


def test_import_roofs_family_name(fixtures_dir, tmp_path, capsys) -> None:
    out = tmp_path / "r"
    assert main(["import", str(fixtures_dir / BERT_H100), "--roofs", "H100", "--out", str(out), "--no-html"]) == 0
    assert "took 'H100 SXM5 80 GB'" in capsys.readouterr().err
    assert Report.load(tmp_path / "r.perfscope").device.properties.get("datasheet") == "H100 SXM5 80 GB"


def test_spec_identity_of_a_trace_device(bert: Report) -> None:
    assert spec_identity(bert.device) == ("H100 SXM5 80 GB", "nvidia", "nvidia-9")
    assert not math.isnan(device_models().priors["gemm-bf16"].floor_ns)


def test_html_dashboard_and_terminal_show_the_whole_run_and_its_band(bert: Report, fixtures_dir) -> None:
    from perfscope.dashboard.html_report import render_html
    from perfscope.dashboard.layout import overview_children
    from perfscope.text_report import render_text

    p = project(bert, Question(gpu="MI300X"))
    page = render_html(p)
    assert "Projection: the whole run" in page and "gemm-bf16" in page and "p10-p90" in page
    assert "(unvalidated)" not in page  # every family of BERT-small has a band on the MI300X
    # a run with kernels of unknown work: its band covers part of the time, and the page says so
    from perfscope.api import load

    part = render_html(project(load(fixtures_dir / H200_RUN), Question(gpu="B200")))
    assert "(unvalidated)" in part and "the rest unvalidated" in part
    tree = str(overview_children(p))
    assert "Projection: the whole run" in tree and "projection-families" in tree and "nvidia-&gt;amd" not in tree
    assert "nvidia->amd" in tree
    text = render_text(p)
    assert "kernel time" in text and "busy time" in text and "wall time" in text and "device-model" in text


def test_gemm_shape_classes_from_the_shapes_a_trace_records() -> None:
    from perfscope.device_models import gemm_dims, gemm_shape_class, shape_classes

    assert gemm_dims("aten::addmm", [[512], [141, 512], [512, 2048], [], []]) == (1, 141, 2048, 512)
    assert gemm_dims("aten::bmm", [[37632, 8, 64], [37632, 64, 8]]) == (37632, 8, 8, 64)
    assert gemm_dims("aten::linear", [[4, 7, 64], [128, 64]]) == (1, 28, 128, 64)
    assert gemm_dims("aten::matmul", [[2, 5, 64], [64, 32]]) == (1, 10, 32, 64)  # the batch folded into M
    assert gemm_shape_class("aten::bmm", "[[37632, 8, 64], [37632, 64, 8]]") == "batched-small"
    assert gemm_shape_class("aten::bmm", [[1, 32, 1], [1, 1, 559]]) == "k-tiny"
    assert gemm_shape_class("aten::addmm", [[1], [5184, 1024], [1024, 1], [], []]) == "gemv"
    assert gemm_shape_class("aten::addmm", [[768], [5, 768], [768, 768], [], []]) == "skinny"
    assert gemm_shape_class("aten::mm", [[8944, 1024], [1024, 2816]]) == "square"
    assert gemm_shape_class("aten::mm", "not shapes") == "" and gemm_shape_class("aten::mm", None) == ""
    got = shape_classes(np.array(["aten::mm", "aten::add", "aten::mm"], object),
                        np.array(["[[1, 768], [768, 768]]", "[[4, 4], [4, 4]]", "[[1, 768], [768, 768]]"], object),
                        np.array(["gemm-bf16", "elementwise", "gemm-bf16"], object))
    assert list(got) == ["gemv", "", "gemv"]  # a kernel of another family has no class


def test_a_class_term_moves_only_its_class_and_round_trips() -> None:
    from perfscope.device_models import N_BINS, PairCorrection

    corr = PairCorrection("intensity", (0.0,) * N_BINS, 0.0, 3.0, 20, ("t",), "roof", (0.0,) * N_BINS, -6.0, -3.0,
                          {"batched-small": 0.5}, "intensity+roof+class")
    f = corr.factor(np.ones(3), np.full(3, 1e9), np.full(3, 1e7), np.array(["batched-small", "square", ""], object))
    assert f == pytest.approx([np.exp(0.5), 1.0, 1.0])
    assert corr.factor(np.ones(1), np.array([1e9]), np.array([1e7]))[0] == 1.0  # no classes given: no class term
    again = PairCorrection.from_dict(corr.to_dict())
    assert again.classes == {"batched-small": 0.5} and again.choice == "intensity+roof+class" and again.axis2 == "roof"


def test_the_pair_correction_terms_are_picked_inside_the_fitted_data(observations: pd.DataFrame) -> None:
    """Nested: the choice of terms uses an inner split of the rows the fit is given, never others. The inner
    split is independent of the outer folds (each outer training fold holds keys of every inner fold), the
    choice is one of the candidates per family group with its inner error, and a fit told the choice keeps it."""
    obs = observations[observations["dataset"].isin(["tracelens gemms", "tracelens families", "llmcompass"])]
    outer = dfit.fold_of(obs["key"])
    train = obs[outer != 0]
    inner = np.array([dfit.zlib.crc32((dfit.INNER_SALT + str(k)).encode()) % dfit.INNER_FOLDS for k in train["key"]])
    assert len(set(inner)) == dfit.INNER_FOLDS
    choices, scores, settings = dfit.select_pair_choices(train)
    assert settings == dfit.CurveSettings() and "curves" not in scores  # one setting given: nothing to pick
    assert set(choices) == {"gemm", "other"}
    for group, choice in choices.items():
        assert choice in dfit.CANDIDATES[group] and set(scores[group]) == set(dfit.CANDIDATES[group])
        assert scores[group][choice] == min(scores[group].values())
    # the rows of the other outer fold do not change the choice made on this one
    moved = obs.copy()
    moved.loc[outer == 0, "time_s"] *= 10.0
    assert dfit.select_pair_choices(moved[outer != 0])[0] == choices
    models = dfit.fit(train, choices={"gemm": "none", "other": "roof"})
    corr = models.pair_correction("H100 SXM5 80 GB", "MI300X", "gemm-bf16")
    assert corr is not None and corr.choice == "none" and corr.factor(np.ones(2), np.ones(2), np.ones(2)) == pytest.approx(1.0)
    shipped = device_models()
    assert set(shipped.pair_selection) == {"gemm", "other", "curves"}
    curves = shipped.pair_selection["curves"]
    assert curves["choice"] in {st.name for st in dfit.CURVE_SETTINGS}
    assert set(curves["scores_pct"]) == {st.name for st in dfit.CURVE_SETTINGS}
    assert curves["scores_pct"][curves["choice"]] == min(curves["scores_pct"].values())
    for group, sel in ((g, v) for g, v in shipped.pair_selection.items() if g != "curves"):
        assert all(c.choice == sel["choice"] for per in shipped.pairs.values() for f, c in per.items()
                   if (f.startswith("gemm")) == (group == "gemm") and c.choice != "none")


def test_wave_fill_is_the_share_of_the_waves_slots_the_tiles_take() -> None:
    """Known truth: 128 x 132 rows of 128-row tiles fill 132 SMs exactly (one wave, 1.0); one tile more needs a
    second wave of which it takes one slot (133 / 264); a batch multiplies the tiles; unknown dimensions: NaN."""
    from perfscope.device_models import gemm_bmn, wave_fill

    got = wave_fill(np.array([1, 1, 1, 2, np.nan]), np.array([128 * 132, 128 * 133, 141, 128, 64]),
                    np.array([128, 128, 512, 128 * 66, 64]), (128, 128), 132)
    assert got[:4] == pytest.approx([1.0, 133 / 264, 8 / 132, 1.0]) and math.isnan(got[4])
    # BERT-small's 141 x 512 GEMM: 8 tiles of 128 x 128 on the MI300X's 304 CUs, 2 of 256 x 256
    assert wave_fill(np.array([1]), np.array([141]), np.array([512]), (256, 256), 304)[0] == pytest.approx(2 / 304)
    dims = gemm_bmn(np.array(["aten::addmm", "aten::bmm", "aten::linear", "aten::add"], object),
                    np.array(["[[512], [141, 512], [512, 512], [], []]", [[96, 3137, 64], [96, 64, 3137]],
                              [[2, 7, 64], [32, 64]], [[4, 4], [4, 4]]], object),
                    np.array(["gemm-bf16", "gemm-bf16", "gemm-fp32", "elementwise"], object))
    assert dims[:3].tolist() == [[1, 141, 512], [96, 3137, 3137], [1, 14, 32]] and np.isnan(dims[3]).all()


def test_a_wave_term_is_the_fill_ratio_times_its_weight(observations: pd.DataFrame) -> None:
    """A correction with a wave term adds ``weight x log(fill_source / fill_target)``: a GEMM of 133 tiles fills
    the H100's 132 SMs to 133/264 and the MI300X's 304 CUs to 133/304, so with weight 1 it runs 304/264 x
    (1.15 x) relatively slower on the MI300X; a GEMM of unknown dimensions is not corrected. A fitted wave term
    (``wave~``) is pulled toward 0, a fixed one keeps weight 1, and both keep their tiles and units through the
    data file."""
    from perfscope.device_models import PairCorrection

    corr = PairCorrection("none", (0.0,) * 21, 0.0, 0.0, 1, wave_tiles=((128, 128), (128, 128)), wave_units=(132, 304),
                          wave_coef=1.0)
    dims = np.array([[1, 128 * 133, 128], [np.nan, np.nan, np.nan]])
    f = corr.factor(np.ones(2), dims=dims)
    assert f[0] == pytest.approx((133 / 264) / (133 / 304)) and f[1] == pytest.approx(1.0)
    assert PairCorrection.from_dict(corr.to_dict()) == corr
    pairs = observations[observations["dataset"] == "tracelens gemms"]
    sub = dfit._pair_rows(pairs, dfit.build_models(pairs, dfit.fit_curves(pairs)))
    sub = sub[(sub["device_s"] == "H100 SXM5 80 GB") & (sub["device_t"] == "MI300X") & (sub["family"] == "gemm-bf16")]
    assert np.isfinite(sub["gemm_m_s"]).all()  # every TraceLens GEMM row carries its dimensions
    fitted = dfit._fit_terms(sub, "wave~128x128/256x128")
    assert fitted is not None and fitted.uses_wave and fitted.wave_units == (132, 304)
    assert fitted.wave_tiles == ((128, 128), (256, 128)) and 0.0 < abs(fitted.wave_coef) < 1.0  # pulled toward 0
    fixed = dfit._fit_terms(sub, "wave128x128/256x128")
    assert fixed is not None and fixed.wave_coef == 1.0 and fixed.axis == "none"


def test_a_persistence_term_keeps_a_share_of_the_kernels_distance_from_its_curve() -> None:
    """Known truth: a correction with a persistence term (``keep``, weight k) adds ``k x d``, ``d = log(T_source /
    g_source(R_source))``: a kernel twice as slow as its family's curve on the source is ``2^(1 + k)`` times the
    target's curve there (with k = -0.5, sqrt(2)), ``d`` is clipped to its measured range, an unknown ``d`` is not
    corrected; fitted on rows whose truth is exactly ``-0.4 x d`` the weight is that slope shrunk by the ridge,
    ``-0.4 x S / (S + KEEP_RIDGE)`` (S the sum of ``d^2``); the projection's path (``device_model_ratio``) takes
    ``d`` from the kernel's time on the measured GPU, and the term survives the data file."""
    from dataclasses import replace

    from perfscope.analysis.projection.times import device_model_ratio
    from perfscope.device_models import PairCorrection

    corr = PairCorrection("none", (0.0,) * 21, 0.0, 0.0, 1, keep_coef=-0.5, keep_lo=-1.0, keep_hi=1.0, choice="keep")
    f = corr.factor(np.ones(4), source_resid=np.array([math.log(2.0), 0.0, 5.0, np.nan]))
    assert f == pytest.approx([2.0 ** -0.5, 1.0, math.exp(-0.5), 1.0])
    assert corr.factor(np.ones(2)) == pytest.approx(1.0)  # no distance given: no correction
    assert PairCorrection.from_dict(corr.to_dict()) == corr
    d = np.linspace(-1.0, 1.0, 41)
    rows = pd.DataFrame({"roof_s_s": 1e-5, "flops_s": 1e9, "bytes_s": 1e7, "le": -0.4 * d, "res_s": d,
                         "dataset": "synthetic", "vendor_s": "nvidia", "vendor_t": "amd", "device_s": "H100 SXM5 80 GB",
                         "device_t": "MI300X"})
    fitted = dfit._fit_terms(rows, "keep")
    s = float(np.sum(d * d))
    assert fitted is not None and fitted.uses_keep and fitted.axis == "none"
    assert fitted.keep_coef == pytest.approx(-0.4 * s / (s + dfit.KEEP_RIDGE), rel=1e-9)
    assert (fitted.keep_lo, fitted.keep_hi) == (-1.0, 1.0)
    assert dfit._fit_terms(rows.drop(columns="res_s"), "keep") is None  # no distance: no term
    models = device_models()
    src, tgt = models.devices["H100 SXM5 80 GB"], models.devices["MI300X"]
    pairs = {"H100 SXM5 80 GB -> MI300X": {"gemm-bf16": corr}}
    mine = replace(models, pairs=pairs)
    fam = np.array(["gemm-bf16"], object)
    base, _ = device_model_ratio(fam, np.array([1e-5]), np.array([8e-6]), src, tgt, replace(models, pairs={}))
    g_s = models.curve(src, "gemm-bf16")[0].time_s(np.array([1e-5]))  # type: ignore[union-attr]
    kept, _ = device_model_ratio(fam, np.array([1e-5]), np.array([8e-6]), src, tgt, mine, source_time_s=2.0 * g_s)
    assert kept[0] == pytest.approx(base[0] * 2.0 ** -0.5)
    unknown, _ = device_model_ratio(fam, np.array([1e-5]), np.array([8e-6]), src, tgt, mine)
    assert unknown[0] == pytest.approx(base[0])


def test_observations_name_their_operator_and_run(observations: pd.DataFrame) -> None:
    """An op term needs the operator a trace's kernel row would name, a run-level term the harness run: vidur's
    columns are the operators perfscope prices them as, TraceLens's perf-report rows their own ops and one run
    per model, a trace pair's kernels their ops and the trace as the run; aiconfigurator's tables name no
    operator a trace holds."""
    by = observations.groupby("dataset")
    vidur = set(by.get_group("vidur")["op"])
    assert {"aten::add", "aten::mm", "_C::silu_and_mul", "_C::rms_norm", "_C::rotary_embedding", "aten::embedding"} == vidur
    gemms = by.get_group("tracelens gemms")
    assert set(gemms["op"]) == {"aten::mm", "aten::addmm", "aten::bmm"}
    assert gemms["run"].nunique() == 4 and all(r.startswith("tracelens gemms|") for r in gemms["run"])
    bert = by.get_group("tracelens bert-small")
    assert set(bert["run"]) == {"tracelens bert-small"} and "aten::addmm" in set(bert["op"])
    assert set(by.get_group("aiconfigurator")["op"]) == {""}
    assert set(by.get_group("llmcompass")["op"]) == {"aten::mm", "aten::_softmax", "aten::native_layer_norm", "aten::gelu"}


def test_an_op_term_is_a_level_per_operator_shrunk_by_its_ridge() -> None:
    """Known truth: a correction with an op term adds the level of the kernel's operator (none for an operator
    the pair never measured, or a kernel of no operator); fitted on rows whose truth is 0 except ``aten::add``'s
    at -0.6 (vidur's A40 -> A100 ``add``: the A100 runs PyTorch's add near its bandwidth, vLLM's own kernels
    at half of it, and the A40 runs all of them at its bandwidth), the level is -0.6 x n / (n + DATASET_RIDGE)
    and the others' 0; it survives the data file, and the projection's path (``device_model_ratio``) applies
    it by each kernel's operator."""
    from dataclasses import replace

    from perfscope.analysis.projection.times import device_model_ratio
    from perfscope.device_models import PairCorrection

    corr = PairCorrection("none", (0.0,) * 21, 0.0, 0.0, 1, choice="op", ops={"aten::add": -0.6})
    f = corr.factor(np.ones(3), op=np.array(["aten::add", "_C::silu_and_mul", ""], object))
    assert f == pytest.approx([math.exp(-0.6), 1.0, 1.0])
    assert corr.factor(np.ones(1)) == pytest.approx(1.0)  # no operator given: no term
    assert PairCorrection.from_dict(corr.to_dict()) == corr
    n_add, n_act = 30, 50
    rows = pd.DataFrame({"roof_s_s": 1e-5, "flops_s": 1e6, "bytes_s": 1e7,
                         "le": [-0.6] * n_add + [0.0] * n_act, "op_s": ["aten::add"] * n_add + ["_C::silu_and_mul"] * n_act,
                         "dataset": "synthetic", "vendor_s": "nvidia", "vendor_t": "nvidia", "device_s": "A40",
                         "device_t": "A100 80 GB SXM4"})
    fitted = dfit._fit_terms(rows, "op")
    assert fitted is not None and fitted.axis == "none"
    assert fitted.ops["aten::add"] == pytest.approx(-0.6 * n_add / (n_add + dfit.DATASET_RIDGE), rel=1e-6)
    assert fitted.ops["_C::silu_and_mul"] == pytest.approx(0.0, abs=1e-9)
    assert dfit._fit_terms(rows.drop(columns="op_s"), "op") is None  # no operators: no term
    models = device_models()
    src, tgt = models.devices["H100 SXM5 80 GB"], models.devices["MI300X"]
    mine = replace(models, pairs={"H100 SXM5 80 GB -> MI300X": {"elementwise": corr}})
    fam = np.array(["elementwise"] * 2, object)
    r, rt = np.array([1e-5, 1e-5]), np.array([8e-6, 8e-6])
    base, _ = device_model_ratio(fam, r, rt, src, tgt, replace(models, pairs={}))
    got, _ = device_model_ratio(fam, r, rt, src, tgt, mine, op=np.array(["aten::add", "aten::mul"], object))
    assert got == pytest.approx([base[0] * math.exp(-0.6), base[1]])


def test_a_run_level_term_weighs_the_runs_median_distance_from_its_curve() -> None:
    """Known truth: a run's level is the median over its distinct works of each work's median distance from
    the curve (a work launched 5 times counts once); a correction with a run term adds ``weight x level``,
    clipped to the measured range; fitted on rows whose truth is ``-0.7 x level`` the weight is that slope shrunk
    by :data:`KEEP_RIDGE`; the projection's path takes the level over the family's kernels it moves."""
    from dataclasses import replace

    from perfscope.analysis.projection.times import device_model_ratio
    from perfscope.device_models import PairCorrection, run_level

    # works A (5 launches at d = 1), B (d = 0), C (d = -0.2): medians per work 1, 0, -0.2 -> their median 0
    assert run_level(np.array([1.0] * 5 + [0.0, -0.2]), np.array([1] * 5 + [2, 3])) == pytest.approx(0.0)
    assert math.isnan(run_level(np.array([np.nan]), np.array([1])))
    corr = PairCorrection("none", (0.0,) * 21, 0.0, 0.0, 1, choice="run", run_coef=-0.5, run_lo=-1.0, run_hi=1.0)
    assert corr.factor(np.ones(3), source_run=np.array([math.log(2.0), 3.0, np.nan])) == pytest.approx(
        [2.0 ** -0.5, math.exp(-0.5), 1.0])
    assert PairCorrection.from_dict(corr.to_dict()) == corr
    lv = np.repeat(np.linspace(-0.8, 0.8, 9), 5)
    rows = pd.DataFrame({"roof_s_s": 1e-5, "flops_s": 1e9, "bytes_s": 1e7, "le": -0.7 * lv, "res_run_s": lv,
                         "dataset": "synthetic", "vendor_s": "nvidia", "vendor_t": "amd", "device_s": "H100 SXM5 80 GB",
                         "device_t": "MI300X"})
    fitted = dfit._fit_terms(rows, "run")
    s = float(np.sum(lv * lv))
    assert fitted is not None and fitted.uses_run and fitted.run_coef == pytest.approx(-0.7 * s / (s + dfit.KEEP_RIDGE))
    models = device_models()
    src, tgt = models.devices["H100 SXM5 80 GB"], models.devices["MI300X"]
    mine = replace(models, pairs={"H100 SXM5 80 GB -> MI300X": {"gemm-bf16": corr}})
    fam = np.array(["gemm-bf16"] * 3, object)
    r = np.array([1e-5, 2e-5, 4e-5])
    g_s = models.curve(src, "gemm-bf16")[0].time_s(r)  # type: ignore[union-attr]
    base, _ = device_model_ratio(fam, r, r * 0.8, src, tgt, replace(models, pairs={}))
    # every kernel twice its curve's time: the run's level is log 2 and each kernel gets 2^-0.5
    got, _ = device_model_ratio(fam, r, r * 0.8, src, tgt, mine, source_time_s=2.0 * g_s)
    assert got == pytest.approx(base * 2.0 ** -0.5)
