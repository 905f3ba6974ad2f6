"""A trace whose profiler collected hardware counters (CUPTI's range profiler, torch.profiler's
``experimental_config`` ``profiler_metrics``): each kernel was replayed inside its launch call. HTA's
CUPTI-profiler A100 trace holds 77 ``cuda_profiler_range`` records, one per ``cudaLaunchKernel``, and no
kernel events; its launch calls took up to 1.2 s each."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.findings import RULES
from perfscope.analysis.idle import first_launches
from perfscope.analysis.readers.kineto import parse
from perfscope.analysis.readers.kineto.reader import read_kineto
from perfscope.analysis.rules._gaps import blocked_launch_text

CUPTI = "kineto/hta_cupti_profiler__benchmark_result_924719_1679055439_trace.json.gz"
NORMS = "memory/tracelens_mi300x_normalization_profile_memory/normalization_layer_test.json.gz"


def _raw_events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)["traceEvents"]


@pytest.mark.parametrize("fast", [True, False], ids=["fast-decoder", "plain-decoder"])
def test_each_counter_range_is_read_by_both_decoders(fixtures_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                     fast: bool) -> None:
    path = fixtures_dir / CUPTI
    ranges = [e for e in _raw_events(path) if e.get("cat") == "cuda_profiler_range"]
    monkeypatch.setattr(parse, "FAST", fast)
    trace = parse.parse_trace(path)
    assert trace.count("prof") == len(ranges) == 77
    names = trace.strings[trace.cols["prof"]["name"]].tolist()
    assert names == [e["name"] for e in ranges]  # in the file's order: the launch order


def test_the_import_says_the_times_include_the_replays_and_the_idle_time_is_the_profilers(fixtures_dir: Path) -> None:
    r = read_kineto(fixtures_dir / CUPTI)
    assert r.params["counter_replays"] == 77
    (w,) = [w for w in r.warnings if "cuda_profiler_range" in w]
    assert "replaying 77 kernel launches" in w and "records no kernel timings" in w
    idle = r.idle
    launch_calls = idle["api"].astype("object").fillna("").str.contains("LaunchKernel")
    # every slice in a launch call is the profiler's replay, none is launch cost
    assert launch_calls.any() and (idle.loc[launch_calls, "cause"] == "profiler").all()
    assert not (idle["cause"] == "launch").any() or idle.loc[idle["cause"] == "launch", "api"].notna().all()
    (f,) = RULES["gpu-idle"](r)
    assert "replayed each kernel to collect hardware counters" in f.recommendation
    assert "CUDA graph" not in f.recommendation and "lazy loading" not in f.recommendation
    labels = [i.label for i in f.items if i.attrs.get("cause") == "profiler"]
    assert labels and all("replaying kernels to count hardware counters, inside cudaLaunchKernel" in x for x in labels)


def test_a_trace_without_counter_ranges_says_nothing_of_them(fixtures_dir: Path) -> None:
    r = read_kineto(fixtures_dir / NORMS)
    assert "counter_replays" not in r.params and not any("cuda_profiler_range" in w for w in r.warnings)


def test_blocked_launches_are_explained_by_what_the_trace_shows(load) -> None:
    """TraceLens's MI300X normalization test: its 10 launch calls of 1 ms or more each launched a kernel for the
    first time in the trace, so the finding says module loading from that, not from a list of guesses."""
    (f,) = RULES["launch-overhead"](load(NORMS))
    assert "Each launched a kernel for the first time in the trace: loading its code module" in f.recommendation
    assert "counter collection" in f.recommendation and "most often" not in f.recommendation


def test_blocked_launch_text_follows_the_evidence() -> None:
    assert "by the profiler" in blocked_launch_text(3, replays=77, first=3)
    assert "counter records of 77 launches" in blocked_launch_text(3, replays=77)
    mixed = blocked_launch_text(5, first=2, queue_empty=True)
    assert "2 of them launched a kernel for the first time" in mixed and "the other 3" in mixed
    assert "full launch queue" in mixed.split("the trace does not show")[0]  # ruled out, not among the unknowns
    none = blocked_launch_text(1, first=0)
    assert "not module loading" in none and "a full launch queue" in none.split("does not show")[1]
    assert "likeliest cause left" in blocked_launch_text(2)


def test_first_launches_are_per_device_and_name_in_start_order() -> None:
    k = pd.DataFrame({"name": ["a", "b", "a", "a", "b"], "device": ["cuda:0", "cuda:0", "cuda:0", "cuda:1", "cuda:0"],
                      "start_ns": [30, 10, 20, 40, 50]})
    # by start: b@10 (first), a@20 (first), a@30 (again), a@40 on cuda:1 (first there), b@50 (again)
    assert first_launches(k, np.arange(5)).tolist() == [False, True, True, True, False]
    assert first_launches(k, np.array([0, 3])).tolist() == [False, True]


def test_the_idle_table_says_which_launch_slices_launched_a_kernel_for_the_first_time(load) -> None:
    """Each launch slice carries its call's correlation id and whether the kernel it launched is the first of its
    name on its device in the trace; checked against the kernel table by hand, and read by gpu-idle's advice."""
    r = load(NORMS)
    idle, k = r.idle, r.kernels
    launch = idle[idle["cause"] == "launch"]
    assert len(launch) and launch["correlation"].notna().all()
    seen: set[tuple[str, str]] = set()
    first_of: dict[float, bool] = {}
    for row in k.sort_values("start_ns", kind="stable").itertuples():
        first_of[float(row.correlation)] = (row.device, row.name) not in seen
        seen.add((row.device, row.name))
    said = launch["first_launch"].astype("boolean")
    known = said.notna().to_numpy()
    assert known.sum() >= 0.9 * len(launch)
    want = [first_of.get(float(c)) for c in launch["correlation"][known]]
    assert said[known].tolist() == want and any(want) and not all(want)
    assert idle.loc[idle["cause"] != "launch", "first_launch"].isna().all()
    (f,) = [f for f in RULES["gpu-idle"](r) if "hipLaunchKernel calls of 1 ms or longer" in f.recommendation]
    assert "Each launched a kernel for the first time in the trace: loading its code module" in f.recommendation
    assert "so no full launch queue held them" in f.recommendation


def test_an_nsys_export_gets_the_same_evidence(load) -> None:
    """nvFuser's H100 matmul export (Nsight Systems; not looked at while writing this): its 8 launch calls of 1 ms
    or more sit between JIT compilations, and each launched the first kernel of its name."""
    r = load("nsys/nvfuser_h100_matmul.sqlite")
    launch = r.idle[r.idle["cause"] == "launch"]
    assert launch["correlation"].notna().all() and launch["first_launch"].notna().sum() >= len(launch) - 1
    (f,) = RULES["gpu-idle"](r)
    assert "cudaLaunchKernel calls of 1 ms or longer" in f.recommendation
    assert "Each launched a kernel for the first time in the trace" in f.recommendation
