"""Profiling sessions: run a workload under a collector, analyse the capture, return a Report.

This is the one place (with the CLI) that crosses layers: engine -> collectors -> analysis.

- :func:`profile_engine` runs the built-in reference engine: an identical warm-up run (every
  shape, and any compilation, is seen before anything is measured), warm unprofiled passes (the
  headline serving metrics: TTFT, TPOT, MFU, MBU), then the profiled run (the kernel breakdown
  and the profiler's overhead), and adds both runs' step and request records to the report.
- :func:`profile_script` runs a Python script in-process under torch.profiler, with every
  transformers ``generate()`` call recorded as steps and requests; when it has some, the script
  runs again with the step timing only (the headline TTFT/TPOT).
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..analysis.summaries.runs import NOISY_BASELINE, baseline_note, judge_baseline, pass_spread
from ..errors import UnsupportedDeviceError, UsageError
from ..format import counted
from ..kv_policy import check_engine_options, parse_kv_policy
from ..redact import redact_argv, redact_text
from ..report import Report, source_info
from ..roof_checks import roof_warnings

if TYPE_CHECKING:
    from ..device import DeviceSpec

Progress = Callable[[str], None]

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class EngineRun:
    """What to run: the built-in engine's model and workload options (``perfscope profile``)."""

    model: str = "small"
    batch: int = 1
    prompt_len: int = 128
    gen_len: int = 32
    device: str = "auto"
    dtype: str = "float32"
    attention: str = "sdpa"
    chunked_prefill: int | None = None
    prefix_cache: bool = False
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    compile: bool | None = None  # None: compile decode on CUDA (CUDA graphs), eager on the CPU
    prompt_file: str | None = None  # real prompts (a model with a tokenizer): one per line, or .jsonl
    chat: bool = False  # wrap each prompt of prompt_file in the model's chat template
    ignore_eos: bool = False  # generate gen_len tokens even past the end-of-sequence token
    speculative: str | None = None  # "ngram" or "self:N" (perfscope.engine.speculative)
    draft_len: int = 4
    memory: bool = False  # profile_memory (and on CUDA the allocator's history and a snapshot)
    gemm_curve_s: float = 8.0  # budget of the GEMM size curve after the profiled run (0: none)
    kv_policy: str | None = None  # streaming:sink=S,window=W | h2o:budget=B[,recent=R] | quest:budget=B[,page=P]

    def resolved_compile(self, device: str) -> bool:
        """Whether decode is compiled on ``device``: the flag, or by default only on CUDA (speculative
        decoding runs eagerly)."""
        from perfscope.engine.generate import default_compile

        if self.compile is not None:
            return self.compile
        if not parse_kv_policy(self.kv_policy).is_full:
            return False  # a KV policy runs eagerly
        return default_compile(device.split(":")[0], self.speculative)

    def check(self) -> None:
        """Raise UsageError for out-of-range options (one clear line each)."""
        for name in ("batch", "prompt_len", "gen_len"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.chunked_prefill is not None and self.chunked_prefill < 1:
            raise UsageError(f"--chunked-prefill must be at least 1, got {self.chunked_prefill}")
        if self.dtype not in DTYPES:
            raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.attention not in ("sdpa", "naive"):
            raise UsageError(f"--attention must be sdpa or naive, got {self.attention!r}")
        check_engine_options(parse_kv_policy(self.kv_policy), compile=bool(self.compile), speculative=self.speculative)


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when available else ``cpu``; checks that ``cuda`` exists."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UnsupportedDeviceError("--device cuda was requested but this machine has no CUDA device",
                                     hint="use --device cpu")
    if not (device == "cpu" or device.startswith("cuda")):
        raise UsageError(f"--device must be cpu, cuda or auto, got {device!r}")
    return device


def _noop(_: str) -> None:
    return None


def read_prompt_file(path: str | Path) -> list[str]:
    """Prompts of a text file: one per non-empty line, or for ``.jsonl`` one JSON string (or an
    object with a ``prompt`` key) per line, so a prompt can hold newlines."""
    import json

    from ..errors import InputFormatError

    p = Path(path).expanduser()
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFormatError(p, f"cannot read the prompt file ({exc})") from exc
    prompts = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if p.suffix == ".jsonl":
            try:
                item = json.loads(line)
                prompts.append(str(item["prompt"] if isinstance(item, dict) else item))
            except (ValueError, KeyError, TypeError) as exc:
                raise InputFormatError(p, f"line {i} is not a JSON string or {{\"prompt\": ...}} ({exc})") from exc
        else:
            prompts.append(line)
    if not prompts:
        raise InputFormatError(p, "the prompt file holds no prompt", hint="write one prompt per line")
    return prompts


def engine_prompts(run: EngineRun, vocab_size: int, tokenizer: Any = None) -> list[list[int]]:
    """The run's prompts: the prompt file's, tokenized (``--chat``: with the chat template), or
    random ones (seeded); with ``--prefix-cache`` random prompts share their first half."""
    from perfscope.engine.generate import random_prompts

    if run.prompt_file:
        if tokenizer is None:
            raise UsageError(f"--prompt-file needs a model with a tokenizer; {run.model!r} has none",
                             hint="use --model smollm2-135m or a .gguf file")
        texts = read_prompt_file(run.prompt_file)
        return [tokenizer.chat_ids(t) if run.chat else tokenizer.encode(t) for t in texts]

    prompts = random_prompts(run.batch, run.prompt_len, vocab_size, seed=run.seed)
    if run.prefix_cache and run.batch > 1:
        shared = max(run.prompt_len // 2, 1)
        prompts = [prompts[0][:shared] + p[shared:] for p in prompts]
    return prompts


MAX_PASSES = 8
"""Warm unprofiled passes at most (the first ones and the retries of a noisy baseline)."""
BASELINE_RETRY_S = 30.0
"""Seconds the retries of a noisy baseline may take in all: another pass is run only while it (about
as long as the fastest so far) fits in what is left; a disagreement left makes the headline a range."""
RECHECK_PASSES = 3
"""Unprofiled passes run again after the profiled run while it was the faster (a disturbed baseline)."""


def more_passes(walls: Sequence[float], spent_s: float, *, budget_s: float = BASELINE_RETRY_S,
                max_passes: int = MAX_PASSES) -> bool:
    """Whether to run another warm unprofiled pass: the two fastest of ``walls`` disagree by more than
    :data:`NOISY_BASELINE`, fewer than ``max_passes`` ran, and one more pass (as long as the fastest)
    fits in what is left of ``budget_s`` after ``spent_s`` of retries."""
    spread = pass_spread(walls)
    if spread is None or spread <= NOISY_BASELINE or len(walls) >= max_passes:
        return False
    return spent_s + min(walls) <= budget_s


def _unprofiled_pass(once: Callable[[], Any]) -> Any:
    """One warm unprofiled pass: the engine run without the profiler (one place, so that a test can
    plant a pass slowed as a busy machine slows it)."""
    return once()


def profile_engine(run: EngineRun | None = None, *, progress: Progress | None = None,
                   roofs: DeviceSpec | None = None, keep_trace_dir: Path | None = None,
                   model: Any = None, baseline: int | bool = True, partial_on_interrupt: bool = True,
                   on_reference: Callable[[Report], None] | None = None, **overrides: Any) -> Report:
    """Profile the reference engine and return its Report (not saved).

    The run order is: an identical warm-up run (so every shape the measured runs meet, and any
    torch.compile / CUDA-graph capture, has run before), ``baseline`` warm unprofiled passes
    (the headline: the fastest pass; while the two fastest disagree by more than 10% another is
    run, up to :data:`MAX_PASSES` within :data:`BASELINE_RETRY_S` seconds of retries, and a
    disagreement left makes the headline a range), then the profiled run (the kernel breakdown; its
    own step and request records are kept beside the unprofiled ones, labelled). While the profiled
    run is faster than every unprofiled pass, up to three more passes follow (within the same
    budget); if it still is, the passes were disturbed and the headline is the profiled run's
    (:mod:`perfscope.analysis.summaries.runs` says which run to believe and why).

    Args:
        run: the workload; keyword ``overrides`` replace its fields.
        progress: called with a short stage label as the run advances.
        roofs: device roofs to classify against (default: measured once per machine, cached).
        keep_trace_dir: where to leave the raw trace (``trace.json.gz``); a temp dir by default.
        model: an already built engine model to reuse (a sweep builds it once).
        baseline: how many warm unprofiled passes to run (True: 2, False: 0; without one the
            headline falls back to the profiled run's figures).
        on_reference: with a KV policy, called with the full cache's own Report, measured beside the
            policy (its passes in turn with the policy's, then one profiled run), e.g. to project it.
        partial_on_interrupt: Ctrl-C (KeyboardInterrupt) at any stage returns a partial Report
            (:func:`interrupted_engine_report`: marked ``partial``, ``params["interrupted"]``)
            instead of raising; a Ctrl-C inside the profiled run keeps its trace as far as it ran.
    """
    run = dataclasses.replace(run or EngineRun(), **overrides)
    run.check()
    got: dict[str, Any] = {"stage": "starting", "run": run}

    def say(label: str) -> None:
        got["stage"] = label
        (progress or _noop)(label)

    try:
        report = _profile_engine(run, say, got, roofs, keep_trace_dir, model, baseline)
        if on_reference is not None and got.get("reference_report") is not None:
            on_reference(got["reference_report"])
        return report
    except KeyboardInterrupt:
        if not partial_on_interrupt:
            raise
        return interrupted_engine_report(got)


def _profile_engine(run: EngineRun, say: Progress, got: dict[str, Any], roofs: DeviceSpec | None,
                    keep_trace_dir: Path | None, model: Any, baseline: int | bool) -> Report:
    """:func:`profile_engine`'s stages; ``got`` holds what was measured so far (for Ctrl-C)."""
    import time

    import torch

    from perfscope.collectors.roofs import device_roofs
    from perfscope.collectors.torch_profiler import profile_callable
    from perfscope.engine.generate import SamplingParams, build_model, generate

    passes = 2 if baseline is True else int(baseline)
    device = resolve_device(run.device)
    policy_text = parse_kv_policy(run.kv_policy).text()
    run = dataclasses.replace(run, compile=run.resolved_compile(device), device=device,
                              kv_policy=None if policy_text == "full" else policy_text)
    got["run"] = run
    say("measuring device roofs (once per machine)")
    spec = roofs or device_roofs(device)
    got["spec"] = spec
    say(f"building model {run.model}")
    if model is None:
        model = build_model(run.model, device=device, dtype=getattr(torch, run.dtype),
                            attention=run.attention, seed=run.seed)
    tokenizer = getattr(model, "tokenizer", None)
    prompts = engine_prompts(run, model.args.vocab_size, tokenizer)
    if run.prompt_file:  # the file sets the batch and the prompt lengths
        run = dataclasses.replace(run, batch=len(prompts), prompt_len=max(len(p) for p in prompts))
        got["run"] = run
    sampling = SamplingParams(run.temperature, run.top_k, run.top_p, run.seed)
    options: dict[str, Any] = {"chunked_prefill": run.chunked_prefill, "prefix_cache": run.prefix_cache,
                               "compile": run.compile}
    if tokenizer is not None and not run.ignore_eos:
        options["stop_ids"] = tokenizer.stop_ids
    if run.speculative:
        options.update(speculative=run.speculative, draft_len=run.draft_len)
    policy = parse_kv_policy(run.kv_policy)
    if not policy.is_full:
        options["kv_policy"] = policy.text()
    # under a KV policy the full cache runs beside it, interleaved pass by pass: the saving on one clock
    reference: list[Any] | None = [] if not policy.is_full and passes > 0 else None
    got["reference"] = reference

    def once() -> Any:
        return generate(model, prompts, run.gen_len, sampling, **options)

    def full_once() -> Any:
        return generate(model, prompts, run.gen_len, sampling, **{**options, "kv_policy": None})

    say("warm-up (compiling decode)" if run.compile else "warm-up")
    if run.compile:
        torch._dynamo.reset()  # a fresh compile per workload: a sweep's shapes never hit the recompile limit
    t0 = time.perf_counter()
    once()
    warmup_s = time.perf_counter() - t0
    got["warmup_s"] = warmup_s
    if reference is not None:
        full_once()
    say("unprofiled runs" + (" (with the full cache in turn)" if reference is not None else ""))
    unprofiled: list[Any] = []
    got["unprofiled"] = unprofiled
    for _ in range(passes):
        unprofiled.append(_unprofiled_pass(once))
        if reference is not None:
            reference.append(full_once())
    retry_s = [0.0]  # the seconds the retries took (the budget of BASELINE_RETRY_S)

    def retry() -> None:
        t = time.perf_counter()
        unprofiled.append(_unprofiled_pass(once))
        retry_s[0] += time.perf_counter() - t

    while passes > 1 and more_passes([r.wall_s for r in unprofiled], retry_s[0]):
        retry()  # the two fastest passes disagree: measure again
    say("profiled run")
    trace_dir = keep_trace_dir or Path(tempfile.mkdtemp(prefix="perfscope-"))
    result, capture = profile_callable(once, trace_dir, cuda=device.startswith("cuda"), memory=run.memory)
    interrupted = bool(capture.interrupted)
    extra = 0
    try:
        while not interrupted and result is not None and unprofiled and extra < RECHECK_PASSES and \
                result.wall_s < min(r.wall_s for r in unprofiled) and \
                retry_s[0] + result.wall_s <= BASELINE_RETRY_S:
            retry()  # faster with the profiler than without: the baseline was disturbed; recheck
            extra += 1
    except KeyboardInterrupt:
        interrupted = True  # the profiled run is complete: analyse it
    got["retry_s"] = retry_s[0]
    base = min(unprofiled, key=lambda r: r.wall_s) if unprofiled else None
    curve = None
    if not interrupted and not run.compile and run.gemm_curve_s > 0:
        say("measuring the GEMM size curve")
        try:
            curve = engine_gemm_curve(model, result or base, run)
        except KeyboardInterrupt:
            interrupted = True  # no curve: whatif falls back to the trace's own sizes
    say("analysing the trace")
    if result is None and base is None:
        from perfscope.errors import PerfscopeError

        raise PerfscopeError(f"the profiled run stopped before any step: {capture.error}")
    known = engine_tensors(model, device) if run.memory else ()
    report = _engine_report(run, spec, capture, result or base, unprofiled, warmup_s, known, curve, retry_s[0])
    if reference and not interrupted:
        say("profiling the full cache (the policy's reference)")
        ref, got["reference_report"] = _full_cache_reference(run, spec, full_once, reference, device, keep_trace_dir)
        report = report.with_manifest(params={**report.params, "kv_policy_reference": ref})
    if interrupted:
        report = report.with_manifest(partial=True, params={**report.params, "interrupted": True})
    return report


def _full_cache_reference(run: EngineRun, spec: DeviceSpec, full_once: Callable[[], Any], passes: Sequence[Any],
                          device: str, keep_trace_dir: Path | None) -> tuple[dict[str, Any], Report]:
    """The full cache's decode figures beside a KV policy's: its warm unprofiled passes (run in turn with
    the policy's) and one profiled run, summarised as the policy run is (``kv_policy_reference``)."""
    from perfscope.analysis.summaries.kv_policy import decode_kv
    from perfscope.collectors.torch_profiler import profile_callable

    trace_dir = (keep_trace_dir / "full-cache") if keep_trace_dir else Path(tempfile.mkdtemp(prefix="perfscope-"))
    trace_dir.mkdir(parents=True, exist_ok=True)
    result, capture = profile_callable(full_once, trace_dir, cuda=device.startswith("cuda"))
    base = min(passes, key=lambda r: r.wall_s)
    full_run = dataclasses.replace(run, kv_policy=None)
    report = _engine_report(full_run, spec, capture, result or base, passes, float("nan"))
    return {"kv_policy": "full", "passes_wall_s": [r.wall_s for r in passes], **decode_kv(report)}, report


def _engine_name(run: EngineRun) -> str:
    return ((f"{run.model}-{Path(run.prompt_file).stem}-g{run.gen_len}" if run.prompt_file
             else f"{run.model}-b{run.batch}-p{run.prompt_len}-g{run.gen_len}")
            + (f"-{run.speculative}" if run.speculative else "")
            + (f"-{parse_kv_policy(run.kv_policy).kind}" if not parse_kv_policy(run.kv_policy).is_full else ""))


def interrupted_engine_report(got: dict[str, Any]) -> Report:
    """The partial Report of an engine profile stopped by Ctrl-C before its profiled run ended:
    no kernels (no trace was finished); the unprofiled passes that completed, if any (their steps
    and requests, the headline timing); the stage it stopped in, in a warning and the params."""
    from perfscope.analysis.readers.finish import Imported, finish

    run: EngineRun = got["run"]
    stage = str(got.get("stage", "starting"))
    passes = [r for r in got.get("unprofiled") or [] if r is not None]
    tables: dict[str, pd.DataFrame] = {}
    params: dict[str, Any] = {**dataclasses.asdict(run), "interrupted": True, "interrupted_stage": stage,
                              "warmup_s": got.get("warmup_s")}
    if passes:
        base = min(passes, key=lambda r: r.wall_s)
        tables["steps_unprofiled"] = _relative_steps(base.steps)
        tables["requests_unprofiled"] = pd.DataFrame([dataclasses.asdict(r) for r in base.requests])
        params.update(unprofiled_wall_s=base.wall_s, unprofiled_wall_s_passes=[r.wall_s for r in passes])
        kept = (f"{counted(len(passes), 'warm unprofiled pass')} completed and {'is' if len(passes) == 1 else 'are'} kept (steps_unprofiled, "
                "requests_unprofiled)")
    else:
        kept = "nothing was measured yet"
    warning = (f"interrupted (Ctrl-C) during the stage '{stage}', before the profiled run ended: no trace, so no "
               f"kernels; {kept}. Run again without interrupting for the kernel breakdown")
    manifest = {"name": _engine_name(run), "source": source_info("engine", None, "torch.profiler"),
                "command": list(sys.argv), "params": params, "warnings": [warning], "partial": True,
                "unavailable_metrics": ["kernels (the run was interrupted before its profiled pass ended)"]}
    return finish(Imported(tables, manifest, got.get("spec"), origin="the interrupted engine run"))


def baseline_params(profiled_s: float, passes_s: Sequence[float], warmup_s: float,
                    compiled: bool, *, retry_s: float | None = None,
                    phase_passes_s: Mapping[str, Sequence[float]] | None = None) -> tuple[dict[str, Any], list[str]]:
    """Manifest params comparing the profiled run with the warm unprofiled passes, and warnings.

    ``profiler_overhead_ratio`` is profiled wall / the faster unprofiled pass, as measured; a ratio
    below 1 is never called an overhead. ``baseline_verdict`` says which run to believe
    (:func:`perfscope.analysis.summaries.runs.judge_baseline`), and a verdict other than ``steady``
    makes a warning that says which and why. A ``noisy`` baseline's ``headline_range`` is, for the
    whole run (``all``) and per phase (``phase_passes_s``: each pass's phase wall seconds, in the order
    of ``passes_s``), the fastest pass's and the second fastest's seconds. ``retry_s``: the seconds the
    retries took. ``compile_s`` is the warm-up's extra time over a warm run (compilation and CUDA-graph
    capture).
    """
    from perfscope.engine.generate import compile_seconds

    base_s = min(passes_s) if passes_s else None
    ratio = profiled_s / base_s if base_s else None
    spread = pass_spread(passes_s)
    which = judge_baseline(profiled_s, passes_s)
    params: dict[str, Any] = {
        "profiled_wall_s": profiled_s, "unprofiled_wall_s": base_s, "unprofiled_wall_s_passes": list(passes_s),
        "profiler_overhead_ratio": ratio, "baseline_spread": spread, "baseline_verdict": which,
        "baseline_retry_s": retry_s, "warmup_s": warmup_s,
        "compile_s": compile_seconds(warmup_s, base_s) if compiled else None}
    if which == "noisy":
        order = sorted(range(len(passes_s)), key=lambda i: passes_s[i])[:2]
        rng = {"all": [float(passes_s[i]) for i in order]}
        for phase, walls in (phase_passes_s or {}).items():
            if len(walls) == len(passes_s):
                rng[phase] = [float(walls[i]) for i in order]
        params["headline_range"] = rng
    note = baseline_note(params)
    return params, [note] if note else []


def _relative_steps(steps: Sequence[Any]) -> pd.DataFrame:
    """An unprofiled run's step records with times from its first step's start."""
    df = pd.DataFrame([dataclasses.asdict(s) for s in steps])
    if len(df):
        t0 = int(df["start_ns"].min())
        df["start_ns"], df["end_ns"] = df["start_ns"] - t0, df["end_ns"] - t0
        df["duration_ns"] = df["end_ns"] - df["start_ns"]
    return df


def engine_tensors(model: Any, device: str) -> list[tuple[Any, ...]]:
    """The engine's tensors made before a profiled run, for its memory timeline: each parameter
    storage once (``weights``; tied embeddings share one), each KV-cache buffer (``kv_cache``) and
    the other buffers (RoPE tables, ...: ``workspace``), as (addr, bytes, op, module, source,
    category, device)."""
    index = getattr(getattr(model, "device", None), "index", None)
    dev = "cpu" if device == "cpu" else f"cuda:{index or 0}" if index is not None else device
    seen: set[int] = set()
    out: list[tuple[Any, ...]] = []

    def add(t: Any, name: str, category: str) -> None:
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen or t.untyped_storage().nbytes() == 0:
            return
        seen.add(ptr)
        out.append((float(ptr), float(t.untyped_storage().nbytes()), None, name, None, category, dev))

    for name, p in model.named_parameters():
        add(p, name, "weights")
    for name, b in model.named_buffers():
        add(b, name, "kv_cache" if name.endswith(("k_cache", "v_cache")) else "workspace")
    return out


def engine_gemm_curve(model: Any, result: Any, run: EngineRun) -> tuple[pd.DataFrame, bool] | None:
    """The engine's GEMM size curve (:mod:`perfscope.collectors.gemm_curve`): its own linear layers timed
    from 1 row to the run's largest step (its prefill), on its device, with its threads."""
    import torch

    from perfscope.collectors.gemm_curve import measure_gemm_curve

    if result is None:
        return None
    max_m = max([int(s.tokens) for s in result.steps] + [int(run.batch) * int(run.prompt_len)])
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return measure_gemm_curve(layers, max_m, budget_s=run.gemm_curve_s)


def _phase_seconds(result: Any) -> dict[str, float]:
    """Wall seconds per phase of one engine run (its steps' durations summed)."""
    out: dict[str, float] = {}
    for s in result.steps:
        out[s.phase] = out.get(s.phase, 0.0) + (s.end_ns - s.start_ns) / 1e9
    return out


def _engine_report(run: EngineRun, spec: DeviceSpec, capture: Any, result: Any, passes: Sequence[Any],
                   warmup_s: float, known: Sequence[tuple[Any, ...]] = (),
                   curve: tuple[pd.DataFrame, bool] | None = None, retry_s: float | None = None) -> Report:
    from perfscope.analysis.costs.compiled_steps import cost_compiled_attention, cost_compiled_steps
    from perfscope.analysis.costs.roofline import precision_of
    from perfscope.analysis.readers.finish import finish
    from perfscope.analysis.readers.kineto.reader import (
        MISSING_COST,
        import_kineto,
        missing_formulas_warning,
    )

    imported = import_kineto(capture.trace_path, device=spec, memory_known=known,
                             memory_known_in_totals=run.device.startswith("cuda"))
    warnings = imported.warnings + list(capture.warnings) + roof_warnings(spec)
    steps, note = align_steps(result.steps, imported.tables["ranges"], own_clock=run.device.startswith("cuda"))
    if note:
        warnings.append(note)
    kernels = imported.tables["kernels"]
    if result.params.get("compile") and not run.device.startswith("cuda"):  # inductor's CPU kernels: costs
        cost = cost_compiled_steps if result.params.get("decode_matmuls_in_kernels") else cost_compiled_attention
        kernels = cost(kernels, steps, precision_of(result.params.get("dtype")))
        warnings = [w for w in warnings if not w.startswith(MISSING_COST)] + missing_formulas_warning(kernels)
    tables = {"steps": steps, "requests": pd.DataFrame([dataclasses.asdict(r) for r in result.requests]),
              "kernels": kernels}
    per_pass = [_phase_seconds(r) for r in passes]
    phase_passes = {ph: [pp.get(ph, 0.0) for pp in per_pass] for ph in dict.fromkeys(k for pp in per_pass for k in pp)}
    timing, notes = baseline_params(result.wall_s, [r.wall_s for r in passes], warmup_s, bool(run.compile),
                                    retry_s=retry_s, phase_passes_s=phase_passes)
    base = min(passes, key=lambda r: r.wall_s) if passes else None
    if base is not None and timing["baseline_verdict"] != "disturbed":  # disturbed passes are not the headline
        tables["steps_unprofiled"] = _relative_steps(base.steps)
        tables["requests_unprofiled"] = pd.DataFrame([dataclasses.asdict(r) for r in base.requests])
    warnings += notes
    if curve is not None:
        tables["gemm_curve"] = curve[0]
        timing["gemm_curve_cut"] = curve[1]  # the budget stopped the ladder before the largest rows
    return finish(imported.with_tables(**tables).with_manifest(
        name=_engine_name(run),
        source=source_info("engine", None, "torch.profiler", capture.torch_version),
        command=redact_argv(sys.argv),
        params={**imported.params, **result.params, **dataclasses.asdict(run), **timing,
                **memory_params(capture, known)},
        warnings=warnings,
        partial=bool(capture.partial or imported.manifest.get("partial")),
    ))


def memory_params(capture: Any, known: Sequence[tuple[Any, ...]]) -> dict[str, Any]:
    """Manifest params of a ``--memory`` run: torch's own peak (CUDA), the snapshot, the engine's
    weight and KV-cache bytes as its tensors hold them."""
    out: dict[str, Any] = {}
    if getattr(capture, "torch_peak_allocated_bytes", None) is not None:
        out["torch_peak_allocated_bytes"] = capture.torch_peak_allocated_bytes
    if getattr(capture, "memory_snapshot", None) is not None:
        out["memory_snapshot"] = str(capture.memory_snapshot)
    if known:
        out["engine_weight_tensor_bytes"] = sum(k[1] for k in known if k[5] == "weights")
        out["engine_kv_cache_tensor_bytes"] = sum(k[1] for k in known if k[5] == "kv_cache")
    return out


def step_records(steps: Sequence[Any]) -> pd.DataFrame:
    """One row per step record (a dataclass); a load test's lists of each step's rows (its requests:
    ``request_ids``...) are left out, for the ``request_steps`` table
    (:func:`perfscope.sessions.loadtest.request_steps_frame`)."""
    from perfscope.engine.serving import MEMBER_FIELDS

    return pd.DataFrame([{k: v for k, v in dataclasses.asdict(s).items() if k not in MEMBER_FIELDS} for s in steps])


def align_steps(steps: Sequence[Any], ranges: pd.DataFrame, *,
                own_clock: bool = False) -> tuple[pd.DataFrame, str | None]:
    """The engine's step records on the trace's timeline.

    The i-th ``prefill``/``decode`` range of the trace is the i-th step (the engine emits one
    range per step, in order). With ``own_clock`` (CUDA: the steps were timed with CUDA events,
    while the ranges are the host's launch intervals, which run ahead of the GPU) or when the
    counts differ (a partial trace), steps keep their own clock shifted onto the trace's first
    phase range; a note says so in the second case.
    """
    df = step_records(steps)
    if not len(df):
        return df, None
    from perfscope.analysis.tree import PHASES

    marks = ranges[ranges["name"].isin(PHASES)].sort_values("start_ns")
    matched = len(marks) == len(df) and (marks["name"].to_numpy() == df["phase"].to_numpy()).all()
    if matched and not own_clock:
        df["start_ns"] = marks["start_ns"].to_numpy()
        df["end_ns"] = marks["end_ns"].to_numpy()
        note = None
    else:
        shift = int(marks["start_ns"].iloc[0]) - int(df["start_ns"].iloc[0]) if len(marks) else 0
        df["start_ns"] = df["start_ns"] + shift
        df["end_ns"] = df["end_ns"] + shift
        note = None if matched else (f"the trace has {len(marks)} prefill/decode/draft/verify ranges for {len(df)} engine steps; "
                "step times come from the engine's own clock")
    df["duration_ns"] = df["end_ns"] - df["start_ns"]
    return df, note


def profile_script(argv: Sequence[str], *, device: str = "auto", progress: Progress | None = None,
                   roofs: DeviceSpec | None = None, keep_trace_dir: Path | None = None,
                   baseline: bool = True, stack: bool = False, memory: bool = False) -> Report:
    """Run a Python script in-process under torch.profiler and return its Report.

    Every transformers ``generate()`` call of the script is recorded step by step
    (:mod:`perfscope.collectors.hf_generate`): its forwards become the ``steps`` and its sequences
    the ``requests``. When the profiled run recorded steps and ``baseline`` is set, the script is
    run once more without torch.profiler, with the step timing only: that run's steps and requests
    (``steps_unprofiled``, ``requests_unprofiled``) are the headline TTFT/TPOT, and the profiled
    run's ``generate()`` time over that run's is ``profiler_overhead_ratio``. The profiled run goes
    first: the baseline then sees every shape warm (the ratio includes the first run's one-time
    costs), and a script without ``generate()`` runs once. ``stack``: record Python stacks in the
    profiled run, whose nn.Module calls give the report its module hierarchy.
    """
    from perfscope.collectors.hf_generate import GenerateRecorder
    from perfscope.collectors.roofs import device_roofs
    from perfscope.collectors.torch_profiler import profile_callable, run_script, script_target

    script_target(argv)  # validate before measuring anything
    say = progress or _noop
    dev = resolve_device(device)
    say("measuring device roofs (once per machine)")
    spec = roofs or device_roofs(dev)
    trace_dir = keep_trace_dir or Path(tempfile.mkdtemp(prefix="perfscope-"))
    say("running the script under torch.profiler")
    with GenerateRecorder() as recorder:
        _, capture = profile_callable(lambda: run_script(argv), trace_dir, cuda=dev.startswith("cuda"),
                                      with_stack=stack, memory=memory)
    profiled, base = recorder.recording, None
    interrupted = capture.interrupted
    if baseline and profiled.steps and not capture.partial:
        say("running the script again without the profiler (headline TTFT/TPOT)")
        base, interrupted = _unprofiled_script_run(argv)
    say("analysing the trace")
    report = _script_report(argv, spec, capture, profiled, base, interrupted, dev.startswith("cuda"))
    extra = memory_params(capture, ())
    return report.with_manifest(params={**report.params, **extra}) if extra else report


def _unprofiled_script_run(argv: Sequence[str]) -> tuple[Any, bool]:
    """The script run again with the ``generate()`` step timing only: (its recording, or None when
    the run failed; interrupted)."""
    from perfscope.collectors.hf_generate import GenerateRecorder
    from perfscope.collectors.torch_profiler import run_script

    with GenerateRecorder() as recorder:
        try:
            run_script(argv)
        except KeyboardInterrupt:
            return None, True
        except Exception as exc:  # noqa: BLE001 - the second run failing must not lose the profiled one
            recorder.recording.warnings.append(f"the unprofiled run of the script failed ({type(exc).__name__}: "
                                               f"{exc}); the headline figures come from the profiled run")
            recorder.recording.steps.clear()
    return recorder.recording, False


def hf_tables(profiled: Any, base: Any, ranges: pd.DataFrame, *, cuda: bool) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """The steps and requests tables of transformers ``generate()`` recordings (the profiled run's on
    the trace's timeline; the unprofiled run's from its first step), and notes."""
    notes = list(profiled.warnings)
    tables: dict[str, pd.DataFrame] = {}
    if profiled.steps:
        steps, note = align_steps(profiled.steps, ranges, own_clock=cuda)
        tables.update(steps=steps, requests=pd.DataFrame(profiled.requests))
        notes += [note] if note else []
    if base is not None and base.steps:
        tables.update(steps_unprofiled=_relative_steps(base.steps), requests_unprofiled=pd.DataFrame(base.requests))
        notes += [w for w in base.warnings if w not in notes]
    return tables, notes


def hf_report(trace_path: Path, spec: DeviceSpec, profiled: Any, base: Any = None, *, cuda: bool,
              partial: bool = False) -> Report:
    """The Report of a torch.profiler trace with the transformers ``generate()`` recordings of the
    profiled run (``profiled``) and of an unprofiled run of the same work (``base``, or None)."""
    from perfscope.analysis.readers.finish import finish
    from perfscope.analysis.readers.kineto.reader import import_kineto

    imported = import_kineto(trace_path, device=spec)
    timing: dict[str, Any] = {}
    timing_notes: list[str] = []
    if profiled.steps:
        timing = hf_timing(profiled, base, timing_notes)
        if timing.get("baseline_verdict") == "disturbed":
            base = None  # the unprofiled run was slower than the profiled one: not the headline
    tables, notes = hf_tables(profiled, base, imported.tables["ranges"], cuda=cuda)
    notes += timing_notes
    params: dict[str, Any] = imported.params
    if profiled.steps:
        params.update(profiled.params(), **timing)
        if not params.get("unprofiled_wall_s_passes"):
            notes.append("no unprofiled run of this generate() work (--no-baseline, perfscope.profile(), or a failed "
                         "second run): TTFT/TPOT are the profiled run's, slowed by torch.profiler")
    return finish(imported.with_tables(**tables).with_manifest(
        params=params, warnings=imported.warnings + notes + roof_warnings(spec),
        partial=bool(partial or imported.manifest.get("partial"))))


def _median_decode_s(recording: Any) -> float | None:
    durations = [s.end_ns - s.start_ns for s in recording.steps if s.phase == "decode"]
    return float(np.median(durations)) / 1e9 if durations else None


def hf_timing(profiled: Any, base: Any, notes: list[str]) -> dict[str, Any]:
    """Manifest params comparing the profiled and the unprofiled ``generate()`` runs (notes appended).

    ``profiled_wall_s`` / ``unprofiled_wall_s`` are the runs' summed ``generate()`` times; the
    ``profiler_overhead_ratio`` is their median decode steps' ratio when both have decode steps
    (the profiled run goes first, so its whole-call time also holds the first call's one-time
    costs: lazy initialisation, the first forward's allocations), else the ``generate()`` time ratio.
    """
    passes = [base.generate_s] if base is not None and base.steps else []
    prof_s, base_s = _median_decode_s(profiled), _median_decode_s(base) if passes else None
    steady = prof_s is not None and base_s is not None
    runs: list[float] = [base_s] if base_s is not None and steady else passes
    timing, _ = baseline_params(prof_s if prof_s is not None and steady else profiled.generate_s,
                                runs, float("nan"), False)
    timing.update(profiled_wall_s=profiled.generate_s, unprofiled_wall_s=passes[0] if passes else None,
                  unprofiled_wall_s_passes=passes, warmup_s=None,
                  profiler_overhead_basis="median decode step" if steady else "generate() time")
    note = baseline_note(timing)  # the verdict of the basis above, said with the generate() times
    notes += [note] if note else []
    return timing


def script_name(argv: Sequence[str]) -> str:
    """A script run's report name: the script's (or ``-m`` module's) name, never an argument after
    it (which may be a secret or an output path)."""
    from perfscope.collectors.torch_profiler import script_target

    try:
        kind, target, _ = script_target(argv)
    except UsageError:
        return "script"
    return redact_text(target.rsplit(".", 1)[-1] if kind == "module" else Path(target).stem) or "script"


def _script_report(argv: Sequence[str], spec: DeviceSpec, capture: Any, profiled: Any, base: Any,
                   interrupted: bool, cuda: bool) -> Report:
    report = hf_report(capture.trace_path, spec, profiled, base, cuda=cuda, partial=capture.partial)
    return report.with_manifest(
        name=script_name(argv),
        source=source_info("torch-script", None, "torch.profiler", capture.torch_version),
        command=redact_argv(argv), warnings=report.warnings + capture.warnings,
        params={"profiled_wall_s": capture.wall_s, **report.params, "script_wall_s": capture.wall_s,
                "interrupted": interrupted},
    )


def profile_external(argv: Sequence[str], *, collector: str, options: Any = None, nvml: bool = False,
                     nvml_rate_hz: float = 10.0, work_dir: Path | None = None,
                     progress: Progress | None = None) -> tuple[Report, dict[str, Path]]:
    """Run any command under ``nsys`` or ``ncu`` (optionally with NVML sampling) and import it.

    Returns:
        (the Report, raw files to keep in the report folder by relative name). When the run
        was interrupted the report is marked partial and ``interrupted`` is set in its params.
    """
    from contextlib import nullcontext

    from perfscope.analysis.readers.detect import import_file
    from perfscope.collectors import CaptureInterrupted, get_collector
    from perfscope.errors import CollectorError

    say = progress or _noop
    col = get_collector(collector)
    opts = options if options is not None else col.options_type()  # type: ignore[attr-defined]
    work = work_dir or Path(tempfile.mkdtemp(prefix="perfscope-"))
    sampler = nvml_sampler(nvml_rate_hz) if nvml and collector != "nvml" else None
    interrupted = False
    say(f"running under {collector}")
    with sampler if sampler is not None else nullcontext():
        try:
            capture = col.collect(list(argv), work, opts)
        except CaptureInterrupted as exc:
            capture, interrupted = exc.capture, True
    if capture.primary is None or not capture.primary.exists():
        raise CollectorError(collector, list(capture.commands[-1]) if capture.commands else list(argv), None,
                             "no output file was written")
    say("importing the capture")
    reports = [p for p in capture.files if p.suffix == ".ncu-rep" and p.exists()]
    if len(reports) > 1:  # ncu top-N: one report per top kernel
        from perfscope.analysis.readers.ncu.reader import read_ncu_reps

        report = read_ncu_reps(reports)
    else:
        report = import_file(capture.primary)
    report = report.with_manifest(
        name=redact_text(Path(argv[0]).name) if argv else collector,
        source={**capture.source(), "path": capture.primary.name},
        command=[redact_argv(c) for c in capture.commands],
        partial=bool(report.manifest.get("partial") or capture.partial or interrupted),
        warnings=report.warnings + list(capture.warnings),
        unavailable_metrics=report.unavailable_metrics + list(capture.unavailable_metrics),
        params={**report.params, **dict(capture.params), "collector": collector, "interrupted": interrupted},
    )
    if sampler is not None:
        report = attach_counters(report, sampler)
    raw = {f"raw/{p.name}": p for p in capture.files if p.exists()}
    return report, raw


def nvml_sampler(rate_hz: float) -> Any:
    """An NVML sampler at ``rate_hz`` (a context manager; ``--nvml`` with any collector)."""
    from perfscope.collectors import NvmlSampler

    return NvmlSampler(rate_hz)


def profile_sweep(base: EngineRun, batches: Sequence[int], prompt_lens: Sequence[int], *,
                  progress: Callable[[str], None] | None = None, roofs: DeviceSpec | None = None) -> Report:
    """Profile every (batch, prompt length) combination into one report.

    Every table gains ``run`` (``b4-p512``), ``batch`` and ``prompt_len`` columns; the model is
    built once; each run has an identical warm-up and one warm unprofiled pass (its headline).
    """
    import torch

    from perfscope.collectors.roofs import device_roofs
    from perfscope.engine.generate import build_model

    if not batches or not prompt_lens:
        raise UsageError("a sweep needs at least one batch size and one prompt length")
    base.check()
    say = progress or _noop
    device = resolve_device(base.device)
    spec = roofs or device_roofs(device)
    model = build_model(base.model, device=device, dtype=getattr(torch, base.dtype),
                        attention=base.attention, seed=base.seed)
    parts: list[Report] = []
    for b in batches:
        for p in prompt_lens:
            say(f"batch {b}, prompt {p}")
            parts.append(profile_engine(dataclasses.replace(base, batch=b, prompt_len=p, device=device),
                                        roofs=spec, model=model, baseline=1, partial_on_interrupt=False))
    return _combine_sweep(parts, base, list(batches), list(prompt_lens), spec)


def _combine_sweep(parts: list[Report], base: EngineRun, batches: list[int], prompt_lens: list[int],
                   spec: DeviceSpec) -> Report:
    from perfscope.schema import TABLES

    tables: dict[str, list[pd.DataFrame]] = {name: [] for name in TABLES}
    runs, id_offset, gap_offset = [], 0, 0
    for part in parts:
        label = f"b{part.params['batch']}-p{part.params['prompt_len']}"
        runs.append({"run": label, "batch": part.params["batch"], "prompt_len": part.params["prompt_len"],
                     "warnings": part.warnings})
        for name in TABLES:
            df = part.table(name).assign(run=label, batch_size=part.params["batch"],
                                         prompt_len=part.params["prompt_len"])
            if name == "ranges" and len(df):
                df = df.assign(id=df["id"] + id_offset, parent=df["parent"] + id_offset)
            if name == "idle" and len(df):  # each run's gaps keep their own numbers
                df = df.assign(gap=df["gap"] + gap_offset)
            tables[name].append(df)
        id_offset += int(part.ranges["id"].max()) + 1 if len(part.ranges) else 0
        gap_offset += int(part.idle["gap"].max()) + 1 if len(part.idle) and part.idle["gap"].notna().any() else 0
    combined = {name: pd.concat(dfs, ignore_index=True) for name, dfs in tables.items() if dfs}
    manifest = {
        "name": f"sweep-{base.model}",
        "source": source_info("engine-sweep", None, "torch.profiler",
                              parts[0].manifest["source"]["tool_version"] if parts else None),
        "command": redact_argv(sys.argv),
        "device": spec.to_dict(),
        "params": {**dataclasses.asdict(base), "sweep": {"batch": batches, "prompt_len": prompt_lens,
                                                         "runs": runs}},
        "warnings": sorted({w for p in parts for w in p.warnings}),
        "partial": any(p.manifest.get("partial") for p in parts),
    }
    return Report.build(combined, manifest, source="sweep")


def attach_counters(report: Report, sampler: Any) -> Report:
    """``report`` with the NVML samples of ``sampler`` as its counters table."""
    counters = sampler.to_frame() if hasattr(sampler, "to_frame") else sampler.frame()
    missing = list(getattr(sampler, "unavailable_metrics", []))
    return report.replace(counters=counters).with_manifest(
        unavailable_metrics=report.unavailable_metrics + missing)
