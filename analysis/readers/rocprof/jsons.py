"""rocprof JSON: rocprofv3 ``*_results.json`` (``{"rocprofiler-sdk-tool": [...]}``) and rocprof v1/v2
Chrome-trace ``results.json``.

rocprofv3 writes integers of any size (an XGMI hive's ``hive_id`` is above 2^63): orjson and msgspec
reject those, so a file they cannot read is parsed again by Python's ``json``, whose integers have no
bound. Metadata integers are kept as they are; no value is a reason to reject the file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from perfscope import inputs
from perfscope.errors import InputFormatError
from perfscope.limits import take

from .counters import costs_from_counters, has_cost_counters
from .device import agent_spec
from .flat import no_counter_note
from .tables import api_table, gpu_label, innermost_range, ints, kernel_table, range_table
from .v3csv import DIRECTION

if TYPE_CHECKING:
    from pathlib import Path

    from perfscope.device import DeviceSpec

HINT = "re-export the run (rocprofv3 --output-format json) or import its CSV / rocpd database"


def load_json(path: Path) -> Any:
    """The file's JSON, decompressed by content (a gzipped ``*_results.json.gz`` too); big integers (over 64
    bits) read exactly, through Python's json (:func:`perfscope.inputs.load_json`)."""
    return inputs.load_json(path, HINT)


def _handle(value: Any) -> Any:
    return value.get("handle") if isinstance(value, dict) else value


def read_v3_json(path: Path, warnings: list[str]) -> tuple[dict[str, pd.DataFrame], DeviceSpec | None, dict[str, Any]]:
    doc = load_json(path)
    tools = doc.get("rocprofiler-sdk-tool") if isinstance(doc, dict) else None
    if isinstance(tools, dict):
        tools = [tools]
    if not tools:
        raise InputFormatError(path, "no rocprofiler-sdk-tool record", hint=HINT)
    if len(tools) > 1:
        warnings.append(f"{len(tools)} processes in the file: only the first is read")
    tool = tools[0]
    meta = tool.get("metadata") or {}
    records = tool.get("buffer_records") or {}
    strings = tool.get("strings") or {}
    kinds = strings.get("buffer_records") or []
    symbols = tool.get("kernel_symbols") or []
    if isinstance(symbols, dict):
        symbols = list(symbols.values())
    names = {s.get("kernel_id"): s.get("formatted_kernel_name") or s.get("kernel_name") for s in symbols
             if isinstance(s, dict)}
    agents = {_handle(a.get("id")): a for a in tool.get("agents") or [] if isinstance(a, dict)}
    dispatches = records.get("kernel_dispatch") or records.get("kernel_dispatches") or []
    take(path, sum(len(v) for v in records.values() if isinstance(v, list)) if isinstance(records, dict) else 0)
    rows = []
    for d in dispatches:
        info = d.get("dispatch_info") or {}
        agent = agents.get(_handle(info.get("agent_id")), {})
        grid, block = info.get("grid_size") or {}, info.get("workgroup_size") or {}
        rows.append({
            "name": names.get(info.get("kernel_id"), f"kernel {info.get('kernel_id')}"),
            "device": gpu_label(agent.get("logical_node_id", agent.get("node_id", _handle(info.get("agent_id"))))),
            "start": d.get("start_timestamp"), "end": d.get("end_timestamp"),
            "correlation": _handle((d.get("correlation_id") or {}).get("internal")),
            "dispatch": info.get("dispatch_id"), "stream": _handle(info.get("queue_id")),
            "grid": f"({grid.get('x')}, {grid.get('y')}, {grid.get('z')})" if grid else None,
            "block": f"({block.get('x')}, {block.get('y')}, {block.get('z')})" if block else None,
        })
    frame = pd.DataFrame(rows, columns=["name", "device", "start", "end", "correlation", "dispatch", "stream",
                                        "grid", "block"])
    counters = _json_counters(tool)
    if counters is not None and len(frame):
        frame = frame.merge(counters, left_on="dispatch", right_index=True, how="left")
    kernels = kernel_table(frame["name"], frame["device"], frame["start"], frame["end"],
                           correlation=ints(frame["correlation"]),
                           stream=ints(frame["stream"]),
                           grid=frame["grid"], block=frame["block"], dispatch_id=ints(frame["dispatch"]))
    if counters is not None and has_cost_counters(frame):
        costs = costs_from_counters(frame)
        for col in costs.columns:
            kernels[col] = costs[col].to_numpy()
    no_counter_note(kernels, warnings)
    tables: dict[str, pd.DataFrame] = {"kernels": kernels}

    def op_name(rec: dict[str, Any]) -> str:
        try:
            return str(kinds[rec["kind"]]["operations"][rec["operation"]])
        except (KeyError, IndexError, TypeError):
            return f"op {rec.get('operation')}"

    hip = records.get("hip_api") or []
    api = pd.DataFrame()
    if hip:
        api = api_table([op_name(r) for r in hip], [r.get("start_timestamp") for r in hip],
                        [r.get("end_timestamp") for r in hip], thread=[r.get("thread_id") for r in hip],
                        correlation=[_handle((r.get("correlation_id") or {}).get("internal")) for r in hip])
        tables["api"] = api
    markers = records.get("marker_api") or []
    messages = {}
    for m in (strings.get("marker_api") or []):
        if isinstance(m, dict):
            messages[m.get("key")] = m.get("value")
    ranged = [m for m in markers if m.get("end_timestamp", 0) > m.get("start_timestamp", 0)]
    if ranged:
        label = [messages.get(_handle((m.get("correlation_id") or {}).get("internal"))) or op_name(m) for m in ranged]
        ranges = range_table(label, [m["start_timestamp"] for m in ranged], [m["end_timestamp"] for m in ranged],
                             [m.get("thread_id") for m in ranged])
        tables["ranges"] = ranges
        innermost_range(kernels, api, ranges)
    copies = records.get("memory_copy") or []
    if copies:
        direction = [op_name(c).replace("MEMORY_COPY_", "") for c in copies]
        s = ints(pd.Series([c.get("start_timestamp") for c in copies]))
        e = ints(pd.Series([c.get("end_timestamp") for c in copies]))
        moved = pd.DataFrame({
            "kind": [DIRECTION.get(d, "other") for d in direction],
            "bytes": ints([c.get("bytes", c.get("size")) for c in copies]),
            "start_ns": s, "end_ns": e, "duration_ns": e - s})
        timed = s.notna() & e.notna()
        if not timed.all():
            warnings.append(f"{int((~timed).sum())} of {len(moved)} memory copies without their times: not imported")
        if moved.loc[timed, "bytes"].isna().any():
            warnings.append(f"{int(moved.loc[timed, 'bytes'].isna().sum())} of {len(moved)} memory copies record no "
                            "size: imported with their bytes missing")
        tables["transfers"] = moved[timed].reset_index(drop=True)
    gpus = [a for a in agents.values() if a.get("type") in (2, "GPU")]
    busy = kernels["device"].value_counts().index[0] if len(kernels) else None
    chosen = next((a for a in gpus if gpu_label(a.get("logical_node_id", a.get("node_id"))) == busy), None)
    spec = agent_spec(chosen or (gpus[0] if gpus else None), warnings)
    params = {"pid": meta.get("pid"), "rocprofiler_sdk_version": (meta.get("config") or {}).get("version")}
    return tables, spec, params


def _json_counters(tool: dict[str, Any]) -> pd.DataFrame | None:
    """Counter values per dispatch id from ``callback_records.counter_collection`` (summed per counter)."""
    cb = (tool.get("callback_records") or {}).get("counter_collection") or []
    if not cb:
        return None
    info = {c.get("id", {}).get("handle") if isinstance(c.get("id"), dict) else c.get("id"): c.get("name")
            for c in tool.get("counters") or [] if isinstance(c, dict)}
    values: dict[Any, dict[str, float]] = {}
    for rec in cb:
        dispatch = ((rec.get("dispatch_data") or {}).get("dispatch_info") or {}).get("dispatch_id")
        for r in rec.get("records") or []:
            name = info.get(_handle(r.get("counter_id")))
            if name is None or dispatch is None:
                continue
            row = values.setdefault(dispatch, {})
            row[name] = row.get(name, 0.0) + float(r.get("value", 0.0))
    return pd.DataFrame.from_dict(values, orient="index") if values else None


def read_v1_json(path: Path, warnings: list[str]) -> tuple[dict[str, pd.DataFrame], list[str], dict[str, Any]]:
    """rocprof v1/v2 Chrome trace: kernel dispatches are the ``ph: "X"`` events whose args carry a kernel
    name; their exact ns times are in args (``BeginNs``/``EndNs``), ``ts``/``dur`` are rounded µs."""
    doc = load_json(path)
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise InputFormatError(path, "no traceEvents array", hint=HINT)
    take(path, len(events))
    rows, api_rows = [], []
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        args = ev.get("args") or {}
        if "KernelName" in args or "BeginNs" in args:
            begin, end = args.get("BeginNs"), args.get("EndNs")
            if begin is None or end is None:
                ts, dur = float(ev.get("ts", "nan")), float(ev.get("dur", "nan"))
                begin, end = ts * 1000, (ts + dur) * 1000
            rows.append({"name": args.get("KernelName") or ev.get("name"), "device": gpu_label(args.get("gpu-id", ev.get("pid"))),
                         "start": begin, "end": end, "correlation": args.get("Index", args.get("index")),
                         "dispatch": args.get("Index", args.get("index")), "stream": args.get("queue-id")})
        else:
            ts, dur = float(ev.get("ts", "nan")), float(ev.get("dur", "nan"))
            api_rows.append({"name": ev.get("name"), "start": ts * 1000, "end": (ts + dur) * 1000, "thread": ev.get("tid")})
    frame = pd.DataFrame(rows, columns=["name", "device", "start", "end", "correlation", "dispatch", "stream"])
    kernels = kernel_table(frame["name"], frame["device"], pd.to_numeric(frame["start"], errors="coerce"),
                           pd.to_numeric(frame["end"], errors="coerce"),
                           correlation=ints(frame["correlation"]),
                           stream=ints(frame["stream"]), dispatch_id=ints(frame["dispatch"]))
    no_counter_note(kernels, warnings)
    tables = {"kernels": kernels}
    if api_rows:
        a = pd.DataFrame(api_rows)
        tables["api"] = api_table(a["name"], a["start"], a["end"], thread=a["thread"])
    return tables, [], {}
