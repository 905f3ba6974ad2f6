"""Column contracts of the Report tables, with units in the names, checked at every boundary.

Readers build tables with :func:`conform` (adds the optional columns they could not fill, as
missing values, and checks the required ones); :meth:`perfscope.report.Report.load` checks
them again, so a damaged report names the file and the missing column.

Missing values are NaN / None / <NA>, never 0: a number that could not be measured is missing.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .errors import ReportFormatError
from .memo import memo, memo_peek, memo_prefixed, memo_seed

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

SCHEMA_VERSION = "1.2"
"""On-disk format version (major.minor): a minor bump only adds optional columns or keys."""


@dataclass(frozen=True)
class Column:
    """One column of a Report table.

    Attributes:
        name: column name; units are part of the name (``_ns``, ``_bytes``, ``_per_s``).
        kind: ``str``, ``int``, ``float`` or ``bool``.
        required: a table without it is rejected.
        doc: one line for the README and the dashboard's hover help.
    """

    name: str
    kind: str
    required: bool = False
    doc: str = ""


def _cols(*specs: tuple[str, str, bool, str]) -> tuple[Column, ...]:
    return tuple(Column(*s) for s in specs)


KERNEL_COLUMNS = _cols(
    ("name", "str", True, "kernel name (GPU) or operator name (CPU run)"),
    ("short_name", "str", False, "base name without template arguments or namespace"),
    ("device", "str", True, "cuda:0, cpu, ..."),
    ("stream", "int", False, "CUDA stream id"),
    ("thread", "int", False, "CPU thread id (CPU operators)"),
    ("start_ns", "int", True, "start on the report's timeline, ns"),
    ("end_ns", "int", True, "end on the report's timeline, ns"),
    ("duration_ns", "int", True, "end_ns - start_ns"),
    ("correlation", "int", False, "CUDA correlation id linking the launch call"),
    ("op", "str", False, "launching framework operator (aten::mm, ...)"),
    ("op_shapes", "str", False, "JSON list of the operator's input shapes"),
    ("op_input_types", "str", False, "JSON list of the operator's input dtypes"),
    ("dtype", "str", False, "dtype of the first tensor input (float32, bfloat16, ...)"),
    ("category", "str", False, "gemm, attention, elementwise, norm, memory, comm, view, other"),
    ("grid", "str", False, "grid dimensions '(x, y, z)'"),
    ("block", "str", False, "block dimensions '(x, y, z)'"),
    ("registers_per_thread", "int", False, "registers per thread"),
    ("shared_mem_bytes", "int", False, "static + dynamic shared memory per block"),
    ("range", "str", False, "innermost NVTX / record_function path, '/'-joined"),
    ("capture_module", "str", False, "CUDA-graph replays joined to a capture trace: the nn.Module calls "
     "around the captured launch, inside the capture, '/'-joined (None otherwise)"),
    ("phase", "str", False, "prefill, decode, mixed (a step with both), draft, verify or None"),
    ("step", "int", False, "the step (steps.parquet ``step``) the kernel ran in, or None outside steps"),
    ("flops", "float", False, "floating-point (or integer tensor) operations"),
    ("dram_bytes", "float", False, "bytes moved to/from DRAM (measured) or compulsory (analytic)"),
    ("flops_source", "str", False, "ncu, analytic, graph-* (CUDA graph replays), engine-step / engine-attention (compiled CPU decode) or None"),
    ("bytes_source", "str", False, "ncu, analytic, graph-* (CUDA graph replays), engine-step / engine-attention (compiled CPU decode) or None"),
    ("flops_analytic", "float", False, "analytic FLOPs kept beside measured ones"),
    ("dram_bytes_analytic", "float", False, "analytic bytes kept beside measured ones"),
    ("analytic_op", "str", False, "the op flops_analytic / dram_bytes_analytic price (wqkv 512x3072x2048, ...)"),
    ("analytic_source", "str", False, "engine (useful work of perfscope's engine at its shapes), trace (the "
     "launching op's cost in a Kineto trace of the same program) or None"),
    ("arith_intensity", "float", False, "flops / dram_bytes, FLOP/byte"),
    ("achieved_flops_per_s", "float", False, "flops / duration"),
    ("achieved_bytes_per_s", "float", False, "dram_bytes / duration"),
    ("precision", "str", False, "fp64, fp32, tf32, bf16, fp16, fp8, int8"),
    ("bound", "str", False, "memory, compute, latency or unknown: the measured limiter's where Nsight Compute or "
     "rocprof-compute measured each unit (latency: no unit at 60% of its peak), else the roofline's"),
    ("roofline_bound", "str", False, "memory, compute or unknown: the roofline's reading (FLOPs and bytes against "
     "the roofs), kept where the measured limiter sets bound"),
    ("limiter", "str", False, "the measured unit with the highest share of its peak: a pipe of the SM/CU (alu, fma, "
     "tensor, xu, lsu, valu, mfma...), sm when no pipe was measured, or a memory level (l1, shared, l2, dram); "
     "None where no unit was measured"),
    ("limiter_pct", "float", False, "the limiter's % of its peak (the SM's throughput when a pipe is named)"),
    ("roof_flops_per_s", "float", False, "attainable FLOP/s at this intensity"),
    ("pct_of_roof", "float", False, "achieved / attainable, percent"),
    # hierarchical roofline (schema 1.2, additive): bytes per memory level and the level whose roof binds
    ("l2_bytes", "float", False, "bytes moved between the L1s and L2 (measured: ncu lts__t_bytes, AMD TCP-TCC requests)"),
    ("l1_bytes", "float", False, "bytes moved through L1 / vL1D (ncu l1tex__t_bytes, AMD TCP accesses x 64)"),
    ("shared_bytes", "float", False, "shared memory / LDS bytes (ncu shared wavefronts, AMD LDS bank activity)"),
    ("bound_level", "str", False, "dram, l2, l1 or shared: the measured limiter's level where a memory level limits "
     "the kernel, else the memory level with the lowest roof at the kernel's intensities (the one that binds); "
     "None without bytes at a level with a known roof"),
    ("level_roof_flops_per_s", "float", False, "attainable FLOP/s of the binding level (intensity there x its "
     "bandwidth); at or above the compute peak: compute-bound at every level"),
    ("family_intensity", "float", False, "FLOP/byte implied by the kernel family's own template arguments where "
     "FLOPs and bytes are unknown (llama.cpp mul_mat_vec_q: 2 x columns / bytes per quantized weight); bounds the "
     "kernel on the roofline, its % of roof stays unknown"),
    ("flops_by_precision", "str", False, "JSON of measured FLOPs per unit and precision (AMD: valu_fp32, mfma_bf16, ...)"),
)

KERNEL_UNIT_COLUMNS = _cols(
    ("sm_throughput_pct", "float", False, "SM throughput, % of peak over the elapsed time (ncu "
     "sm__throughput.avg.pct_of_peak_sustained_elapsed: the busiest of the SM's pipes and issue)"),
    ("dram_throughput_pct", "float", False, "DRAM/HBM bandwidth, % of peak (ncu gpu__dram_throughput; AMD: "
     "HBM bytes / time / the DRAM roof)"),
    ("l2_throughput_pct", "float", False, "L2 throughput, % of peak (ncu lts__throughput; AMD TCC requests x "
     "128 B over the L2 channels' peak)"),
    ("l1_throughput_pct", "float", False, "L1 throughput, % of peak over the elapsed time (ncu l1tex__throughput "
     "_elapsed, or its _active value x SM active / elapsed cycles; AMD vL1D accesses x 128 B over its peak)"),
    ("shared_throughput_pct", "float", False, "shared memory/LDS bandwidth, % of peak (AMD LDS accesses)"),
    *(("pipe_" + p + "_pct", "float", False, f"{p} pipe utilization, % of peak over the elapsed time (ncu "
       f"sm__pipe_{p}_cycles_active / sm__inst_executed_pipe_{p}, the larger; AMD rocprof-compute's "
       "VALU/MFMA/SALU/VMEM/branch utilization)")
      for p in ("alu", "fma", "fp16", "fp64", "tensor", "xu", "lsu", "uniform", "adu", "cbu", "tex", "tma",
                "valu", "mfma", "salu", "vmem", "branch")),
)
"""Each unit's measured share of its peak, the input of the kernel's ``limiter``
(:mod:`perfscope.analysis.costs.limiter`). Optional columns that only an Nsight Compute or rocprof-compute
import fills: declared here, not in :data:`KERNEL_COLUMNS`, so that every other kernel table (a million
rows of a trace) does not carry them as missing values; :func:`conform` keeps them as extra columns."""

KERNEL_COMM_COLUMNS = _cols(
    ("process_group", "str", False, "the process group a collective kernel ran in: its name in the trace's "
     "distributedInfo.pg_config (Kineto's Process Group Name on NCCL/RCCL kernels, PyTorch 2.x)"),
)
"""Collective kernels' process group: declared here, not in :data:`KERNEL_COLUMNS`, so that a kernel
table whose trace names no group does not carry it; :func:`conform` keeps it as an extra column."""

KERNEL_DISPATCH_COLUMNS = _cols(
    ("dispatch_id", "int", False, "the dispatch's sequence number in its process (rocprofv3 Dispatch_Id, rocpd "
     "dispatch_id, rocprof v1/v2 Index / Dispatch_ID): global across agents and queues, so the ids a trace lacks "
     "between its first and last kernel are dispatches it does not hold (a kernel filter, sampling, lost records)"),
)
"""AMD traces' dispatch sequence numbers: declared here, not in :data:`KERNEL_COLUMNS`, so that a kernel table whose
trace numbers no dispatch does not carry it; :func:`conform` keeps it as an extra column. The idle classification
reads it (:mod:`perfscope.analysis.idle`: cause ``unrecorded``)."""

RANGE_COLUMNS = _cols(
    ("id", "int", True, "range id, unique in the report"),
    ("name", "str", True, "range message"),
    ("start_ns", "int", True, "start, ns"),
    ("end_ns", "int", True, "end, ns"),
    ("duration_ns", "int", False, "end_ns - start_ns"),
    ("depth", "int", False, "nesting depth, 0 = outermost"),
    ("parent", "int", False, "id of the enclosing range"),
    ("path", "str", False, "'/'-joined names from the outermost range"),
    ("domain", "str", False, "NVTX domain (None = default)"),
    ("thread", "int", False, "thread id"),
    ("source", "str", False, "nvtx, record_function, gpu_annotation, module (nn.Module calls of a with_stack trace)"),
)

TRANSFER_COLUMNS = _cols(
    ("kind", "str", True, "HtoD, DtoH, DtoD, PtoP, HtoH, memset, other"),
    ("bytes", "int", False, "bytes copied or set (None where the trace does not record them: ROCm's Kineto copies)"),
    ("start_ns", "int", True, "start, ns"),
    ("end_ns", "int", True, "end, ns"),
    ("duration_ns", "int", False, "end_ns - start_ns"),
    ("device", "str", False, "cuda:N"),
    ("stream", "int", False, "CUDA stream"),
    ("correlation", "int", False, "CUDA correlation id"),
    ("pinned", "bool", False, "host side is pinned memory (None when unknown)"),
    ("src_kind", "str", False, "Pageable, Pinned, Device, ..."),
    ("dst_kind", "str", False, "Pageable, Pinned, Device, ..."),
    ("range", "str", False, "innermost range path of the launching call"),
)

API_COLUMNS = _cols(
    ("name", "str", True, "API function (cudaLaunchKernel, ...)"),
    ("start_ns", "int", True, "start, ns"),
    ("end_ns", "int", True, "end, ns"),
    ("duration_ns", "int", False, "end_ns - start_ns"),
    ("thread", "int", False, "thread id"),
    ("correlation", "int", False, "CUDA correlation id"),
    ("kind", "str", False, "runtime or driver"),
)

COUNTER_COLUMNS = _cols(
    ("t_ns", "int", True, "sample time on the report's timeline, ns"),
    ("device", "str", False, "cuda:N"),
    ("gpu_util_pct", "float", False, "NVML utilization.gpu, %"),
    ("mem_util_pct", "float", False, "NVML utilization.memory, %"),
    ("sm_clock_mhz", "float", False, "SM clock, MHz"),
    ("mem_clock_mhz", "float", False, "memory clock, MHz"),
    ("power_w", "float", False, "board power, W"),
    ("temp_c", "float", False, "GPU temperature, deg C"),
    ("mem_used_bytes", "float", False, "device memory in use, bytes"),
)

NVML_PARAMS_KEY = b"perfscope.nvml.params"
"""Parquet metadata key of an ``nvml.parquet`` file holding the sampler's params as JSON."""

REQUEST_COLUMNS = _cols(
    ("request_id", "int", True, "request index in the batch"),
    ("prompt_tokens", "int", False, "prompt length, tokens (missing where it could not be counted: an endpoint's "
     "text prompt without usage in the stream nor a tokenizer)"),
    ("output_tokens", "int", True, "generated tokens"),
    ("ttft_s", "float", True, "time to first token, s"),
    ("tpot_s", "float", False, "time per output token after the first, s"),
    ("e2e_s", "float", True, "end-to-end latency, s"),
    ("itl_mean_s", "float", False, "mean inter-token latency, s"),
    ("itl_p99_s", "float", False, "p99 inter-token latency, s"),
    # load tests (``perfscope loadtest``; schema 1.1): times in s from the run's start
    ("arrival_s", "float", False, "arrival time, s from the run's start"),
    ("admitted_s", "float", False, "admission (KV slot taken), s from the run's start"),
    ("first_token_s", "float", False, "first token, s from the run's start"),
    ("end_s", "float", False, "last token, s from the run's start"),
    ("max_output_tokens", "int", False, "output tokens asked for (EOS may stop earlier)"),
    ("finish_reason", "str", False, "length or eos"),
    ("token_times_s", "str", False, "JSON list of every token's time, s from the run's start"),
    # transformers generate() and the engine: padding is not prompt; speculative decoding
    ("prompt_padded_tokens", "int", False, "the padded prompt width the request ran at (its prompt_tokens are "
     "the real ones, from the attention mask)"),
    ("prompt_padding_pct", "float", False, "share of the padded prompt width that is padding, %"),
    ("drafted_tokens", "int", False, "speculative decoding: draft tokens proposed for this request"),
    ("accepted_tokens", "int", False, "speculative decoding: draft tokens accepted"),
    ("acceptance_pct", "float", False, "speculative decoding: accepted / drafted, %"),
    ("mean_accepted_len", "float", False, "speculative decoding: mean draft tokens accepted per verify step "
     "(the step emits one more, the target's own)"),
    # the scheduler's log of a load test (issue 42): what the request waited for
    ("considered_s", "float", False, "the scheduler's first look at the request after its arrival (admitted then, "
     "or refused for want of a KV slot or KV room), s from the run's start"),
    ("preemptions", "int", False, "times the request was preempted (its KV cache dropped, recomputed on readmission)"),
    ("preempted_s", "str", False, "JSON list of its preemption times, s from the run's start"),
    ("readmitted_s", "str", False, "JSON list of its readmission times after each preemption"),
    ("response_id", "str", False, "an endpoint's id of the response (the stream's id: cmpl-..., chatcmpl-...)"),
)

STEP_COLUMNS = _cols(
    ("step", "int", True, "step index"),
    ("phase", "str", True, "prefill, decode, mixed (prefill and decode tokens in one step), or speculative draft / verify"),
    ("batch", "int", False, "sequences in the step (missing for a --steps range whose name does not say)"),
    ("tokens", "int", False, "tokens processed in the step (None when the step's label does not say)"),
    ("context_len", "int", False, "context length after the step, tokens"),
    ("start_ns", "int", True, "start on the report's timeline, ns"),
    ("end_ns", "int", True, "end, ns"),
    ("duration_ns", "int", False, "end_ns - start_ns"),
    ("weight_bytes", "float", False, "weight bytes read by the step"),
    ("kv_cache_bytes", "float", False, "KV-cache bytes read by the step"),
    ("kv_cache_size_bytes", "float", False, "KV-cache bytes allocated and in use after the step"),
    ("kv_entries", "float", False, "KV entries (tokens) one sequence's attention read in the step, mean over the "
     "layers: the context, or what a --kv-policy kept or selected (engine steps)"),
    # load tests (``perfscope loadtest``; schema 1.1)
    ("iteration", "int", False, "scheduler iteration (a prefill and a decode step may share one)"),
    ("prefill_tokens", "int", False, "prompt tokens prefilled in the step"),
    ("decode_seqs", "int", False, "sequences decoding one token in the step"),
    ("kv_slots_in_use", "int", False, "KV-cache slots (sequences) held during the step"),
    ("kv_slots_total", "int", False, "KV-cache slots of the engine (max batch)"),
    ("queue_len", "int", False, "requests arrived and waiting for a slot"),
    ("flops", "float", False, "model FLOPs of the step (matmuls and attention, analytic)"),
    ("drafted", "int", False, "speculative verify step: draft tokens checked"),
    ("accepted", "int", False, "speculative verify step: draft tokens accepted"),
    # steps of any framework (schema 1.2): vLLM / SGLang annotations, transformers generate(), by hand
    ("framework", "str", False, "who marked the step: engine, vllm, sglang, hf (transformers generate()), user"),
    ("label", "str", False, "the step's annotation as the trace has it (range name)"),
    ("prefill_seqs", "int", False, "sequences prefilling (new tokens > 1) in the step"),
    ("context_tokens", "int", False, "sum over the step's sequences of their context (KV) length, tokens"),
    ("kernel_time_ns", "int", False, "sum of the durations of the kernels that ran in the step, ns"),
    ("kernel_flops", "float", False, "sum of those kernels' FLOPs (missing when under 90% of their time is costed)"),
    ("kernel_dram_bytes", "float", False, "sum of those kernels' DRAM bytes (same rule)"),
    ("outlier", "str", False, "why the step is kept out of the headline numbers (first step, host stall, ...) or None"),
    ("attention_prefill_share", "float", False, "share of the step's attention work (sum over requests of new "
     "tokens x context) in its prefilling requests, from a label with per-request lengths (vLLM), else None"),
    ("preempted", "int", False, "load tests: requests preempted in the step's iteration before it"),
)

REQUEST_STEP_COLUMNS = _cols(
    ("request_id", "int", True, "the request (requests.parquet request_id)"),
    ("step", "int", True, "a step (steps.parquet step) the request took part in"),
    ("role", "str", True, "its part in the step: prefill (a chunk of its prompt), recompute (its cache rebuilt after "
     "a preemption), decode (one token), done (a finished row of a static batch)"),
    ("tokens", "int", False, "its tokens in the step"),
)

IDLE_COLUMNS = _cols(
    ("device", "str", True, "the device that was idle (cuda:0, cpu, ...)"),
    ("start_ns", "int", True, "start of the idle slice on the report's timeline, ns"),
    ("end_ns", "int", True, "end, ns"),
    ("duration_ns", "int", True, "end_ns - start_ns"),
    ("cause", "str", True, "why the device waits: launch, host, sync, copy, graph, profiler, unrecorded or unknown (docs/idle.md)"),
    ("host_kind", "str", False, "host slices: dispatch, cpu compute, waiting, host code or untraced (docs/idle.md); None otherwise"),
    ("range", "str", False, "innermost NVTX / record_function / nn.Module range around the slice on the host"),
    ("api", "str", False, "the host call the slice fell in (copies: the copy call; sync: the sync call whose return "
     "opened the gap; graph: the graph launch)"),
    ("op", "str", False, "the CPU operator the host ran over the slice (outermost on the launching thread), or its "
     "host math call (numpy.linalg.svd); sync: the operator behind the sync call (aten::item, aten::to)"),
    ("op_shapes", "str", False, "that operator's input shapes (JSON, record_shapes)"),
    ("function", "str", False, "the innermost Python function of the user's code around the slice (with_stack)"),
    ("wait", "str", False, "the OS-runtime call (nsys OSRT: futex, poll, nanosleep...) or blocking Python call "
     "(time.sleep, lock acquire) the host was in"),
    ("gap", "int", False, "the gap (idle interval between two pieces of device work) the slice belongs to, numbered "
     "per device from 0"),
    ("correlation", "int", False, "the copy call's correlation id (launch: the launch call's; graph: the replay's)"),
    ("bytes", "float", False, "bytes of the copy the call made (copies)"),
    ("pinned", "bool", False, "the copy's host memory is pinned (None when unknown)"),
    ("first_launch", "bool", False, "launch slices: the call launched the first kernel of its name on its device in "
     "the trace (where modules load lazily, the launch that loads its code); None on other slices and where the "
     "trace does not say which kernel the call launched"),
    ("window_ns", "float", False, "length of the device's window (inference window, or first to last work), ns"),
    ("window_pct", "float", False, "the slice's share of that window, percent"),
    ("unrecorded_dispatches", "int", False, "unrecorded slices: the dispatch ids the whole trace lacks between the "
     "last kernel dispatched before the gap and the first started after it (kernels the trace does not hold); "
     "None on other slices and on traces without dispatch ids"),
    ("dispatch_before", "int", False, "unrecorded slices: the highest dispatch id started before the gap"),
    ("dispatch_after", "int", False, "unrecorded slices: the lowest dispatch id started after the gap"),
)

HOST_COLUMNS = _cols(
    ("kind", "str", True, "op (a CPU operator, outermost on its thread), python (a function of the user's code, "
     "recorded with_stack), wait (an OS-runtime call, or a Python call that blocks: sleep, lock, select, read) or "
     "math (the outermost call into a host math library: numpy, scipy)"),
    ("name", "str", True, "the operator, the function ('file.py(line): name') or the call"),
    ("start_ns", "int", True, "start on the report's timeline, ns"),
    ("end_ns", "int", True, "end, ns"),
    ("duration_ns", "int", False, "end_ns - start_ns"),
    ("thread", "int", False, "thread id"),
    ("device_calls", "int", False, "ops: launch, copy and memset calls made inside it (0: it queued no device work)"),
    ("host_compute", "bool", False, "ops: computed on the host: it queued no device work, and it or an operator "
     "inside it is more than a view, an allocation or a scalar read"),
    ("inner_op", "str", False, "ops: the longest operator inside it that computes (aten::bmm inside aten::matmul)"),
    ("op_shapes", "str", False, "ops: JSON list of its input shapes (record_shapes)"),
    ("op_input_types", "str", False, "ops: JSON list of its input dtypes"),
)

MEMORY_COLUMNS = _cols(
    ("t_ns", "int", True, "event time on the report's timeline, ns"),
    ("device", "str", True, "cuda:N or cpu"),
    ("action", "str", True, "alloc, free (torch's allocated bytes drop), free_completed (the block is reusable), "
     "segment_alloc / segment_free (reserved memory), oom; a pre-existing allocation is an alloc row at the first "
     "event with preexisting true"),
    ("size_bytes", "int", False, "bytes of the allocation (or segment), positive"),
    ("delta_bytes", "int", False, "change of allocated bytes made by the event (+ alloc, - free, 0 otherwise)"),
    ("allocated_bytes", "int", False, "bytes allocated on the device after the event"),
    ("reserved_bytes", "int", False, "bytes reserved by the caching allocator after the event (None: not recorded)"),
    ("addr", "int", False, "address of the block"),
    ("stream", "int", False, "CUDA stream of the block"),
    ("alloc_id", "int", False, "the allocation an alloc and its free rows share"),
    ("alloc_t_ns", "int", False, "free rows: when the allocation was made (None: before the record)"),
    ("free_t_ns", "int", False, "alloc rows: when it was freed (None: still live at the end)"),
    ("preexisting", "bool", False, "allocated before the record began (from the snapshot's segments or a free "
     "without its alloc)"),
    ("op", "str", False, "operator that made the allocation (aten::mm, ...)"),
    ("module", "str", False, "nn.Module path around it"),
    ("source", "str", False, "innermost user source line, 'file.py:line function' (snapshot frames)"),
    ("stack", "str", False, "the user's Python frames from the source line outwards, ' < '-joined (snapshot frames)"),
    ("category", "str", False, "weights, kv_cache, activations, workspace, optimizer, gradient, cuda_graph_pool, "
     "before_recording, unknown (docs/memory.md: the rules)"),
    ("category_rule", "str", False, "the rule that gave the category"),
    ("phase", "str", False, "prefill, decode, ... of the step around the event"),
    ("step", "int", False, "the step (steps.parquet) around the event"),
    ("memory_source", "str", False, "kineto, snapshot, memory_timeline (torch.profiler export_memory_timeline)"),
    ("event", "int", False, "the event's place in its device's record, from 0 (-1: there before the record); "
     "an instant is 'after event k'"),
    ("free_event", "int", False, "alloc rows: the event that freed it (None: still live at the end)"),
    ("requested_bytes", "float", False, "bytes the caller asked for, before the allocator rounded them (snapshot "
     "blocks at the dump)"),
)

GAUGE_COLUMNS = _cols(
    ("t_s", "float", True, "scrape time, s from the load test's start (the requests' clock)"),
    ("metric", "str", True, "canonical gauge: kv_cache_usage_pct, requests_running, requests_waiting, "
     "preemptions_total, prefix_cache_hit_pct, spec_decode_acceptance_pct, ..."),
    ("value", "float", False, "the value (percentages 0-100; counters cumulative)"),
    ("server_name", "str", False, "the server's own metric name (vllm:gpu_cache_usage_perc, sglang:token_usage, ...)"),
    ("labels", "str", False, "the sample's labels as JSON"),
)

GEMM_CURVE_COLUMNS = _cols(
    ("n", "int", True, "the weight's output features (a GEMM's N)"),
    ("k", "int", True, "the weight's input features (a GEMM's K)"),
    ("dtype", "str", True, "the weight's dtype, as torch.profiler names it in op_input_types (float, c10::BFloat16)"),
    ("m", "int", True, "rows of the activation (a GEMM's M: the step's tokens)"),
    ("time_ns", "float", True, "one call's time at these sizes, measured on the report's device (best of rounds)"),
    ("copies", "int", False, "copies of the layer the calls cycled through, so each read its weight from memory"),
)

TABLES: dict[str, tuple[Column, ...]] = {
    "kernels": KERNEL_COLUMNS,
    "ranges": RANGE_COLUMNS,
    "transfers": TRANSFER_COLUMNS,
    "api": API_COLUMNS,
    "counters": COUNTER_COLUMNS,
    "requests": REQUEST_COLUMNS,
    "steps": STEP_COLUMNS,
    "requests_unprofiled": REQUEST_COLUMNS,
    "steps_unprofiled": STEP_COLUMNS,
    "request_steps": REQUEST_STEP_COLUMNS,
    "idle": IDLE_COLUMNS,
    "host": HOST_COLUMNS,
    "memory": MEMORY_COLUMNS,
    "gauges": GAUGE_COLUMNS,
    "gemm_curve": GEMM_CURVE_COLUMNS,
}
"""Every table of a Report; each is stored as ``<name>.parquet`` (or a ``<name>/`` dataset).

``steps`` and ``requests`` are the profiled run's (on the trace's timeline); an engine report also
holds ``steps_unprofiled`` and ``requests_unprofiled``: the same workload run warm without the
profiler (times from that run's start), the source of the headline serving metrics.
``request_steps`` joins a load test's requests to the steps they took part in (the scheduler's log;
``run`` column as the others). ``gemm_curve``
is an engine profile's GEMM size curve (:mod:`perfscope.collectors.gemm_curve`), measured on the
report's device after the profiled run. ``host`` is the host's own activity that explains the
device's idle time (docs/idle.md), read by :mod:`perfscope.analysis.idle`. Reports written before
these tables existed load with them empty."""

PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")
BOUNDS = ("memory", "compute", "latency", "unknown")


def column_names(table: str) -> list[str]:
    """Names of every column of ``table``, in contract order."""
    return [c.name for c in TABLES[table]]


FACTORIZE_BY_IDENTITY_MIN_ROWS = 20_000
"""From this many rows, an object column whose rows share a few string objects (names looked up
from a string table) is factorized by object identity first (see :func:`factorize`)."""


FACTORIZE_BY_IDENTITY_MIN_CHARS = 40
"""... and when its text is this long on average (shorter text hashes faster than the detour)."""


def factorize(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """``pd.factorize(values)`` (codes, -1 where missing; distinct values as an object array, in
    order of first appearance), fast for long repeated names.

    pandas hashes the UTF-8 bytes of every text element again; for 1M long C++ kernel names that
    are a few dozen shared Python objects (a reader maps name ids through its string table) that
    costs a third of a second per column. Such columns are factorized on the objects' identities
    (integers), then the few distinct objects on their values, which gives the same result.
    """
    n = len(values)
    if values.dtype == object and n >= FACTORIZE_BY_IDENTITY_MIN_ROWS:
        array = values.to_numpy()
        sample = array[:: max(1, n // 2000)]
        long_text = sum(len(v) for v in sample if isinstance(v, str)) >= FACTORIZE_BY_IDENTITY_MIN_CHARS * len(sample)
        if long_text and len({id(v) for v in sample}) <= 200:  # long names in shared objects: identity first
            ids = np.fromiter(map(id, array), dtype=np.int64, count=n)
            id_codes = pd.factorize(ids)[0]
            # codes number objects by first appearance: the first occurrences, in order, are one per code
            first = np.flatnonzero(~pd.Series(id_codes).duplicated().to_numpy())
            codes, uniques = pd.factorize(array[first], use_na_sentinel=True)
            return codes[id_codes], np.asarray(uniques, dtype=object)
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    return codes, np.asarray(uniques, dtype=object)


def map_distinct(values: pd.Series, fn: Callable[[object], object]) -> pd.Series:
    """``values.map(fn)`` calling ``fn`` once per distinct value (missing ones as None), as an
    object Series: the same on every pandas version, whatever dtype ``values`` has (object,
    ``str``/``string``, Arrow, nullable integer)."""
    return pd.Series(map_codes(*factorize(values), fn), index=values.index, dtype="object")


def map_codes(codes: np.ndarray, distinct: np.ndarray, fn: Callable[[object], object]) -> np.ndarray:
    """``fn`` of each value that :func:`factorize` codes stand for, as an object array, calling
    ``fn`` once per distinct value (and once with None for the missing, code -1)."""
    return decode(codes, np.array([fn(u) for u in distinct], dtype=object), fn(None))


CODES_KEY = "schema:codes:"
"""The memo key prefix of a table's :func:`column_codes`."""
ROWS_OF_KEY = "schema:rows-of"
"""The memo key of a cut's (parent table, row positions), set by :func:`rows_where` and :func:`subset`."""


def column_codes(table: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    """``pd.factorize(table[column])`` computed once per table object: (codes, -1 where missing;
    the distinct values as an object array). Hashing a 1M-row text column costs a quarter of a
    second; the rules, tables and figures of one report ask for the same few columns. A cut made by
    :func:`subset` or :func:`rows_where` takes its parent's codes (renumbered, not hashed again)."""
    return memo(table, f"{CODES_KEY}{column}", lambda: _codes_of(table, column))


def _codes_of(table: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    link = memo_peek(table, ROWS_OF_KEY)
    if link is not None and column in link[0]:
        parent, pos = link
        codes, distinct = column_codes(parent, column)
        return recode(codes[pos], distinct)
    return factorize(table[column])


def recode(codes: np.ndarray, distinct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes of some rows of a factorized column (-1: missing) renumbered in order of first appearance,
    with only the distinct values they use: what :func:`factorize` of those rows gives, without hashing text.

    The values seen are collected a million rows at a time (each slice's few distinct codes), so no
    hash table or sort of the whole column is made: the only full-length array is the result."""
    codes = np.asarray(codes)
    narrow = np.int32 if codes.dtype.itemsize <= 4 else np.intp  # narrow codes (the idle table's) stay narrow
    order: list[int] = []
    seen: set[int] = set()
    for lo in range(0, len(codes), RECODE_SLICE):
        for c in pd.unique(codes[lo:lo + RECODE_SLICE]).tolist():
            if c not in seen:
                seen.add(c)
                order.append(c)
    used = np.array([c for c in order if c >= 0], dtype=np.int64)
    table = np.full(len(distinct) + 1, -1, dtype=narrow)  # position 0 is the missing code -1
    table[used + 1] = np.arange(len(used), dtype=narrow)
    per = table[codes + 1]
    if len(order) <= 1 and len(per) >= COMPACT_MIN_ROWS:
        per = repeated(per[0], len(per))  # one value (or none) in every row: held once
    return per, np.asarray(distinct, dtype=object)[used]


RECODE_SLICE = 1 << 20
"""Rows :func:`recode` looks at a time."""


def seed_codes(table: pd.DataFrame, column: str, codes: np.ndarray, distinct: np.ndarray) -> None:
    """Give ``table[column]`` its :func:`column_codes` from the codes its maker built it from (``codes``
    index ``distinct``, -1 missing; any order, unused values allowed: renumbered as :func:`factorize` would)."""
    memo_seed(table, f"{CODES_KEY}{column}", recode(codes, distinct))


def carry_codes(source: pd.DataFrame, target: pd.DataFrame) -> None:
    """Give ``target``, a table with the same rows in the same order as ``source`` (a conformed copy), the
    column codes memoized on ``source``."""
    if target is source:
        return
    for key, value in memo_prefixed(source, CODES_KEY).items():
        col = key[len(CODES_KEY):]
        if col in target.columns and col in source.columns and target[col].dtype == source[col].dtype:
            memo_seed(target, key, value)


def subset(table: pd.DataFrame, mask: np.ndarray) -> pd.DataFrame:
    """``table[mask]`` (``mask`` a bool array), or ``table`` itself when every row is kept (no copy, and
    its memoized codes kept); the cut's :func:`column_codes` come from the table's, not hashed again."""
    mask = np.asarray(mask, bool)
    if mask.all():
        return table
    out = table[mask]
    memo_seed(out, ROWS_OF_KEY, (table, np.flatnonzero(mask)))
    return out


def rows_where(table: pd.DataFrame, column: str, value: object) -> pd.DataFrame:
    """The rows of ``table`` whose ``column`` is ``value``, compared on the column's memoized codes (no
    per-row text compare): ``table`` itself when every row is (one device's report cut per device)."""
    if not len(table):
        return table
    codes, distinct = column_codes(table, column)
    hit = [i for i, v in enumerate(distinct.tolist()) if v == value]
    return subset(table, codes == hit[0] if hit else np.zeros(len(table), bool))


def value_mask(table: pd.DataFrame, column: str, predicate: Callable[[object], object]) -> np.ndarray:
    """Per row of ``table``, ``bool(predicate(value))`` (None for a missing value), as a bool array:
    ``predicate`` runs once per distinct value, on the table's memoized :func:`column_codes`, so
    ``table[column] == x`` or ``.isin(...)`` over a 1M-row text column costs no hashing."""
    codes, distinct = column_codes(table, column)
    flags = np.array([bool(predicate(v)) for v in distinct] + [bool(predicate(None))], dtype=bool)
    return flags[codes]  # code -1 (missing) takes the last flag


def value_positions(table: pd.DataFrame, column: str) -> list[tuple[object, np.ndarray]]:
    """(value, row positions) for each distinct non-missing value of ``table[column]``, values
    sorted: ``groupby(column, sort=True)`` on the memoized :func:`column_codes`."""
    codes, distinct = column_codes(table, column)
    order = sorted(range(len(distinct)), key=lambda i: distinct[i])
    return [(distinct[i], np.flatnonzero(codes == i)) for i in order]


def rows_at(table: pd.DataFrame, pos: np.ndarray, columns: Iterable[str]) -> pd.DataFrame:
    """The rows ``pos`` of ``columns`` of ``table`` (those it has; index kept): numbers taken as
    arrays, text decoded from the table's memoized :func:`column_codes`. ``table.iloc[pos]`` copies
    every text column through Arrow, about 50 ms per column on a million rows."""
    index = table.index[pos]
    out: dict[str, Any] = {}
    for col in (c for c in columns if c in table.columns):
        series = table[col]
        if pd.api.types.is_numeric_dtype(series.dtype) or pd.api.types.is_bool_dtype(series.dtype):
            out[col] = series.iloc[pos].to_numpy() if isinstance(series.dtype, pd.api.extensions.ExtensionDtype) \
                else series.to_numpy()[pos]
        else:
            codes, uniques = column_codes(table, col)
            # object dtype kept: pandas 3 would otherwise copy a million decoded strings into Arrow
            out[col] = pd.Series(decode(codes[pos], uniques), index=index, dtype=object, copy=False)
    return pd.DataFrame(out, index=index)


def decode(codes: np.ndarray, distinct: np.ndarray, missing: object = None) -> np.ndarray:
    """The object array of the values that :func:`factorize` codes stand for; ``missing`` where the
    code is -1."""
    return np.concatenate([distinct, np.array([missing], dtype=object)])[codes]


def text_of(values: pd.Series, missing: str = "") -> pd.Series:
    """``values`` as Python strings in an object Series, ``missing`` where a value is missing.

    Use this instead of ``.astype(str)`` before concatenating or matching text: pandas 2 turns a
    missing value into ``"nan"``/``"None"`` there, pandas 3 keeps it missing (its ``str`` dtype),
    and adding a ``str`` Series to an object array raises on pandas 3.
    """
    return map_distinct(values, lambda v: missing if v is None else str(v))


def _missing_series(kind: str, n: int, index: pd.Index) -> pd.Series:
    """A column of ``n`` missing values that costs no memory per row: a read-only view of one missing value
    (stride 0; an nsys export leaves ~30 optional kernel columns empty, 0.3 GB per million kernels when
    materialised). Readers see NaN / <NA> / None as from a full array; pandas copies it before any write."""
    if kind == "float":
        return pd.Series(repeated(np.float64(np.nan), n), index=index, dtype="float64", copy=False)
    if kind == "int":
        return pd.Series(pd.arrays.IntegerArray(repeated(np.int64(0), n), repeated(np.True_, n)), index=index, copy=False)
    if kind == "bool":
        return pd.Series(pd.arrays.BooleanArray(repeated(np.False_, n), repeated(np.True_, n)), index=index, copy=False)
    return pd.Series(repeated(np.array(None, dtype=object), n), index=index, dtype="object", copy=False)


def compact_missing(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with each column whose every value is missing held as :func:`_missing_series` (no memory per
    row), and each text or whole-number column whose every row has one and the same value held as that value
    once (:func:`_one_value`); ``df`` itself when none is. Cheap: a sample of rows rejects most columns."""
    n = len(df)
    if n < COMPACT_MIN_ROWS:
        return df
    swap = {}
    for name in df.columns:
        series = df[name]
        kind = _kind_of(series.dtype)
        if kind is None or _isrepeated(series):
            continue
        if not series.iloc[:1].isna().all():
            if (one := _one_value(series, kind)) is not None:
                swap[name] = one
            continue
        if not series.isna().all():
            continue
        swap[name] = _missing_series(kind, n, df.index)
    if not swap:
        return df
    out = pd.DataFrame({name: swap.get(name, df[name]) for name in df.columns}, index=df.index, copy=False)
    carry_codes(df, out)
    return out


def _one_value(series: pd.Series, kind: str) -> pd.Series | None:
    """``series`` held as its one value (stride 0) when every row has the same known text or whole number (a
    trace's one device, stream or thread: 8-9 bytes a row otherwise); None when not, or not held that way."""
    if not READONLY_OK or kind not in ("str", "int"):
        return None
    if kind == "str":
        values = series.to_numpy()
        if not isinstance(values[0], str) or (held := held_once(values)) is values:
            return None
        return pd.Series(held, index=series.index, dtype=object, copy=False)
    array = series.array
    data, mask = getattr(array, "_data", None), getattr(array, "_mask", None)
    if not isinstance(data, np.ndarray) or not isinstance(mask, np.ndarray) or mask.any() or \
            (held := held_once(data)) is data:
        return None
    return pd.Series(pd.arrays.IntegerArray(held, repeated(np.False_, len(data))), index=series.index, copy=False)


def held_once(values: np.ndarray) -> np.ndarray:
    """``values`` held as its one value (:func:`repeated`) when every row has it (NaN counts as one value);
    ``values`` itself otherwise. A sample of rows rejects most arrays before the full comparison."""
    n = len(values)
    if n < 2 or values.strides == (0,):
        return values
    first = values[:1].copy()
    if values.dtype.kind == "f" and np.isnan(first[0]):
        same = bool(np.isnan(values[:: max(1, n // 64)]).all() and np.isnan(values).all())
    else:
        same = bool((values[:: max(1, n // 64)] == first[0]).all() and (values == first[0]).all())
    return repeated(first, n) if same else values


COMPACT_MIN_ROWS = 4096
"""Tables shorter than this keep their missing columns as they are (nothing worth saving)."""


def _kind_of(dtype: Any) -> str | None:
    """The contract kind whose missing column has ``dtype`` (None: a dtype not stored that way)."""
    if dtype == "float64":
        return "float"
    if dtype == "Int64":
        return "int"
    if dtype == "boolean":
        return "bool"
    if dtype == object:
        return "str"
    return None


def _isrepeated(series: pd.Series) -> bool:
    """Whether ``series`` is already held as one repeated value (stride 0)."""
    a = series.array
    data = getattr(a, "_ndarray", getattr(a, "_data", None))
    return isinstance(data, np.ndarray) and data.ndim == 1 and data.strides == (0,)


def repeated(value: Any, n: int) -> np.ndarray:
    """``n`` times ``value`` as a read-only view of one element (no memory per row); a full array where
    pandas cannot read a read-only buffer (:data:`READONLY_OK`)."""
    if not READONLY_OK:
        return np.full(n, value, dtype=np.asarray(value).dtype)
    return np.broadcast_to(np.asarray(value), (n,))


READONLY_OK = tuple(int(x) for x in re.findall(r"\d+", pd.__version__)[:2]) >= (2, 2)
"""Whether this pandas reads read-only arrays everywhere: before 2.2 its Cython hashing (``factorize`` of a
nullable column) refuses them ("buffer source array is read-only"), so there a missing column is held in full."""


def whole_numbers(values: Any) -> pd.Series:
    """``values`` as a nullable ``Int64`` column: numbers rounded to the nearest whole number (rocprof-compute
    writes timestamps averaged over its passes, ``3806496773226489.5``); text, NaN, ±inf and values beyond
    int64 become missing, never an exception (pandas' own cast refuses a fraction and warns on inf)."""
    series = values if isinstance(values, pd.Series) else pd.Series(values)
    nums = pd.to_numeric(series, errors="coerce")
    if pd.api.types.is_signed_integer_dtype(nums.dtype):
        return nums.astype("Int64")
    f = nums.to_numpy(dtype="float64", na_value=np.nan) if hasattr(nums, "to_numpy") else np.asarray(nums, "float64")
    ok = np.isfinite(f) & (np.abs(f) < 2.0**63)
    out = np.zeros(len(f), dtype="int64")
    out[ok] = np.rint(f[ok]).astype("int64")
    return pd.Series(pd.arrays.IntegerArray(out, ~ok), index=series.index)


def shared_text(series: pd.Series) -> pd.Series:
    """``series`` (text) as an object column that holds each distinct value once: every row refers to one
    shared ``str`` per value (8 bytes a row), where pandas 3's default ``str`` dtype stores each row's own
    UTF-8 bytes (a 5M-kernel trace's kernel names alone are ~1 GB that way). Values, missing ones (None)
    included, read the same; ``series`` itself when it is not in a pandas string dtype."""
    if not isinstance(series.dtype, pd.StringDtype) and not _arrow_text(series.dtype):
        return series
    codes, distinct = pd.factorize(series, use_na_sentinel=True)
    values = np.asarray(distinct, dtype=object)
    return pd.Series(decode(codes, values), index=series.index, dtype=object, copy=False)


def shared_texts(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with each text column in a pandas string dtype as :func:`shared_text` (the roofline's
    ``bound`` columns, set after :func:`conform`); ``df`` itself when none is."""
    swap = {name: shared_text(df[name]) for name in df.columns if isinstance(df[name].dtype, pd.StringDtype)
            or _arrow_text(df[name].dtype)}
    if not swap:
        return df
    out = pd.DataFrame({name: swap.get(name, df[name]) for name in df.columns}, index=df.index, copy=False)
    carry_codes(df, out)
    return out


def _arrow_text(dtype: Any) -> bool:
    """Whether ``dtype`` is an Arrow string dtype (``string[pyarrow]`` read as ``ArrowDtype``)."""
    pa_type = getattr(dtype, "pyarrow_dtype", None)
    if pa_type is None:
        return False
    import pyarrow as pa

    return bool(pa.types.is_string(pa_type) or pa.types.is_large_string(pa_type))


def _coerce(series: pd.Series, col: Column) -> pd.Series:
    dtype = series.dtype
    if (col.kind == "float" and dtype == "float64") or (col.kind == "bool" and dtype == "boolean") or \
            (col.kind == "int" and (dtype == "Int64" or (dtype == "int64" and col.required))):
        return series  # already in contract form: no copy
    if col.kind == "float":
        return pd.to_numeric(series, errors="coerce").astype("float64")
    if col.kind == "int":
        values = whole_numbers(series)
        if col.required and not values.isna().any():
            return values.astype("int64")
        return values
    if col.kind == "bool":
        return series.astype("boolean")
    return shared_text(series)


@functools.cache
def _empty(table: str) -> pd.DataFrame:
    return conform(pd.DataFrame(), table, source="<empty>")


def empty_table(table: str) -> pd.DataFrame:
    """A zero-row table with every column of ``table`` and its dtype (a fresh copy each call)."""
    return _empty(table).copy()


def conform(df: pd.DataFrame, table: str, *, source: str) -> pd.DataFrame:
    """Check and normalise a table against its contract.

    Required columns must be present (unless the table has no rows); optional columns that are
    absent are added as missing values; numeric columns get their dtypes. Extra columns (for
    example ncu metrics or ``rank``) are kept after the contract columns.

    Args:
        df: the table to check; not modified.
        table: one of :data:`TABLES`.
        source: the file or reader the table came from, named in errors.

    Raises:
        ReportFormatError: a required column is missing, or has missing values where it
            must not.
    """
    spec = TABLES[table]
    missing = [c.name for c in spec if c.required and c.name not in df.columns]
    if missing and len(df):
        raise ReportFormatError(
            source,
            f"{table} table lacks required column(s) {', '.join(missing)}",
            hint="re-create the report with this version of perfscope",
        )
    out = {}
    for col in spec:
        if col.name in df.columns:
            out[col.name] = _coerce(df[col.name], col)
        else:
            out[col.name] = _missing_series(col.kind, len(df), df.index)
    for name in df.columns:
        if name not in out:
            out[name] = shared_text(df[name])  # extra text (``process_group``, ncu's names) held once per value too
    result = pd.DataFrame(out, index=df.index, copy=False).reset_index(drop=True)  # columns kept as they are shared
    carry_codes(df, result)  # same rows, same text: the codes its maker memoized hold
    result = compact_missing(result)  # a column a reader filled with missing values costs nothing per row
    for col in spec:
        if col.required and col.kind == "int" and len(result) and result[col.name].isna().any():
            bad = int(result[col.name].isna().sum())
            raise ReportFormatError(
                source, f"{table}.{col.name} has {bad} missing value(s) but is required"
            )
    return result


MAX_NS = 1 << 62
"""The largest time, or span of time, in ns a table holds (146 years); past it a value is damage."""
MAX_BYTES = 1 << 60
"""The largest size in bytes (an exbibyte) a table holds."""
MAX_FLOPS = 1e24
"""The most operations one kernel is taken to do (a second of a 10^18 FLOP/s device is 10^18)."""
SIGNED_BYTES = frozenset({"delta_bytes", "allocated_bytes"})
"""Byte columns that may be negative (a free's change; a window's allocated bytes before its first alloc)."""
VALIDATED = ("kernels", "transfers", "api", "ranges", "memory", "counters")
"""Tables whose numbers come from a file, checked by :func:`validate` before a report holds them."""


def untimed(df: pd.DataFrame, table: str) -> tuple[pd.DataFrame, list[str]]:
    """Before :func:`conform`: rows of a :data:`VALIDATED` table whose required time (``start_ns``, ``end_ns``,
    ``t_ns``) is missing or not a whole number in int64 (text, NaN, ±inf, 1e400) are dropped and counted,
    so one damaged time costs its row, not the import."""
    if table not in VALIDATED or not len(df):
        return df, []
    required = [c.name for c in TABLES[table] if c.required and c.kind == "int" and c.name.endswith("_ns")]
    bad = np.zeros(len(df), dtype=bool)
    for col in required:
        if col in df:
            bad |= whole_numbers(df[col]).isna().to_numpy()
    if not bad.any():
        return df, []
    note = f"{table}: {int(bad.sum())} row(s) without a readable {'/'.join(required)} dropped"
    return df.loc[~bad].reset_index(drop=True), [note]


def _mask(values: pd.Series, bad: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Rows whose value is known and ``bad`` (missing values are never bad)."""
    nums = pd.to_numeric(values, errors="coerce").astype("float64").to_numpy()
    known = ~np.isnan(nums)
    out = np.zeros(len(nums), dtype=bool)
    out[known] = bad(nums[known])
    return out


def validate(df: pd.DataFrame, table: str) -> tuple[pd.DataFrame, list[str]]:
    """The one check of the numbers a reader read, for a conformed ``table`` of :data:`VALIDATED`:
    what fails is dropped, and counted in the returned notes (for the manifest's warnings).

    - a row whose time is out of range (``start_ns``, ``end_ns``, ``t_ns`` beyond ±:data:`MAX_NS`), whose
      ``duration_ns`` is negative or past :data:`MAX_NS`, or which ends before it starts, is dropped;
    - a size (a ``*_bytes`` column but :data:`SIGNED_BYTES`, ``bytes``) that is negative, past
      :data:`MAX_BYTES` or not finite becomes missing (a transfer keeps its row: its time is still measured);
    - ``flops`` negative, past :data:`MAX_FLOPS` or not finite becomes missing;
    - any other float that is not finite (±inf) becomes missing.
    """
    if table not in VALIDATED or not len(df):
        return df, []
    notes: list[str] = []
    drop = np.zeros(len(df), dtype=bool)
    for col in ("start_ns", "end_ns", "t_ns"):
        if col in df:
            drop |= _mask(df[col], lambda v: np.abs(v) > MAX_NS)
    if "duration_ns" in df:
        drop |= _mask(df["duration_ns"], lambda v: (v < 0) | (v > MAX_NS))
    if "start_ns" in df and "end_ns" in df:
        s = pd.to_numeric(df["start_ns"], errors="coerce").astype("float64").to_numpy()
        e = pd.to_numeric(df["end_ns"], errors="coerce").astype("float64").to_numpy()
        with np.errstate(invalid="ignore"):
            drop |= e < s
    out = df
    if drop.any():
        notes.append(f"{table}: {int(drop.sum())} row(s) with a negative, reversed or out-of-range time dropped")
        out = df.loc[~drop].reset_index(drop=True)
    changed: dict[str, int] = {}
    for col in out.columns:
        kind = out[col].dtype
        if not (pd.api.types.is_numeric_dtype(kind) and not pd.api.types.is_bool_dtype(kind)):
            continue
        if col == "bytes" or (col.endswith("_bytes") and col not in SIGNED_BYTES):
            bad = _mask(out[col], lambda v: ~np.isfinite(v) | (v < 0) | (v > MAX_BYTES))
        elif col == "flops":
            bad = _mask(out[col], lambda v: ~np.isfinite(v) | (v < 0) | (v > MAX_FLOPS))
        elif pd.api.types.is_float_dtype(kind):
            bad = np.isinf(out[col].to_numpy(dtype="float64", na_value=np.nan))
        else:
            continue
        if bad.any():
            changed[col] = int(bad.sum())
            if out is df:
                out = df.copy()
            out[col] = out[col].mask(pd.Series(bad, index=out.index))
    if changed:
        what = ", ".join(f"{col} {n}" for col, n in sorted(changed.items()))
        notes.append(f"{table}: values that are not finite, negative where a size is, or out of range made missing "
                     f"({what})")
    return out, notes


def check_columns(columns: Iterable[str], table: str, *, source: str) -> None:
    """Raise ReportFormatError naming ``source`` when required columns are absent."""
    have = set(columns)
    missing = [c.name for c in TABLES[table] if c.required and c.name not in have]
    if missing:
        raise ReportFormatError(
            source,
            f"{table} table lacks required column(s) {', '.join(missing)}",
            hint="re-create the report with this version of perfscope",
        )
