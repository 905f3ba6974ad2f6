"""PyTorch/Kineto trace -> Report: kernels linked to their ops, analytic costs, ranges, copies.

Linking (FORMATS.md §4.6): a GPU event's ``correlation`` names its launch call
(``cuda_runtime``/``cuda_driver``); the launch sits inside the CPU operator that issued it
(found by time containment on the launching thread, or by ``External id``). The operator's
analytic FLOPs and bytes (``analysis.costs``) go to its kernels, split by kernel time when it
launched several. CPU-only traces have no kernels: each outermost costed operator (or leaf
operator) becomes a row with device ``cpu``.

Ranges are the ``user_annotation`` events (``record_function``); a row's ``range`` is the
'/'-joined path of the ranges around it (around its launch call, for kernels) and its ``phase``
is ``prefill`` or ``decode`` when one of those names is on the path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfscope.device import DeviceSpec
from perfscope.report import Report
from perfscope.schema import conform

from .costs import COMPOSITE_WHEN_PARENT, base_name, category_of, has_formula, op_cost
from .kineto_parse import ParsedTrace, parse_trace
from .roofline import classify
from .tree import PHASES, nest_intervals

ANN, OP, API = 0, 1, 2


def read_kineto(path: Path, *, device: DeviceSpec | None = None) -> Report:
    """Read a torch.profiler / Kineto trace (``.json`` or ``.json.gz``) into a Report.

    Args:
        path: the trace file.
        device: roofs to classify against; by default the trace's GPU from a datasheet table
            (CPU traces have no roofs unless given, so their bound stays ``unknown``).
    """
    trace = parse_trace(Path(path))
    tables, warnings = build_tables(trace)
    spec = device or device_from_meta(trace.meta, has_gpu=trace.count("kernel") > 0)
    kernels = classify(conform(tables["kernels"], "kernels", source=str(path)), spec)
    missing = missing_formulas(kernels)
    if missing:
        warnings.append("no cost formula (FLOPs/bytes left missing) for: " + ", ".join(missing))
    if trace.count("kernel") == 0 and trace.count("op"):
        warnings.append("no GPU kernel events in this trace: rows are CPU operators")
    if spec is None or not spec.compute:
        warnings.append("no device roofs known for this trace: bound is 'unknown' (pass device roofs to classify)")
    manifest = {
        "name": Path(path).name.split(".")[0],
        "source": {"kind": "kineto", "path": str(path), "tool": "torch.profiler",
                   "tool_version": _tool_version(trace.meta)},
        "device": spec.to_dict() if spec else None,
        "warnings": trace.warnings + warnings,
        "partial": trace.partial,
        "params": {"events": trace.n_events},
        "unavailable_metrics": [] if tables["kernels"]["flops"].notna().any() else ["flops", "dram_bytes"],
    }
    tables["kernels"] = kernels
    return Report.build(tables, manifest, source=str(path))


read = read_kineto


# ---------------------------------------------------------------------------- time
def _base_ns(meta: Mapping[str, Any]) -> int:
    base = meta.get("baseTimeNanoseconds")
    try:
        return int(base) if base is not None else 0
    except (TypeError, ValueError):
        return 0


def _to_ns(ts: list[Any], base: int) -> np.ndarray:
    arr = np.asarray(ts, dtype="float64")
    return np.rint(arr * 1000.0).astype("int64") + base


def _frame(cols: Mapping[str, list[Any]], base: int) -> pd.DataFrame:
    df = pd.DataFrame({k: v for k, v in cols.items() if k not in ("ts", "dur")})
    start = _to_ns(cols["ts"], base)
    dur = np.maximum(np.rint(np.asarray(cols["dur"], dtype="float64") * 1000.0).astype("int64"), 0)
    df["start_ns"], df["end_ns"], df["duration_ns"] = start, start + dur, dur
    return df


# ---------------------------------------------------------------------------- tables
def build_tables(trace: ParsedTrace) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """All report tables from a parsed trace, before roofline classification."""
    base = _base_ns(trace.meta)
    ops, anns, apis = (_frame(trace.cols[k], base) for k in ("op", "ann", "api"))
    cpu = _cpu_nodes(anns, ops, apis)
    ranges = _ranges(cpu)
    if trace.count("kernel"):
        kernels = _gpu_kernels(_frame(trace.cols["kernel"], base), cpu)
    else:
        kernels = _cpu_rows(cpu)
    transfers = _transfers(trace, base, cpu)
    api = _api(cpu)
    return {"kernels": kernels, "ranges": ranges, "transfers": transfers, "api": api}, []


def _cpu_nodes(anns: pd.DataFrame, ops: pd.DataFrame, apis: pd.DataFrame) -> pd.DataFrame:
    """Annotations, ops and launch calls of every CPU thread, nested by time containment."""
    parts = []
    for kind, df in ((ANN, anns), (OP, ops), (API, apis)):
        if len(df):
            part = df.copy()
            part["kind"] = kind
            parts.append(part)
    nodes = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    for col in ("name", "pid", "tid", "start_ns", "end_ns", "duration_ns", "kind", "ext", "corr",
                "dims", "types", "concrete", "driver"):
        if col not in nodes:
            nodes[col] = pd.Series([None] * len(nodes), dtype="object")
    nodes["thread_key"] = nodes["pid"].astype(str) + ":" + nodes["tid"].astype(str)
    return nest_intervals(nodes, group="thread_key", range_kind=ANN, op_kind=OP)


def _ranges(nodes: pd.DataFrame) -> pd.DataFrame:
    anns = nodes[nodes["kind"] == ANN]
    return pd.DataFrame({
        "id": anns.index.astype("int64"),
        "name": anns["name"].to_numpy(),
        "start_ns": anns["start_ns"].to_numpy(),
        "end_ns": anns["end_ns"].to_numpy(),
        "duration_ns": anns["duration_ns"].to_numpy(),
        "depth": anns["range_depth"].to_numpy(),
        "parent": anns["range_parent"].to_numpy(),
        "path": anns["range_path_self"].to_numpy(),
        "thread": pd.to_numeric(anns["tid"], errors="coerce").to_numpy(),
        "source": "record_function",
    })


def _json(v: Any) -> str | None:
    return json.dumps(v, separators=(",", ":")) if isinstance(v, list) else None


def _first_dtype(types: Any) -> str | None:
    from .costs import DTYPE_NAMES

    if isinstance(types, list):
        for t in types:
            if isinstance(t, str) and t not in ("", "Scalar", "ScalarList", "TensorList", "GenericList"):
                return DTYPE_NAMES.get(t.lower(), t)
    return None


def _costs(ops: pd.DataFrame) -> pd.DataFrame:
    cache: dict[tuple[str, str, str, str], tuple[float, float, str]] = {}
    flops, nbytes, cats = [], [], []
    for name, dims, types, conc in zip(ops["name"], ops["dims"], ops["types"], ops["concrete"]):
        key = (name, _json(dims) or "", _json(types) or "", _json(conc) or "")
        if key not in cache:
            cost = op_cost(name, dims, types, conc)
            cache[key] = (cost.flops, cost.bytes, cost.category) if cost else (np.nan, np.nan, category_of(name))
        f, b, c = cache[key]
        flops.append(f)
        nbytes.append(b)
        cats.append(c)
    return pd.DataFrame({"flops": flops, "dram_bytes": nbytes, "category": cats}, index=ops.index)


def _select_cpu_rows(nodes: pd.DataFrame) -> pd.Index:
    """Outermost ops that have a formula (or are leaves): they never nest, so times add up."""
    ops = nodes[nodes["kind"] == OP]
    chosen: list[int] = []
    covered_end: dict[str, int] = {}
    for idx, key, start, end, name, n_children in zip(
        ops.index, ops["thread_key"], ops["start_ns"], ops["end_ns"], ops["name"], ops["op_children"]
    ):
        if start < covered_end.get(key, -1):
            continue
        composite = base_name(name) in COMPOSITE_WHEN_PARENT and n_children > 0
        if (has_formula(name) and not composite) or n_children == 0:
            chosen.append(idx)
            covered_end[key] = end
    return pd.Index(chosen)


def _cpu_rows(nodes: pd.DataFrame) -> pd.DataFrame:
    ops = nodes.loc[_select_cpu_rows(nodes)]
    if not len(ops):
        return pd.DataFrame()
    costs = _costs(ops)
    zero_view = (costs["category"] == "view") | ops["name"].map(
        lambda n: base_name(n) in COMPOSITE_WHEN_PARENT)
    costs.loc[zero_view, ["flops", "dram_bytes"]] = 0.0
    costs.loc[zero_view, "category"] = "view"
    known = costs["flops"].notna()
    return pd.DataFrame({
        "name": ops["name"].to_numpy(),
        "short_name": ops["name"].map(base_name).to_numpy(),
        "device": "cpu",
        "thread": pd.to_numeric(ops["tid"], errors="coerce").to_numpy(),
        "start_ns": ops["start_ns"].to_numpy(),
        "end_ns": ops["end_ns"].to_numpy(),
        "duration_ns": ops["duration_ns"].to_numpy(),
        "op": ops["name"].to_numpy(),
        "op_shapes": ops["dims"].map(_json).to_numpy(),
        "op_input_types": ops["types"].map(_json).to_numpy(),
        "dtype": ops["types"].map(_first_dtype).to_numpy(),
        "category": costs["category"].to_numpy(),
        "range": ops["range_path"].to_numpy(),
        "phase": ops["phase"].to_numpy(),
        "flops": costs["flops"].to_numpy(),
        "dram_bytes": costs["dram_bytes"].to_numpy(),
        "flops_source": np.where(known, "analytic", None),
        "bytes_source": np.where(known, "analytic", None),
    }).sort_values("start_ns", kind="stable")


def _costed_flags(nodes: pd.DataFrame) -> np.ndarray:
    """Per node: an op the cost model prices itself (not a composite that delegates to a child)."""
    names = nodes["name"].to_numpy()
    uniq = pd.unique(names)
    formula = dict(zip(uniq, (has_formula(str(n)) for n in uniq)))
    composite = dict(zip(uniq, (base_name(str(n)) in COMPOSITE_WHEN_PARENT for n in uniq)))
    is_op = nodes["kind"].to_numpy() == OP
    has_kids = nodes["op_children"].to_numpy() > 0
    priced = np.fromiter((formula[n] for n in names), bool, len(names))
    delegating = np.fromiter((composite[n] for n in names), bool, len(names)) & has_kids
    return is_op & priced & ~delegating


def _launches(nodes: pd.DataFrame) -> pd.DataFrame:
    """Launch calls by correlation id, with their costed op (nearest op ancestor with a formula)."""
    api = nodes[(nodes["kind"] == API) & nodes["corr"].notna()].drop_duplicates("corr", keep="first")
    ops = nodes[nodes["kind"] == OP]
    by_ext = pd.Series(ops.index, index=ops["ext"])
    by_ext = by_ext[by_ext.index.notna() & ~by_ext.index.duplicated()]
    start = pd.Series(api["ext"].to_numpy()).map(by_ext).to_numpy(dtype="float64")
    start = np.where(np.isnan(start), api["op_ancestor"].to_numpy(dtype="float64"), start)
    costed = _costed_flags(nodes)
    ancestor = nodes["op_ancestor"].to_numpy(dtype="float64")
    cost_op = np.array([_costed_ancestor(costed, ancestor, s) for s in start])
    return pd.DataFrame({"corr": api["corr"].to_numpy(), "api_idx": api.index,
                         "cost_op": cost_op}).set_index("corr")


def _costed_ancestor(costed: np.ndarray, ancestor: np.ndarray, idx: float) -> float:
    for _ in range(64):
        if np.isnan(idx):
            return np.nan
        i = int(idx)
        if costed[i]:
            return float(i)
        idx = ancestor[i]
    return np.nan


def _gpu_kernels(k: pd.DataFrame, nodes: pd.DataFrame) -> pd.DataFrame:
    launches = _launches(nodes)
    corr = pd.to_numeric(k["corr"], errors="coerce")
    link = launches.reindex(corr.to_numpy())
    api_idx = link["api_idx"].to_numpy()
    has_api = ~pd.isna(api_idx)
    rng = np.full(len(k), None, dtype=object)
    phase = np.full(len(k), None, dtype=object)
    safe = api_idx[has_api].astype("int64")
    rng[has_api] = nodes.loc[safe, "range_path"].to_numpy()
    phase[has_api] = nodes.loc[safe, "phase"].to_numpy()
    cost_op = link["cost_op"].to_numpy()
    out = pd.DataFrame({
        "name": k["name"].to_numpy(),
        "device": "cuda:" + pd.to_numeric(k["device"], errors="coerce").fillna(0).astype("int64").astype(str),
        "stream": pd.to_numeric(k["stream"], errors="coerce").to_numpy(),
        "start_ns": k["start_ns"].to_numpy(),
        "end_ns": k["end_ns"].to_numpy(),
        "duration_ns": k["duration_ns"].to_numpy(),
        "correlation": corr.to_numpy(),
        "grid": k["grid"].to_numpy(),
        "block": k["block"].to_numpy(),
        "registers_per_thread": pd.to_numeric(k["regs"], errors="coerce").to_numpy(),
        "shared_mem_bytes": pd.to_numeric(k["smem"], errors="coerce").to_numpy(),
        "est_occupancy_pct": pd.to_numeric(k["occupancy"], errors="coerce").to_numpy(),
        "range": rng,
        "phase": phase,
        "_cost_op": cost_op,
    })
    out["short_name"] = out["name"].map(short_kernel_name)
    out = _attribute_costs(out, nodes)
    return out.sort_values("start_ns", kind="stable").drop(columns="_cost_op")


def _attribute_costs(kernels: pd.DataFrame, nodes: pd.DataFrame) -> pd.DataFrame:
    n = len(kernels)
    has = kernels["_cost_op"].notna().to_numpy()
    op_idx = kernels["_cost_op"].to_numpy()[has].astype("int64")
    op_col = np.full(n, None, dtype=object)
    shapes, types, dtype = (np.full(n, None, dtype=object) for _ in range(3))
    flops, nbytes = np.full(n, np.nan), np.full(n, np.nan)
    if has.any():
        ops = nodes.loc[np.unique(op_idx)]
        costs = _costs(ops)
        dur = kernels["duration_ns"].to_numpy()[has].astype("float64")
        total = pd.Series(dur).groupby(op_idx).transform("sum").to_numpy()
        count = pd.Series(op_idx).map(pd.Series(op_idx).value_counts()).to_numpy()
        frac = np.where(total > 0, dur / np.where(total > 0, total, 1.0), 1.0 / count)
        op_col[has] = ops.loc[op_idx, "name"].to_numpy()
        shapes[has] = ops.loc[op_idx, "dims"].map(_json).to_numpy()
        types[has] = ops.loc[op_idx, "types"].map(_json).to_numpy()
        dtype[has] = ops.loc[op_idx, "types"].map(_first_dtype).to_numpy()
        flops[has] = costs.loc[op_idx, "flops"].to_numpy(dtype="float64") * frac
        nbytes[has] = costs.loc[op_idx, "dram_bytes"].to_numpy(dtype="float64") * frac
    known = ~np.isnan(flops)
    kernels = kernels.assign(
        op=op_col, op_shapes=shapes, op_input_types=types, dtype=dtype, flops=flops, dram_bytes=nbytes,
        flops_source=np.where(known, "analytic", None), bytes_source=np.where(known, "analytic", None),
    )
    kernels["category"] = [category_of(o if isinstance(o, str) else None, k)
                           for o, k in zip(kernels["op"], kernels["name"])]
    return kernels


def short_kernel_name(name: str) -> str:
    """Base function name of a (demangled) kernel name: no return type, namespace or arguments."""
    text = name
    depth, cut = 0, len(text)
    for i, ch in enumerate(text):
        if ch in "<(":
            if depth == 0 and ch == "(":
                cut = i
                break
            depth += 1
        elif ch in ">)":
            depth = max(depth - 1, 0)
    head = text[:cut].strip()
    tokens = []
    depth = 0
    word = ""
    for ch in head:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == " " and depth == 0:
            tokens.append(word)
            word = ""
            continue
        if depth == 0 and ch not in "<>":
            word += ch
    tokens.append(word)
    last = tokens[-1] if tokens[-1] else head
    return last.split("::")[-1] or name


def _transfers(trace: ParsedTrace, base: int, nodes: pd.DataFrame) -> pd.DataFrame:
    parts = []
    for kind in ("memcpy", "memset"):
        if trace.count(kind):
            df = _frame(trace.cols[kind], base)
            df["is_memset"] = kind == "memset"
            parts.append(df)
    if not parts:
        return pd.DataFrame()
    df = pd.concat(parts, ignore_index=True)
    parsed = df["name"].map(parse_copy_name)
    launches = nodes[(nodes["kind"] == API) & nodes["corr"].notna()].drop_duplicates("corr")
    range_by_corr = pd.Series(launches["range_path"].to_numpy(), index=launches["corr"].to_numpy())
    corr = pd.to_numeric(df["corr"], errors="coerce")
    return pd.DataFrame({
        "kind": np.where(df["is_memset"], "memset", parsed.map(lambda p: p[0])),
        "bytes": pd.to_numeric(df["bytes"], errors="coerce").fillna(0).astype("int64"),
        "start_ns": df["start_ns"], "end_ns": df["end_ns"], "duration_ns": df["duration_ns"],
        "device": "cuda:" + pd.to_numeric(df["device"], errors="coerce").fillna(0).astype("int64").astype(str),
        "stream": pd.to_numeric(df["stream"], errors="coerce"),
        "correlation": corr,
        "src_kind": parsed.map(lambda p: p[1]),
        "dst_kind": parsed.map(lambda p: p[2]),
        "pinned": parsed.map(lambda p: p[3]),
        "range": range_by_corr.reindex(corr.to_numpy()).to_numpy(),
    }).sort_values("start_ns", kind="stable")


def parse_copy_name(name: str) -> tuple[str, str | None, str | None, bool | None]:
    """``Memcpy HtoD (Pageable -> Device)`` -> (HtoD, Pageable, Device, pinned=False)."""
    kind, src, dst = "other", None, None
    text = name.strip()
    if text.lower().startswith("memset"):
        inner = text[text.find("(") + 1: text.rfind(")")] if "(" in text else None
        return "memset", None, inner, None
    parts = text.split()
    if len(parts) >= 2 and text.lower().startswith("memcpy"):
        kind = parts[1]
    if "(" in text and "->" in text:
        inner = text[text.find("(") + 1: text.rfind(")")]
        src, dst = (s.strip() for s in inner.split("->", 1))
    host = src if kind.startswith("HtoD") else dst if kind.startswith("DtoH") else None
    pinned = None if host is None else host.lower() == "pinned"
    return kind, src, dst, pinned


def _api(nodes: pd.DataFrame) -> pd.DataFrame:
    api = nodes[nodes["kind"] == API]
    return pd.DataFrame({
        "name": api["name"].to_numpy(),
        "start_ns": api["start_ns"].to_numpy(),
        "end_ns": api["end_ns"].to_numpy(),
        "duration_ns": api["duration_ns"].to_numpy(),
        "thread": pd.to_numeric(api["tid"], errors="coerce").to_numpy(),
        "correlation": pd.to_numeric(api["corr"], errors="coerce").to_numpy(),
        "kind": np.where(api["driver"].astype(bool), "driver", "runtime"),
    })


# ---------------------------------------------------------------------------- device
def _tool_version(meta: Mapping[str, Any]) -> str | None:
    parts = []
    for key in ("cupti_version", "cuda_runtime_version", "roctracer_version", "hip_runtime_version"):
        if key in meta:
            parts.append(f"{key}={meta[key]}")
    return ", ".join(parts) or None


def device_from_meta(meta: Mapping[str, Any], *, has_gpu: bool) -> DeviceSpec | None:
    """The trace's first GPU (with datasheet roofs when its name is known), or None for CPU."""
    props = meta.get("deviceProperties") or []
    if not has_gpu:
        return DeviceSpec(name="CPU (host of the trace)", kind="cpu")
    if not props or not isinstance(props, list) or not isinstance(props[0], dict):
        return DeviceSpec(name="GPU (not recorded in the trace)",
                          kind="rocm" if "hip_runtime_version" in meta else "cuda")
    p = props[0]
    kind = "rocm" if ("hip_runtime_version" in meta or "roctracer_version" in meta) else "cuda"
    properties = {k: p.get(k) for k in ("numSms", "totalGlobalMem", "computeMajor", "computeMinor") if k in p}
    properties["gpus_in_trace"] = len(props)
    name = str(p.get("name", "GPU"))
    try:
        from perfscope.datasheets import datasheet_spec
    except ImportError:  # datasheets are optional data
        datasheet_spec = None  # type: ignore[assignment]
    spec = datasheet_spec(name) if datasheet_spec else None
    if spec is not None:
        return DeviceSpec(name=name, kind=kind, compute=spec.compute, memory=spec.memory,
                          properties={**spec.properties, **properties})
    return DeviceSpec(name=name, kind=kind, properties=properties)


def missing_formulas(kernels: pd.DataFrame, limit: int = 12) -> list[str]:
    """Ops with rows but no cost formula, most time first (``name (N rows, x% of time)``)."""
    if "op" not in kernels or not len(kernels):
        return []
    names = kernels["op"].where(kernels["op"].notna(), None)
    if kernels["device"].eq("cpu").all():
        names = kernels["name"]
    mask = kernels["flops"].isna() & names.notna()
    if not mask.any():
        return []
    total = float(kernels["duration_ns"].sum()) or 1.0
    grouped = kernels[mask].groupby(names[mask])["duration_ns"].agg(["count", "sum"])
    grouped = grouped.sort_values("sum", ascending=False).head(limit)
    return [f"{n} ({int(r['count'])} rows, {100 * r['sum'] / total:.1f}% of time)" for n, r in grouped.iterrows()]


__all__ = ["PHASES", "read", "read_kineto", "short_kernel_name", "parse_copy_name"]
