"""Fitting the device models (:mod:`perfscope.device_models`) from public measurements, and their
held-out validation (the bands).

**Observations.** Every measured kernel becomes one row: the dataset, a key that names the same work
on every device that ran it (a table's shape; a trace's op, input shapes and category), the device (its
datasheet row), its family (:func:`perfscope.device_models.kernel_family`), its work (FLOPs, DRAM bytes,
from perfscope's cost formulas) and its time. Repeats of a key on one device (a layer's GEMM in every
layer) are one row: their median time, weighted by the square root of their count. Read from:

- the published cross-GPU tables (``tests/fixtures/crossgpu/``): aiconfigurator A100 / H100 GEMMs and
  attention, vidur A100 / H100 / A40 Llama-2-7B operators, LLMCompass A100 / MI210 sweeps;
- real traces of the same model on two GPUs (TraceLens's BERT-small and TimeSformer on H100 and MI300X):
  kernels of one op with the same input shapes, as many on each side, are the same work;
- real traces of one GPU (H100 Qwen, B200, A100 training, MI300X vLLM / SGLang decode, MI300X norms,
  MI308X FlashMLA, perfscope's own H200 engine run): each kernel's time against its own work.

**The fit** (:func:`fit`). For each observation ``y = log(T / R)`` with ``R`` its roof time on its device
(datasheet peaks; a GEMM's 2-norm of compute and memory time), the model is
``y = a[device, family](log10 R) + u[key] + noise``: ``a`` is piecewise linear over the knots
(:func:`perfscope.device_models.knots`), ``u`` the key's own difficulty, shared by every device that ran
it (a shape that is hard on the A100 is hard on the H100), pulled to 0 by a ridge (a key seen on one
device lends its curve half its residual). A second-difference penalty keeps each curve smooth; Huber
weights keep an outlier (a 20x slower ROCm bmm) from bending it. Solved by alternating: each curve is a
small weighted least-squares problem given ``u``; ``u`` a weighted mean given the curves.

**Projection.** A kernel measured ``T_s`` on device s takes ``T_s x g_t(R_t) / g_s(R_s)`` on device t,
``g_d(R) = max(floor, R exp(a_d(log10 R)))``: it keeps its own distance from its family's curve, and
moves along the curves of the two devices; times ``exp(c(x))``, the pair's correction where the two devices
ran the same work of the family (:func:`pair_corrections`: fitted on those pairs' residuals after the
curves, along a GEMM's log FLOPs per byte or any other family's log roof time).

**Validation** (:func:`cross_validate`). :data:`OUTER_FOLDS` folds by a hash of the key: each fold's rows are
projected with the models fitted on the other folds only (every device pair, both directions, that shares keys),
so every error is held out. The bands are the p10 / p90 of ``log(measured / projected)`` per family group
and vendor pair, widened (:func:`bands`); :func:`coverage` checks bands taken from the other folds' rows on
each fold's rows.
"""

from __future__ import annotations

import functools
import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.datasheets import DATASHEETS, find_datasheet
from perfscope.device_models import (
    N_BINS,
    WAVE_TILES,
    Band,
    Curve,
    DeviceModel,
    DeviceModels,
    PairCorrection,
    at_least,
    axis_knots,
    curve_step,
    family_group,
    gemm_bmn,
    interp_weights,
    pair_axis,
    pair_axis_name,
    run_levels,
    shape_classes,
    sheet_identity,
    spec_identity,
)

from . import crossgpu
from .devices import datasheet_roofs, families, roof_times
from .times import project_times

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from perfscope.report import Report

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"

SOURCES: dict[str, str] = {
    "aiconfigurator": "ai-dynamo/aiconfigurator (Apache-2.0): measured GEMM and attention latency tables, "
                      "vLLM 0.14 kernels, A100-SXM4-80GB and H100 80GB HBM3",
    "vidur": "microsoft/vidur (MIT): Llama-2-7B per-operator times, 1-4096 tokens, TP 1-8, A100 / H100 / A40",
    "llmcompass": "PrincetonUniversity/LLMCompass (BSD-3): fp16 matmul, softmax, layernorm, GELU sweeps measured "
                  "on A100-80GB and MI210",
    "tracelens bert-small": "AMD-AGI/TraceLens @171dd747 (MIT), tests/traces/{h100,mi300}: BERT-small inference "
                            "traced with one harness on H100 and MI300X",
    "tracelens timesformer": "AMD-AGI/TraceLens @171dd747 (MIT), tests/traces/{h100,mi300}: TimeSformer inference "
                             "traced with one harness on H100 and MI300X",
    "tracelens-h100-qwen": "AMD-AGI/TraceLens (MIT): Qwen1.5-0.5B-Chat inference on H100",
    "tracelens-b200": "AMD-AGI/TraceLens (MIT): an eager training step on B200 (rank 0 of 8, NCCL)",
    "tracelens-mi300x-vllm": "AMD-AGI/TraceLens @171dd747 (MIT): vLLM V1 decode step of 32 requests on MI300X "
                             "(graph replay joined to its capture trace)",
    "tracelens-mi300x-sglang": "AMD-AGI/TraceLens @171dd747 (MIT): SGLang Qwen3-8B decode step on MI300X",
    "tracelens-mi300x-norms": "AMD-AGI/TraceLens (MIT): normalization layers test on MI300X",
    "tracelens-mi300x-compile": "AMD-AGI/TraceLens (MIT): a torch.compile run on MI300X (hipBLASLt GEMMs of "
                                "32768 rows, Triton kernels)",
    "hta-a100-training": "facebookresearch/HolisticTraceAnalysis (MIT): a training step on A100-SXM4-80GB "
                         "(rank 0 of 16)",
    "aiter-mi308x": "vjelic/aiter-glog-fork (MIT): FlashMLA decode under rocprof-compute 3.0 on MI308X",
    "perfscope-h200": "perfscope's own engine, Llama-3.2-1B batch 1 on one H200 (tests/fixtures/h200)",
    "tracelens gemms": "AMD-AGI/TraceLens (MIT), tests/traces/{h100,mi300}/*_perf_report_csvs/GEMM.csv: the GEMM ops "
                       "of Qwen1.5-0.5B, an NSFW image classifier and OWLv2, each traced with one harness on H100 and "
                       "MI300X (kernel time per op and input shapes)",
    "tracelens families": "AMD-AGI/TraceLens (MIT), tests/traces/{h100,mi300}/*_perf_report_csvs/{SDPA_fwd,"
                          "BinaryElementwise,UnaryElementwise,Normalization,Reduce_fwd}.csv: the other ops of the same "
                          "three models on H100 and MI300X (attention, elementwise, norm, copies; kernel time per op "
                          "and inputs)",
}
"""Every dataset the models are fitted from (tests/fixtures/README.md has the commits and licences)."""

PAIR_TRACES = {
    "tracelens bert-small": ("kineto/tracelens_h100__gaunernst_bert-small-uncased__1016001.json.gz",
                             "crossgpu/tracelens_h100_vs_mi300/mi300__gaunernst_bert-small-uncased__1016001.json.gz"),
    "tracelens timesformer": (
        "crossgpu/tracelens_h100_vs_mi300/h100__facebook_timesformer-base-finetuned-k400__1016002.json.gz",
        "crossgpu/tracelens_h100_vs_mi300/mi300__facebook_timesformer-base-finetuned-k400__1016002.json.gz"),
}
"""The same model traced on two GPUs: dataset -> (H100 trace, MI300X trace), under tests/fixtures."""

SINGLE_TRACES = {
    "tracelens-h100-qwen": "kineto/tracelens_h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "tracelens-b200": "kineto/tracelens_b200__eager_trace.json.gz",
    "hta-a100-training": "kineto/hta_negative_queue_length_values_check__rank0.json.gz",
    "tracelens-mi300x-vllm": "thirdparty/tracelens_vllm_decode_full/graph_execution.json.gz",
    "tracelens-mi300x-sglang": "thirdparty/tracelens_sglang_decode/sglang_Qwen3-8B_decode.json.gz",
    "tracelens-mi300x-norms": "memory/tracelens_mi300x_normalization_profile_memory/normalization_layer_test.json.gz",
    "tracelens-mi300x-compile": "kineto/tracelens_torch_compile_triton__trace.json.gz",
    "aiter-mi308x": "rocprof/aiter_fmla_MI308X_rocprof_compute",
    "perfscope-h200": "h200/h200_llama1b_b1_p2048_g64.perfscope",
}
"""Traces of one GPU: dataset -> path under tests/fixtures (each kernel against its own work)."""

TABLE_FAMILY = {
    "aiconfigurator gemm": "gemm-bf16", "aiconfigurator decode attention": "attention-decode",
    "aiconfigurator prefill attention": "attention-prefill", "llmcompass matmul": "gemm-fp16",
    "llmcompass softmax": "reduction", "llmcompass layernorm": "reduction", "llmcompass gelu": "elementwise",
    "vidur llama-2-7b attn_pre_proj": "gemm-fp16", "vidur llama-2-7b attn_post_proj": "gemm-fp16",
    "vidur llama-2-7b mlp_up_proj": "gemm-fp16", "vidur llama-2-7b mlp_down_proj": "gemm-fp16",
    "vidur llama-2-7b mlp_act": "elementwise", "vidur llama-2-7b attn_rope": "elementwise",
    "vidur llama-2-7b add": "elementwise", "vidur llama-2-7b input_layernorm": "reduction",
    "vidur llama-2-7b post_attention_layernorm": "reduction", "vidur llama-2-7b emb": "copy",
    "tracelens gemms bf16": "gemm-bf16", "tracelens gemms fp16": "gemm-fp16", "tracelens gemms fp32": "gemm-fp32",
}
"""A published table's family."""

HOST_TIMED = ("llmcompass",)
"""Tables timed from the host: each sweep's times hold a fixed harness cost (launch and sync; LLMCompass's GELU
on the A100 takes 47-48 us from 1 K to 16 M elements, on the MI210 21 us), which a kernel in a trace does
not have. The fit takes each sweep's plateau (its shortest time on that device) off, and keeps the rows
at least :data:`PLATEAU_FACTOR` times above it on the device (below, the time is the harness's)."""
PLATEAU_FACTOR = 2.0

OBS_COLUMNS = ["dataset", "table", "key", "device", "vendor", "generation", "family", "precision", "flops",
               "bytes", "time_s", "count", "shape_class", "gemm_b", "gemm_m", "gemm_n", "run", "op"]
"""``run``: one harness run on one device (a trace, a table; a perf report's model), whose kernels of one family
share a level on the source (a run-level term, :attr:`perfscope.device_models.PairCorrection.run_coef`); ``op``:
the operator a trace's kernel row names (``aten::add``, ``_C::silu_and_mul``; "" where a table's row is no
such operator), an op term's key (:attr:`perfscope.device_models.PairCorrection.ops`)."""

RIDGE = 0.3
"""The pull of a key's own difficulty ``u`` to 0, in observation weights: a key seen once keeps half its
residual."""
DATASET_RIDGE = 10.0
"""The pull of a dataset's own level ``c`` (per family group: a harness, a library: PyTorch's eager GEMMs in
a trace against vLLM's tuned ones in a table) to 0, in observation weights. A device measured by one
dataset alone keeps that dataset's level in its curve."""
DEVICE_RIDGE = 0.03
"""The pull of a GPU's departure from its family's curve to 0, per knot, in observation weights."""
SMOOTH = 4.0
"""The second-difference penalty on each curve, in observation weights per knot."""


@dataclass(frozen=True)
class CurveSettings:
    """The curves' smoothness and ridges (:func:`fit_curves`): :data:`SMOOTH`, :data:`DEVICE_RIDGE`,
    :data:`DATASET_RIDGE`, :data:`RIDGE` by default."""

    smooth: float = SMOOTH
    device_ridge: float = DEVICE_RIDGE
    dataset_ridge: float = DATASET_RIDGE
    key_ridge: float = RIDGE

    @property
    def name(self) -> str:
        return (f"smooth {self.smooth:g}, device {self.device_ridge:g}, dataset {self.dataset_ridge:g}, "
                f"key {self.key_ridge:g}")

    def to_dict(self) -> dict[str, float]:
        return {"smooth": self.smooth, "device_ridge": self.device_ridge, "dataset_ridge": self.dataset_ridge,
                "key_ridge": self.key_ridge}


CURVE_SETTINGS = (CurveSettings(), CurveSettings(smooth=1.0), CurveSettings(smooth=16.0),
                  CurveSettings(device_ridge=0.01), CurveSettings(device_ridge=0.1),
                  CurveSettings(dataset_ridge=3.0), CurveSettings(dataset_ridge=30.0))
"""The curves' settings :func:`select_pair_choices` picks among, by the same inner cross-validation as the
pair corrections' terms (never on rows it is checked on): the defaults, and each setting one step (smoothness
x4, ridges about x3) either side of its default with the others at theirs; the first (the defaults) wins a tie."""
HUBER = 0.25
"""Residuals (natural log) past this are down-weighted: errors past ~28% count linearly, not squared."""
ITERATIONS = 25


# ----------------------------------------------------------------------------- observations
def _table_device(gpu: str) -> tuple[str, str, str]:
    sheet = find_datasheet(crossgpu.DEVICE_NAMES[gpu])
    assert sheet is not None, gpu
    return sheet_identity(sheet)


def table_observations(root: Path = FIXTURES / "crossgpu") -> pd.DataFrame:
    """Every row of the published cross-GPU tables, one observation per (device, row)."""
    frames = []
    for name, loader in crossgpu.SOURCES.items():
        for src, tgt, rows in loader(root):
            key = (rows["table"] + "|" + rows["flops"].round(0).astype(str) + "|" + rows["bytes"].round(0).astype(str)
                   + "|" + rows["size"].round(0).astype(str))
            if "shape" in rows:  # a table that names its shapes: one key per shape
                key = key + "|" + rows["shape"].astype(str)
            # a table of many families names each row's; the others are one family per table
            family = rows["family"] if "family" in rows else rows["table"].map(TABLE_FAMILY).fillna("other")
            for gpu, col in ((src, "t_src_s"), (tgt, "t_tgt_s")):
                model, vendor, gen = _table_device(gpu)
                frames.append(pd.DataFrame({
                    "dataset": name, "table": rows["table"], "key": key, "device": model, "vendor": vendor,
                    "generation": gen, "family": family,
                    "precision": rows["precision"], "flops": rows["flops"], "bytes": rows["bytes"],
                    "time_s": rows[col], "count": 1,
                    "shape_class": rows.get("shape_class", ""),
                    **{c: rows.get(c, np.nan) for c in ("gemm_b", "gemm_m", "gemm_n")},
                    "run": name + "|" + rows["run"].astype(str) if "run" in rows else name,
                    "op": rows["aten"].fillna("").astype(str) if "aten" in rows else ""}))
    obs = pd.concat(frames, ignore_index=True)
    obs = obs[np.isfinite(obs["time_s"]) & (obs["time_s"] > 0)]
    host = obs["dataset"].isin(HOST_TIMED).to_numpy()
    if host.any():
        plateau = obs.groupby(["table", "device"], sort=False)["time_s"].transform("min").to_numpy()
        keep = ~host | (obs["time_s"].to_numpy() >= PLATEAU_FACTOR * plateau)
        obs = obs.assign(time_s=np.where(host, obs["time_s"].to_numpy() - plateau, obs["time_s"].to_numpy()))[keep]
    return _collapse(obs)


def _collapse(obs: pd.DataFrame) -> pd.DataFrame:
    """One row per (dataset, device, key): the median time, the count of repeats."""
    keys = ["dataset", "device", "key"]
    g = obs.groupby(keys, sort=False)
    first = g.first().reset_index()
    first["time_s"] = g["time_s"].median().to_numpy()
    first["count"] = g["count"].sum().to_numpy()
    return first[OBS_COLUMNS]


def report_observations(report: Report, dataset: str, table: str | None = None) -> pd.DataFrame:
    """A trace's costed kernels as observations: key = op, input shapes and category (a kernel without an
    op, its name). Kernels of a device no datasheet row names, or of unknown work, are left out."""
    dev = report.device
    ident = spec_identity(dev) if dev is not None else None
    k = report.kernels
    if ident is None or not len(k):
        return pd.DataFrame(columns=OBS_COLUMNS)
    model, vendor, gen = ident
    f = k["flops"].to_numpy(np.float64, na_value=np.nan)
    b = k["dram_bytes"].to_numpy(np.float64, na_value=np.nan)
    ok = (np.isfinite(f) | np.isfinite(b)) & (k["duration_ns"].to_numpy(np.float64, na_value=np.nan) > 0)
    fam = families(k, f, b, k["precision"].astype("object"))
    label = k["op"].astype("object").where(k["op"].notna(), k["name"].astype("object"))
    key = (label.astype(str) + "|" + k["op_shapes"].astype("object").fillna("").astype(str) + "|"
           + k["category"].astype("object").fillna("").astype(str))
    obs = pd.DataFrame({"dataset": dataset, "table": table or dataset, "key": key.to_numpy(), "device": model,
                        "vendor": vendor, "generation": gen, "family": fam,
                        "precision": k["precision"].astype("object").to_numpy(), "flops": np.nan_to_num(f),
                        "bytes": np.nan_to_num(b), "time_s": k["duration_ns"].to_numpy(np.float64, na_value=np.nan) * 1e-9,
                        "count": 1, "shape_class": shape_classes(k["op"].to_numpy(object), k["op_shapes"].to_numpy(object),
                                                                 fam),
                        **dict(zip(("gemm_b", "gemm_m", "gemm_n"),
                                   gemm_bmn(k["op"].to_numpy(object), k["op_shapes"].to_numpy(object), fam).T)),
                        "run": dataset, "op": k["op"].astype("object").fillna("").astype(str).to_numpy()})[ok]
    return _collapse(obs)


@functools.lru_cache(maxsize=32)
def _load(path: Path) -> Report:
    from perfscope.api import load

    return load(str(path))


def trace_reports(root: Path = FIXTURES) -> dict[str, Report]:
    """Every trace the models are fitted from, imported (once per process): dataset -> report (a pair's
    two as ``NAME h100`` and ``NAME mi300x``)."""
    out = {}
    for name, (a, b) in PAIR_TRACES.items():
        out[f"{name} h100"], out[f"{name} mi300x"] = _load(root / a), _load(root / b)
    for name, p in SINGLE_TRACES.items():
        if (root / p).exists():
            out[name] = _load(root / p)
    return out


def pair_observations(root: Path = FIXTURES, datasets: Iterable[str] | None = None) -> pd.DataFrame:
    """The same model traced on two GPUs: keys with as many kernels on each side are the same work
    (the rest, a convolution split differently by each vendor's library, is each device's own)."""
    frames = []
    for name in datasets or PAIR_TRACES:
        a, b = (report_observations(_load(root / p), name) for p in PAIR_TRACES[name])
        both = a.merge(b, on="key", suffixes=("_a", "_b"))
        same = set(both.loc[both["count_a"] == both["count_b"], "key"])
        for side, tag in ((a, "a"), (b, "b")):
            side = side.copy()
            side["table"] = name + " " + side["family"]
            own = ~side["key"].isin(same)
            side.loc[own, "key"] = side.loc[own, "key"] + "|own-" + tag
            frames.append(side)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=OBS_COLUMNS)


def single_observations(root: Path = FIXTURES, datasets: Iterable[str] | None = None) -> pd.DataFrame:
    """Traces of one GPU, each kernel against its own work (absolute efficiency data)."""
    frames = []
    for name in datasets or SINGLE_TRACES:
        path = root / SINGLE_TRACES[name]
        if path.exists():
            obs = report_observations(_load(path), name)
            obs["key"] = name + "|" + obs["key"]
            frames.append(obs)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=OBS_COLUMNS)


def all_observations(root: Path = FIXTURES, *, singles: bool = True) -> pd.DataFrame:
    """Tables, pairs and (``singles``) one-GPU traces, with each row's roof time on its device."""
    parts = [table_observations(root / "crossgpu"), pair_observations(root)]
    if singles:
        parts.append(single_observations(root))
    return with_roofs(pd.concat(parts, ignore_index=True))


# ----------------------------------------------------------------------------- roofs
def with_roofs(obs: pd.DataFrame) -> pd.DataFrame:
    """``obs`` with ``roof_s`` (on its own device) and ``y = log(T / R)``; rows without a positive roof
    time are dropped."""
    obs = obs.reset_index(drop=True)
    r = np.full(len(obs), np.nan)
    for dev, idx in obs.groupby("device", sort=False).indices.items():
        sub = obs.iloc[idx]
        r[idx] = roof_times(sub["flops"].to_numpy(), sub["bytes"].to_numpy(), sub["precision"].astype("object"),
                            sub["family"].to_numpy(), datasheet_roofs(dev))
    obs["roof_s"] = r
    obs = obs[np.isfinite(r) & (r > 0)].reset_index(drop=True)
    obs["y"] = np.log(obs["time_s"] / obs["roof_s"])
    return obs


# ----------------------------------------------------------------------------- fit
def _curve_system(i: np.ndarray, w_up: np.ndarray, weights: np.ndarray, target: np.ndarray,
                  ridge: float = 1e-6, smooth: float = SMOOTH) -> np.ndarray:
    """Weighted least squares for one curve's knot values, with the smoothness penalty and a ridge (toward 0)."""
    ata = np.zeros((N_BINS, N_BINS))
    atb = np.zeros(N_BINS)
    lo, hi = 1.0 - w_up, w_up
    j = np.minimum(i + 1, N_BINS - 1)
    for (p, wp), (q, wq) in (((i, lo), (i, lo)), ((i, lo), (j, hi)), ((j, hi), (i, lo)), ((j, hi), (j, hi))):
        np.add.at(ata, (p, q), weights * wp * wq)
    np.add.at(atb, i, weights * lo * target)
    np.add.at(atb, j, weights * hi * target)
    d2 = np.zeros((N_BINS - 2, N_BINS))
    for r in range(N_BINS - 2):
        d2[r, r:r + 3] = (1.0, -2.0, 1.0)
    ata += smooth * d2.T @ d2 + ridge * np.eye(N_BINS)
    return np.linalg.solve(ata, atb)


@dataclass
class Fit:
    """A fitted set of curves (before they become :class:`DeviceModel` s)."""

    curves: dict[tuple[str, str], np.ndarray]
    residual: np.ndarray
    priors: dict[str, np.ndarray]


def fit_curves(obs: pd.DataFrame, settings: CurveSettings | None = None) -> Fit:
    """The curves ``a[device, family] = p[family] + d[device, family]``, datasets' ``c`` and keys' ``u`` of
    ``y = a(log10 R) + c + u + noise`` (module docstring): ``p`` is the family's curve over every GPU, ``d``
    a GPU's own departure from it, pulled to 0 by :data:`DEVICE_RIDGE` (so past a GPU's measured sizes its
    curve returns to the family's). ``settings``: the smoothness and ridges (:class:`CurveSettings`; the
    defaults where None)."""
    cs = settings or CurveSettings()
    y = obs["y"].to_numpy(np.float64, na_value=np.nan)
    base_w = np.sqrt(obs["count"].to_numpy(np.float64, na_value=np.nan))
    i, w_up = interp_weights(np.log10(obs["roof_s"].to_numpy(np.float64, na_value=np.nan)))
    j = np.minimum(i + 1, N_BINS - 1)
    curve_codes, curve_keys = pd.factorize(pd.MultiIndex.from_arrays([obs["device"], obs["family"]]))
    fam_codes, fam_keys = pd.factorize(obs["family"])
    key_codes, _ = pd.factorize(obs["key"])
    groups_of = np.array([family_group(f) for f in obs["family"]], object)
    set_codes, _ = pd.factorize(pd.MultiIndex.from_arrays([obs["dataset"], groups_of]))
    groups = [np.flatnonzero(curve_codes == c) for c in range(len(curve_keys))]
    fgroups = [np.flatnonzero(fam_codes == f) for f in range(len(fam_keys))]
    u = np.zeros(int(key_codes.max()) + 1 if len(key_codes) else 0)
    c = np.zeros(int(set_codes.max()) + 1 if len(set_codes) else 0)
    prior = np.zeros((len(fam_keys), N_BINS))
    d = np.zeros((len(curve_keys), N_BINS))
    w = base_w.copy()
    resid = np.zeros_like(y)

    def at(table: np.ndarray, codes: np.ndarray) -> np.ndarray:
        return table[codes, i] * (1.0 - w_up) + table[codes, j] * w_up

    for _ in range(ITERATIONS):
        target = y - u[key_codes] - c[set_codes] - at(d, curve_codes)
        for f, idx in enumerate(fgroups):
            prior[f] = _curve_system(i[idx], w_up[idx], w[idx], target[idx], smooth=cs.smooth)
        target = y - u[key_codes] - c[set_codes] - at(prior, fam_codes)
        for k, idx in enumerate(groups):
            d[k] = _curve_system(i[idx], w_up[idx], w[idx], target[idx], cs.device_ridge, cs.smooth)
        fitted = at(prior, fam_codes) + at(d, curve_codes)
        rest = y - fitted - u[key_codes]
        c = np.bincount(set_codes, w * rest, len(c)) / (np.bincount(set_codes, w, len(c)) + cs.dataset_ridge)
        rest = y - fitted - c[set_codes]
        u = np.bincount(key_codes, w * rest, len(u)) / (np.bincount(key_codes, w, len(u)) + cs.key_ridge)
        resid = rest - u[key_codes]
        w = base_w * np.minimum(1.0, HUBER / np.maximum(np.abs(resid), 1e-12))
    fam_index = {str(f): n for n, f in enumerate(fam_keys)}
    return Fit({(str(dv), str(f)): prior[fam_index[str(f)]] + d[k] for k, (dv, f) in enumerate(curve_keys)}, resid,
               {str(f): prior[n] for n, f in enumerate(fam_keys)})


PROFILED_TABLES = ("tracelens gemms", "tracelens families")
"""Tables whose times are kernels timed by a profiler in eager traces (TraceLens's per-op kernel times, GEMMs
and the other families)."""
TRACES = frozenset(PAIR_TRACES) | frozenset(SINGLE_TRACES) | frozenset(PROFILED_TABLES)
"""The datasets of kernels as a user's trace holds them (profiler traces); the rest are tables."""


FLOOR_ROOF_S = 1e-6
"""A floor is read from kernels whose work takes the GPU under this at its datasheet peaks (roof time): their
time is the fixed cost. The shortest of a device's larger kernels is no floor (the MI300X's one traced
prefill attention, 3.7 ms for 1.1 TFLOP, would make every short attention take 3.7 ms)."""


def _floors_ns(s: pd.DataFrame) -> tuple[float, float]:
    """(trace floor, table floor) of one device and family: its shortest small kernel (:data:`FLOOR_ROOF_S`)
    in a profiler trace, and in a table timed on the GPU (not from the host: LLMCompass's rows hold its
    harness's 21-48 us); NaN where there is none."""
    t = s["time_s"].to_numpy(np.float64, na_value=np.nan) * 1e9
    small = s["roof_s"].to_numpy(np.float64, na_value=np.nan) < FLOOR_ROOF_S
    trace = s["dataset"].isin(TRACES).to_numpy() & small
    table = ~s["dataset"].isin(TRACES).to_numpy() & ~s["dataset"].isin(HOST_TIMED).to_numpy() & small
    return (float(t[trace].min()) if trace.any() else np.nan, float(t[table].min()) if table.any() else np.nan)


def _floor_ns(s: pd.DataFrame, family_floor: float | None) -> float:
    """A device's floor for a family: its shortest kernel in a profiler trace, else in a table timed on the
    GPU; a device measured only from the host (LLMCompass's MI210) takes the family's floor over the GPUs
    measured (:func:`_family_floors`)."""
    for f in _floors_ns(s):
        if not np.isnan(f):
            return f
    if family_floor is not None and not np.isnan(family_floor):
        return float(family_floor)
    return float(s["time_s"].min() * 1e9)


def _family_floors(obs: pd.DataFrame) -> pd.Series:
    """Per family, the median over the devices of their floor (trace, else timed table)."""
    per: dict[str, list[float]] = {}
    for (fam, _), s in obs.groupby(["family", "device"], sort=False):
        f = next((x for x in _floors_ns(s) if not np.isnan(x)), np.nan)
        if not np.isnan(f):
            per.setdefault(str(fam), []).append(f)
    return pd.Series({fam: float(np.median(v)) for fam, v in per.items()}, dtype=float)


def build_models(obs: pd.DataFrame, fit: Fit, launch: Mapping[str, tuple[float | None, float | None]] | None = None
                 ) -> DeviceModels:
    """:class:`DeviceModels` from a fit and the observations it was fitted on."""
    devices: dict[str, DeviceModel] = {}
    # a kernel's floor is what a profiler timed on the GPU: a host-timed table's shortest row is its harness's
    family_floor = _family_floors(obs)
    for dev, sub in obs.groupby("device", sort=False):
        curves = {}
        for fam, s in sub.groupby("family", sort=False):
            lr = np.log10(s["roof_s"].to_numpy(np.float64, na_value=np.nan))
            every = np.log10(obs.loc[obs["family"] == fam, "roof_s"].to_numpy(np.float64, na_value=np.nan))
            i, _ = interp_weights(lr)
            counts = np.bincount(i, minlength=N_BINS)
            trace_floor, table_floor = _floors_ns(s)
            curves[str(fam)] = Curve(tuple(float(x) for x in fit.curves[(str(dev), str(fam))]),
                                     tuple(int(c) for c in counts), float(every.min()), float(every.max()),
                                     _floor_ns(s, family_floor.get(fam)), len(s), tuple(sorted(set(s["dataset"]))),
                                     float(lr.min()), float(lr.max()), trace_floor, table_floor)
        first = sub.iloc[0]
        lc, gap = (launch or {}).get(str(dev), (None, None))
        devices[str(dev)] = DeviceModel(str(dev), str(first["vendor"]), str(first["generation"]), curves, lc, gap,
                                        tuple(sorted(set(sub["dataset"]))))
    priors = {}
    for fam, s in obs.groupby("family", sort=False):
        lr = np.log10(s["roof_s"].to_numpy(np.float64, na_value=np.nan))
        i, _ = interp_weights(lr)
        floor = family_floor.get(fam)
        priors[str(fam)] = Curve(tuple(float(x) for x in fit.priors[str(fam)]),
                                 tuple(int(c) for c in np.bincount(i, minlength=N_BINS)), float(lr.min()),
                                 float(lr.max()), float(floor) if floor is not None and not np.isnan(floor) else
                                 float(s["time_s"].min() * 1e9), len(s), tuple(sorted(set(s["dataset"]))),
                                 float(lr.min()), float(lr.max()))
    return DeviceModels(devices, sources=dict(SOURCES), priors=priors)


def fit(obs: pd.DataFrame, launch: Mapping[str, tuple[float | None, float | None]] | None = None,
        choices: Mapping[str, str] | None = None, candidates: Mapping[str, tuple[str, ...]] | None = None
        ) -> DeviceModels:
    """Device models fitted on ``obs`` (:func:`all_observations`): the curves, then each device pair's
    correction from the work both ran (:func:`pair_corrections`), its terms picked by a cross-validation
    inside ``obs`` among ``candidates`` (:func:`select_pair_choices`; ``choices`` given: those)."""
    scores: dict[str, dict[str, float]] = {}
    settings = CurveSettings()
    if choices is None:
        choices, scores, settings = select_pair_choices(obs, candidates, CURVE_SETTINGS)
    models = build_models(obs, fit_curves(obs, settings), launch)
    selection = {g: {"choice": c, "scores_pct": {k: round(v, 3) for k, v in scores.get(g, {}).items()},
                     "inner_folds": INNER_FOLDS} for g, c in sorted(choices.items())}
    if "curves" in scores:  # the curves' settings, picked in the same inner cross-validation
        selection["curves"] = {"choice": settings.name, "settings": settings.to_dict(),
                               "scores_pct": {k: round(v, 3) for k, v in scores["curves"].items()},
                               "inner_folds": INNER_FOLDS}
    return DeviceModels(models.devices, models.bands, models.sources, models.validation, models.fitted_by,
                        models.priors, pair_corrections(obs, models, choices), selection)


def _work(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A pair row's source roof time, FLOPs and bytes (the axes of a :class:`PairCorrection`)."""
    r, f, b = (rows[c].to_numpy(np.float64, na_value=np.nan) for c in ("roof_s_s", "flops_s", "bytes_s"))
    return r, f, b


def _classes(rows: pd.DataFrame) -> np.ndarray | None:
    """A pair row's GEMM shape class on the source (None where the rows carry none)."""
    return rows["shape_class_s"].to_numpy(object) if "shape_class_s" in rows else None


def _resid(rows: pd.DataFrame) -> np.ndarray | None:
    """A pair row's distance from its family's curve on the source (None where the rows carry none)."""
    return rows["res_s"].to_numpy(np.float64, na_value=np.nan) if "res_s" in rows else None


def _ops(rows: pd.DataFrame) -> np.ndarray | None:
    """A pair row's operator on the source (None where the rows carry none)."""
    return rows["op_s"].to_numpy(object) if "op_s" in rows else None


def _run(rows: pd.DataFrame) -> np.ndarray | None:
    """A pair row's run level on the source (None where the rows carry none)."""
    return rows["res_run_s"].to_numpy(np.float64, na_value=np.nan) if "res_run_s" in rows else None


RUN_KEYS = ["run_s", "device_s", "device_t", "family"]
"""A run's kernels of one family, on one pair of devices (its level, :func:`_run_levels`)."""


def _run_levels(rows: pd.DataFrame, resid: np.ndarray) -> pd.Series:
    """Each run's level on the source over the pair rows ``rows`` (:func:`perfscope.device_models.run_levels`,
    a work per source roof time, as a user's projection reads it), indexed by :data:`RUN_KEYS`."""
    if not len(rows):
        return pd.Series(dtype=np.float64)
    return run_levels(resid, rows["roof_s_s"].to_numpy(np.float64, na_value=np.nan),
                      pd.DataFrame({k: rows[k].to_numpy(object) for k in RUN_KEYS}))


def _map_levels(rows: pd.DataFrame, levels: pd.Series) -> np.ndarray:
    """Each pair row's run level from ``levels`` (:func:`_run_levels`); NaN where its run has none."""
    if not len(rows) or not len(levels):
        return np.full(len(rows), np.nan)
    return levels.reindex(pd.MultiIndex.from_frame(rows[RUN_KEYS].astype(object))).to_numpy(np.float64, na_value=np.nan)


def _dims(rows: pd.DataFrame) -> np.ndarray | None:
    """A pair row's GEMM (batch, M, N) on the source, shape (n, 3) (None where the rows carry none)."""
    cols = ("gemm_b_s", "gemm_m_s", "gemm_n_s")
    if not all(c in rows for c in cols):
        return None
    return np.column_stack([rows[c].to_numpy(np.float64, na_value=np.nan) for c in cols])


def _tile_name(nv: tuple[int, int], amd: tuple[int, int]) -> str:
    return f"{nv[0]}x{nv[1]}/{amd[0]}x{amd[1]}"


WAVES = tuple(f"wave{_tile_name(nv, amd)}" for nv in WAVE_TILES["nvidia"] for amd in WAVE_TILES["amd"])
"""The wave (tile occupancy) terms a GEMM correction may have, one per nominal tile of each vendor
(:data:`perfscope.device_models.WAVE_TILES`): ``waveNV/AMD`` adds the physical factor ``log(fill_source /
fill_target)`` (:func:`perfscope.device_models.wave_fill`; a GEMM that fills the H100's 132 SMs and a fraction of
the MI300X's 304 CUs runs relatively slower on the MI300X), ``wave~NV/AMD`` the same times a fitted weight
(pulled to 0 by :data:`WAVE_RIDGE`)."""
WAVE_RIDGE = 1.0
"""The pull of a fitted wave weight (``wave~``) to 0, in observation weights."""

KEEP_RIDGE = 1.0
"""The pull of a persistence weight (a ``keep`` term, :attr:`perfscope.device_models.PairCorrection.keep_coef`)
to 0 (the kernel keeps all its distance from its curve), in observation weights: :data:`WAVE_RIDGE`'s."""

BASE_CANDIDATES: dict[str, tuple[str, ...]] = {
    "gemm": ("none", "roof", "intensity", "roof+class", "intensity+class", "intensity+roof", "intensity+roof+class"),
    "other": ("none", "roof")}
"""The candidates before the persistence term (``keep``) was offered (``python benchmarks/whatif_crossgpu.py
--no-keep`` measures them)."""

KEEP_CANDIDATES: dict[str, tuple[str, ...]] = {
    "gemm": (*BASE_CANDIDATES["gemm"], "keep", "intensity+keep", "intensity+roof+keep", "intensity+roof+class+keep"),
    "other": BASE_CANDIDATES["other"]}
"""The candidates before the run-level and op terms were offered, and before the persistence term was offered to
the other families (``python benchmarks/whatif_crossgpu.py --keep-only`` measures them)."""

CANDIDATES: dict[str, tuple[str, ...]] = {
    "gemm": (*KEEP_CANDIDATES["gemm"], "intensity+keep+run", "intensity+roof+keep+run", "intensity+roof+class+keep+run",
             "intensity+roof+keep+op", "intensity+roof+class+keep+op", "intensity+roof+keep+run+op"),
    "other": (*BASE_CANDIDATES["other"], "keep", "roof+keep", "roof+keep+run", "roof+op", "roof+keep+op", "roof+keep+run+op")}
"""The terms a pair correction may have, per family group, simplest first (a tie goes to the simpler):
nothing; a smooth function of the source's roof time or of a GEMM's FLOPs per byte; either plus a level per
GEMM shape class (:data:`perfscope.device_models.SHAPE_CLASSES`); both axes, added (backfitted); ``keep``: the
kernel's own distance from its family's curve on the source times a fitted weight (:data:`KEEP_RIDGE`), the share
of that distance it does not keep on the target (:attr:`perfscope.device_models.PairCorrection.keep_coef`);
``run``: the level of the kernel's run (its trace or table) on the source times a fitted weight
(:attr:`~perfscope.device_models.PairCorrection.run_coef`); ``op``: a level per operator (``aten::add``,
``aten::bmm``...) the pair measured, pulled to 0 like a class's (:attr:`~perfscope.device_models.PairCorrection.ops`).
Each term
has the curves' smoothness (:data:`SMOOTH`), its ridge toward 0 (:data:`DEVICE_RIDGE` per knot; a class
level :data:`DATASET_RIDGE`, so a class of few rows keeps little of its mean) and the Huber weights
(:data:`HUBER`). Which one a pair and family gets is picked by :func:`select_pair_choices`."""

WAVE_CANDIDATES: dict[str, tuple[str, ...]] = {
    "gemm": (*BASE_CANDIDATES["gemm"], *WAVES, *(f"wave~{w[4:]}" for w in WAVES),
             *(f"intensity+roof+{w}" for w in WAVES), *(f"intensity+roof+wave~{w[4:]}" for w in WAVES),
             *(f"intensity+roof+class+{w}" for w in WAVES), *(f"intensity+roof+class+wave~{w[4:]}" for w in WAVES)),
    "other": BASE_CANDIDATES["other"]}
""":data:`BASE_CANDIDATES` with a GEMM's wave (tile occupancy) term (:data:`WAVES`, its weight :data:`WAVE_RIDGE`) alone
or beside the axes (and the classes): offered to the inner cross-validation by ``python
benchmarks/whatif_crossgpu.py --wave`` (``candidates=WAVE_CANDIDATES``). Not the default: on every row the inner
cross-validation did not pick it (docs/whatif.md, "Wave quantisation")."""


def _wave_of(part: str) -> tuple[bool, tuple[int, int], tuple[int, int]] | None:
    """(fitted weight, NVIDIA tile, AMD tile) of a ``wave...`` term of a choice; None for any other term."""
    if not part.startswith("wave"):
        return None
    fitted = part.startswith("wave~")
    nv, amd = part[5 if fitted else 4:].split("/")
    a, b = (tuple(int(x) for x in t.split("x")) for t in (nv, amd))
    return fitted, (a[0], a[1]), (b[0], b[1])


@functools.lru_cache(maxsize=64)
def _units(device: str) -> int:
    """A datasheet row's SMs / CUs (0 where it does not say)."""
    sheet = next((d for d in DATASHEETS if d.model == device), None)
    return int(sheet.sm_count or 0) if sheet is not None else 0

INNER_FOLDS = 4
INNER_SALT = "inner|"
"""The inner split of :func:`select_pair_choices`: a hash (crc32) of ``INNER_SALT + key``, mod
:data:`INNER_FOLDS`: independent of the outer folds (:func:`fold_of`), so inside one outer training fold the
keys fall in both inner folds."""


def _group_of(family: str) -> str:
    """A family's group of :data:`CANDIDATES` (``gemm`` or ``other``)."""
    return "gemm" if str(family).startswith("gemm") else "other"


def _candidates(family: str, candidates: Mapping[str, tuple[str, ...]] | None = None) -> tuple[str, ...]:
    return (candidates or CANDIDATES)[_group_of(family)]


def _pair_rows(obs: pd.DataFrame, models: DeviceModels, run_obs: pd.DataFrame | None = None) -> pd.DataFrame:
    """The pairs of ``obs`` with ``le = log(T_target / projected by the curves alone)`` (finite only),
    ``res_s``, the source's distance from its family's curve, and ``res_run_s``, its run's level there
    (:func:`_project_pairs`; the runs' levels over the pairs of ``run_obs`` where given: a run's keys
    beyond ``obs``, whose source times a user's trace holds too)."""
    rows = pairs_of(obs)
    if not len(rows):
        return rows.assign(le=np.zeros(0), res_s=np.zeros(0), res_run_s=np.zeros(0))
    levels = None
    if run_obs is not None:
        every = pairs_of(run_obs)
        levels = _run_levels(every, _curve_pairs(every, models)[1])
    pred, resid, run = _project_pairs(rows, models, corrected=False, levels=levels)
    le = np.log(rows["time_s_t"].to_numpy(np.float64, na_value=np.nan) / pred)
    return rows.assign(le=le, res_s=resid, res_run_s=run)[np.isfinite(le)].reset_index(drop=True)


def _levels(codes: np.ndarray, names: pd.Index, w: np.ndarray, r: np.ndarray) -> np.ndarray:
    """A level per name (a shape class, an operator): the weighted mean of its rows' ``r``, pulled toward 0 by
    :data:`DATASET_RIDGE`; 0 for the name "" (rows that carry none)."""
    level = np.bincount(codes, w * r, len(names)) / (np.bincount(codes, w, len(names)) + DATASET_RIDGE)
    level[np.asarray(names, object) == ""] = 0.0
    return level


def _fit_terms(sub: pd.DataFrame, choice: str) -> PairCorrection | None:
    """One pair and family's correction with the terms of ``choice`` (:data:`CANDIDATES`), fitted on ``sub``
    (pair rows with ``le``); None where it has no term or no row places it."""
    parts = choice.split("+")
    axes = [a for a in parts if a in ("roof", "intensity")]
    use_class = "class" in parts and "shape_class_s" in sub
    use_op = "op" in parts and "op_s" in sub
    use_keep = "keep" in parts and "res_s" in sub
    use_run = "run" in parts and "res_run_s" in sub
    wave = next((w for w in map(_wave_of, parts) if w is not None), None)
    wave_tiles: tuple[tuple[int, int], ...] = ()
    wave_units: tuple[int, ...] = ()
    if wave is not None and len(sub):
        tile = {"nvidia": wave[1], "amd": wave[2]}
        first = sub.iloc[0]
        vs, vt = str(first["vendor_s"]), str(first["vendor_t"])
        units = (_units(str(first["device_s"])), _units(str(first["device_t"])))
        if vs in tile and vt in tile and min(units) > 0:
            wave_tiles, wave_units = (tile[vs], tile[vt]), units
    if not axes and not wave_tiles and not use_keep and not use_run and not use_op:
        return None
    r, f, b = _work(sub)
    xs = [pair_axis(a, r, f, b) for a in axes]
    # the source's distance from its curve (a keep term): a row without one is no evidence for this term
    xs_k = sub["res_s"].to_numpy(np.float64, na_value=np.nan) if use_keep else None
    xs_r = sub["res_run_s"].to_numpy(np.float64, na_value=np.nan) if use_run else None
    known = [*xs, *(x for x in (xs_k, xs_r) if x is not None)]
    ok = np.logical_and.reduce([np.isfinite(x) for x in known]) if known else np.ones(len(sub), bool)
    if not ok.any():
        return None
    probe = PairCorrection("none", (), 0.0, 0.0, 0, wave_tiles=wave_tiles, wave_units=wave_units, wave_coef=1.0)
    xw = probe.wave_log(_dims(sub), len(sub))[ok]
    coef = 1.0 if wave_tiles else 0.0
    xk = xs_k[ok] if xs_k is not None else np.zeros(int(ok.sum()))
    kcoef = 0.0
    xr = xs_r[ok] if xs_r is not None else np.zeros(int(ok.sum()))
    rcoef = 0.0
    y = sub["le"].to_numpy(np.float64, na_value=np.nan)[ok]
    xs = [x[ok] for x in xs]
    grid = [interp_weights(x, *axis_knots(a)) for x, a in zip(xs, axes)]
    cls = sub["shape_class_s"].to_numpy(object)[ok].astype(str) if use_class else np.full(len(y), "", object)
    codes, names = pd.factorize(pd.Series(cls, dtype=object))
    level = np.zeros(len(names))
    opn = sub["op_s"].to_numpy(object)[ok].astype(str) if use_op else np.full(len(y), "", object)
    ocodes, onames = pd.factorize(pd.Series(opn, dtype=object))
    olevel = np.zeros(len(onames))
    terms = [np.zeros(N_BINS) for _ in axes]
    w = np.ones(len(y))

    def at(a: np.ndarray, g: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        i, u = g
        return a[i] * (1.0 - u) + a[np.minimum(i + 1, N_BINS - 1)] * u

    for _ in range(ITERATIONS):
        for n, g in enumerate(grid):
            others = sum((at(terms[m], grid[m]) for m in range(len(grid)) if m != n), np.zeros(len(y)))
            terms[n] = _curve_system(g[0], g[1], w, y - others - level[codes] - olevel[ocodes] - coef * xw - kcoef * xk
                                     - rcoef * xr, DEVICE_RIDGE)
        fitted = sum((at(t, g) for t, g in zip(terms, grid)), np.zeros(len(y)))
        if use_class:  # a GEMM of unknown shape: no class level
            level = _levels(codes, names, w, y - fitted - olevel[ocodes] - coef * xw - kcoef * xk - rcoef * xr)
        if use_op:  # a level per operator, pulled to 0 like a class's; a row of no operator: none
            olevel = _levels(ocodes, onames, w, y - fitted - level[codes] - coef * xw - kcoef * xk - rcoef * xr)
        if wave_tiles and wave is not None and wave[0]:  # a fitted weight of the wave term
            coef = float(np.sum(w * xw * (y - fitted - level[codes] - olevel[ocodes] - kcoef * xk - rcoef * xr))
                         / (np.sum(w * xw * xw) + WAVE_RIDGE))
        if use_keep:  # the persistence weight, pulled to 0 (the kernel keeps all its distance)
            kcoef = float(np.sum(w * xk * (y - fitted - level[codes] - olevel[ocodes] - coef * xw - rcoef * xr))
                          / (np.sum(w * xk * xk) + KEEP_RIDGE))
        if use_run:  # the run level's weight, pulled to 0 likewise
            rcoef = float(np.sum(w * xr * (y - fitted - level[codes] - olevel[ocodes] - coef * xw - kcoef * xk))
                          / (np.sum(w * xr * xr) + KEEP_RIDGE))
        resid = y - fitted - level[codes] - olevel[ocodes] - coef * xw - kcoef * xk - rcoef * xr
        w = np.minimum(1.0, HUBER / np.maximum(np.abs(resid), 1e-12))
    first_axis = bool(axes)
    lo1, hi1 = (float(xs[0].min()), float(xs[0].max())) if first_axis else (0.0, 0.0)
    second = len(axes) > 1
    return PairCorrection(
        axes[0] if first_axis else "none", tuple(float(v) for v in terms[0]) if first_axis else (0.0,) * N_BINS,
        lo1, hi1, len(y), tuple(sorted(set(sub["dataset"].astype(str)))),
        axes[1] if second else "", tuple(float(v) for v in terms[1]) if second else (),
        float(xs[1].min()) if second else math.nan, float(xs[1].max()) if second else math.nan,
        {str(k): float(v) for k, v in zip(names, level) if str(k) and use_class}, choice,
        wave_tiles if coef != 0.0 else (), wave_units if coef != 0.0 else (), coef if wave_tiles else 0.0,
        kcoef, float(xk.min()) if use_keep else math.nan, float(xk.max()) if use_keep else math.nan,
        rcoef, float(xr.min()) if use_run else math.nan, float(xr.max()) if use_run else math.nan,
        {str(k): float(v) for k, v in zip(onames, olevel) if str(k) and use_op})


def pair_corrections(obs: pd.DataFrame, models: DeviceModels, choices: Mapping[str, str] | None = None,
                     ) -> dict[str, dict[str, PairCorrection]]:
    """Per ordered device pair and family, a correction of ``log(T_target / projected)`` over the pairs of
    ``obs`` (one key on both devices in one dataset) projected by ``models``' curves alone, with the terms
    ``choices`` names for its family group (``gemm`` / ``other`` -> a :data:`CANDIDATES` entry; missing, or
    no ``choices``: the family's default axis, :func:`perfscope.device_models.pair_axis_name`); a pair and
    family whose choice is ``none`` gets a correction of 1 that says so."""
    rows = _pair_rows(obs, models)
    out: dict[str, dict[str, PairCorrection]] = {}
    if not len(rows):
        return out
    for (ds, dt, fam), idx in rows.groupby(["device_s", "device_t", "family"], sort=True).indices.items():
        sub = rows.iloc[idx]
        key = _group_of(str(fam))
        choice = (choices or {}).get(key, pair_axis_name(str(fam)))
        corr = _fit_terms(sub, choice)
        if corr is None:  # no term: a correction of 1, which says the inner cross-validation chose none
            corr = PairCorrection("none", (0.0,) * N_BINS, 0.0, 0.0, len(sub),
                                  tuple(sorted(set(sub["dataset"].astype(str)))), choice="none")
        out.setdefault(f"{ds} -> {dt}", {})[str(fam)] = corr
    return out


CELL_WEIGHT = "equal"
"""How :func:`select_pair_choices` weighs each pair and family's median error: ``equal``, or ``sqrt`` (the
square root of its inner held-out rows: a median's standard error falls as one over it)."""


def _cell_mean(cells: list[tuple[float, int]]) -> float:
    med = np.array([m for m, _ in cells])
    w = np.ones(len(cells)) if CELL_WEIGHT == "equal" else np.sqrt([n for _, n in cells])
    return float(np.sum(w * med) / np.sum(w))


def select_pair_choices(obs: pd.DataFrame, candidates: Mapping[str, tuple[str, ...]] | None = None,
                        settings: Sequence[CurveSettings] = (CurveSettings(),)
                        ) -> tuple[dict[str, str], dict[str, dict[str, float]], CurveSettings]:
    """Per ordered device pair and family, the terms of its correction (:data:`CANDIDATES`) picked by
    cross-validation inside ``obs`` alone: ``obs``'s keys split in :data:`INNER_FOLDS` by a salted hash
    (:data:`INNER_SALT`); for each inner fold, the curves are fitted on the other inner folds, every
    candidate correction on their pairs, and the inner fold's pairs projected. Per family group (GEMMs,
    the rest) the candidate with the smallest mean over the device pairs and families of their median
    ``|log(measured / projected)|`` on the inner held-out pairs wins (a tie: the simpler), so a pair of few
    keys weighs as much as one of thousands but its noise is not its own choice. Inside
    :func:`cross_validate` the choice never sees the outer held-out fold.

    The curves' own settings (``settings``; :func:`fit` passes :data:`CURVE_SETTINGS`) are picked in the same
    loop: each inner fold's curves are fitted with each setting and every candidate scored on them; a setting's
    score is the mean over the family groups of its best candidate's score, the smallest wins (a tie: the
    first), and the groups' choices are the ones under it. Returns the choice per group, every candidate's
    score under the chosen setting (% error, the mean of the logs; and ``curves``: each setting's score, where
    there were several), and the setting.
    """
    obs = obs.reset_index(drop=True)
    inner = np.array([zlib.crc32((INNER_SALT + str(k)).encode()) % INNER_FOLDS for k in obs["key"]], np.int64)
    per_setting = [_inner_scores(obs, inner, candidates, st) for st in settings]
    totals = [float(np.mean([min(sc.values()) for sc in scores.values()])) if scores else math.inf
              for _, scores in per_setting]
    best = min(range(len(settings)), key=lambda n: (round(totals[n], 6), n))
    choices, scores = per_setting[best]
    scores = dict(scores)
    if len(settings) > 1:
        scores["curves"] = {st.name: t for st, t in zip(settings, totals)}
    return choices, scores, settings[best]


def _inner_scores(obs: pd.DataFrame, inner: np.ndarray, candidates: Mapping[str, tuple[str, ...]] | None,
                  settings: CurveSettings) -> tuple[dict[str, str], dict[str, dict[str, float]]]:
    """:func:`select_pair_choices`'s inner cross-validation with the curves fitted at ``settings``: the choice
    per family group and every candidate's score."""
    k_in = INNER_FOLDS
    errs: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    for g in range(k_in):
        train, test = obs[inner != g], obs[inner == g]
        if not len(train) or not len(test):
            continue
        models = build_models(train, fit_curves(train, settings))
        fit_rows = _pair_rows(train, models)
        test_rows = _pair_rows(test, models, run_obs=obs)  # a run's level from all its keys' source times
        if not len(test_rows):
            continue
        by_fit = fit_rows.groupby(["device_s", "device_t", "family"], sort=False).indices if len(fit_rows) else {}
        for (ds, dt, fam), idx in test_rows.groupby(["device_s", "device_t", "family"], sort=False).indices.items():
            sub = test_rows.iloc[idx]
            train_idx = by_fit.get((ds, dt, fam))
            per = errs.setdefault((str(ds), str(dt), str(fam)), {})
            for cand in _candidates(str(fam), candidates):
                corr = None if train_idx is None or cand == "none" else _fit_terms(fit_rows.iloc[train_idx], cand)
                lf = (corr.log_factor(*_work(sub), _classes(sub), _dims(sub), _resid(sub), _run(sub), _ops(sub))
                      if corr is not None
                      else np.zeros(len(sub)))
                per.setdefault(cand, []).extend(np.abs(sub["le"].to_numpy() - lf).tolist())
    # one choice per family group: each pair and family's median error counts once (a pair of 17 keys as
    # much as one of 4,000), and the candidate with the smallest mean of them wins
    cells: dict[str, dict[str, list[tuple[float, int]]]] = {}
    for key, per in errs.items():
        group = _group_of(key[2])
        if len({round(float(np.median(v)), 12) for v in per.values() if v}) <= 1:
            continue  # no candidate could be fitted (a pair and family of one key): it tells none apart
        for c, v in per.items():
            if v:
                cells.setdefault(group, {}).setdefault(c, []).append((float(np.median(v)), len(v)))
    choices: dict[str, str] = {}
    scores: dict[str, dict[str, float]] = {}
    for group, by_cand in cells.items():
        sc = {c: float((np.exp(_cell_mean(v)) - 1.0) * 100.0) for c, v in by_cand.items()}
        order = (candidates or CANDIDATES)[group]
        choices[group] = min(sc, key=lambda c: (round(sc[c], 6), order.index(c)))
        scores[group] = sc
    return choices, scores


# ----------------------------------------------------------------------------- launch cost
def launch_costs(reports: Mapping[str, Report]) -> dict[str, tuple[float | None, float | None]]:
    """Per device: the host's kernel-launch call (median) and the GPU's own gap between queued kernels
    (median of the gaps under 10 us), over the traces of it that recorded them."""
    calls: dict[str, list[float]] = {}
    gaps: dict[str, list[float]] = {}
    for rep in reports.values():
        ident = spec_identity(rep.device) if rep.device is not None else None
        if ident is None:
            continue
        api = rep.api
        if len(api):
            launch = api[api["name"].astype(str).str.contains(r"Launch(?:Kernel|Cooperative)", regex=True)
                         & ~api["name"].astype(str).str.contains("Graph")]
            calls.setdefault(ident[0], []).extend(launch["duration_ns"].astype(float).tolist())
        k = rep.kernels.sort_values("start_ns")
        if len(k) > 1:
            ends = np.maximum.accumulate(k["end_ns"].to_numpy(np.float64, na_value=np.nan))[:-1]
            gap = k["start_ns"].to_numpy(np.float64, na_value=np.nan)[1:] - ends
            gaps.setdefault(ident[0], []).extend(gap[(gap >= 0) & (gap < 10_000)].tolist())
    out: dict[str, tuple[float | None, float | None]] = {}
    for dev in set(calls) | set(gaps):
        c, g = calls.get(dev, []), gaps.get(dev, [])
        out[dev] = (float(np.median(c)) if c else None, float(np.median(g)) if g else None)
    return out


# ----------------------------------------------------------------------------- projection of rows
def project_pairs(rows: pd.DataFrame, models: DeviceModels, corrected: bool = True) -> np.ndarray:
    """Projected target time of each pair row (``device_s``, ``device_t``, ``family``, ``roof_s_s``,
    ``roof_s_t``, ``time_s_s``, ``flops_s``, ``bytes_s``) with ``models``: ``T_s x g_t(R_t) / g_s(R_s)``, times
    the pair's correction (``corrected``, where ``models`` has one); NaN where either device lacks the
    family's curve."""
    return _project_pairs(rows, models, corrected)[0]


def _project_pairs(rows: pd.DataFrame, models: DeviceModels, corrected: bool = True, levels: pd.Series | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`project_pairs`, and each row's distance from its family's curve on the source, ``log(T_s /
    g_s(R_s))`` (a persistence term's input, :meth:`perfscope.device_models.PairCorrection.keep_log`), and its
    run's level there (a run-level term's, :meth:`~perfscope.device_models.PairCorrection.run_log`: from
    ``levels``, :func:`_run_levels`, where given, else over ``rows``)."""
    out, resid, bound = _curve_pairs(rows, models)
    run = _map_levels(rows, levels if levels is not None else _run_levels(rows, resid))
    if not corrected:
        return out, resid, run
    for (ds, dt, fam), idx in rows.groupby(["device_s", "device_t", "family"], sort=False).indices.items():
        corr = models.pair_correction(ds, dt, fam)
        if corr is not None:
            sub = rows.iloc[idx]
            out[idx] *= corr.factor(*_work(sub), _classes(sub), _dims(sub), resid[idx], run[idx], _ops(sub))
    return at_least(out, bound), resid, run  # never under the target's floor (floor_bound_s)


def _curve_pairs(rows: pd.DataFrame, models: DeviceModels) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each pair row projected along the two devices' curves alone (no pair correction), its distance from
    its family's curve on the source (:func:`_project_pairs`), and the shortest time it may be projected at
    (:func:`perfscope.device_models.floor_bound_s`; NaN: no bound)."""
    out = np.full(len(rows), np.nan)
    resid = np.full(len(rows), np.nan)
    bound = np.full(len(rows), np.nan)
    for (ds, dt, fam), idx in rows.groupby(["device_s", "device_t", "family"], sort=False).indices.items():
        ms, mt = models.devices.get(ds), models.devices.get(dt)
        if ms is None or mt is None:
            continue
        cs, _ = models.curve(ms, fam)
        ct, _ = models.curve(mt, fam)
        if cs is None or ct is None:
            continue
        sub = rows.iloc[idx]
        # a table's row meets the table's floors, a trace's the traces' (pair_floors_ns)
        table = ~sub["dataset"].isin(TRACES).to_numpy()
        for part, prefer in ((table, "table"), (~table, "trace")):
            if part.any():
                at = idx[part]
                t_s = sub["time_s_s"].to_numpy(np.float64, na_value=np.nan)[part]
                ratio, resid[at], bound[at] = curve_step(cs, ct, sub["roof_s_s"].to_numpy()[part],
                                                         sub["roof_s_t"].to_numpy()[part], t_s, prefer)
                out[at] = t_s * ratio
    return out, resid, bound


def pairs_of(obs: pd.DataFrame) -> pd.DataFrame:
    """Every (source, target) pair of observations of one key on two devices (both directions)."""
    cols = ["dataset", "table", "key", "device", "vendor", "family", "precision", "flops", "bytes", "time_s",
            "roof_s", "shape_class", "gemm_b", "gemm_m", "gemm_n", "run", "op"]
    o = obs.assign(**{c: obs.get(c, d) for c, d in (("run", obs["dataset"]), ("op", ""))})[cols]
    j = o.merge(o, on=["dataset", "key"], suffixes=("_s", "_t"))
    j = j[j["device_s"] != j["device_t"]].copy()
    j["table"] = j["table_s"]
    j["family"] = j["family_s"]
    j["pair"] = j["device_s"] + " -> " + j["device_t"]
    j["vendor_pair"] = j["vendor_s"] + "->" + j["vendor_t"]
    j["group"] = [family_group(f) for f in j["family"]]
    return j.reset_index(drop=True)


def baselines(rows: pd.DataFrame) -> pd.DataFrame:
    """The ``ratio`` (the measured time x the datasheet ratio of the roof that binds on the source) and
    ``roof`` (the kernel at the target's roofline) predictions, and the previous model's (``v1``: each
    kernel keeps its efficiency, :func:`.times.project_times`)."""
    out = pd.DataFrame(index=rows.index, columns=["pred_ratio_s", "pred_roof_s", "pred_v1_s"], dtype=float)
    for (ds, dt), idx in rows.groupby(["device_s", "device_t"], sort=False).indices.items():
        sub = rows.iloc[idx]
        rs, rt = datasheet_roofs(ds), datasheet_roofs(dt)
        prec = sub["precision_s"].astype("object").reset_index(drop=True)
        f, b = sub["flops_s"].to_numpy(np.float64, na_value=np.nan), sub["bytes_s"].to_numpy(np.float64, na_value=np.nan)
        ps, pt = rs.peak(prec), rt.peak(prec)
        bws, bwt = float(rs.bytes_per_s or np.nan), float(rt.bytes_per_s or np.nan)
        with np.errstate(divide="ignore", invalid="ignore"):
            fs = np.where(f > 0, f / ps, 0.0)
            memory = (b / bws) >= np.nan_to_num(fs)
            ratio = np.where(memory | np.isnan(pt), bws / bwt, ps / pt)
            roof = np.maximum(np.where(f > 0, f / pt, 0.0), b / bwt)
        t_s = sub["time_s_s"].to_numpy()
        v1 = project_times(t_s, f, b, prec, sub["table"].reset_index(drop=True), rs, rt,
                           tensor=np.char.startswith(sub["family"].to_numpy().astype(str), "gemm"))["time_s"].to_numpy()
        out.iloc[idx, 0] = t_s * ratio
        out.iloc[idx, 1] = np.nan_to_num(roof, nan=np.nan)
        out.iloc[idx, 2] = v1
    return out


OUTER_FOLDS = 4
"""The outer folds of :func:`cross_validate`: each fit sees three quarters of the keys. Two (each fit on half)
until this stop: a fit on half the keys is further from the shipped fit on all of them, and a band checked on one
fold with two folds comes from one fit only, so it cannot see how much the fits differ (:func:`between_fits`)."""


def fold_of(keys: pd.Series, folds: int = OUTER_FOLDS) -> np.ndarray:
    """A key's fold: a stable hash (crc32) of it, mod ``folds``."""
    return np.array([zlib.crc32(str(k).encode()) % folds for k in keys], np.int64)


def cross_validate(obs: pd.DataFrame, folds: int = OUTER_FOLDS,
                   launch: Mapping[str, tuple[float | None, float | None]] | None = None,
                   candidates: Mapping[str, tuple[str, ...]] | None = None) -> pd.DataFrame:
    """Every pair row projected by models fitted without its fold (module docstring), with the baselines
    and each error: ``err_{model,ratio,roof,v1}_pct`` (absolute, %) and ``log_err`` (log measured / projected)."""
    obs = obs.reset_index(drop=True)
    fold = fold_of(obs["key"], folds)
    obs = obs.assign(fold=fold)
    rows = pairs_of(obs.assign(key=obs["key"]))
    rows["fold"] = fold_of(rows["key"], folds)
    rows["pred_model_s"] = np.nan
    selection = {}
    for f in range(folds):
        models = fit(obs[obs["fold"] != f], launch, candidates=candidates)  # terms picked inside the fold
        selection[f] = {g: v["choice"] for g, v in models.pair_selection.items()}
        idx = np.flatnonzero(rows["fold"].to_numpy() == f)
        # a run's level on the source from all its keys (source times only, as a user's trace holds them)
        levels = _run_levels(rows, _curve_pairs(rows, models)[1])
        rows.loc[idx, "pred_model_s"] = _project_pairs(rows.iloc[idx], models, levels=levels)[0]
    rows = with_errors(pd.concat([rows, baselines(rows)], axis=1))
    rows.attrs["pair_selection"] = selection  # per held-out fold: the terms the fit of the other folds picked
    return rows


def with_errors(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with ``err_*_pct`` for each prediction and ``log_err`` of the model's."""
    truth = rows["time_s_t"].to_numpy(np.float64, na_value=np.nan)
    for m in ("model", "ratio", "roof", "v1"):
        col = f"pred_{m}_s"
        if col in rows:
            rows[f"err_{m}_pct"] = np.abs(rows[col].to_numpy(np.float64, na_value=np.nan) / truth - 1.0) * 100.0
    rows["log_err"] = np.log(truth / rows["pred_model_s"].to_numpy(np.float64, na_value=np.nan))
    return rows


# ----------------------------------------------------------------------------- bands and tables
BAND_MARGIN_SE = 1.645
"""Each end of a band is moved out by this many standard errors of its quantile's coverage: the p10 / p90 of n
held-out rows, taken as the band of rows not yet seen, hold 80% of them only on average; widened, each end holds
its 10% with 95% confidence (one-sided) against the sampling of the rows it came from (``0.1 x 0.9 / n``: on
16,000 rows the band is the p9.6-p90.4, on 58 rows the p3.5-p96.5) and, since this stop, against the variation
between fits (:func:`between_fits`). It was one standard error until the op and run-level terms, with which one
coverage check held 79.9%; the sampling margin alone then held 79.1% on one check, the NVIDIA GEMM band moving
with the fold's fit by more than its rows' sampling (docs/whatif.md, "Bands")."""


MIN_BAND_ROWS = 10
"""A family group and vendor pair validated on fewer held-out rows has no band (it says unvalidated)."""


def band_levels(n: int, between: tuple[float, float] = (0.0, 0.0), fits: int = 1) -> tuple[float, float]:
    """The quantile levels of a band from ``n`` held-out rows: 0.1 and 0.9, each moved out by
    :data:`BAND_MARGIN_SE` standard errors of its coverage: the sampling of the rows (``0.1 x 0.9 / n``) and, for
    a band pooled from the held-out rows of ``fits`` fits, the variance between fits of the share beyond each end
    (``between``, :func:`between_fits`), as a new fit's share varies (``x (1 + 1 / fits)``)."""
    levels = []
    for p, v, side in ((0.1, between[0], -1.0), (0.9, between[1], 1.0)):
        margin = BAND_MARGIN_SE * float(np.sqrt(0.1 * 0.9 / max(n, 1) + v * (1.0 + 1.0 / max(fits, 1))))
        levels.append(min(1.0, max(0.0, p + side * margin)))
    return levels[0], levels[1]


BETWEEN_MIN_ROWS = 100
"""The fewest held-out rows per fold for :func:`between_fits` to measure anything: below it a fold's share beyond a
band's end has a sampling spread of more than 3 points (``sqrt(0.1 x 0.9 / 100)``), and four folds' spread of
such shares is noise, not a difference between the fits (the AMD GEMM rows, 32-36 a fold, would send their band
to the slowest and fastest row); such a band keeps the sampling margin alone."""


def between_fits(beyond: np.ndarray, fold: np.ndarray) -> float:
    """The variance between the fits of the outer folds of the share of their held-out rows beyond a band's end
    (``beyond``: True past it), less what the sampling of each fold's rows explains (the method of moments of a
    random-effects meta-analysis, DerSimonian and Laird 1986); 0 with fewer than two folds, or a fold of fewer
    than :data:`BETWEEN_MIN_ROWS` rows."""
    folds, counts = np.unique(fold, return_counts=True)
    if len(folds) < 2 or counts.min() < BETWEEN_MIN_ROWS:
        return 0.0
    share = np.array([beyond[fold == f].mean() for f in folds])
    sampling = np.mean([0.1 * 0.9 / int((fold == f).sum()) for f in folds])
    return max(0.0, float(np.var(share, ddof=1)) - float(sampling))


def bands(rows: pd.DataFrame) -> list[Band]:
    """Per family group and vendor pair: the p10 / p90 of the held-out ``log(measured / projected)``, widened
    by the sampling error of those quantiles and their variation between the folds' fits (:func:`band_levels`)."""
    ok = rows[np.isfinite(rows["log_err"])]
    out = []
    for (group, pair), g in ok.groupby(["group", "vendor_pair"], sort=True):
        if len(g) < MIN_BAND_ROWS:
            continue
        le = g["log_err"].to_numpy()
        err = g["err_model_pct"].to_numpy()
        fold = g["fold"].to_numpy() if "fold" in g else np.zeros(len(g), np.int64)
        between = (between_fits(le < np.quantile(le, 0.1), fold), between_fits(le > np.quantile(le, 0.9), fold))
        lo, hi = band_levels(len(le), between, len(np.unique(fold)))
        out.append(Band(str(group), str(pair), float(np.quantile(le, lo)), float(np.quantile(le, hi)), len(g),
                        float(np.median(err)), float(np.quantile(err, 0.9))))
    return out


def coverage(rows: pd.DataFrame, fit_on: np.ndarray) -> pd.DataFrame:
    """The share of ``rows[~fit_on]`` whose truth lies inside the band taken from ``rows[fit_on]``, per
    family group and vendor pair and overall (``ALL``)."""
    bs = {(b.group, b.pair): b for b in bands(rows[fit_on])}
    check = rows[~fit_on & np.isfinite(rows["log_err"].to_numpy())]
    inside = np.array([(b := bs.get((g, p))) is not None and b.q10 <= le <= b.q90
                       for g, p, le in zip(check["group"], check["vendor_pair"], check["log_err"])], bool)
    banded = np.array([(g, p) in bs for g, p in zip(check["group"], check["vendor_pair"])], bool)
    check = check.assign(inside=inside, banded=banded)
    out = [{"group": g, "pair": p, "rows": int(s["banded"].sum()), "inside_pct": float(s.loc[s["banded"], "inside"].mean() * 100)}
           for (g, p), s in check.groupby(["group", "vendor_pair"], sort=True) if s["banded"].any()]
    c = check[check["banded"]]
    out.append({"group": "ALL", "pair": "ALL", "rows": len(c), "inside_pct": float(c["inside"].mean() * 100)})
    return pd.DataFrame(out)


GOALS = {"gemm": 15.0, "other": 20.0}
"""The goals (issue 41): median absolute error, %, of GEMMs and of every other family."""


def _agg(g: pd.DataFrame) -> dict[str, Any]:
    d: dict[str, Any] = {"rows": len(g)}
    for m in ("model", "ratio", "roof", "v1"):
        e = g[f"err_{m}_pct"].dropna()
        d[f"{m}_median"] = float(e.median()) if len(e) else np.nan
        d[f"{m}_p90"] = float(e.quantile(0.9)) if len(e) else np.nan
    return d


def error_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Median and p90 absolute % error per (pair, table), then per (pair, group), then per (vendor pair,
    group), with the goal and whether the model beats both baselines (median)."""
    ok = rows[np.isfinite(rows["pred_model_s"])]
    parts = []
    for (p, t), g in ok.groupby(["pair", "table"], sort=True):
        parts.append({"pair": p, "table": t, "group": g["group"].iloc[0], **_agg(g)})
    for (p, grp), g in ok.groupby(["pair", "group"], sort=True):
        parts.append({"pair": p, "table": f"ALL {grp}", "group": grp, **_agg(g)})
    for (p, grp), g in ok.groupby(["vendor_pair", "group"], sort=True):
        parts.append({"pair": p, "table": f"ALL {grp}", "group": grp, **_agg(g)})
    table = pd.DataFrame(parts)
    table["goal_pct"] = np.where(table["group"] == "gemm", GOALS["gemm"], GOALS["other"])
    table["beats_both"] = (table["model_median"] < table["ratio_median"]) & (table["model_median"] < table["roof_median"])
    return table


def validation_records(table: pd.DataFrame) -> list[dict[str, Any]]:
    """The per-pair group rows of :func:`error_table`, as the data file keeps them (docs and ``--json``)."""
    sel = table[table["table"].str.startswith("ALL ")]
    return [{"pair": r.pair, "group": r.group, "rows": int(r.rows), "median_pct": round(float(r.model_median), 2),
             "p90_pct": round(float(r.model_p90), 2), "ratio_median_pct": round(float(r.ratio_median), 2),
             "roof_median_pct": round(float(r.roof_median), 2)} for r in sel.itertuples(index=False)]


def shipped(obs: pd.DataFrame, rows: pd.DataFrame, launch: Mapping[str, tuple[float | None, float | None]],
            candidates: Mapping[str, tuple[str, ...]] | None = None) -> DeviceModels:
    """The models fitted on every observation, with the bands and validation of the held-out ``rows``."""
    models = fit(obs, launch, candidates=candidates)
    return DeviceModels(models.devices, bands(rows), dict(SOURCES), validation_records(error_table(rows)),
                        "python benchmarks/whatif_crossgpu.py --write", models.priors, models.pairs,
                        models.pair_selection)


def whole_model(models: DeviceModels, root: Path = FIXTURES, datasets: Sequence[str] | None = None
                ) -> pd.DataFrame:
    """Each pair trace's H100 report projected onto the MI300X with ``models`` (``perfscope whatif --gpu
    MI300X``), beside the MI300X's measured total kernel time."""
    from .project import Question, project

    out = []
    for name in datasets or PAIR_TRACES:
        src, tgt = (_load(root / p) for p in PAIR_TRACES[name])
        proj = project(src, Question(gpu="MI300X"), models=models)
        whole = (proj.manifest.get("projection") or {}).get("whole_run") or {}
        kt = whole.get("kernel_time_s") or {}
        measured = float(tgt.kernels["duration_ns"].sum()) * 1e-9
        out.append({"dataset": name, "source_s": float(src.kernels["duration_ns"].sum()) * 1e-9,
                    "projected_s": kt.get("projected"), "low_s": kt.get("low"), "high_s": kt.get("high"),
                    "measured_s": measured,
                    "error_pct": (float(kt["projected"]) / measured - 1.0) * 100.0 if kt.get("projected") else np.nan})
    return pd.DataFrame(out)


__all__ = ["GOALS", "PAIR_TRACES", "SINGLE_TRACES", "SOURCES", "all_observations", "bands", "coverage",
           "cross_validate", "error_table", "fit", "fold_of", "launch_costs", "pair_corrections", "pair_observations",
           "project_pairs", "shipped", "single_observations", "table_observations", "whole_model", "with_roofs"]
