"""Why a kernel group runs far below its roof when no counter measured its limiter: the causes the trace
itself shows (docs/findings.md, "Below the roof without counters").

``memory-below-roof`` and ``compute-below-roof`` list their groups; where Nsight Compute or rocprof-compute
measured a group's limiter, that limiter's advice applies (``kernels.LIMITER_ADVICE``). For the others this
module reads what a trace does hold, per group, and names a cause only where its evidence is present:

- ``grid``: the launch's blocks (Kineto's ``grid`` column) below the device's SM/CU count: under one wave,
  some SMs idle for the whole kernel.
- ``tail``: (NVIDIA) a grid of more than one wave whose last wave leaves SMs without a block for a quarter or more
  of the launch's SM time (wave quantization), the blocks an SM holds counted from the launch's block size, registers
  and shared memory (:func:`resident_blocks`).
- ``small``: the bytes of one launch stream at the DRAM roof in less than its family's kernel-time floor
  (:func:`kernel_floor`), and that floor is at least half of what a launch loses to the roof
  (:data:`FLOOR_SHARE`): fixed per-kernel costs, not DRAM bandwidth, set its time.
- ``weights``: a memory-bound GEMM of few rows (decode-sized M) whose bytes are its weights. In a fused op whose
  kernels share its bytes by time, a kernel is not the weights' reader where another GEMM kernel of the op names
  the packed weight format and its own name does not (:func:`packed_readers`): it is said so, with no weights advice.
- ``kv``: a memory-bound attention kernel of a decode phase: its bytes are the KV cache.
- ``fuse``: an elementwise/norm/copy/reduction group launched back to back with kernels of the same kinds:
  each reads and writes its tensor again.
- ``fp32``: an FP32 elementwise/norm/copy group: BF16 halves its bytes.
- ``shape``: a compute-bound GEMM with a tiny inner dimension or sizes off multiples of 8.
- ``occupancy``: Kineto's estimated occupancy under a quarter with the registers and shared memory that cap
  it (not for GEMM/attention, whose warp-specialised kernels run at low occupancy by design).

A group none of these explain is reported as unexplained, and the advice names the measurement that would tell.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd

from perfscope.device_models import (
    DECODE_INTENSITY,
    Curve,
    device_models,
    kernel_family,
    spec_identity,
)
from perfscope.device_models import gemm_dims as shape_dims
from perfscope.format import counted, duration, nbytes
from perfscope.memo import memo
from perfscope.schema import column_codes, map_distinct
from perfscope.shapes import parse_shapes, tensor_shapes
from perfscope.vocab import is_amd

from ..costs.operators import category_of
from ..costs.quantized import PRECISION_WIDTH, kernel_precision, narrowest_operand
from ..summaries.kernels import group_codes
from ._base import collect_advice, from_ncu, is_cpu_report
from .matmul_units import TENSOR_CORE_FP32_NAME, faster_matrix, fp32_matmuls, no_faster_matrix_text

if TYPE_CHECKING:
    from collections.abc import Sequence

    from perfscope.report import Report

SMALL_STREAM_NS = 1_000.0
"""The default kernel-time floor, where no device model measured one for the family on the device or a device of its
vendor (:func:`kernel_floor`): a GPU kernel spends a few µs ramping up its blocks and draining the last wave whatever
its size, so a launch whose bytes stream in under 1 µs at the DRAM roof is those fixed costs, not its bytes."""
FLOOR_SHARE = 0.5
"""``small`` explains a group only where the floor is at least half of what one launch loses to the roof (its mean
time less its bytes' time at the DRAM roof): a kernel takes about the floor plus its bytes' time, so a launch far
longer than that loses most of its time to something else (a 6.3 µs launch whose bytes need 1.2 µs is not explained
by a 2.6 µs floor), and the fixed cost is then not named as its cause."""
L2_RESIDENT_SHARE = 0.25
"""Bytes per launch under a quarter of the L2 can stay in it between launches (the working set is
cache-resident: its reads need not come from DRAM at all)."""
MiB = 2**20
L2_BYTES = {
    "V100": 6 * MiB,  # NVIDIA Tesla V100 GPU Architecture whitepaper: 6144 KB L2
    "A100": 40 * MiB,  # NVIDIA A100 Tensor Core GPU Architecture whitepaper: 40 MB L2
    "H100": 50 * MiB,  # NVIDIA H100 Tensor Core GPU Architecture whitepaper: 50 MB L2 (H100 SXM5); an H100 nsys
    # fixture's own cudaDeviceProp.l2CacheSize says the same (tests/fixtures/nsys/nvfuser_h100_matmul.sqlite: 52428800)
    "H200": 60 * MiB,  # the device's own CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, recorded by Nsight Compute on an H200
    # (tests/fixtures/h200/h200_engine_gemm_attn_full.ncu-rep: 62914560 B): the full GH100's 60 MB (Chips and Cheese,
    # "Nvidia's H100: Funny L2", 2023); NVIDIA's H200 datasheet gives no L2 size, and pages that copy H100's 50 MB are
    # not the device
    "A10G": 6 * MiB,  # NVIDIA Ampere GA102 GPU Architecture whitepaper: 6144 KB L2; the A10G's own
    "A10": 6 * MiB,  # device attribute in tests/fixtures/ncu/esmm_a10g_roofline_set.ncu-rep: 6291456 B
    "T4": 4 * MiB,  # the T4's own cudaDeviceProp.l2CacheSize (tests/fixtures/nsys/aws_t4_softmax.sqlite: 4194304 B);
    # Jia et al., "Dissecting the NVidia Turing T4 GPU via Microbenchmarking" (arXiv:1903.07486): 4 MiB
    # AMD: the L2 one die's CUs share ("Shared by all compute units on the same GCD", AMD's ROCm "AMD GPU
    # specifications" table, rocm.docs.amd.com/en/latest/reference/gpu-specs.html), which is what hipDeviceProp and
    # rocprof-compute report (tests/fixtures/rocprof/aiter_fmla_MI308X_rocprof_compute: 4096 KiB, an MI300-series XCD)
    "MI300X": 4 * MiB,  # that table: "32 (4 per XCD)"; the 256 MiB Infinity Cache behind it is not counted
    "MI250X": 8 * MiB,  # that table: "16 (8 per GCD)"; each GCD is a device of its own to HIP
    "MI250": 8 * MiB,  # that table: "16 (8 per GCD)"
    "MI210": 8 * MiB,  # that table: 8 (one GCD)
    "R9700": 8 * MiB,  # that table, Radeon AI PRO R9700 (RDNA4): L2 8 MiB, Infinity Cache 64 MiB not counted
}
"""L2 size by datasheet family where the device properties do not give it (``l2_cache_bytes``), the source of each in
its comment. Left out where the sources disagree or none was found: B200 (96 or 126 MB), MI308X (not in AMD's table;
its rocprof-compute reports carry their own 4 MiB per XCD), the RTX 4080 Laptop GPU (no vendor figure found)."""
UNDERFILL_WAVES = 0.75
"""A grid that gives at most three quarters of the SMs a block leaves a quarter or more idle for the whole launch
(a grid just under one wave costs its few idle SMs only: not a cause of a group far below its roof)."""
SM_LIMITS = {
    # compute capability: (resident warps, resident blocks, shared memory per SM in KiB), registers 64K on every one
    "7.0": (64, 32, 96), "7.2": (64, 32, 96), "7.5": (32, 16, 64),
    "8.0": (64, 32, 164), "8.6": (48, 16, 100), "8.7": (48, 16, 164), "8.9": (48, 24, 100),
    "9.0": (64, 32, 228), "10.0": (64, 32, 228), "12.0": (48, 32, 128),
}
"""Per compute capability, what one SM holds at once: the CUDA C++ Programming Guide's "Technical Specifications
per Compute Capability" (7.0-9.0) and the Blackwell Tuning Guide, section 1.4.1.1 Occupancy (10.0: 64 warps, 32
blocks, 228 KB; 12.0: 48 warps, 32 blocks, 128 KB). A capability not here is not guessed."""
REGISTERS_PER_SM = 65536
REGISTER_UNIT = 256
SUB_PARTITIONS = 4
"""Registers are allocated per warp in units of 256, within each of an SM's 4 sub-partitions: the warps that fit
are 4 x (65536 / 4 / the registers of one warp), as CUDA's occupancy calculator (``cuda_occupancy.h``,
``cudaOccMaxBlocksPerSMRegsLimit``) counts them."""
SHARED_UNIT = 128
SHARED_RESERVED = 1024
"""Shared memory is allocated per block in units of 128 bytes, plus 1 KB the runtime reserves per block (compute
capability 8.0 and later)."""
TAIL_IDLE = 0.25
"""A launch of more than one wave whose last wave leaves SMs without a block for a quarter or more of the launch's
SM time (wave quantization, each wave taken to last as long): the same quarter :data:`UNDERFILL_WAVES` allows a grid
of under one wave. Only SMs that get no block count: an SM holding fewer blocks than it could is not idle."""
ITEMSIZE = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "fp4": 0.5, "int4": 0.5}
WEIGHT_SHARE = 0.5
"""A GEMM whose weights are at least half its bytes streams its weights."""
FUSIBLE = ("elementwise", "norm", "memory", "reduction")
"""Kernel categories that read and write whole tensors with little work per byte: fused chains read each once."""
FUSE_SHARE = 0.5
"""A group is launched back to back with fusible kernels when at least half of its launches have one beside
them on their stream."""
TINY_INNER = 64
"""A GEMM inner dimension under 64 gives each output few multiply-adds: the tensor-core tiles are mostly
loads and epilogue."""
ALIGN = 8
"""GEMM sizes off multiples of 8 elements miss the 16-byte aligned tensor-core paths (cuBLAS / hipBLASLt)."""
OCCUPANCY_LOW_PCT = 25.0
"""As in :mod:`.occupancy`: under a quarter of the warps per SM leaves too few to hide memory latency."""
MATMUL = ("gemm", "attention")
GEMM_OPS = ("aten::mm", "aten::matmul", "aten::addmm", "aten::linear", "aten::bmm", "aten::baddbmm")
"""Operators whose input shapes give M, K and N (their layouts: :func:`perfscope.device_models.gemm_dims`)."""
BATCHED = ("aten::bmm", "aten::baddbmm")
"""Batched matmuls: their second operand is another activation (attention's K or V), not weights."""


@dataclass
class Causes:
    """What the trace shows about one group: ``clauses`` (what the label says), ``advice`` per cause code (what
    the recommendation says), ``attrs`` (the numbers behind them, units in the keys)."""

    clauses: list[str] = field(default_factory=list)
    advice: dict[str, str] = field(default_factory=dict)
    attrs: dict[str, float | int | str | None] = field(default_factory=dict)


def _blocks(grid: object) -> float:
    """The blocks of a launch grid ``(x, y, z)``; NaN when not a grid."""
    if not isinstance(grid, str):
        return math.nan
    try:
        dims = [int(v) for v in grid.strip("()[] ").split(",") if v.strip()]
    except ValueError:
        return math.nan
    return float(np.prod(dims)) if dims and all(d > 0 for d in dims) else math.nan


def gemm_dims(op: object, shapes: object) -> tuple[int | None, int | None, int | None]:
    """(M, K, N) of a GEMM operator from its input shapes (``op_shapes`` text), read by the one GEMM shape
    reader (:func:`perfscope.device_models.gemm_dims`: M the rows of one matrix, a bmm's batch apart) where the
    operator's layout is known (:data:`GEMM_OPS`); for another operator of a GEMM kernel (a fused MoE), M only,
    from its first input's leading dimensions. None where the shapes do not say."""
    s = tensor_shapes(shapes)
    if not s:
        return None, None, None
    if not (isinstance(op, str) and op in GEMM_OPS):
        a = s[0]
        return (int(np.prod(a[:-1])) if len(a) >= 2 else None), None, None
    dims = shape_dims(op, s)
    if dims is None:
        return None, None, None
    _, m, n, k = dims
    return m, k, n


def weight_share(m: int, k: int | None, n: int | None, shapes: Sequence[Sequence[int]], per_launch: float,
                 precision: object) -> float:
    """The share of a memory-bound GEMM's bytes that are its weights: ``K*N / (K*N + M*K + M*N)`` where K and N are
    known; else (an operator such as a fused MoE) what its activation (the first input, read and its like written)
    leaves of the bytes per launch. NaN when neither is known."""
    if k and n:
        return k * n / (k * n + m * k + m * n)
    size = ITEMSIZE.get(str(precision), 2)
    if not shapes or not shapes[0] or not per_launch > 0:
        return math.nan
    act = 2.0 * float(np.prod(shapes[0])) * size
    return max(0.0, 1.0 - act / per_launch)


def _short(name: object, most: int = 48) -> str:
    """A group's name as the advice names it: cut to ``most`` characters, with an ellipsis where cut."""
    text = str(name)
    return text if len(text) <= most else text[:most - 1] + "…"


def _median(values: object) -> float:
    """The median of the known values; NaN when none is known (no warning)."""
    v = pd.to_numeric(pd.Series(values), errors="coerce").dropna() if values is not None else pd.Series(dtype=float)
    return float(v.median()) if len(v) else math.nan


def _mode(values: pd.Series) -> object:
    v = values.dropna()
    return v.mode().iloc[0] if len(v) else None


@dataclass(frozen=True)
class Floor:
    """The kernel-time floor ``small`` measures a launch's bytes against: the shortest kernel of the family
    (``family``) measured on ``device`` (``kind``: ``trace``, a profiler trace; ``table``, a published benchmark
    table), or the documented default (``kind`` ``default``, ``device`` ""); ``stand_in``: why the device is not the
    report's own ("" when it is)."""

    ns: float
    device: str
    family: str
    kind: str
    stand_in: str = ""

    def source(self) -> str:
        """Which floor it is and where it came from, as the item's attrs say it."""
        if self.kind == "default":
            return f"default {SMALL_STREAM_NS:.0f} ns ({self.stand_in})"
        if self.kind == "this trace":
            return f"the shortest {self.family} kernel of this trace ({self.stand_in})"
        return f"{self.device} {self.family}, shortest in a {self.kind}" + (f"; {self.stand_in}" if self.stand_in else "")

    def words(self) -> str:
        """The floor as the label says it."""
        if self.kind == "default":
            return f"the {duration(self.ns)} default floor ({self.stand_in})"
        if self.kind == "this trace":
            return f"the shortest {self.family} kernel of this trace, {duration(self.ns)} ({self.stand_in})"
        return (f"the shortest {self.family} kernel measured on {self.device}, {duration(self.ns)}"
                + (f" ({self.stand_in})" if self.stand_in else ""))


def _measured_floor(curve: Curve) -> tuple[float, str]:
    """A curve's measured floor: the shortest kernel in a profiler trace, else in a published table; NaN when the
    device measured neither (its curve's floor then is the family's over every GPU, not its own)."""
    for kind in ("trace", "table"):
        v = float(getattr(curve, f"{kind}_floor_ns"))
        if np.isfinite(v) and v > 0:
            return v, kind
    return math.nan, ""


@functools.lru_cache(maxsize=256)
def _floor(identity: tuple[str, str, str] | None, family: str) -> Floor:
    models = device_models()
    if identity is None:
        return Floor(SMALL_STREAM_NS, "", family, "default", "no device model: the device has no datasheet row")
    tried: set[str] = set()
    while True:  # the device's own model, then the nearest measured device of its vendor (DeviceModels.resolve)
        pool = replace(models, devices={k: m for k, m in models.devices.items() if k not in tried})
        got = pool.resolve(identity)
        if got is None:
            return Floor(SMALL_STREAM_NS, "", family, "default",
                         f"no {identity[1]} device measured a {family} kernel")
        tried.add(got.model.device)
        curve, fam = got.model.curve(family)
        ns, kind = _measured_floor(curve) if curve is not None else (math.nan, "")
        if np.isfinite(ns):
            own = got.model.device == identity[0]
            why = "" if own else (f"{identity[0]} measured no {family} kernel" if identity[0] in models.devices
                                  else f"{identity[0]} has no device model") + f": {got.model.device}'s stands in"
            return Floor(ns, got.model.device, fam, kind, why)


def _trace_floors(k: pd.DataFrame) -> dict[str, float]:
    """Per kernel family (:func:`perfscope.device_models.kernel_family`), the shortest kernel of the table: the family
    decided once per distinct (category, precision, phase, low intensity) from the columns' codes (no text pass)."""
    def build() -> dict[str, float]:
        if not len(k) or "category" not in k or "duration_ns" not in k:
            return {}
        parts = []
        for c in ("category", "precision", "phase"):
            codes, values = column_codes(k, c) if c in k else (np.full(len(k), -1, np.int64), np.zeros(0, object))
            parts.append((codes.astype(np.int64) + 1, np.concatenate([[None], values]).astype(object)))

        def num(c: str) -> np.ndarray:
            if c not in k:
                return np.full(len(k), np.nan)
            return pd.to_numeric(k[c], errors="coerce").to_numpy("float64", na_value=np.nan)
        f, b = num("flops"), num("dram_bytes")
        with np.errstate(divide="ignore", invalid="ignore"):
            low = (np.where(b > 0, f / b, np.inf) < DECODE_INTENSITY).astype(np.int64)
        (cc, cv), (pc, pv), (hc, hv) = parts
        key = ((cc * len(pv) + pc) * len(hv) + hc) * 2 + low
        inverse, uniq = pd.factorize(key)
        rest, lo = np.divmod(uniq, 2)
        rest, ph = np.divmod(rest, len(hv))
        ca, pr = np.divmod(rest, len(pv))
        fam = kernel_family(cast("Sequence[Any]", cv[ca]), cast("Sequence[Any]", pv[pr]),
                            np.where(lo == 1, 0.0, np.inf), np.ones(len(uniq)),
                            cast("Sequence[Any]", hv[ph]) if "phase" in k else None)
        dur = pd.to_numeric(k["duration_ns"], errors="coerce").to_numpy("float64", na_value=np.nan)
        shortest = np.full(len(uniq), np.inf)
        ok = dur > 0
        np.minimum.at(shortest, inverse[ok], dur[ok])  # per distinct key, then per family over the few keys
        out: dict[str, float] = {}
        for x, v in zip(fam.tolist(), shortest.tolist()):
            if np.isfinite(v):
                out[str(x)] = min(v, out.get(str(x), math.inf))
        return out
    return memo(k, "rules:trace_floors", build)


def kernel_floor(report: Report, family: str, k: pd.DataFrame | None = None) -> Floor:
    """The shortest kernel of ``family`` (:func:`perfscope.device_models.kernel_family`) measured on the report's
    device (its device model, :mod:`perfscope.device_models`), else on the nearest measured device of its vendor
    (the one :meth:`~perfscope.device_models.DeviceModels.resolve` picks, then the next), else the documented
    default :data:`SMALL_STREAM_NS`; where the kernel table ``k`` holds a shorter kernel of the family, that one (a
    floor no kernel the device ran can go under)."""
    dev = report.device
    floor = _floor(spec_identity(dev) if dev is not None else None, family)
    own = _trace_floors(k).get(family, math.nan) if k is not None else math.nan
    if np.isfinite(own) and own < floor.ns:
        was = "the default" if floor.kind == "default" else f"{floor.device}'s"
        return Floor(own, "", family, "this trace", f"under {was} {duration(floor.ns)}"
                     + (f", the stand-in: {floor.stand_in.split(':')[0]}" if floor.stand_in else ""))
    return floor


def l2_bytes(report: Report) -> float:
    """The device's L2 size: its properties' ``l2_cache_bytes``, else :data:`L2_BYTES` of the family its datasheet row
    or its name names as a word (``NVIDIA A100-SXM4-80GB``: A100, never A10); NaN."""
    dev = report.device
    if dev is None:
        return math.nan
    v = dev.properties.get("l2_cache_bytes")
    if isinstance(v, (int, float)) and v > 0:
        return float(v)
    names = (str(dev.properties.get("datasheet") or ""), str(dev.name or ""))
    words = {w for n in names for w in re.split(r"[\s\-_/(),]+", n.upper()) if w}
    return next((float(b) for fam, b in L2_BYTES.items() if fam in words), math.nan)


SCOPES = ("capture_module", "range")
"""Where the kernel table records the scope each kernel was launched in, in order of preference: the nn.Module
call path of a CUDA-graph replay joined to its capture, else the innermost record_function / NVTX path."""
SCOPE_WORDS = {"capture_module": "module calls", "range": "record_function / NVTX ranges"}
"""How a label names the scopes that put two kernels in one op chain."""
STEP_SCOPE_SHARE = 0.5
"""A scope that holds more than half of the table's kernels is a whole step or model call (vLLM's
``execute_context_...`` range, a compiled graph's module), not an op chain: kernels in it are stream neighbours
only."""


@dataclass(frozen=True)
class Scopes:
    """Each row's launch scope (:data:`SCOPES`) as codes over one dictionary of the scopes and their parents
    (``code``, -1: none recorded, or a scope of a whole step), its parent scope's code (``parent``, -1 at the top),
    and the column they come from ("" when the table records none)."""

    code: np.ndarray
    parent: np.ndarray
    column: str


def _scopes(k: pd.DataFrame) -> Scopes:
    """:class:`Scopes` of the kernel table: from its codes of the scope column (the first of :data:`SCOPES` with a
    value), each distinct path's parent made once; a scope of more than :data:`STEP_SCOPE_SHARE` of the kernels
    counts as none."""
    def build() -> Scopes:
        col = next((c for c in SCOPES if c in k and k[c].notna().any()), "")
        if not col:
            none = np.full(len(k), -1, dtype=np.int64)
            return Scopes(none, none, "")
        codes, values = column_codes(k, col)
        counts = np.bincount(codes[codes >= 0], minlength=len(values))
        paths = [str(v) for v in values]
        parents = [v.rsplit("/", 1)[0] if "/" in v else "" for v in paths]
        joint, _ = pd.factorize(pd.Series(paths + parents, dtype=object))
        own = np.where(counts <= STEP_SCOPE_SHARE * len(k), joint[:len(paths)], -1)
        up = np.where(np.array([bool(p) for p in parents], dtype=bool), joint[len(paths):], -1)
        lut = np.append(own, -1).astype(np.int64), np.append(up, -1).astype(np.int64)  # code -1: the last
        at = np.where(codes >= 0, codes, len(values))
        return Scopes(lut[0][at], lut[1][at], col)
    return memo(k, "rules:scopes", build)


def _one_chain(sc: Scopes, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whether rows ``a`` and ``b`` were launched in one op chain: the same scope, one inside the other, or two
    calls of one parent (``layer.0/attn/q_norm`` beside ``layer.0/attn/rope``); False where either has no scope."""
    sa, sb, pa, pb = sc.code[a], sc.code[b], sc.parent[a], sc.parent[b]
    return (sa >= 0) & (sb >= 0) & ((sa == sb) | (pa == sb) | (sa == pb) | ((pa >= 0) & (pa == pb)))


@dataclass(frozen=True)
class Neighbours:
    """The fusible kernel groups launched beside a group's launches (most frequent first) and the share of its
    launches that have one; ``chain``: whether the trace's scopes put at least :data:`FUSE_SHARE` of the launches in
    one op chain with such a neighbour (``column``: the scope column that says so), else they are stream
    neighbours (the scopes say nothing: none recorded, or one around a whole step)."""

    names: list[str]
    share: float
    chain: bool
    column: str


def _neighbours(k: pd.DataFrame, rows: np.ndarray) -> Neighbours:
    """The fusible kernel groups launched right before or after the ``rows`` on their stream (most frequent first,
    ties in order of first sight: row by row, the one before, then the one after), and the share of the rows that
    have one. Where the trace records both kernels' scopes (:func:`_scopes`) they must be one op chain
    (:func:`_one_chain`): a neighbour the scopes put in another module or range is not counted."""
    if "stream" not in k or "category" not in k or not len(rows):
        return Neighbours([], 0.0, False, "")
    order, lane, pos = _stream_order(k)
    codes, names = group_codes(k)
    fusible = memo(k, "rules:fusible", lambda: k["category"].isin(FUSIBLE).to_numpy(bool))
    sc = _scopes(k)
    p = pos[rows]
    near = np.empty((len(rows), 2), dtype=np.int64)  # per row: the row before and after it on its stream
    hit = np.empty((len(rows), 2), dtype=bool)
    chain = np.empty((len(rows), 2), dtype=bool)  # a hit whose scopes put both in one op chain
    for j, q in enumerate((p - 1, p + 1)):
        inside = (q >= 0) & (q < len(order))
        o = order[np.clip(q, 0, len(order) - 1)]
        near[:, j] = codes[o]
        hit[:, j] = inside & (lane[o] == lane[rows]) & fusible[o] & (codes[o] >= 0) & (codes[o] != codes[rows])
        known = (sc.code[rows] >= 0) & (sc.code[o] >= 0)
        one = _one_chain(sc, rows, o)
        hit[:, j] &= ~known | one
        chain[:, j] = hit[:, j] & known & one
    found, which = pd.factorize(near[hit])  # row-major: row by row, before then after
    counts = np.bincount(found, minlength=len(which))
    ranked = np.argsort(-counts, kind="stable")
    by_chain = float(chain.any(axis=1).sum()) / len(rows) >= FUSE_SHARE
    return Neighbours([str(names[which[i]]) for i in ranked], float(hit.any(axis=1).sum()) / len(rows), by_chain,
                      sc.column if by_chain else "")


def _lane_codes(k: pd.DataFrame, column: str) -> np.ndarray:
    """The column's codes (:func:`perfscope.schema.column_codes`, no text pass), missing as a code of its own (0)."""
    if column not in k:
        return np.zeros(len(k), dtype=np.int64)
    return column_codes(k, column)[0].astype(np.int64) + 1


def _stream_order(k: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row positions of ``k`` by device, stream and start (kernels one after another on a stream), each row's
    (device, stream) lane code (a missing device or stream is a lane of its own), and each row's place in that
    order."""
    def build() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        dev, stream = _lane_codes(k, "device"), _lane_codes(k, "stream")
        start = k["start_ns"].to_numpy("float64", na_value=np.nan)
        lane = dev * (int(stream.max(initial=0)) + 1) + stream
        order = np.lexsort((start, stream, dev))
        pos = np.empty(len(order), dtype=np.int64)
        pos[order] = np.arange(len(order))
        return order, lane, pos
    return memo(k, "rules:stream_order", build)


def resident_blocks(capability: object, threads: float, registers: float, shared: float) -> int | None:
    """Blocks of ``threads`` threads, ``registers`` per thread and ``shared`` bytes of shared memory that one SM of
    ``capability`` (``"9.0"``) holds at once: the least of the warp, block, register and shared-memory limits
    (:data:`SM_LIMITS`, the occupancy calculator's allocation rules); None where the capability or an input is
    unknown, or one block does not fit."""
    limits = SM_LIMITS.get(str(capability))
    if limits is None or not all(np.isfinite(v) for v in (threads, registers, shared)) or threads <= 0:
        return None
    warps_max, blocks_max, shared_kib = limits
    warps = math.ceil(threads / 32)
    by_warps = warps_max // warps
    per_warp = math.ceil(max(registers, 1) * 32 / REGISTER_UNIT) * REGISTER_UNIT
    if per_warp * math.ceil(warps / SUB_PARTITIONS) * SUB_PARTITIONS > REGISTERS_PER_SM:
        return None  # the block does not fit the register file (the hardware's per-block check)
    by_registers = (REGISTERS_PER_SM // SUB_PARTITIONS // per_warp) * SUB_PARTITIONS // warps
    per_block = math.ceil(max(shared, 0) / SHARED_UNIT) * SHARED_UNIT
    per_block += SHARED_RESERVED if float(str(capability)) >= 8.0 else 0
    by_shared = (shared_kib * 1024) // per_block if per_block > 0 else blocks_max
    n = int(min(blocks_max, by_warps, by_registers, by_shared))
    return n if n > 0 else None


def _tail(dev: object, g: pd.DataFrame, blocks: float, sms: int) -> tuple[int, float, int, float] | None:
    """(resident blocks per SM, waves, the blocks of the last wave, the share of the launch's SM time that SMs with
    no block in it leave idle) of a group's median launch, where that share is :data:`TAIL_IDLE` or more over more
    than one wave; None where it is not, or where the block, registers, shared memory or the device's capability is
    not known. Each wave is taken to last as long, the last one's blocks one per SM."""
    cap = getattr(dev, "properties", {}).get("compute_capability")
    if cap is None or not {"block", "registers_per_thread", "shared_mem_bytes"} <= set(g.columns):
        return None
    threads = _median(map_distinct(g["block"], _blocks))
    regs = _median(pd.to_numeric(g["registers_per_thread"], errors="coerce"))
    smem = _median(pd.to_numeric(g["shared_mem_bytes"], errors="coerce"))
    resident = resident_blocks(cap, threads, regs, smem)
    if resident is None:
        return None
    slots = sms * resident
    waves = blocks / slots
    last = int(blocks - math.floor(waves) * slots) if waves > 1 else 0
    if last <= 0 or last >= sms:
        return None
    idle = (sms - last) / sms / math.ceil(waves)
    return (resident, waves, last, idle) if idle >= TAIL_IDLE else None


def group_causes(report: Report, k: pd.DataFrame, groups: pd.DataFrame, bound: str) -> list[Causes]:
    """Per row of ``groups`` (``_group_totals`` of ``k``: group, count, time_ns, dram_bytes, precision, first),
    the causes its trace evidence shows (empty :class:`Causes` when none); a CPU report's only
    :data:`CPU_CAUSES`."""
    gpu = not is_cpu_report(report)
    dev = report.device
    sms = dev.properties.get("sm_count") if dev is not None else None
    sms = int(sms) if isinstance(sms, (int, float)) and sms > 0 else None
    unit = "CU" if is_amd(dev) else "SM"
    bw = dev.peak_bandwidth("dram") if dev is not None else None
    l2 = l2_bytes(report)
    codes, _ = group_codes(k)
    out = []
    for row in groups.to_dict("records"):
        first = int(row["first"])
        rows = np.flatnonzero(codes == codes[first]) if first >= 0 else np.zeros(0, dtype=np.int64)
        g = k.iloc[rows]
        c = Causes()
        name = _short(row["group"])
        count = max(int(row["count"]), 1)
        cat = _mode(g["category"]) if "category" in g else None
        c.attrs["category"] = str(cat) if isinstance(cat, str) else None
        # the grid against the SMs
        if gpu and sms and "grid" in g:
            blocks = _median(map_distinct(g["grid"], _blocks))
            if np.isfinite(blocks):
                c.attrs.update(grid_blocks=float(blocks), sm_count=sms)
                if blocks <= UNDERFILL_WAVES * sms:
                    c.clauses.append(f"grid of {counted(blocks, 'block')} on {sms} {unit}s "
                                     f"({blocks / sms:.2g} wave)")
                    c.advice["grid"] = name
                elif not is_amd(dev):
                    tail = _tail(dev, g, blocks, sms)
                    if tail is not None:
                        resident, waves, last, idle = tail
                        c.attrs.update(resident_blocks_per_sm=resident, waves=waves, last_wave_blocks=last,
                                       tail_idle_share=idle)
                        c.clauses.append(f"{blocks:.0f} blocks on {sms} SMs x {resident} resident: {waves:.2f} waves, "
                                         f"the last of {counted(last, 'block')}, so {sms - last} SMs "
                                         f"have none through it ({idle:.0%} of the launch's SM time)")
                        c.advice["tail"] = name
        # bytes per launch against the DRAM roof and the L2
        per_launch = float(row["dram_bytes"]) / count
        if gpu and bound == "memory" and bw and per_launch > 0:
            stream_ns = per_launch / bw * 1e9
            family = str(kernel_family([cat], [row.get("precision")], np.array([float(row.get("flops", np.nan))]),
                                       np.array([float(row["dram_bytes"])]),
                                       [_mode(g["phase"])] if "phase" in g else None)[0])
            floor = kernel_floor(report, family, k)
            c.attrs.update(bytes_per_launch=per_launch, stream_at_roof_ns=stream_ns,
                           mean_launch_ns=float(row["time_ns"]) / count, floor_ns=floor.ns,
                           floor_source=floor.source())
            if np.isfinite(l2):
                c.attrs["l2_bytes"] = l2
            mean_ns = float(row["time_ns"]) / count
            lost_ns = mean_ns - stream_ns  # what one launch loses to the roof
            share = floor.ns / lost_ns if lost_ns > 0 else math.nan
            c.attrs["floor_share"] = share
            if stream_ns < floor.ns and np.isfinite(share) and share >= FLOOR_SHARE:
                fits = (f" ({per_launch / l2:.1%} of the {nbytes(l2)} L2)" if np.isfinite(l2)
                        and per_launch < L2_RESIDENT_SHARE * l2 else "")
                c.clauses.append(f"{nbytes(per_launch)} per launch{fits}: {duration(stream_ns)} at the DRAM roof of "
                                 f"a {duration(mean_ns)} launch, under {floor.words()}, "
                                 f"{min(share, 1.0):.0%} of the {duration(lost_ns)} a launch loses to the roof")
                c.advice["small"] = name
        # the category and the shapes
        op, shapes = (_mode(g["op"]) if "op" in g else None), (_mode(g["op_shapes"]) if "op_shapes" in g else None)
        prec = row.get("precision")
        if cat == "gemm":
            m, kk, n = gemm_dims(op, shapes)
            c.attrs.update(gemm_m=m, gemm_k=kk, gemm_n=n)
            if bound == "memory" and m is not None and op not in BATCHED:  # a bmm's operands are both activations
                share = weight_share(m, kk, n, tensor_shapes(shapes), per_launch, prec)
                fmt = weight_format(g) if np.isfinite(share) and share >= WEIGHT_SHARE else None
                readers = packed_readers(k, g, fmt) if fmt is not None else None
                if readers is not None:
                    bits, names = readers
                    c.clauses.append(f"{counted(m, 'row')} ({op}): its bytes are a time share of the op's; "
                                     f"the op's {bits}-bit weights are read by {_shown(names)} (their names state the "
                                     f"format, this kernel's does not)")
                    c.attrs.update(weights_read_by="; ".join(names), weight_precision=None)
                elif np.isfinite(share) and share >= WEIGHT_SHARE:
                    stored = f" at {weight_bits(fmt[0])} bits ({fmt[1]})" if fmt else ""
                    c.clauses.append(f"{counted(m, 'row')} ({op}): the weights are {share:.0%} of its "
                                     f"bytes{stored}")
                    c.attrs.update(weight_share=share, weight_precision=fmt[0] if fmt else None)
                    c.advice["weights"] = name
            if bound == "compute" and kk is not None and n is not None and m is not None:
                off = [f"{d}={v}" for d, v in (("M", m), ("K", kk), ("N", n)) if v % ALIGN]
                if kk < TINY_INNER:
                    c.clauses.append(f"inner dimension K={kk}")
                    c.advice["shape"] = name
                elif off:
                    c.clauses.append(f"{', '.join(off)} not a multiple of {ALIGN}")
                    c.advice["shape"] = name
            if prec == "fp32":
                if len(fp32_matmuls(g)) and faster_matrix(dev) is not None:
                    c.clauses.append("FP32 matmul")
                    c.advice["fp32mm"] = name
                elif len(fp32_matmuls(g)):  # no faster matrix roof here: FP32 is not what holds it back
                    c.clauses.append(f"FP32 matmul ({no_faster_matrix_text(dev)}: not a cause here)")
                elif g["name"].astype(str).str.contains(TENSOR_CORE_FP32_NAME).any():
                    c.clauses.append("FP32 matmul on the tensor cores (TF32 / MFMA, by its name)")
                else:  # a matmul op's kernel that names no matmul (a split-K reduction; in a report saved before
                    # the import set copies aside, aten::addmm's bias copy)
                    c.clauses.append("FP32, launched by a matmul op but no matmul kernel by its name")
        if gpu and cat == "attention" and bound == "memory" and "phase" in g and _mode(g["phase"]) == "decode":
            c.clauses.append("attention of a decode phase: its bytes are the KV cache")
            c.advice["kv"] = name
        if cat in FUSIBLE:
            nb = _neighbours(k, rows)
            near = nb.names
            if near and nb.share >= FUSE_SHARE:
                where = (f"{nb.share:.0%} of launches, one op chain by their {SCOPE_WORDS[nb.column]}" if nb.chain
                         else f"stream neighbours, {nb.share:.0%} of launches: the trace records no scope of its op chain")
                c.clauses.append(f"launched beside {', '.join(_short(n) for n in near[:2])} ({where})")
                c.attrs["fusible_neighbours"] = "; ".join(n[:80] for n in near[:3])
                c.attrs["neighbours_scope"] = nb.column or "stream"
                c.advice["fuse"] = f"{name} with {', '.join(_short(n) for n in near[:2])}"
            if prec == "fp32":
                c.clauses.append("FP32 tensors")
                c.advice["fp32"] = name
        # Kineto's estimated occupancy, with what caps it
        if gpu and cat not in MATMUL and "est_occupancy_pct" in g:
            occ = pd.to_numeric(g["est_occupancy_pct"], errors="coerce")
            occ = _median(occ[occ > 0])  # 0: Kineto did not estimate it (a running kernel has warps)
            if np.isfinite(occ):
                c.attrs["est_occupancy_pct"] = float(occ)
                if occ < OCCUPANCY_LOW_PCT:
                    regs = _median(pd.to_numeric(g.get("registers_per_thread"), errors="coerce"))
                    smem = _median(pd.to_numeric(g.get("shared_mem_bytes"), errors="coerce"))
                    caps = ", ".join(x for x in (f"{regs:.0f} registers per thread" if np.isfinite(regs) else "",
                                                 f"{nbytes(smem)} shared memory per block" if smem > 0 else "") if x)
                    c.clauses.append(f"estimated occupancy {occ:.0f}%" + (f" ({caps})" if caps else ""))
                    c.advice["occupancy"] = name
        out.append(c)
    return out


CAUSE_ADVICE = {
    "grid": ("{groups}: the grid has fewer blocks than the device has {unit}s, so some stay idle for the whole "
             "launch: more blocks per launch (split-K / split-KV, smaller tiles, more requests per batch)."),
    "tail": ("{groups}: the grid ends in a partial wave (wave quantization): the SMs that get no block in the last "
             "wave idle through it. A grid of whole waves fills them: tiles or a split-K chosen for this device's "
             "SM count, or a persistent (stream-K) kernel that spreads the work over all SMs."),
    "small": ("{groups}: each launch moves too few bytes to approach the DRAM roof: fixed per-kernel costs (ramp-up, "
              "the last wave) set its time, not DRAM bandwidth: give each launch more work (a larger batch) or fuse "
              "it with its neighbours, so that fewer launches pay those costs."),
    "weights": ("{groups}: the bytes are the weights (weight streaming: each weight is read for few rows): "
                "{cut}more rows per launch (a larger batch) amortise them."),
    "kv": ("{groups}: decode attention reads the KV cache: split-KV / flash-decoding spreads short batches over "
           "more blocks, a lower-precision KV cache (FP8) cuts the bytes."),
    "fuse": ("Fuse {groups} (torch.compile, a fused kernel): back-to-back elementwise/norm/copy {what} each read and "
             "write the tensor again."),
    "fp32": "{groups}: FP32 tensors: in BF16 the same {what} move half the bytes.",
    "shape": ("{groups}: the GEMM shape tiles badly (a tiny inner dimension, or sizes off multiples of 8): pad the "
              "sizes to multiples of 16, or batch the small GEMMs into one grouped/batched GEMM."),
    "fp32mm": "{groups}: FP32 matmuls: the fp32-matmul finding gives their gain on the tensor cores.",
    "occupancy": ("{groups}: a low estimated occupancy (Kineto's estimate from registers and shared memory per "
                  "block): fewer registers per thread or less shared memory per block leave room for more warps."),
}
"""The advice per cause code of :func:`group_causes`, naming the groups (``{groups}``) that show it."""
WEIGHT_CUT = {
    4: "they already stream at 4 bits, so no lower precision cuts them further; ",
    8: "they stream at 8 bits: 4-bit weights (INT4, MXFP4/NVFP4) would halve the bytes, ",
    16: "they stream at 16 bits: FP8 weights halve the bytes and 4-bit ones (INT4, MXFP4/NVFP4) quarter them, ",
    32: "they stream at 32 bits: BF16 weights halve the bytes and FP8 ones quarter them, ",
    None: ("the trace states neither the kernel's format nor the op's input types, so how far a lower-precision "
           "weight format would cut the bytes is unknown; "),
}
"""What a weight format leaves to cut, by the bits the weights stream at (:func:`weight_bits`)."""


def weight_bits(precision: object) -> int | None:
    """The bits per weight of a precision :func:`weight_format` reads (``fp4``/``int4`` 4, ``fp8``/``int8`` 8,
    ``bf16``/``fp16`` 16, ``fp32`` 32: each rank of :data:`PRECISION_WIDTH` doubles the width); None for another."""
    rank = PRECISION_WIDTH.get(precision) if isinstance(precision, str) else None
    return None if rank is None else 4 << rank


def weight_format(g: pd.DataFrame) -> tuple[str, str] | None:
    """The precision a weight-streaming GEMM group's weights are stored at and where the trace says it: its kernel's
    name, else its op's input types (:func:`narrowest_operand`); None when neither says."""
    name = _mode(g["name"]) if "name" in g else None
    types = parse_shapes(_mode(g["op_input_types"])) if "op_input_types" in g else None
    return narrowest_operand(name, types or ())


OP_KEY = ("op", "op_shapes", "op_input_types")
"""The columns that name one op with one set of inputs: the kernels a fused op launched share them."""


def _op_kernels(k: pd.DataFrame) -> dict[tuple[str, ...], frozenset[str]]:
    """The kernel names launched by each op with each set of inputs (:data:`OP_KEY`), made once per table."""
    def build() -> dict[tuple[str, ...], frozenset[str]]:
        cols = [c for c in OP_KEY if c in k]
        if "op" not in cols or "name" not in k:
            return {}
        d = k[cols + ["name"]].dropna(subset=["op", "name"]).astype(str).drop_duplicates()
        return {tuple(key) if isinstance(key, tuple) else (key,): frozenset(v)
                for key, v in d.groupby(cols, sort=False)["name"]}
    return memo(k, "rules:op_kernels", build)


def packed_readers(k: pd.DataFrame, g: pd.DataFrame, mine: tuple[str, str] | None = None
                   ) -> tuple[int, list[str]] | None:
    """Where a GEMM group's kernels are not the readers of their op's packed weights: the weights' bits and the
    kernels that read them, else None. A fused op (a MoE) launches several kernels and its bytes are split among them
    by time; packed weights are read by the kernel that unpacks them, whose name states their format
    (:func:`narrowest_operand`). Another GEMM kernel of the same op and inputs whose name states a format narrower
    than this group's (from its own name or the op's input types) reads them; this group (a finalize / scatter
    epilogue, ``_finalize_matmul_scatter_bf16`` beside ``_matmul_ogs_..._bf16xbf16xmxfp4``) does not. A sibling
    that is not a GEMM by its name (a quantize or dequantize kernel) is not a reader. ``mine``: the group's
    :func:`weight_format`, where the caller has read it."""
    cols = [c for c in OP_KEY if c in g]
    if "op" not in cols or "name" not in g or not len(g):
        return None
    own = set(g["name"].dropna().astype(str))
    mine = mine or weight_format(g)
    if mine is None or mine[1] == "the kernel's name":
        return None
    keys = {tuple(r) for r in g[cols].dropna(subset=["op"]).astype(str).drop_duplicates().itertuples(index=False)}
    launched = _op_kernels(k)
    others = sorted({n for key in keys for n in launched.get(key, ())} - own)
    readers = []
    for n in others:
        fmt = narrowest_operand(n)
        gemm = kernel_precision(n) is not None or category_of(None, n) == "gemm"  # trtllm's bmm_: by its formats
        if fmt is not None and gemm and PRECISION_WIDTH[fmt[0]] < PRECISION_WIDTH.get(mine[0], 99):
            readers.append((PRECISION_WIDTH[fmt[0]], fmt[0], n))
    if not readers:
        return None
    return weight_bits(min(readers)[1]) or 0, [_short(n) for *_, n in readers]


CPU_CAUSES = ("fuse", "fp32", "weights", "shape", "fp32mm")
"""Causes a CPU report's operators can show (no grid, no SMs, no GPU occupancy)."""
UNEXPLAINED = "Nothing in the trace explains {groups} ({stake} at stake): "
UNEXPLAINED_MEASURE = {
    False: "measure {them} with {tool}, whose limiter (the busiest unit and its % of peak) says what holds {them} back.",
    True: ("measure {them} with a hardware-counter profiler (perf stat, VTune, uProf), whose cache-miss and "
           "bandwidth counters say what holds {them} back."),
}
"""The advice for the groups nothing explains: the measurement that would tell, never a recipe."""


def _shown(names: list[str]) -> str:
    """The first three names an advice sentence names, then how many more."""
    return "; ".join(names[:3] + ([f"{len(names) - 3} more"] if len(names) > 3 else []))


def causes_advice(report: Report, causes: list[Causes], stakes: list[float], names: list[str]) -> list[str]:
    """The advice sentences, one per cause in order of the stake of the groups showing it, then the groups nothing
    explains with the measurement that would tell (:func:`._base.collect_advice`: the vendor's counter profiler,
    or the sections an Nsight Compute report lacks)."""
    cpu = is_cpu_report(report)
    unit = "CU" if is_amd(report.device) else "SM"
    weight: dict[str, float] = {}
    who: dict[str, list[str]] = {}
    for c, s in zip(causes, stakes):
        for code, name in c.advice.items():
            weight[code] = weight.get(code, 0.0) + (s if np.isfinite(s) else 0.0)
            who.setdefault(code, []).append(name)
    parts = []
    for code in sorted(weight, key=lambda x: -weight[x]):
        names_ = list(dict.fromkeys(who[code]))
        if code == "fuse":  # "silu with mul" says "mul with silu" too
            kept: list[str] = []
            for entry in names_:
                if not any(entry.split(" with ")[0] in e.split(" with ", 1)[1].split(", ") for e in kept):
                    kept.append(entry)
            names_ = kept
        if code == "weights":  # one sentence per precision the weights stream at: what is left to cut differs
            by_fmt: dict[str | None, list[str]] = {}
            for c in causes:
                if "weights" in c.advice:
                    fmt = c.attrs.get("weight_precision")
                    by_fmt.setdefault(fmt if isinstance(fmt, str) else None, []).append(c.advice["weights"])
            for fmt, names_ in by_fmt.items():
                bits = weight_bits(fmt)
                cut = WEIGHT_CUT[bits]
                if bits == 32 and faster_matrix(report.device) is None:  # bf16 has no faster path on this device
                    cut = (f"they stream at 32 bits; BF16 weights would halve the bytes, but "
                           f"{no_faster_matrix_text(report.device)}, so the arithmetic of a bf16 matmul may cost more "
                           "than the bytes save: measure it before converting; ")
                parts.append(CAUSE_ADVICE[code].format(groups=_shown(list(dict.fromkeys(names_))), cut=cut))
            continue
        parts.append(CAUSE_ADVICE[code].format(groups=_shown(names_), unit=unit,
                                               what="operators" if cpu else "kernels"))
    none = [(n, s) for c, s, n in zip(causes, stakes, names) if not c.advice]
    if none:
        stake = float(sum(s for _, s in none if np.isfinite(s)))
        shown = [_short(n) for n, _ in none[:3]] + ([counted(len(none) - 3, "more group")] if len(none) > 3 else [])
        them = "it" if len(none) == 1 else "them"
        head = UNEXPLAINED.format(groups=", ".join(shown), stake=duration(stake))
        tool = "" if cpu else collect_advice(report, "{counters}")
        parts.append(f"{head[:-2]}. {tool}" if from_ncu(report) else head + UNEXPLAINED_MEASURE[cpu].format(them=them, tool=tool))
    return parts


__all__ = ["CAUSE_ADVICE", "CPU_CAUSES", "Causes", "Floor", "causes_advice", "gemm_dims", "group_causes", "kernel_floor",
           "l2_bytes"]
