"""Kineto traces written by the idle tests, with their truth: a host timeline of ranges and calls and
the GPU work it queues, on a whole-microsecond grid, and an oracle that walks that grid one
microsecond at a time (independent of the interval code in analysis/idle.py)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

PID, TID, STREAM = 100, 100, 7
CALL_CAUSE = {"cudaLaunchKernel": "launch", "cudaMemcpyAsync": "copy", "cudaStreamSynchronize": "sync",
              "cudaEventSynchronize": "sync", "cudaDeviceSynchronize": "sync", "cuptiActivityFlushAll": "profiler"}


@dataclass
class HostTrace:
    """Builds a torch.profiler (Kineto) trace: ``ts``/``dur`` in whole microseconds."""

    events: list[dict] = field(default_factory=list)
    ranges: list[tuple[int, int, str]] = field(default_factory=list)
    calls: list[tuple[int, int, str, str]] = field(default_factory=list)  # start, end, name, kind of copy
    waits: list[tuple[int, int, str]] = field(default_factory=list)  # OS-runtime calls (nsys OSRT_API only)
    busy: list[tuple[int, int]] = field(default_factory=list)
    corr: int = 0

    def range(self, name: str, start: int, end: int) -> None:
        self.ranges.append((start, end, name))
        self.events.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": PID, "tid": TID,
                            "ts": start, "dur": end - start})

    def op(self, name: str, start: int, end: int) -> None:
        """A CPU operator (``cpu_op``) around the host's calls from ``start`` to ``end``."""
        self.events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": PID, "tid": TID, "ts": start,
                            "dur": end - start, "args": {}})

    def _call(self, name: str, start: int, dur: int, kind: str = "") -> int:
        self.corr += 1
        self.calls.append((start, start + dur, name, kind))
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": PID, "tid": TID, "ts": start,
                            "dur": dur, "args": {"correlation": self.corr, "External id": self.corr}})
        return self.corr

    def launch(self, start: int, dur: int, kernel_start: int, kernel_dur: int, name: str = "gemm_kernel") -> None:
        corr = self._call("cudaLaunchKernel", start, dur)
        self.busy.append((kernel_start, kernel_start + kernel_dur))
        self.events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": STREAM, "ts": kernel_start,
                            "dur": kernel_dur, "args": {"correlation": corr, "External id": corr, "device": 0,
                                                        "stream": STREAM, "grid": [1, 1, 1], "block": [128, 1, 1]}})

    def copy(self, start: int, dur: int, copy_start: int, copy_dur: int, nbytes: int, kind: str = "HtoD",
             pinned: bool = False) -> None:
        corr = self._call("cudaMemcpyAsync", start, dur, kind)
        host = "Pinned" if pinned else "Pageable"
        what = f"Memcpy {kind} ({host} -> Device)" if kind == "HtoD" else f"Memcpy {kind} (Device -> {host})"
        self.busy.append((copy_start, copy_start + copy_dur))
        self.events.append({"ph": "X", "cat": "gpu_memcpy", "name": what, "pid": 0, "tid": STREAM, "ts": copy_start,
                            "dur": copy_dur, "args": {"correlation": corr, "device": 0, "stream": STREAM,
                                                      "bytes": nbytes}})

    def sync(self, start: int, dur: int, name: str = "cudaStreamSynchronize") -> None:
        self._call(name, start, dur)

    def osrt(self, start: int, dur: int, name: str) -> None:
        """An OS-runtime call (futex, nanosleep, read...): a row of nsys's OSRT_API; Kineto records none."""
        self.waits.append((start, start + dur, name))

    def write(self, path: Path) -> Path:
        doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA GeForce RTX 4060 Ti"}],
               "traceEvents": self.events}
        path.write_text(json.dumps(doc))
        return path

    # ------------------------------------------------------------------ the truth
    def truth(self) -> Counter[tuple[str, str | None]]:
        """Idle ns per (cause, innermost range) from the first GPU work to the last, one µs at a time.

        The queue model: host time in a gap that opened while the host was inside a sync call (or a copy
        to the host) and after that call returned is the sync's."""
        lo, hi = min(s for s, _ in self.busy), max(e for _, e in self.busy)
        busy = set()
        for s, e in self.busy:
            busy.update(range(s, e))
        out: Counter[tuple[str, str | None]] = Counter()
        opened_at = None  # the first idle µs of the current gap
        for us in range(lo, hi):
            if us in busy:
                opened_at = None
                continue
            if opened_at is None:
                opened_at = us
            cause = "host"
            for s, e, name, kind in self.calls:
                if s <= us < e:
                    cause = CALL_CAUSE[name]
                    if cause == "copy" and kind == "DtoD":
                        cause = "launch"
            if cause == "host":
                for s, e, name, kind in self.calls:
                    blocks = CALL_CAUSE[name] == "sync" or (CALL_CAUSE[name] == "copy" and kind == "DtoH")
                    if blocks and s <= opened_at <= e <= us:
                        cause = "sync"
            inside = [(s, e, n) for s, e, n in self.ranges if s <= us < e]
            rng = max(inside, key=lambda r: (r[0], -r[1]))[2] if inside else None
            out[(cause, rng)] += 1000
        return out


def weight_streaming(tokens: int = 4, layers: int = 4) -> HostTrace:
    """The shape of the RTX 4060 Ti trace of issue 29: per token, per layer, ``ensure_layer_N_weights``
    stages the layer's weights with one pageable HtoD copy (host work first, then the copy call, the
    DMA only at the end of the call), then ``layer_N_computation`` launches its kernels."""
    t = HostTrace()
    now = 0
    for tok in range(tokens):
        tok_start = now
        for layer in range(layers):
            ens = now
            now += 300  # host-side preparation (Python, allocation) before the copy
            t.copy(now, 1500, now + 1400, 100, 4 << 20)  # 1.5 ms call, the DMA in its last 100 µs
            now += 1500
            t.range(f"ensure_layer_{layer}_weights", ens, now)
            comp = now
            gpu = now
            for _ in range(6):  # 6 launches of 10 µs, kernels of 40 µs queue behind each other
                gpu = max(gpu, now + 12)
                t.launch(now, 10, gpu, 40)
                gpu += 40
                now += 10
            now = max(now, gpu) + 5
            t.range(f"layer_{layer}_computation", comp, now)
        t.range(f"token_{tok}_processing", tok_start, now)
        now += 20
    return t


def launch_bound(steps: int = 3, launches: int = 40, kernel: str = "gemm_kernel", ranges: bool = True) -> HostTrace:
    """``decode_step`` ranges (none without ``ranges``) of back-to-back 20 µs launch calls of 3 µs kernels
    named ``kernel``: the GPU waits inside the launch calls."""
    t = HostTrace()
    now = 0
    for step in range(steps):
        start = now
        for _ in range(launches):
            t.launch(now, 20, now + 21, 3, name=kernel)
            now += 20
        now += 30
        if ranges:
            t.range(f"decode_step {step}", start, now)
    return t


def _forward(t: HostTrace, now: int, op: str | None = None) -> tuple[int, int]:
    """4 launches of 10 µs calls from ``now``, each kernel 50 µs, queued 12 µs after its call (each inside
    ``op`` where one is given): (when the host is done, when the GPU is)."""
    gpu = now
    for _ in range(4):
        gpu = max(gpu, now + 12)
        t.launch(now, 10, gpu, 50)
        if op:
            t.op(op, now, now + 10)
        gpu += 50
        now += 10
    return now, gpu


def sync_bound(steps: int = 3, *, op: str | None = None, copy: str | None = "DtoH",
               api: str = "cudaStreamSynchronize", ops_elsewhere: bool = False) -> HostTrace:
    """Per step a forward of 4 launches, then ``sampler``: a copy (``copy``: DtoH, the logits; HtoD from pageable
    memory; None: no copy) and a blocking ``api`` call that returns long after the GPU drained (the .item()
    pattern), inside the operator ``op`` where one is given, then 400 µs of Python in ``postprocess``.
    ``ops_elsewhere``: each launch is inside an ``aten::mm``, so the trace records operators."""
    t = HostTrace()
    now = 0
    for step in range(steps):
        start = now
        now, gpu = _forward(t, now, "aten::mm" if ops_elsewhere else None)
        samp = now
        if copy:
            t.copy(now, 20, gpu, 5, 4096, kind=copy)
            now += 20
        t.sync(now, 600, api)
        now += 600
        if op:
            t.op(op, samp, now)
        t.range("sampler", samp, now)
        post = now
        now += 400
        t.range("postprocess", post, now)
        t.range(f"iteration {step}", start, now)
    return t


def copy_back(nbytes: int, steps: int = 3) -> HostTrace:
    """Per step a forward of 4 launches, then one copy of ``nbytes`` to the host whose call blocks for 800 µs
    (the DMA in its last 5 µs, after the kernels): the GPU waits inside the copy call."""
    t = HostTrace()
    now = 0
    for step in range(steps):
        start = now
        now, _ = _forward(t, now)
        t.copy(now, 800, now + 795, 5, nbytes, kind="DtoH")
        now += 800
        t.range(f"iteration {step}", start, now)
    return t


def layer_streaming(layers: int = 64, launches: int = 32, wait_us: int = 9_900, waits: tuple[str, ...] = ("futex",),
                    ) -> HostTrace:
    """The shape of issue 39's RTX 4060 Ti trace: per layer, ``ensure_layer_N_weights`` stages the layer's
    weights on the host for 10 ms without any CUDA call, blocked in an OS call (``waits``, in turn) for
    ``wait_us`` of it; then ``layer_N_computation`` launches ``launches`` kernels back to back (10 µs calls,
    9 µs kernels: the GPU drains 1 µs before each next kernel). 64 gaps of 10 ms and ~2,000 gaps of 1 µs."""
    t = HostTrace()
    now = 0
    for layer in range(layers):
        ens = now
        now += 50  # Python before the blocking call
        t.osrt(now, wait_us, waits[layer % len(waits)])
        now += wait_us + 50
        t.range(f"ensure_layer_{layer}_weights", ens, now)
        comp = now
        for _ in range(launches):
            t.launch(now, 10, now + 11, 9)
            now += 10
        now += 12
        t.range(f"layer_{layer}_computation", comp, now)
    return t


def profiler_flush(steps: int = 3) -> HostTrace:
    """``step N`` ranges of 5 launches, then the profiler flushing its buffers (a 700 µs
    ``cuptiActivityFlushAll`` call) while the GPU has drained."""
    t = HostTrace()
    now = 0
    for step in range(steps):
        start = now
        for _ in range(5):
            t.launch(now, 10, now + 12, 30)
            now += 10
        now += 40
        t.range(f"step {step}", start, now)
        t._call("cuptiActivityFlushAll", now, 700)
        now += 720
    return t


# ---------------------------------------------------------------------------- the same trace as an nsys export
NSYS_TEMPLATE = "nsys/nvfuser_h100_matmul.sqlite"
"""A real nsys SQLite export whose schema (tables, enums, string table) the synthetic rows are written into."""
NSYS_NAMES = {"cudaLaunchKernel": "cudaLaunchKernel_v7000", "cudaMemcpyAsync": "cudaMemcpyAsync_v3020",
              "cudaStreamSynchronize": "cudaStreamSynchronize_v3020"}
COPY_KIND_ID = {"HtoD": 1, "DtoH": 2, "DtoD": 8}
MEM_PAGEABLE, MEM_PINNED, MEM_DEVICE = 0, 1, 2


OSRT_TEMPLATE = "nsys/aws_t4_softmax.sqlite"
"""A real nsys export recorded with --trace=osrt: the OSRT_API table's schema is taken from it."""


def write_nsys(trace: HostTrace, template: Path, out: Path, osrt_template: Path | None = None) -> Path:
    """``trace`` written into a copy of a real nsys export: its kernel, runtime, memcpy and NVTX rows
    replaced by the trace's (times in ns, the export's own string ids and process / thread keys); its
    OS-runtime calls into an OSRT_API table made with the schema of ``osrt_template``'s."""
    import shutil
    import sqlite3

    shutil.copyfile(template, out)
    if trace.waits and osrt_template is not None:
        with sqlite3.connect(f"file:{osrt_template}?mode=ro", uri=True) as src:
            (schema,) = src.execute("SELECT sql FROM sqlite_master WHERE name = 'OSRT_API'").fetchone()
            event_class = src.execute("SELECT eventClass FROM OSRT_API LIMIT 1").fetchone()[0]
        with sqlite3.connect(out) as db:
            db.execute("DROP TABLE IF EXISTS OSRT_API")
            db.execute(schema)
    with sqlite3.connect(out) as db:
        ids = {v: i for i, v in db.execute("SELECT id, value FROM StringIds")}
        pid = db.execute("SELECT globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1").fetchone()[0]
        tid, event_class = db.execute("SELECT globalTid, eventClass FROM CUPTI_ACTIVITY_KIND_RUNTIME "
                                      "LIMIT 1").fetchone()
        templates = {}
        for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY",
                      "NVTX_EVENTS"):
            cur = db.execute(f"SELECT * FROM {table} LIMIT 1")
            templates[table] = dict(zip([d[0] for d in cur.description], cur.fetchone()))
            db.execute(f"DELETE FROM {table}")
        for table in ("CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"):
            db.execute(f"DELETE FROM {table}")

        def insert(table: str, **values: object) -> None:
            row = {**templates[table], **values}
            db.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                       tuple(row.values()))

        def name_id(name: str) -> int:  # a name the export's string table lacks is added to it
            if name not in ids:
                ids[name] = max(ids.values()) + 1
                db.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (ids[name], name))
            return ids[name]

        base = 1_000_000_000
        for e in trace.events:
            ts, te = base + e["ts"] * 1000, base + (e["ts"] + e["dur"]) * 1000
            corr = (e.get("args") or {}).get("correlation")
            if e["cat"] == "cuda_runtime":
                insert("CUPTI_ACTIVITY_KIND_RUNTIME", start=ts, end=te, eventClass=event_class, globalTid=tid,
                       correlationId=corr, nameId=name_id(NSYS_NAMES.get(e["name"], e["name"])), returnValue=0,
                       callchainId=None)
            elif e["cat"] == "kernel":
                insert("CUPTI_ACTIVITY_KIND_KERNEL", start=ts, end=te, streamId=STREAM, correlationId=corr,
                       globalPid=pid, graphNodeId=None)
            elif e["cat"] == "gpu_memcpy":
                kind = e["name"].split()[1]
                host = MEM_PINNED if "Pinned" in e["name"] else MEM_PAGEABLE
                src, dst = (host, MEM_DEVICE) if kind == "HtoD" else (MEM_DEVICE, host)
                insert("CUPTI_ACTIVITY_KIND_MEMCPY", start=ts, end=te, streamId=STREAM, correlationId=corr,
                       globalPid=pid, bytes=e["args"]["bytes"], copyKind=COPY_KIND_ID[kind], srcKind=src, dstKind=dst,
                       graphNodeId=None)
            elif e["cat"] == "user_annotation":
                insert("NVTX_EVENTS", start=ts, end=te, eventType=59, text=e["name"], textId=None, globalTid=tid,
                       endGlobalTid=None, domainId=0)
        if trace.waits and osrt_template is not None:
            db.executemany("INSERT INTO OSRT_API (start, end, eventClass, globalTid, nameId, returnValue, nestingLevel, "
                           "callchainId) VALUES (?, ?, ?, ?, ?, 0, 0, 0)",
                           [(base + s * 1000, base + e * 1000, event_class, tid, name_id(name))
                            for s, e, name in trace.waits])
    return out
