"""Validation of the time model on published cross-GPU tables: each source-GPU row projected onto the
target GPU with the target's datasheet roofs, against the time measured there.

Tables read (``tests/fixtures/crossgpu/``, sources in tests/fixtures/README.md):

- aiconfigurator (vLLM 0.14 kernels): 9,240 bf16 GEMM shapes, decode and prefill attention, A100 -> H100;
- vidur: Llama-2-7B fp16 per-operator times (1 to 4096 tokens, TP 1/2/4/8), A100 -> H100 and A100 -> A40;
- LLMCompass: fp16 matmul, softmax, layernorm and GELU sweeps, A100 -> MI210;
- TraceLens's perf reports of four models traced with one harness on H100 and MI300X (Qwen1.5-0.5B,
  an NSFW image classifier, OWLv2, and llama3_2 of its comparative evals): each GEMM op's kernel time
  (median) at its input shapes, H100 -> MI300X;
  and the other ops of the same reports (attention, elementwise, normalization, copies), priced from their
  shapes and put in the family a trace's kernel of that op gets.

The work of every row comes from perfscope's cost formulas (:func:`perfscope.analysis.costs.operators.op_cost`
and the framework formulas), the same ones that price a trace's operators; the time from
:func:`.times.project_times`. Two baselines sit beside it: (a) ``ratio``, the measured time scaled by
the datasheet ratio of the roof that binds on the source (bandwidth for memory-bound rows, FLOP/s for
compute-bound ones); (b) ``roof``, every kernel at the target's roofline (``max(F/P, B/BW)``, the
analytic tools' answer).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfscope.datasheets import find_datasheet, sheet_spec
from perfscope.device_models import (
    family_group,
    gemm_bmn,
    gemm_dims,
    gemm_shape_class,
    kernel_family,
)
from perfscope.errors import UsageError

from ..costs.attention import SDPA_SIGNATURES
from ..costs.operators import op_cost
from .shapes import parse_lists
from .times import Roofs, project_times

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

AIC = "aiconfigurator_vllm0.14_gemm_attn_a100_vs_h100"
VIDUR = "vidur_llama2_7b_mlp"
LLMC = "llmcompass_A100_vs_MI210"
TLG = "tracelens_perf_report_gemms_h100_vs_mi300"
DEVICE_NAMES = {"a100": "NVIDIA A100-SXM4-80GB", "h100": "NVIDIA H100 80GB HBM3", "a40": "NVIDIA A40",
                "mi210": "AMD Instinct MI210", "mi300x": "AMD Instinct MI300X"}
"""The device names the tables were measured on (as drivers print them), looked up in the datasheets."""

BF16, FP16 = "c10::BFloat16", "c10::Half"
GOALS = {"gemm": 15.0, "other": 25.0}
"""The issue's goals: median absolute error (%) of GEMMs and of the other operators."""


def parse_roofs(text: str) -> tuple[str, Roofs]:
    """``a40=fp16:149.7,bf16:149.7,dram:696`` (TFLOP/s, GB/s) -> (``a40``, its roofs), for a GPU perfscope
    has no datasheet row for yet (the benchmark labels such rows as assumed)."""
    gpu, _, spec = text.partition("=")
    peaks: dict[str, float] = {}
    bw = None
    extra: dict[str, float] = {}
    for part in spec.split(","):
        key, _, value = part.partition(":")
        if key.strip() == "dram":
            bw = float(value) * 1e9
        elif key.strip() in ("sms", "clock"):
            extra[key.strip()] = float(value)
        else:
            peaks[key.strip()] = float(value) * 1e12
    if not gpu.strip() or bw is None or not peaks:
        raise UsageError(f"--roofs {text!r}: give GPU=PRECISION:TFLOPS,...,dram:GB_PER_S[,sms:N,clock:MHZ]")
    sm_mhz = extra["sms"] * extra["clock"] if "sms" in extra and "clock" in extra else None
    return gpu.strip().lower(), Roofs(peaks, bw, f"{gpu.strip()} (assumed roofs)", sm_mhz)


def roofs_for(gpu: str, assumed: dict[str, Roofs] | None = None) -> Roofs:
    """The datasheet roofs of a table's GPU (``a100``, ``h100``, ``a40``, ``mi210``), else ``assumed``'s.

    Raises:
        UsageError: perfscope has no datasheet row for it (one line naming the GPU)."""
    name = DEVICE_NAMES[gpu]
    if assumed and gpu in assumed and find_datasheet(name) is None:
        return assumed[gpu]
    sheet = find_datasheet(name)
    if sheet is None:
        raise UsageError(f"no datasheet row for {name!r}: its roofs are missing from perfscope/datasheets.py, "
                         f"so the {gpu.upper()} rows cannot be projected",
                         hint="add the row (`perfscope devices --datasheet` lists those there)")
    return Roofs.of(sheet_spec(sheet, name=name))


def _cost(op: str, dims: list | None, types: list | None) -> tuple[float, float]:
    c = op_cost(op, dims, types)
    return (np.nan, np.nan) if c is None else (c.flops, c.bytes)


def _rows(table: str, op: str, kind: str, precision: str, costs: list[tuple[float, float]],
          t_src_s: np.ndarray, t_tgt_s: np.ndarray, size: np.ndarray, shape_class: list[str] | None = None,
          dims: np.ndarray | None = None) -> pd.DataFrame:
    f, b = (np.array(x, np.float64) for x in zip(*costs)) if costs else (np.array([]), np.array([]))
    bmn = np.full((len(f), 3), np.nan) if dims is None else np.asarray(dims, np.float64).reshape(-1, 3)
    return pd.DataFrame({"table": table, "op": op, "kind": kind, "precision": precision, "flops": f, "bytes": b,
                         "t_src_s": t_src_s, "t_tgt_s": t_tgt_s, "size": size,
                         "shape_class": shape_class if shape_class is not None else "",
                         "gemm_b": bmn[:, 0], "gemm_m": bmn[:, 1], "gemm_n": bmn[:, 2]})


def _mn(m: np.ndarray, n: np.ndarray) -> np.ndarray:
    """(batch 1, M, N) rows of a table's GEMMs (a GEMM's wave term, :func:`perfscope.device_models.wave_fill`)."""
    return np.column_stack([np.ones(len(m)), np.asarray(m, np.float64), np.asarray(n, np.float64)])


def _gemm_costs(m: np.ndarray, n: np.ndarray, k: np.ndarray, dtype: str) -> list[tuple[float, float]]:
    return [_cost("aten::mm", [[int(a), int(c)], [int(c), int(b)]], [dtype, dtype]) for a, b, c in zip(m, n, k)]


def _gemm_classes(m: np.ndarray, n: np.ndarray, k: np.ndarray) -> list[str]:
    return [gemm_shape_class("aten::mm", [[int(a), int(c)], [int(c), int(b)]]) for a, b, c in zip(m, n, k)]


def aiconfigurator(root: Path) -> Iterator[tuple[str, str, pd.DataFrame]]:
    """(source gpu, target gpu, rows) of the aiconfigurator tables: GEMM, decode and prefill attention."""
    base = root / AIC
    a = pd.read_parquet(base / "a100_sxm" / "gemm_gemm_perf.parquet")
    h = pd.read_parquet(base / "h100_sxm" / "gemm_gemm_perf.parquet")
    g = a.merge(h[h["gemm_dtype"] == "bfloat16"], on=["m", "n", "k"], suffixes=("_s", "_t"))
    yield "a100", "h100", _rows("aiconfigurator gemm", "gemm", "gemm", "bf16",
                                _gemm_costs(g["m"].to_numpy(), g["n"].to_numpy(), g["k"].to_numpy(), BF16),
                                g["latency_s"].to_numpy() * 1e-3, g["latency_t"].to_numpy() * 1e-3,
                                (2.0 * g["m"] * g["n"] * g["k"]).to_numpy(),
                                _gemm_classes(g["m"].to_numpy(), g["n"].to_numpy(), g["k"].to_numpy()),
                                _mn(g["m"].to_numpy(), g["n"].to_numpy()))
    keys = ["batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "step"]
    for part, label in (("generation", "decode attention"), ("context", "prefill attention")):
        s = pd.read_parquet(base / "a100_sxm" / f"attention_{part}_attention_perf.parquet")
        t = pd.read_parquet(base / "h100_sxm" / f"attention_{part}_attention_perf.parquet")
        s = s[s["kv_cache_dtype"] == "bfloat16"]
        t = t[t["kv_cache_dtype"] == "bfloat16"]
        j = s.merge(t, on=keys, suffixes=("_s", "_t")).drop_duplicates(keys)
        costs = []
        for b, isl, hq, hk, d, step in j[keys].itertuples(index=False):
            q_len, kv_len = (1, isl + step) if part == "generation" else (isl, isl)
            q, kv = [b, hq, q_len, d], [b, hk, kv_len, d]
            costs.append(_cost("aten::_scaled_dot_product_flash_attention", [q, kv, kv], [BF16] * 3))
        yield "a100", "h100", _rows(f"aiconfigurator {label}", label, "attention", "bf16", costs,
                                    j["latency_s"].to_numpy() * 1e-3, j["latency_t"].to_numpy() * 1e-3,
                                    np.array([c[0] for c in costs]))


VIDUR_OPS: dict[str, Callable[[int, int, int, int, int, int], tuple[str, list, list]]] = {
    "attn_pre_proj": lambda t, h, hq, hk, i, tp: ("aten::mm", [[t, h], [h, (hq + 2 * hk) * (h // hq) // tp]], [FP16] * 2),
    "attn_post_proj": lambda t, h, hq, hk, i, tp: ("aten::mm", [[t, h // tp], [h // tp, h]], [FP16] * 2),
    "mlp_up_proj": lambda t, h, hq, hk, i, tp: ("aten::mm", [[t, h], [h, 2 * i // tp]], [FP16] * 2),
    "mlp_down_proj": lambda t, h, hq, hk, i, tp: ("aten::mm", [[t, i // tp], [i // tp, h]], [FP16] * 2),
    "mlp_act": lambda t, h, hq, hk, i, tp: ("_C::silu_and_mul", [[t, i // tp], [t, 2 * i // tp]], [FP16] * 2),
    "input_layernorm": lambda t, h, hq, hk, i, tp: ("_C::rms_norm", [[t, h], [t, h], [h], []], [FP16, FP16, FP16, "Scalar"]),
    "post_attention_layernorm": lambda t, h, hq, hk, i, tp: ("_C::rms_norm", [[t, h], [t, h], [h], []],
                                                             [FP16, FP16, FP16, "Scalar"]),
    "attn_rope": lambda t, h, hq, hk, i, tp: ("_C::rotary_embedding",
                                              [[t], [t, hq * (h // hq) // tp], [t, hk * (h // hq) // tp], [], [4096, h // hq]],
                                              ["long int", FP16, FP16, "Scalar", FP16]),
    "add": lambda t, h, hq, hk, i, tp: ("aten::add", [[t, h], [t, h]], [FP16] * 2),
    "emb": lambda t, h, hq, hk, i, tp: ("aten::embedding", [[32768, h // tp], [t]], [FP16, "long int"]),
}
"""vidur's per-operator columns -> the op perfscope prices it as, with its shapes (vidur's
``mlp.csv``: Llama-2-7B, hidden ``n_embd``, ``n_expanded_embd`` intermediate, heads, TP)."""


def vidur(root: Path) -> Iterator[tuple[str, str, pd.DataFrame]]:
    """(a100, target, rows) of vidur's Llama-2-7B operator tables, targets H100 and A40."""
    base = root / VIDUR
    keys = ["num_tokens", "num_tensor_parallel_workers"]
    a = pd.read_csv(base / "mlp_a100.csv").drop_duplicates(keys)
    for tgt in ("h100", "a40"):
        t = pd.read_csv(base / f"mlp_{tgt}.csv").drop_duplicates(keys)
        j = a.merge(t, on=keys, suffixes=("_s", "_t"))
        frames = []
        for col, shape_of in VIDUR_OPS.items():
            costs, classes, dims_of = [], [], []
            aten = ""  # the operator a trace's kernel row of this column names
            kind = "gemm" if col.endswith("_proj") else "other"
            for row in j[keys + ["n_embd_s", "n_head_s", "n_kv_head_s", "n_expanded_embd_s"]].itertuples(index=False):
                tokens, tp, hidden, hq, hk, inter = (int(x) for x in row)
                aten, dims, types = shape_of(tokens, hidden, hq, hk, inter, tp)
                costs.append(_cost(aten, dims, types))
                classes.append(gemm_shape_class(aten, dims) if kind == "gemm" else "")
                bmn = gemm_dims(aten, dims) if kind == "gemm" else None
                dims_of.append(bmn[:3] if bmn is not None else (np.nan,) * 3)
            frames.append(_rows(f"vidur llama-2-7b {col}", col, kind, "fp16", costs,
                                j[f"time_stats.{col}.median_s"].to_numpy() * 1e-3,
                                j[f"time_stats.{col}.median_t"].to_numpy() * 1e-3,
                                j["num_tokens"].to_numpy().astype(np.float64), classes, np.array(dims_of, np.float64))
                          .assign(aten=aten))
        yield "a100", tgt, pd.concat(frames, ignore_index=True)


def _llmc(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, header=None, skipinitialspace=True)


def llmcompass(root: Path) -> Iterator[tuple[str, str, pd.DataFrame]]:
    """(a100, mi210, rows) of LLMCompass's fp16 sweeps: matmul, softmax, layernorm, GELU."""
    base = root / LLMC
    frames = []
    s, t = _llmc(base / "matmul_A100.csv"), _llmc(base / "matmul_MI210.csv")
    for df in (s, t):
        df["t"] = df[3].str.removesuffix("ms").astype(float) * 1e-3
    j = s.merge(t, on=[0, 1, 2], suffixes=("_s", "_t"))
    frames.append(_rows("llmcompass matmul", "matmul", "gemm", "fp16",
                        _gemm_costs(j[0].to_numpy(), j[1].to_numpy(), j[2].to_numpy(), FP16),
                        j["t_s"].to_numpy(), j["t_t"].to_numpy(), (2.0 * j[0] * j[1] * j[2]).to_numpy(),
                        _gemm_classes(j[0].to_numpy(), j[1].to_numpy(), j[2].to_numpy()),
                        _mn(j[0].to_numpy(), j[1].to_numpy())).assign(aten="aten::mm"))
    for op, aten in (("softmax", "aten::_softmax"), ("layernorm", "aten::native_layer_norm")):
        s, t = _llmc(base / f"{op}_A100.csv"), _llmc(base / f"{op}_MI210.csv")
        j = s.merge(t, on=[0, 1], suffixes=("_s", "_t"))
        elems = (j[0] * j[1]).to_numpy().astype(np.float64)
        dims = ([[int(m), int(n)], []] if op == "softmax" else [[int(m), int(n)], [], [int(n)], [int(n)]]
                for m, n in zip(j[0], j[1]))
        types = [FP16, "Scalar"] if op == "softmax" else [FP16, "ScalarList", FP16, FP16]
        frames.append(_rows(f"llmcompass {op}", op, "other", "fp16", [_cost(aten, d, types) for d in dims],
                            elems / (j["2_s"].to_numpy() * 1e9), elems / (j["2_t"].to_numpy() * 1e9), elems)
                      .assign(aten=aten))
    s, t = _llmc(base / "gelu_A100.csv"), _llmc(base / "gelu_MI210.csv")
    j = s.merge(t, on=[0], suffixes=("_s", "_t"))
    elems = j[0].to_numpy().astype(np.float64)
    frames.append(_rows("llmcompass gelu", "gelu", "other", "fp16",
                        [_cost("aten::gelu", [[int(n)]], [FP16]) for n in j[0]],
                        elems / (j["1_s"].to_numpy() * 1e9), elems / (j["1_t"].to_numpy() * 1e9), elems)
                  .assign(aten="aten::gelu"))
    yield "a100", "mi210", pd.concat(frames, ignore_index=True)


TLG_PRECISION = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32"}
TLF = "tracelens_perf_report_families_h100_vs_mi300"
HOST_COPY = ("Memcpy HtoD", "Memcpy DtoH")
"""Kernels that move data between host and device (PCIe, not DRAM): not priced by perfscope's formulas."""


def _sdpa_call(name: str, dims: str, types: str, strides: str, concrete: str) -> tuple[str, str, str, str, str]:
    """An attention op's call as both GPUs share it: its query, key and value inputs and its causal flag. PyTorch
    picks the SDPA backend per GPU (cuDNN on the H100, the memory-efficient kernel on the MI300X for one call),
    and the backends record the mask with other broadcast dims, so the op's name and its other inputs differ."""
    pos = SDPA_SIGNATURES.get(name.removeprefix("aten::"), (None, "", None))[0]
    d, ty, st, c = (parse_lists(x) or [] for x in (dims, types, strides, concrete))
    flag = str(c[pos]) if pos is not None and pos < len(c) else ""
    return "attention", str(d[:3]), str(ty[:3]), str(st[:3]), flag


def _tracelens_pairs(path: Path, keys: list[str]) -> pd.DataFrame:
    """A TraceLens perf-report extract's H100 and MI300X rows of one op at one set of inputs, joined; an
    attention op's rows by its call (:func:`_sdpa_call`), the H100's name and inputs kept for pricing."""
    t = pd.read_csv(path, keep_default_na=False, na_values={"Kernel Time (us)_median": [""]})
    t = t.assign(**{k: "" for k in keys if k not in t})  # an input the extract did not keep: the same on both
    # one op at one set of inputs listed twice on a GPU (the library picked another kernel for some calls:
    # llama3_2's H100 GEMMs, cuBLAS's nvjet for most calls and a CUTLASS sm80 kernel for the rest): the row
    # of most calls is the op's kernel
    calls = pd.to_numeric(t["name_count"], errors="coerce").fillna(0)
    t = t.assign(_calls=calls).sort_values("_calls", ascending=False, kind="stable")
    t = t.drop_duplicates(["gpu", *keys]).sort_index().drop(columns="_calls")
    call = ["name", "Input Dims_first", "Input type_first", "Input Strides_first", "Concrete Inputs_first"]
    if "table" in t and (t["table"] == "SDPA_fwd").any() and all(c in keys for c in call):
        match = t[call].astype(str).copy()
        sdpa = (t["table"] == "SDPA_fwd").to_numpy()
        match.loc[sdpa, call] = [list(_sdpa_call(*r)) for r in t.loc[sdpa, call].itertuples(index=False)]
        t = t.assign(**{f"{c} match": match[c] for c in call})
        keys = [k for k in keys if k not in call] + [f"{c} match" for c in call]
        j = t[t["gpu"] == "h100"].merge(t[t["gpu"] == "mi300x"], on=keys, suffixes=("", "_t"))
        return j.rename(columns={c: f"{c}_s" for c in t.columns if c not in keys and c not in call})
    return t[t["gpu"] == "h100"].merge(t[t["gpu"] == "mi300x"], on=keys, suffixes=("_s", "_t"))


def _precision(types: list | None) -> str:
    return TLG_PRECISION.get(types[0], "bf16") if types else "bf16"


def tracelens_gemms(root: Path) -> Iterator[tuple[str, str, pd.DataFrame]]:
    """(h100, mi300x, rows) of the GEMM ops of TraceLens's perf reports (``gemm_kernel_times.csv``: per model,
    GPU, op and input shapes, the median over its calls of the op's kernel time, every kernel it launched);
    an op of one model with the same shapes and types on both GPUs is one row, priced by perfscope's own
    cost formula from its shapes; where the extract keeps the inputs' strides (a model whose report lists one
    shape twice, once per layout: a weight read transposed or not), they are part of the op's inputs."""
    j = _tracelens_pairs(root / TLG / "gemm_kernel_times.csv",
                         ["model", "name", "Input Dims_first", "Input type_first", "Input Strides_first"])
    types = [parse_lists(x) for x in j["Input type_first"]]
    prec = np.array([_precision(ty) for ty in types], object)
    costs = np.array([_cost(op, parse_lists(d), ty) for op, d, ty in zip(j["name"], j["Input Dims_first"], types)],
                     np.float64).reshape(-1, 2)
    strides = j["Input Strides_first"].map(lambda x: f"|{x}" if x else "")
    shape = (j["model"] + "|" + j["name"] + "|" + j["Input Dims_first"] + strides).to_numpy()
    classes = np.array([gemm_shape_class(op, d) for op, d in zip(j["name"], j["Input Dims_first"])], object)
    bmn = gemm_bmn(j["name"].to_numpy(object), j["Input Dims_first"].to_numpy(object))
    frames = []
    for p in sorted(set(prec)):
        sel = prec == p
        rows = _rows(f"tracelens gemms {p}", "gemm", "gemm", str(p), [tuple(c) for c in costs[sel]],
                     j["Kernel Time (us)_median_s"].to_numpy()[sel] * 1e-6,
                     j["Kernel Time (us)_median_t"].to_numpy()[sel] * 1e-6, costs[sel, 0], list(classes[sel]),
                     bmn[sel])
        rows["shape"] = shape[sel]  # two bmm of OWLv2 have one work and two times: each is its own key
        rows["run"] = j["model"].to_numpy()[sel]  # each model is its own harness run
        rows["aten"] = j["name"].to_numpy()[sel]
        frames.append(rows)
    yield "h100", "mi300x", pd.concat(frames, ignore_index=True)


def tracelens_family_rows(root: Path) -> tuple[pd.DataFrame, dict[str, int]]:
    """The other ops of TraceLens's perf reports (``family_kernel_times.csv``: SDPA, binary and unary
    elementwise, normalization, reduction, convolution tables), one row per op of one model at the same
    inputs (shapes, types, strides, scalars) on both GPUs, each priced by :func:`op_cost` from its shapes
    (an SDPA's causal flag from its scalar inputs) and given the family a trace's kernel of that op gets
    (:func:`perfscope.device_models.kernel_family`). Returns the rows and, per reason and op, the rows left
    out: no kernel timed on a GPU, a host transfer (``Memcpy HtoD/DtoH``), a parent op whose kernel is its
    child's row (``aten::layer_norm`` of ``aten::native_layer_norm``), no cost formula."""
    keys = ["model", "table", "name", "Input Dims_first", "Input type_first", "Input Strides_first",
            "Concrete Inputs_first"]
    j = _tracelens_pairs(root / TLF / "family_kernel_times.csv", keys)
    left: dict[str, int] = {}

    def drop(mask: np.ndarray, why: str) -> None:
        for op in j.loc[mask, "name"]:
            left[f"{why}: {op}"] = left.get(f"{why}: {op}", 0) + 1

    t_s = j["Kernel Time (us)_median_s"].to_numpy(np.float64, na_value=np.nan)
    t_t = j["Kernel Time (us)_median_t"].to_numpy(np.float64, na_value=np.nan)
    untimed = ~((t_s > 0) & (t_t > 0))
    host = (j["memcpy_s"].str.startswith(HOST_COPY) | j["memcpy_t"].str.startswith(HOST_COPY)).to_numpy() & ~untimed
    parent = (j["name"] == "aten::layer_norm").to_numpy() & ~untimed & ~host
    costs = [op_cost(op, parse_lists(d), parse_lists(ty), parse_lists(c))
             for op, d, ty, c in zip(j["name"], j["Input Dims_first"], j["Input type_first"], j["Concrete Inputs_first"])]
    unpriced = np.array([c is None for c in costs]) & ~untimed & ~host & ~parent
    for mask, why in ((untimed, "no kernel timed"), (host, "host transfer"), (parent, "parent of a priced op"),
                      (unpriced, "no cost formula")):
        drop(mask, why)
    keep = ~(untimed | host | parent | unpriced)
    j = j[keep].reset_index(drop=True)
    kept = [c for c, k in zip(costs, keep) if k]
    prec = np.array([_precision(parse_lists(ty)) for ty in j["Input type_first"]], object)
    f = np.array([c.flops for c in kept if c is not None], np.float64)
    b = np.array([c.bytes for c in kept if c is not None], np.float64)
    fam = kernel_family([c.category for c in kept if c is not None], list(prec), f, b)
    rows = pd.DataFrame({"table": ["tracelens " + x for x in fam], "op": j["name"].to_numpy(),
                         "kind": [family_group(x) for x in fam], "precision": prec, "flops": f, "bytes": b,
                         "t_src_s": t_s[keep] * 1e-6, "t_tgt_s": t_t[keep] * 1e-6, "size": f, "family": fam,
                         "shape": (j["model"] + "|" + j["name"] + "|" + j["Input Dims_first"] + "|"
                                   + j["Input type_first"] + "|" + j["Input Strides_first"]).to_numpy(),
                         "run": j["model"].to_numpy(), "aten": j["name"].to_numpy()})
    return rows, left


def tracelens_families(root: Path) -> Iterator[tuple[str, str, pd.DataFrame]]:
    """(h100, mi300x, rows) of :func:`tracelens_family_rows`."""
    yield "h100", "mi300x", tracelens_family_rows(root)[0]


SOURCES = {"aiconfigurator": aiconfigurator, "vidur": vidur, "llmcompass": llmcompass, "tracelens gemms": tracelens_gemms,
           "tracelens families": tracelens_families}


def project_rows(rows: pd.DataFrame, source: Roofs, target: Roofs) -> pd.DataFrame:
    """``rows`` with the model's projection and the two baselines (``pred_*_s``) and their errors (``err_*_pct``)."""
    family = rows["table"]
    prec = rows["precision"]
    out = rows.copy()
    proj = project_times(rows["t_src_s"].to_numpy(), rows["flops"].to_numpy(), rows["bytes"].to_numpy(), prec,
                         family, source, target, tensor=(rows["kind"] == "gemm").to_numpy())
    out["pred_model_s"] = proj["time_s"].to_numpy()
    out["rule"] = proj["rule"].to_numpy()
    f, b = rows["flops"].to_numpy(np.float64, na_value=np.nan), rows["bytes"].to_numpy(np.float64, na_value=np.nan)
    ps, pt = source.peak(prec), target.peak(prec)
    bw_src = float(source.bytes_per_s) if source.bytes_per_s else np.nan
    bw_tgt = float(target.bytes_per_s) if target.bytes_per_s else np.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        memory = (b / bw_src) >= (f / ps)
        ratio = np.where(memory, bw_src / bw_tgt, ps / pt)
        out["pred_ratio_s"] = rows["t_src_s"].to_numpy() * ratio
        out["pred_roof_s"] = np.maximum(f / pt, b / bw_tgt)
        for m in ("model", "ratio", "roof"):
            out[f"err_{m}_pct"] = np.abs(out[f"pred_{m}_s"] - out["t_tgt_s"]) / out["t_tgt_s"] * 100.0
    return out


def validate(root: Path, *, sources: tuple[str, ...] = tuple(SOURCES), every: int = 1,
             missing: list[str] | None = None, assumed: dict[str, Roofs] | None = None) -> pd.DataFrame:
    """Every row of the tables under ``root``, projected (every ``every``-th row of each table: a
    deterministic subset for tests). GPU pairs whose roofs perfscope lacks are left out, one line each in
    ``missing``."""
    frames = []
    for name in sources:
        for src, tgt, rows in SOURCES[name](root):
            try:
                s_roofs, t_roofs = roofs_for(src, assumed), roofs_for(tgt, assumed)
            except UsageError as exc:
                if missing is not None:
                    missing.append(f"{name} {src}->{tgt}: {exc}")
                continue
            if every > 1:
                rows = rows[rows.groupby("table", sort=False).cumcount() % every == 0]
            out = project_rows(rows.reset_index(drop=True), s_roofs, t_roofs)
            out.insert(0, "pair", f"{src}->{tgt}" + (" (assumed roofs)" if "assumed" in t_roofs.name else ""))
            frames.append(out)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def error_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Median absolute % error per table and GPU pair, then per pair and kind (gemm / other), then per kind."""
    errs = ["err_model_pct", "err_ratio_pct", "err_roof_pct"]
    ok = rows[np.isfinite(rows["t_tgt_s"]) & (rows["t_tgt_s"] > 0)]

    def agg(g: pd.DataFrame) -> pd.Series:
        med = g[errs].median()
        return pd.Series({"rows": len(g), "model_pct": med.iloc[0], "ratio_pct": med.iloc[1], "roof_pct": med.iloc[2]})

    per_table = pd.DataFrame([{"pair": p, "table": t, **agg(g)} for (p, t), g in ok.groupby(["pair", "table"], sort=False)])
    per_pair = pd.DataFrame([{"pair": p, "table": k, **agg(g)} for (p, k), g in ok.groupby(["pair", "kind"], sort=False)])
    per_pair["table"] = "ALL " + per_pair["table"]
    per_kind = pd.DataFrame([{"table": k, **agg(g)} for k, g in ok.groupby("kind", sort=False)])
    per_kind["table"] = "ALL " + per_kind["table"]
    per_kind.insert(0, "pair", "all pairs")
    table = pd.concat([per_table, per_pair, per_kind], ignore_index=True)
    table["goal_pct"] = np.where(table["table"].str.contains("gemm|proj|matmul"), GOALS["gemm"], GOALS["other"])
    table["beats_both"] = (table["model_pct"] < table["ratio_pct"]) & (table["model_pct"] < table["roof_pct"])
    return table
