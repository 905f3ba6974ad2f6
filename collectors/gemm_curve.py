"""A GEMM's time against its row count on this device: the size curve ``perfscope whatif`` reads.

A profiled run records each weight GEMM at the few row counts the run had (decode's M = batch, the
prefill's M = batch x prompt). How the time grows between them is not a line on every device: a CPU
BLAS streams the weights at M = 1 but packs them first at 2 <= M << 128 (2-3x the time of M = 1 on
the 2-core VM, docs/whatif.md), so another batch or draft length is not predictable from the run's own
sizes. This measures it, right after the profiled run, in the same process (same threads, same
library, the model's own layers): for each distinct weight (out x in features, dtype), the time of a
call at M = 1, 2, ... up to :data:`REACH` x the largest M of the run.

- Each call reads its weight from memory, as in a model's step: the layer is copied until the copies
  hold 4x the last-level cache (64-512 MiB, :func:`working_set_bytes_of`; at most :data:`MAX_COPIES`)
  and the calls cycle through them, so a small weight is not served from the cache it would not be in
  between a model's layers.
- Time = the best of :data:`REPEATS` rounds (a round: one call per copy, divided by the copies) after a
  warm-up round; CUDA is synchronised around each round. Where a round took over
  :data:`SLOW_ROUND_S` at the previous row count (a large M, compute-bound, where the cache matters
  little), the layer cycles through fewer copies (a round of about that long) and is timed once.
- Row counts go up together over all weights (every weight at M = 1, then M = 2, ...) until
  :data:`BUDGET_S` is spent, so a large model on a slow device keeps its small-M points (decode, draft
  and verify steps) and loses the large ones; the rows measured say which.

The result is the Report's ``gemm_curve`` table (``n``, ``k``, ``dtype``, ``m``, ``time_ns``,
``copies``), with the profiler's dtype names so that it joins the kernels' ``op_input_types``.
"""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from perfscope.schema import empty_table

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

LADDER = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
          3072, 4096, 6144, 8192)
"""The row counts measured (up to the run's largest; the largest is always added)."""

MIN_WORKING_SET_BYTES = 64 << 20
MAX_WORKING_SET_BYTES = 512 << 20
LAST_CACHE_MULTIPLE = 4
"""The copies of a layer hold this many times the last-level cache (the CPU's L3, the GPU's L2), at
least :data:`MIN_WORKING_SET_BYTES` and at most :data:`MAX_WORKING_SET_BYTES`: cycling through them in
order, each call finds its weight evicted, as between a model's layers."""
MAX_COPIES = 64
REPEATS = 3
SLOW_ROUND_S = 0.05
"""A layer whose round (one call per copy) took longer than this at the previous row count cycles
through fewer copies (a round of about this long) and is timed once, not :data:`REPEATS` times."""
BUDGET_S = 8.0
REACH = 4
"""The curve goes on to this many times the run's largest rows (another batch or prompt is asked of
the run: a batch of 4 at the same prompt has 4x the prefill's rows)."""

PROFILER_DTYPES = {"float32": "float", "float64": "double", "bfloat16": "c10::BFloat16", "float16": "c10::Half"}
"""torch dtypes -> the names torch.profiler records in ``op_input_types``."""


def row_counts(max_m: int, reach: int = 1) -> list[int]:
    """The row counts measured for a run whose largest GEMM had ``max_m`` rows: the ladder up to
    ``reach`` x that, with the run's own largest and the end itself."""
    max_m = max(1, int(max_m))
    top = max_m * max(1, int(reach))
    return sorted({m for m in LADDER if m < top} | {max_m, top})


def last_cache_bytes(device: Any) -> int | None:
    """The last-level cache of ``device`` (a torch device): the GPU's L2, the CPU's L3 (else L2); None
    where the system does not say."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        size = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
        return int(size) or None
    best: tuple[int, int] | None = None  # (level, bytes) of the highest level the kernel lists
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text().strip())
            text = (index / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit() and (best is None or level > best[0]):
            best = (level, int(digits) * scale)
    if best:
        return best[1]
    for name in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
        try:
            size = os.sysconf(name)
        except (ValueError, OSError, AttributeError):
            continue
        if size and size > 0:
            return int(size)
    return None


def working_set_bytes_of(device: Any) -> int:
    """The bytes a layer's copies hold on ``device`` (see :data:`LAST_CACHE_MULTIPLE`)."""
    cache = last_cache_bytes(device)
    want = LAST_CACHE_MULTIPLE * cache if cache else MAX_WORKING_SET_BYTES
    return max(MIN_WORKING_SET_BYTES, min(MAX_WORKING_SET_BYTES, want))


def distinct_layers(modules: Iterable[Any]) -> list[Any]:
    """One module per distinct (out, in, bias, dtype, device, class) among ``modules`` that have a 2-D weight."""
    seen: dict[tuple[Any, ...], Any] = {}
    for m in modules:
        w = getattr(m, "weight", None)
        if w is None or getattr(w, "dim", lambda: 0)() != 2:
            continue
        key = (tuple(w.shape), getattr(m, "bias", None) is not None, w.dtype, w.device, type(m))
        seen.setdefault(key, m)
    return list(seen.values())


def measure_gemm_curve(layers: Iterable[Any], max_m: int, *, reach: int = REACH, budget_s: float = BUDGET_S,
                       repeats: int = REPEATS, working_set_bytes: int | None = None,
                       clock: Callable[[], float] = time.perf_counter) -> tuple[pd.DataFrame, bool]:
    """Time each layer (a module ``y = f(x)`` with a 2-D ``weight`` [out, in]) at each of
    :func:`row_counts` (``max_m``, ``reach``); returns the ``gemm_curve`` rows and whether the budget cut
    the ladder short."""
    import torch

    layers = distinct_layers(layers)
    rows: list[dict[str, Any]] = []
    if not layers:
        return empty_table("gemm_curve"), False
    copies: list[list[Any]] = []
    for layer in layers:
        w = layer.weight
        ws = working_set_bytes if working_set_bytes is not None else working_set_bytes_of(w.device)
        c = max(1, min(MAX_COPIES, ws // max(1, w.numel() * w.element_size())))
        copies.append([layer] + [copy.deepcopy(layer) for _ in range(c - 1)])
    cuda = any(layer.weight.device.type == "cuda" for layer in layers)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    start = clock()
    cut = False
    last = [0.0] * len(layers)  # each layer's time per call at the previous row count
    with torch.inference_mode():
        for m in row_counts(max_m, reach):
            for i, (layer, group) in enumerate(zip(layers, copies)):
                if clock() - start > budget_s:
                    cut = True
                    break
                w = layer.weight
                x = torch.randn(m, w.shape[1], dtype=w.dtype, device=w.device)
                rounds = repeats
                if last[i] * len(group) > SLOW_ROUND_S:
                    # a long call (a large M: compute-bound, where the cache matters little): fewer copies,
                    # one timed round, so the large rows do not spend the budget of the small ones
                    group = group[:max(1, min(len(group), int(SLOW_ROUND_S / last[i]) + 1))]
                    rounds = 1
                best = float("inf")
                for r in range(rounds + 1):
                    sync()
                    t0 = clock()
                    for mod in group:
                        mod(x)
                    sync()
                    if r:  # round 0 warms up
                        best = min(best, (clock() - t0) / len(group))
                last[i] = best
                rows.append({"n": int(w.shape[0]), "k": int(w.shape[1]),
                             "dtype": PROFILER_DTYPES.get(str(w.dtype).removeprefix("torch."), str(w.dtype)),
                             "m": m, "time_ns": best * 1e9, "copies": len(group)})
            if cut:
                break
    return pd.DataFrame(rows), cut
