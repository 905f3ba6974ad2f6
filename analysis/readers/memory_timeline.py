"""torch.profiler's ``export_memory_timeline`` JSON -> the ``memory`` table.

Two layouts: the coalesced ``[times_us, sizes]`` (``.json`` / ``.json.gz``), where ``sizes[i]``
is ``[0, bytes per category...]`` in torch's category order, and the raw
``[[t_ns, action, bytes, category], ...]`` (``.raw.json.gz``; action 1 PREEXISTING,
2 CREATE, 3 INCREMENT_VERSION, 4 DESTROY; t -1 for pre-existing tensors). torch's categories
map onto perfscope's (docs/memory.md): PARAMETER -> weights, OPTIMIZER_STATE -> optimizer,
INPUT and ACTIVATION -> activations, TEMPORARY -> workspace, GRADIENT and AUTOGRAD_DETAIL ->
gradient, unknown -> unknown. There are no addresses: rows are changes of a category's bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import pandas as pd

from perfscope.errors import InputFormatError
from perfscope.inputs import read_bytes
from perfscope.limits import take
from perfscope.report import Report, source_info

from .finish import Imported, finish

if TYPE_CHECKING:
    from perfscope.device import DeviceSpec

TORCH_CATEGORIES = ("weights", "optimizer", "activations", "workspace", "activations", "gradient", "gradient",
                    "unknown")
"""torch.profiler._memory_profiler's category order (PARAMETER, OPTIMIZER_STATE, INPUT, TEMPORARY,
ACTIVATION, GRADIENT, AUTOGRAD_DETAIL, None) as perfscope categories."""


MAX_US = (1 << 62) // 1000
"""The largest time (µs) a timeline may hold: its ns (x 1000) stay in the ns columns' range."""


def parse(doc: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(t_ns, category index, delta bytes) of either layout, or None when ``doc`` is neither."""
    if (isinstance(doc, list) and len(doc) == 2 and isinstance(doc[0], list) and isinstance(doc[1], list)
            and len(doc[0]) == len(doc[1]) and all(isinstance(r, list) and len(r) == 9 for r in doc[1][:5])):
        times = np.asarray(doc[0], dtype="int64")
        if len(times) and np.abs(times).max() > MAX_US:
            raise ValueError("a time out of range")
        sizes = np.asarray(doc[1], dtype="float64")[:, 1:]
        deltas = np.diff(np.vstack([np.zeros((1, sizes.shape[1])), sizes]), axis=0)
        ti, ci = np.nonzero(deltas)
        return times[ti] * 1000, ci, deltas[ti, ci]
    if isinstance(doc, list) and doc and all(isinstance(r, list) and len(r) == 4 for r in doc[:5]):
        raw = np.asarray(doc, dtype="int64")
        t = raw[:, 0]
        if np.abs(t).max() > MAX_US * 1000:
            raise ValueError("a time out of range")
        first = t[t >= 0].min() if (t >= 0).any() else 0
        return np.where(t < 0, first, t), raw[:, 3], raw[:, 2].astype("float64")
    return None


def import_memory_timeline(path: str | Path, *, device: DeviceSpec | None = None) -> Imported:
    p = Path(path)
    data = read_bytes(p)  # decompressed by content, memory budget checked as read
    try:
        got = parse(orjson.loads(data))
    except orjson.JSONDecodeError as exc:
        raise InputFormatError(p, f"damaged JSON ({exc})", hint="re-export it with export_memory_timeline") from None
    except (TypeError, ValueError, OverflowError, IndexError) as exc:  # a value of the wrong type or size
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
        raise InputFormatError(p, f"holds a value no export_memory_timeline output has ({first})",
                               hint="re-export it with export_memory_timeline") from None
    if got is None:
        raise InputFormatError(p, "is a JSON list but not an export_memory_timeline output",
                               hint="give [times, sizes] (.json) or the raw events (.raw.json.gz)")
    t, cat, delta = got
    take(p, len(t))
    order = np.argsort(t, kind="stable")
    t, cat, delta = t[order], cat[order], delta[order]
    categories = np.array(TORCH_CATEGORIES, dtype=object)[np.clip(cat, 0, len(TORCH_CATEGORIES) - 1)]
    memory = pd.DataFrame({
        "t_ns": t, "device": "unknown", "action": np.where(delta >= 0, "alloc", "free"),
        "size_bytes": np.abs(delta), "delta_bytes": delta, "allocated_bytes": np.cumsum(delta),
        "category": categories, "category_rule": "torch.profiler's memory profiler",
        "memory_source": "memory_timeline", "event": np.arange(len(t), dtype="int64"),
    })
    manifest = {"name": p.name.split(".")[0],
                "source": source_info("memory-timeline", p, "torch.profiler export_memory_timeline", None),
                "warnings": ["export_memory_timeline does not name its device: device is 'unknown'"],
                "unavailable_metrics": ["flops", "dram_bytes"]}
    return Imported({"memory": memory}, manifest, device, origin=str(p))


def read_memory_timeline(path: Path, *, device: DeviceSpec | None = None) -> Report:
    return finish(import_memory_timeline(path, device=device))


read = read_memory_timeline
