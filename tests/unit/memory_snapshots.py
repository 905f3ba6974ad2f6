"""Build CUDA memory snapshots in torch's own layout (``torch.cuda.memory._snapshot()``: ``segments``
with their ``blocks`` at the dump, ``device_traces`` of events with ``frames``), pickled by Python's
own pickler as ``_dump_snapshot`` does, for tests whose truth is known by construction.

Frames follow torch's order, innermost first: the allocator's C++ frames, ``at::_ops::empty_strided``,
the op that allocated, then the Python frames of the user's code (``file.py``, line, function).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

BASE = 0x7F00_0000_0000
"""Address of the first segment."""


def frames(op: str | None, py: list[tuple[str, int, str]] = (), *, cpp: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """A traceback: allocator frames, ``at::_ops::empty_strided``, ``at::_ops::OP`` (``div_Tensor``),
    extra C++ frames, then Python frames (path, line, function), innermost first."""
    out = [{"name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, "
                    "unsigned long, CUstream_st*)", "filename": "CUDACachingAllocator.cpp", "line": 0},
           {"name": "at::_ops::empty_strided::call(c10::ArrayRef<c10::SymInt>)", "filename": "??", "line": 0}]
    if op is not None:
        out.append({"name": f"at::_ops::{op}::call(at::Tensor const&)", "filename": "??", "line": 0})
    out += [{"name": n, "filename": "??", "line": 0} for n in cpp]
    out += [{"name": fn, "filename": path, "line": line} for path, line, fn in py]
    return out


def round_block(n: int) -> int:
    """The caching allocator's block size for a request: 512-byte multiples, at least 512."""
    return max(512, -(-n // 512) * 512)


@dataclass
class Snapshot:
    """A device's record under construction: one segment per allocation (as large blocks get), so the
    dump's segments are the blocks live at the end plus those freed (kept cached, inactive)."""

    time: bool = True
    t_us: int = 1_754_000_000_000_000
    events: list[dict[str, Any]] = field(default_factory=list)
    live: dict[int, tuple[int, int, list[dict[str, Any]]]] = field(default_factory=dict)  # addr -> (size, requested, frames)
    cached: dict[int, int] = field(default_factory=dict)  # segment addr -> size, free
    next_addr: int = BASE

    def _event(self, action: str, addr: int, size: int, fr: list[dict[str, Any]]) -> None:
        self.t_us += 7
        e: dict[str, Any] = {"action": action, "addr": addr, "size": size, "stream": 0}
        if self.time:
            e["time_us"] = self.t_us
        e["frames"] = fr
        self.events.append(e)

    def before(self, requested: int, fr: list[dict[str, Any]] | None = None) -> int:
        """A block allocated before the record began (live at the dump, no event); its frames
        (empty: history was off) as given."""
        addr, size = self.next_addr, round_block(requested)
        self.next_addr += -(-size // (2 << 20)) * (2 << 20) + (2 << 20)
        self.live[addr] = (size, requested, fr or [])
        return addr

    def alloc(self, requested: int, fr: list[dict[str, Any]]) -> int:
        """An allocation in the record: a new segment (``segment_alloc``) and its block (``alloc``)."""
        addr, size = self.next_addr, round_block(requested)
        self.next_addr += -(-size // (2 << 20)) * (2 << 20) + (2 << 20)
        self._event("segment_alloc", addr, -(-size // (2 << 20)) * (2 << 20), fr)
        self._event("alloc", addr, size, fr)
        self.live[addr] = (size, requested, fr)
        return addr

    def free(self, addr: int, fr: list[dict[str, Any]] | None = None) -> None:
        """``free_requested`` then ``free_completed`` of a live block; its segment stays cached."""
        size, _, _ = self.live.pop(addr)
        self._event("free_requested", addr, size, fr or [])
        self._event("free_completed", addr, size, fr or [])
        self.cached[addr] = -(-size // (2 << 20)) * (2 << 20)

    def dump(self) -> dict[str, Any]:
        """``torch.cuda.memory._snapshot()``'s dict: the segments at the end (live blocks, and the cached
        free ones, each in its own segment) and the device's trace."""
        segments = []
        for addr, (size, requested, fr) in sorted(self.live.items()):
            total = -(-size // (2 << 20)) * (2 << 20)
            blocks = [{"address": addr, "size": size, "requested_size": requested, "state": "active_allocated",
                       "frames": fr}]
            if total > size:
                blocks.append({"address": addr + size, "size": total - size, "requested_size": 0,
                               "state": "inactive", "frames": []})
            segments.append({"device": 0, "address": addr, "total_size": total, "allocated_size": size,
                             "active_size": size, "requested_size": requested, "stream": 0, "segment_type": "large",
                             "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks})
        for addr, total in sorted(self.cached.items()):
            segments.append({"device": 0, "address": addr, "total_size": total, "allocated_size": 0, "active_size": 0,
                             "requested_size": 0, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
                             "is_expandable": False, "frames": [],
                             "blocks": [{"address": addr, "size": total, "requested_size": 0, "state": "inactive",
                                         "frames": []}]})
        return {"segments": segments, "device_traces": [self.events], "allocator_settings": {},
                "external_annotations": []}

    def write(self, path: Any) -> None:
        """Pickle :meth:`dump` as ``_dump_snapshot`` does (``pickle.dump``, the default protocol)."""
        with open(path, "wb") as f:
            pickle.dump(self.dump(), f)


def replay(snap: dict[str, Any], upto: int | None = None) -> tuple[list[int], dict[int, int]]:
    """A direct replay of a snapshot's first trace: the allocated bytes after each event, and the
    blocks (address -> bytes) live after event ``upto`` (default: the last). It starts from the
    dump's blocks the trace never allocates, plus the blocks it frees before allocating them."""
    events = snap["device_traces"][0]
    allocated_in_trace = {e["addr"] for e in events if e["action"] == "alloc"}
    live: dict[int, int] = {}
    for s in snap["segments"]:
        for b in s["blocks"]:
            if b["state"] == "active_allocated" and b["address"] not in allocated_in_trace:
                live[b["address"]] = b["size"]
    seen: set[int] = set()
    for e in events:
        if e["action"] == "alloc":
            seen.add(e["addr"])
        elif e["action"] == "free_requested" and e["addr"] not in seen:
            live.setdefault(e["addr"], e["size"])
    level = sum(live.values())
    levels = []
    at: dict[int, int] = {}
    last = len(events) - 1 if upto is None else upto
    for k, e in enumerate(events):
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            level += e["size"]
        elif e["action"] == "free_requested" and e["addr"] in live:
            level -= live.pop(e["addr"])
        levels.append(level)
        if k == last:
            at = dict(live)
    return levels, at
