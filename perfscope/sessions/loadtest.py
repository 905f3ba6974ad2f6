"""``perfscope loadtest``: serve a stream of requests with continuous batching and report it.

:func:`build_workload` draws the requests (Poisson arrivals at a rate, or recorded arrival
times; prompt and output lengths from a distribution), the same lengths and prompts for every
rate of a sweep (arrivals are one draw of unit exponential gaps scaled by 1/rate).
:func:`run_loadtest` serves them on the reference engine (:mod:`perfscope.engine.serving`) on a
real clock, under torch.profiler or not, and returns a Report: per-request records in
``requests``, per-step composition in ``steps``, kernels and ranges when profiled.

Length distributions (``--prompt-len``, ``--output-len``): ``128`` (fixed), ``uniform:a,b``
(integers a..b inclusive), ``normal:mu,sigma`` (rounded, at least 1), or a file with one length a
line (used in order, repeated when there are more requests than lines).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..errors import InputFormatError, UsageError
from ..kv_policy import parse_kv_policy
from ..redact import redact_argv
from ..report import Report, source_info
from ..request_metrics import token_latencies

if TYPE_CHECKING:
    from ..device import DeviceSpec

Progress = Callable[[str], None]
MAX_REQUESTS = 100_000
DEFAULT_REQUESTS = 100


@dataclass(frozen=True)
class LengthDist:
    """A distribution of token counts: ``fixed``, ``uniform``, ``normal`` or ``file``."""

    kind: str
    a: float = 0.0
    b: float = 0.0
    values: tuple[int, ...] = ()
    text: str = ""

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        if self.kind == "fixed":
            return np.full(n, int(self.a), dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(int(self.a), int(self.b) + 1, size=n)
        if self.kind == "normal":
            return np.maximum(np.rint(rng.normal(self.a, self.b, size=n)), 1).astype(np.int64)
        return np.resize(np.asarray(self.values, dtype=np.int64), n)

    def upper(self) -> int | None:
        """The largest length the distribution can give (None: unbounded, the normal)."""
        if self.kind == "normal":
            return None
        if self.kind == "file":
            return max(self.values)
        return int(self.b if self.kind == "uniform" else self.a)


def parse_dist(text: str, option: str) -> LengthDist:
    """``N``, ``uniform:a,b``, ``normal:mu,sigma`` or a file of lengths (one per line)."""
    t = str(text).strip()
    hint = f"use {option} N, uniform:A,B, normal:MU,SIGMA or a file of lengths"
    if t.isdigit():
        if int(t) < 1:
            raise UsageError(f"{option} must be at least 1 token, got {t}")
        return LengthDist("fixed", int(t), text=t)
    kind, sep, rest = t.partition(":")
    if sep and kind in ("uniform", "normal"):
        try:
            a, b = (float(x) for x in rest.split(","))
        except ValueError:
            raise UsageError(f"bad {option} {t!r}", hint=hint) from None
        if kind == "uniform" and not (a == int(a) and b == int(b) and 1 <= a <= b):
            raise UsageError(f"{option} {t!r}: uniform:A,B needs integers 1 <= A <= B")
        if kind == "normal" and not (a >= 1 and b >= 0 and math.isfinite(a) and math.isfinite(b)):
            raise UsageError(f"{option} {t!r}: normal:MU,SIGMA needs MU >= 1 and SIGMA >= 0")
        return LengthDist(kind, a, b, text=t)
    path = Path(t).expanduser()
    if not path.is_file():
        raise UsageError(f"{option} {t!r} is neither a length, a distribution nor a file", hint=hint)
    return LengthDist("file", values=tuple(_read_numbers(path, option, integer=True)), text=t)


def _read_numbers(path: Path, option: str, *, integer: bool) -> list[Any]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFormatError(path, f"cannot read {option} file: {exc}") from None
    out: list[Any] = []
    for i, line in enumerate(lines, start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            value = float(line)
        except ValueError:
            raise InputFormatError(path, f"line {i} is not a number: {line!r}",
                                   hint=f"{option} files hold one number a line") from None
        if integer:
            if value != int(value) or value < 1:
                raise InputFormatError(path, f"line {i}: {line!r} is not a length of at least 1 token")
            value = int(value)
        elif not (math.isfinite(value) and value >= 0):
            raise InputFormatError(path, f"line {i}: arrival time {line!r} must be a number of seconds >= 0")
        out.append(value)
    if not out:
        raise InputFormatError(path, f"the {option} file is empty", hint="write one number a line")
    return out


def read_arrivals(path: str | Path) -> list[float]:
    """Arrival times in seconds from the run's start, one a line (sorted on reading)."""
    return sorted(_read_numbers(Path(path).expanduser(), "--arrivals", integer=False))


def parse_rates(text: str) -> list[float]:
    """``20`` or ``1,2,4,8`` -> positive rates (requests per second)."""
    try:
        rates = [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--rate must be requests per second (or a comma-separated list), got {text!r}") from None
    if not rates or any(not math.isfinite(r) or r <= 0 for r in rates):
        raise UsageError(f"--rate must be > 0 requests per second, got {text!r}")
    return sorted(set(rates))


@dataclass(frozen=True)
class LoadRun:
    """What ``perfscope loadtest`` runs."""

    model: str = "tiny"
    rates: tuple[float, ...] = (10.0,)
    requests: int | None = None  # None: DEFAULT_REQUESTS, or as many as arrive within duration_s
    duration_s: float | None = None
    prompt_len: str = "64"
    output_len: str = "32"
    max_batch: int = 16
    max_batched_tokens: int | None = None
    seed: int = 0
    arrivals: str | None = None
    slo: dict[str, float] = field(default_factory=dict)
    profile: bool = True
    kv_dtype: str = "auto"
    device: str = "auto"
    dtype: str = "float32"
    attention: str = "sdpa"
    eos_id: int | None = None  # None: the model's own (checkpoints), or no EOS stop (random models)
    ignore_eos: bool = False
    policy: str = "continuous"
    burstiness: float = 1.0  # gamma shape of the arrival gaps (1: Poisson)
    kv_capacity: int | None = None  # KV positions of all running sequences together (preemption); None: a slot each
    kv_policy: str | None = None  # full | streaming:sink=S,window=W | h2o:budget=B[,recent=R] | quest:budget=B[,page=P]

    def check(self) -> None:
        from perfscope.engine.serving import ServeConfig, check_kv_dtype
        from perfscope.sessions.profile import DTYPES

        check_workload(self)
        if self.dtype not in DTYPES:
            raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        check_kv_dtype(self.kv_dtype)
        if not parse_kv_policy(self.kv_policy).is_full and self.kv_capacity is not None:
            raise UsageError("--kv-capacity counts every position a request has seen, while --kv-policy keeps fewer: "
                             "the two are not combined", hint="drop one of them")
        ServeConfig(self.max_batch, self.max_batched_tokens, None, self.policy, self.kv_capacity).check()


def check_workload(run: Any) -> None:
    """The workload options the engine's and the endpoint's load tests share (a :class:`LoadRun`
    or an endpoint run): rates, request count, duration, burstiness, prompt and output lengths."""
    if not run.rates or any(not math.isfinite(r) or r <= 0 for r in run.rates):
        raise UsageError(f"--rate must be > 0 requests per second, got {list(run.rates)}")
    if run.requests is not None and not 1 <= run.requests <= MAX_REQUESTS:
        raise UsageError(f"--requests must be between 1 and {MAX_REQUESTS}, got {run.requests}")
    if run.duration_s is not None and not (math.isfinite(run.duration_s) and run.duration_s > 0):
        raise UsageError(f"--duration must be > 0 seconds, got {run.duration_s}")
    if not (math.isfinite(run.burstiness) and run.burstiness > 0):
        raise UsageError(f"--burstiness must be > 0 (1: Poisson; < 1 burstier, > 1 steadier), got {run.burstiness}")
    parse_dist(run.prompt_len, "--prompt-len")
    parse_dist(run.output_len, "--output-len")


def arrival_times(run: Any, rate: float | None) -> np.ndarray:
    """Arrival times (s from the run's start) of ``run`` (a :class:`LoadRun` or an endpoint run) at ``rate``.

    Gaps are one seeded draw of unit-mean gaps scaled by 1/rate: exponential (Poisson arrivals) or,
    with ``burstiness`` b != 1, gamma of shape b and scale 1/b (vLLM's ``--burstiness``); ``arrivals``
    replays a file. Cut to ``duration_s`` and ``requests`` (default :data:`DEFAULT_REQUESTS`).
    """
    rng = np.random.default_rng(run.seed)
    b = float(getattr(run, "burstiness", 1.0))
    unit_gaps = rng.exponential(1.0, size=MAX_REQUESTS) if b == 1.0 else rng.gamma(b, 1.0 / b, size=MAX_REQUESTS)
    if run.arrivals:
        arrivals = np.asarray(read_arrivals(run.arrivals), dtype=float)
    else:
        assert rate is not None
        arrivals = np.cumsum(unit_gaps) / rate
    if run.duration_s is not None:
        arrivals = arrivals[arrivals < run.duration_s]
    n = run.requests if run.requests is not None else (len(arrivals) if run.duration_s or run.arrivals
                                                          else DEFAULT_REQUESTS)
    arrivals = arrivals[:n]
    if not len(arrivals):
        raise UsageError("no request arrives within --duration", hint="use a longer --duration or a higher --rate")
    return arrivals


def sample_lengths(run: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output lengths of ``n`` requests (the same at every rate)."""
    prompt_d, output_d = parse_dist(run.prompt_len, "--prompt-len"), parse_dist(run.output_len, "--output-len")
    lens_rng = np.random.default_rng([run.seed, 1])
    return prompt_d.sample(n, lens_rng), output_d.sample(n, lens_rng)


def random_prompt_ids(seed: int, lengths: Sequence[int] | np.ndarray, vocab_size: int) -> list[tuple[int, ...]]:
    """Seeded random token ids, one prompt per length."""
    tok_rng = np.random.default_rng([seed, 2])
    return [tuple(int(t) for t in tok_rng.integers(0, vocab_size, int(n))) for n in lengths]


def build_workload(run: LoadRun, rate: float | None, vocab_size: int, max_seq_len: int) -> list[Any]:
    """The run's requests at ``rate`` (None with ``--arrivals``): same prompts and lengths at every rate."""
    from perfscope.engine.serving import LoadRequest

    arrivals = arrival_times(run, rate)
    n = len(arrivals)
    prompt_lens, output_lens = sample_lengths(run, n)
    longest = int((prompt_lens + output_lens).max())
    if longest > max_seq_len:
        i = int((prompt_lens + output_lens).argmax())
        raise UsageError(f"request {i} needs {prompt_lens[i]} prompt + {output_lens[i]} output tokens = {longest}, "
                         f"beyond the model's context of {max_seq_len} tokens",
                         hint="use shorter --prompt-len/--output-len")
    prompts = random_prompt_ids(run.seed, prompt_lens, vocab_size)
    return [LoadRequest(i, float(arrivals[i]), prompts[i], int(output_lens[i])) for i in range(n)]


def _check_context(run: LoadRun, max_seq_len: int) -> None:
    """Fail before any work when the length distributions can exceed the model's context."""
    p, o = parse_dist(run.prompt_len, "--prompt-len").upper(), parse_dist(run.output_len, "--output-len").upper()
    if p is not None and o is not None and p + o > max_seq_len:
        raise UsageError(f"--prompt-len {run.prompt_len} + --output-len {run.output_len} reach {p + o} tokens, "
                         f"beyond the model's context of {max_seq_len}", hint="use shorter lengths")


def request_frame(result: Any) -> pd.DataFrame:
    """One row per request (the ``requests`` table) from a :class:`LoadResult`."""
    import json

    rows = []
    for t in result.requests:
        times = t.token_times_s
        n = len(times)
        first, end = (times[0], times[-1]) if n else (math.nan, math.nan)
        lat = token_latencies(t.arrival_s, times)
        rows.append({
            "request_id": t.request_id, "prompt_tokens": t.prompt_tokens, "output_tokens": n,
            "ttft_s": lat["ttft_s"], "tpot_s": lat["tpot_s"], "e2e_s": lat["e2e_s"],
            "itl_mean_s": lat["itl_mean_s"], "itl_p99_s": lat["itl_p99_s"],
            "arrival_s": t.arrival_s, "admitted_s": t.admitted_s, "first_token_s": first, "end_s": end,
            "max_output_tokens": t.max_output_tokens, "finish_reason": t.finish_reason,
            "token_times_s": json.dumps([round(x, 9) for x in times]),
            "considered_s": t.considered_s, "preemptions": len(t.preempted_s),
            "preempted_s": json.dumps([round(x, 9) for x in t.preempted_s]),
            "readmitted_s": json.dumps([round(x, 9) for x in t.readmitted_s]),
        })
    return pd.DataFrame(rows)


def step_frame(result: Any) -> pd.DataFrame:
    from perfscope.sessions.profile import step_records

    df = step_records(result.steps)
    if len(df):
        df["duration_ns"] = df["end_ns"] - df["start_ns"]
    return df


def request_steps_frame(steps: Sequence[Any], ids: dict[int, Any] | None = None) -> pd.DataFrame:
    """The ``request_steps`` table: one row per request and step it took part in (the scheduler's log:
    its role and tokens there). ``ids`` maps the engine's request ids to the report's (a server's
    own ids to the client's); rows of requests it does not hold are left out."""
    rows = []
    for s in steps:
        for rid, tokens, role in zip(s.request_ids, s.request_tokens, s.request_roles):
            if ids is not None:
                if rid not in ids:
                    continue
                rid = ids[rid]
            rows.append((rid, s.step, role, tokens))
    df = pd.DataFrame(rows, columns=["request_id", "step", "role", "tokens"])
    return df.astype({"request_id": "int64", "step": "int64", "tokens": "int64"})


def _noop(_: str) -> None:
    return None


def _warm_up(model: Any, kv_dtype: str, kv_policy: str | None = None) -> None:
    from perfscope.engine.serving import SlotEngine

    with SlotEngine(model, 2, 24, kv_dtype, kv_policy) as eng:
        eng.forward([0, 1], [[1] * 16, [2] * 8], [0, 0])
        for i in range(4):
            eng.forward([0, 1], [[3], [4]], [16 + i, 8 + i])


def _trace_tables(capture: Any, spec: DeviceSpec, steps: Sequence[Any]) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """One rate's trace as raw tables (classified once, with the other rates', when the report is finished)."""
    from perfscope.analysis.readers.kineto.reader import import_kineto
    from perfscope.sessions.profile import align_steps

    imported = import_kineto(capture.trace_path, device=spec)
    tables = dict(imported.tables)
    warnings = imported.warnings + list(capture.warnings)
    # the i-th prefill/decode range is the i-th step: step times move onto the trace's timeline
    tables["steps"], note = align_steps(steps, tables["ranges"])
    if note:
        warnings.append(note)
    return tables, warnings


def model_eos(name_or_path: str, model: Any) -> int | None:
    """The model's end-of-sequence token: its config's ``eos_token_id`` (None for random models)."""
    import json

    eos = model.args.extra.get("eos_token_id")
    folder = Path(name_or_path).expanduser()
    for name in ("generation_config.json", "config.json"):
        if eos is None and (folder / name).is_file():
            try:
                eos = json.loads((folder / name).read_text(encoding="utf-8")).get("eos_token_id")
            except (OSError, ValueError, AttributeError):
                eos = None
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    return int(eos) if isinstance(eos, int) else None


def run_loadtest(run: LoadRun, *, progress: Progress | None = None, roofs: DeviceSpec | None = None,
                 model: Any = None, clock_factory: Callable[[], Any] | None = None,
                 executor_wrap: Callable[[Any, Any], Any] | None = None) -> Report:
    """Serve the run's requests at each rate and return one Report (not saved).

    ``clock_factory`` and ``executor_wrap`` (called with the engine and the clock) simulate: a virtual
    clock advanced by a cost model around the real engine gives timings independent of the machine."""
    import torch

    from perfscope.collectors.roofs import device_roofs
    from perfscope.engine.generate import build_model
    from perfscope.engine.serving import (
        ServeConfig,
        SlotEngine,
        check_requests,
        kv_bytes_per_position,
        kv_logit_error,
        serve,
    )
    from perfscope.sessions.profile import resolve_device

    run.check()
    say = progress or _noop
    device = resolve_device(run.device)
    say("measuring device roofs (once per machine)")
    spec = roofs or device_roofs(device)
    say(f"building model {run.model}")
    if model is None:
        model = build_model(run.model, device=device, dtype=getattr(torch, run.dtype), attention=run.attention,
                            seed=run.seed)
    max_seq = model.args.max_seq_len
    _check_context(run, max_seq)
    eos = None if run.ignore_eos else (run.eos_id if run.eos_id is not None else model_eos(run.model, model))
    config = ServeConfig(run.max_batch, run.max_batched_tokens, eos, run.policy, run.kv_capacity)
    rates: list[float | None] = [None] if run.arrivals else list(run.rates)
    workloads = [build_workload(run, r, model.args.vocab_size, max_seq) for r in rates]
    for reqs in workloads:
        check_requests(reqs, model.args.vocab_size)
    say("warm-up")
    _warm_up(model, run.kv_dtype, run.kv_policy)
    parts: list[dict[str, pd.DataFrame]] = []
    runs_meta: list[dict[str, Any]] = []
    from perfscope.roof_checks import roof_warnings

    warnings: list[str] = roof_warnings(spec)
    tool_version = None
    partial = False
    for rate, reqs in zip(rates, workloads):
        label = "arrivals" if rate is None else f"rate={rate:g}"
        say(f"serving {len(reqs)} requests ({label})")
        max_len = max(len(r.prompt) + r.max_output_tokens for r in reqs)
        engine = SlotEngine(model, run.max_batch, max_len, run.kv_dtype, run.kv_policy)
        try:
            clock = clock_factory() if clock_factory else None
            executor = executor_wrap(engine, clock) if executor_wrap else engine
            work = functools.partial(serve, executor, reqs, config, clock)
            if run.profile:
                from perfscope.collectors.torch_profiler import profile_callable

                trace_dir = Path(tempfile.mkdtemp(prefix="perfscope-"))
                result, capture = profile_callable(work, trace_dir, cuda=device.startswith("cuda"))
                if result is None:
                    from perfscope.errors import PerfscopeError

                    raise PerfscopeError(f"the load test stopped before it finished: {capture.error}")
                tables, notes = _trace_tables(capture, spec, result.steps)
                warnings += notes
                tool_version = capture.torch_version
                partial = partial or capture.partial
            else:
                result = work()
                tables = {"steps": step_frame(result)}
        finally:
            engine.close()
        tables["requests"] = request_frame(result)
        tables["request_steps"] = request_steps_frame(result.steps)
        n_rate = float("nan") if rate is None else rate
        for name, df in tables.items():
            tables[name] = df.assign(run=label, rate_per_s=n_rate)
        duration = float(tables["requests"]["end_s"].max())
        offered = len(reqs) / reqs[-1].arrival_s if reqs[-1].arrival_s > 0 else float("nan")
        runs_meta.append({"run": label, "rate_per_s": rate, "offered_rate_per_s": offered, "requests": len(reqs),
                          "duration_s": duration, "wall_s": result.wall_s, "steps": len(result.steps),
                        "preemptions": sum(s.preempted for s in result.steps)})
        parts.append(tables)
    return _build_report(run, spec, model, parts, runs_meta, warnings, tool_version, partial, eos,
                         kv_bytes_per_position(model, run.kv_dtype),
                         _logit_error(model, run, kv_logit_error, say))


def _logit_error(model: Any, run: LoadRun, fn: Any, say: Progress) -> dict[str, Any] | None:
    policy = parse_kv_policy(run.kv_policy)
    if run.kv_dtype == "auto" and policy.is_full:
        return None
    what = " ".join(x for x in (run.kv_dtype if run.kv_dtype != "auto" else "", policy.text() if not policy.is_full
                                else "") if x)
    say(f"logit error of the {what} KV cache")
    rng = np.random.default_rng([run.seed, 3])
    # prompts longer than the policy keeps, so that it evicts or selects before the compared steps
    kept = policy.kept() or (policy.budget if policy.kind == "quest" else 0)
    n_prompt = min(max(32, 2 * kept), model.args.max_seq_len - 16)
    prompts = [rng.integers(0, model.args.vocab_size, n_prompt).tolist() for _ in range(4)]
    return {"kv_dtype": run.kv_dtype, "kv_policy": policy.text(), "reference": str(model.dtype).removeprefix("torch."),
            "model": model.args.name, "prompt_tokens": n_prompt, "new_tokens": 16,
            **fn(model, run.kv_dtype, prompts, 16, kv_policy=policy.text())}


def _build_report(run: LoadRun, spec: DeviceSpec, model: Any, parts: list[dict[str, pd.DataFrame]],
                  runs_meta: list[dict[str, Any]], warnings: list[str], tool_version: str | None, partial: bool,
                  eos: int | None, kv_per_pos: float, logit_error: dict[str, Any] | None) -> Report:
    from perfscope.analysis.summaries.loadtest import knee, load_metrics

    combined: dict[str, pd.DataFrame] = {}
    id_offset = 0
    for tables in parts:
        for name, df in tables.items():
            if name == "ranges" and len(df):
                df = df.assign(id=df["id"] + id_offset, parent=df["parent"] + id_offset)
            combined.setdefault(name, []).append(df)  # type: ignore[arg-type]
        if "ranges" in tables and len(tables["ranges"]):
            id_offset += int(tables["ranges"]["id"].max()) + 1
    frames = {name: pd.concat(dfs, ignore_index=True) for name, dfs in combined.items()}  # type: ignore[arg-type]
    metrics = []
    for meta in runs_meta:
        req = frames["requests"][frames["requests"]["run"] == meta["run"]]
        metrics.append({"run": meta["run"], "rate_per_s": meta["rate_per_s"],
                        **load_metrics(req, run.slo, meta["duration_s"])})
    rates = np.asarray([m["rate_per_s"] for m in metrics if m["rate_per_s"] is not None], dtype=float)
    p99 = np.asarray([m["e2e_s"]["p99"] for m in metrics if m["rate_per_s"] is not None], dtype=float)
    knee_rate = knee(rates, p99) if len(rates) > 1 else None
    n_params = sum(p.numel() for p in model.parameters())
    params = {
        **dataclasses.asdict(run), "rates": list(run.rates), "model": model.args.name, "n_params": n_params,
        "kv_policy": parse_kv_policy(run.kv_policy).text(), "n_layer": model.args.n_layer,
        "weight_bytes": float(sum(p.numel() * p.element_size() for p in model.parameters())),
        "dtype": str(model.dtype).removeprefix("torch."), "device": str(model.device), "eos_id": eos,
        "kv_cache_bytes_per_token": kv_per_pos, "batch": run.max_batch,
        "loadtest": {"runs": runs_meta, "slo": dict(run.slo), "knee_rate_per_s": knee_rate,
                     "kv_dtype": run.kv_dtype, "kv_policy": parse_kv_policy(run.kv_policy).text(),
                     "kv_logit_error": logit_error, "policy": run.policy,
                     "metrics": metrics},
    }
    name = f"loadtest-{model.args.name}-" + ("arrivals" if run.arrivals else "r" + "_".join(f"{r:g}" for r in run.rates))
    manifest = {
        "name": name,
        "source": source_info("engine-loadtest", None, "torch.profiler" if run.profile else None, tool_version),
        "command": redact_argv(sys.argv), "params": params,
        "warnings": sorted(set(warnings)), "partial": partial,
    }
    if not run.profile:
        manifest["unavailable_metrics"] = ["kernels (run with the profiler: drop --no-profile)"]
    from perfscope.analysis.readers.finish import Imported, finish

    return finish(Imported(frames, manifest, spec, origin="loadtest"))


def cli_payload(report: Report) -> dict[str, Any]:
    """The ``--json`` output: one run's metrics flat; a sweep's as ``runs`` with the knee."""
    from perfscope.analysis.summaries.tails import tails_payload

    lt = report.params["loadtest"]
    extra = {"kv_dtype": lt["kv_dtype"], "kv_policy": lt.get("kv_policy", "full"),
             **({"kv_logit_error": lt["kv_logit_error"]} if lt["kv_logit_error"] else {}), "tails": tails_payload(report)}
    return metrics_payload(lt, extra)


def metrics_payload(lt: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """A load test's metrics (``params["loadtest"]``) as ``--json`` prints them, with ``extra`` keys:
    one run's metrics flat, a sweep's as ``runs`` with the knee (the engine's and an endpoint's)."""
    metrics = [dict(m) for m in lt["metrics"]]
    if len(metrics) == 1:
        return {**metrics[0], **extra}
    return {"runs": metrics, "knee_rate_per_s": lt["knee_rate_per_s"], **extra}


__all__ = ["LengthDist", "LoadRun", "build_workload", "cli_payload", "metrics_payload", "parse_dist", "parse_rates", "read_arrivals",
           "request_frame", "request_steps_frame", "run_loadtest", "step_frame"]
