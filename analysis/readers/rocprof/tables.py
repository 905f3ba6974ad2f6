"""Report tables from rocprof records: kernel names cleaned, categories, device labels, ranges."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope import inputs
from perfscope.kernel_names import short_kernel_name
from perfscope.schema import map_distinct, whole_numbers

from ...costs.operators import category_of
from ...tree import nest

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

KD_SUFFIX = re.compile(r"(\s*\[clone \.kd\]|\s*\(\.kd\)|\.kd)\s*$")
AMD_GEMM = ("mul_mat", "cijk_", "gemm", "hipblaslt", "_mfma_", "wvsplitk", "matmul")
AMD_ATTENTION = ("flash_attn", "fmha", "mla", "paged_attention", "attention", "pa_fwd")
NO_COUNTERS = ("a kernel trace records no hardware counters and rocprof kernel names carry no shapes: FLOPs and "
               "bytes stay missing, bound 'unknown' (profile with `rocprofv3 --pmc` or rocprof-compute for "
               "measured costs)")


class MissingColumns(Exception):
    """A table lacks the columns a reader needs (the message names them); the reader names the file."""


def clean_name(name: object) -> str:
    """A rocprof kernel name without the code-object suffix (``[clone .kd]``, ``(.kd)``, ``.kd``)."""
    text = str(name).strip() if name is not None and not pd.isna(name) else ""
    if len(text) > 1 and text[0] == text[-1] == '"':
        text = text[1:-1]
    return KD_SUFFIX.sub("", text).strip() or "(unnamed kernel)"


def amd_category(name: object) -> str:
    """category_of, plus AMD's library kernel families (llama.cpp mul_mat*, Tensile Cijk_, aiter MLA)."""
    base = category_of(None, str(name))
    if base != "other":
        return base
    low = str(name).lower()
    if any(s in low for s in AMD_ATTENTION):
        return "attention"
    if any(s in low for s in AMD_GEMM):
        return "gemm"
    return base


MAX_DIM = 2**32
"""A launch's grid or workgroup dimension is a 32-bit count; a value past it (1e400 read as infinity) is no launch's."""


def dims_column(x: pd.Series, y: pd.Series | None = None, z: pd.Series | None = None) -> pd.Series:
    """Each kernel's launch dimensions ``(x, y, z)`` as text; None where one of them is missing or no launch's
    (not a number, negative, infinite or past :data:`MAX_DIM`): that kernel's grid is unknown, the others keep
    theirs."""
    xs = pd.to_numeric(x, errors="coerce")
    ys = pd.to_numeric(y, errors="coerce") if y is not None else pd.Series(1, index=x.index)
    zs = pd.to_numeric(z, errors="coerce") if z is not None else pd.Series(1, index=x.index)
    ok = pd.Series(True, index=x.index)
    for v in (xs, ys, zs):
        ok &= v.notna() & (v >= 0) & (v < MAX_DIM)
    out = pd.Series(None, index=x.index, dtype="object")
    out[ok] = ["(" + f"{int(a)}, {int(b)}, {int(c)}" + ")" for a, b, c in zip(xs[ok], ys[ok], zs[ok])]
    return out


def ints(values: Any) -> Any:
    """Whole numbers of a column read from a file (:func:`perfscope.schema.whole_numbers`); None stays None
    (a column the file does not have)."""
    return None if values is None else whole_numbers(values)


def kernel_table(name: Sequence[Any] | pd.Series, device: Sequence[Any] | pd.Series,
                 start: Any, end: Any, **columns: Any) -> pd.DataFrame:
    """A kernel table: names cleaned, short names, categories, ns times; ``columns`` added as given."""
    names = map_distinct(pd.Series(list(name) if not isinstance(name, pd.Series) else name.to_numpy(), dtype="object"),
                         lambda n: clean_name(n) if n is not None else None)
    start_ns = ints(start).reset_index(drop=True)
    end_ns = ints(end).reset_index(drop=True)
    out = pd.DataFrame({
        "name": names.reset_index(drop=True),
        "short_name": map_distinct(names, lambda n: short_kernel_name(n) if isinstance(n, str) else None).reset_index(drop=True),
        "device": pd.Series(list(device), dtype="object"),
        "start_ns": start_ns, "end_ns": end_ns, "duration_ns": end_ns - start_ns,
        "category": map_distinct(names, lambda n: amd_category(n) if isinstance(n, str) else None).reset_index(drop=True),
    })
    for key, value in columns.items():
        out[key] = value.reset_index(drop=True) if isinstance(value, pd.Series) else value
    return out


def tagged(values: pd.Series, tag: str) -> pd.Series:
    """``tag`` where ``values`` is known, None elsewhere (a cost's source)."""
    return pd.Series(tag, index=values.index, dtype="object").where(values.notna(), None)


def gpu_label(agent: object) -> str:
    """``Agent 1`` / 1 / ``2`` -> ``gpu:1``: the rocprof agent's number, as the capture names it."""
    text = str(agent).strip()
    m = re.search(r"(\d+)$", text)
    return f"gpu:{m.group(1)}" if m else f"gpu:{text or '?'}"


def api_table(name: Any, start: Any, end: Any, *, thread: Any = None, correlation: Any = None,
              kind: Any = "runtime", pid: Any = None) -> pd.DataFrame:
    s, e = ints(start).reset_index(drop=True), ints(end).reset_index(drop=True)
    out = pd.DataFrame({"name": pd.Series(list(name), dtype="object"), "start_ns": s, "end_ns": e,
                        "duration_ns": e - s})
    out["thread"] = ints(thread).reset_index(drop=True) if thread is not None else pd.NA
    out["correlation"] = ints(correlation).reset_index(drop=True) if correlation is not None else pd.NA
    out["kind"] = kind.reset_index(drop=True) if isinstance(kind, pd.Series) else kind
    if pid is not None:
        out["pid"] = ints(pid).reset_index(drop=True)
    return out


def range_table(name: Any, start: Any, end: Any, thread: Any = None) -> pd.DataFrame:
    """roctx ranges -> the ranges table (ids, depth, parent and path from nesting per thread:
    :func:`...tree.nest`, linear in the ranges however deep; paths bounded by :data:`...tree.MAX_PATH_DEPTH`)."""
    s, e = ints(start).reset_index(drop=True), ints(end).reset_index(drop=True)
    df = pd.DataFrame({"name": pd.Series(list(name), dtype="object"), "start_ns": s, "end_ns": e})
    df["thread"] = ints(thread).reset_index(drop=True) if thread is not None else pd.NA
    df = df[df["start_ns"].notna() & df["end_ns"].notna() & (df["end_ns"] >= df["start_ns"])].reset_index(drop=True)
    if df.empty:
        return pd.DataFrame()
    df = df.sort_values(["start_ns", "end_ns"], ascending=[True, False], kind="stable").reset_index(drop=True)
    df["id"] = np.arange(len(df), dtype=np.int64)
    groups = pd.factorize(df["thread"].astype("object").where(df["thread"].notna(), -1), use_na_sentinel=False)[0]
    names = df["name"].to_numpy(dtype=object)
    nst = nest(groups.astype("int64"), df["start_ns"].to_numpy("int64"), df["end_ns"].to_numpy("int64"),
               np.zeros(len(df), dtype="int64"), lambda pos: names[pos], range_kind=0, op_kind=1)
    everyone = np.arange(len(df))
    parent = nst.range_parent
    df["depth"] = nst.range_depth(everyone)
    above = pd.array(np.where(parent >= 0, parent, 0), dtype="Int64")
    above[parent < 0] = pd.NA
    df["parent"] = above
    df["path"] = nst.range_path_self(everyone)
    df["duration_ns"] = df["end_ns"] - df["start_ns"]
    df["source"] = "roctx"
    return df


def innermost_range(kernels: pd.DataFrame, api: pd.DataFrame, ranges: pd.DataFrame) -> None:
    """Give each kernel the innermost roctx range around its launch call (by correlation), else
    around the kernel itself on the host timeline; in place. An interval join (:func:`...tree.nest` over
    the ranges and the launch times together: the latest-starting range that holds the time), linear
    in kernels + ranges, where a pass per range over every kernel took 20.9 s for 40,000 ranges."""
    if ranges.empty or kernels.empty:
        return
    when = kernels["start_ns"].astype("float64")
    if len(api) and "correlation" in kernels and api["correlation"].notna().any():
        calls = api.dropna(subset=["correlation"]).drop_duplicates("correlation").set_index("correlation")
        launch = kernels["correlation"].map(calls["start_ns"]).astype("float64")
        when = launch.where(launch.notna(), when)
    t = when.to_numpy("float64", na_value=np.nan)
    known = np.flatnonzero(~np.isnan(t))
    found = np.full(len(t), None, dtype=object)
    if len(known):
        n = len(ranges)
        starts = np.concatenate([ranges["start_ns"].to_numpy("int64"), t[known].astype("int64")])
        ends = np.concatenate([ranges["end_ns"].to_numpy("int64"), t[known].astype("int64")])
        kinds = np.concatenate([np.zeros(n, dtype="int64"), np.ones(len(known), dtype="int64")])
        paths = ranges["path"].to_numpy(dtype=object)
        nst = nest(np.zeros(len(starts), dtype="int64"), starts, ends, kinds,
                   lambda pos: np.full(len(pos), "", dtype=object), range_kind=0, op_kind=1)  # paths: the table's
        around = nst.range_parent[n:]
        hit = around >= 0
        found[known[hit]] = paths[around[hit]]
    kernels["range"] = found


def read_csv(path: Path, hint: str) -> pd.DataFrame:
    """A rocprof CSV as a table (through the limits layer: decompressed by content, rows counted as read);
    a damaged or cut one is one error line naming the file, with ``hint``."""
    return inputs.read_csv(path, hint, low_memory=False)
