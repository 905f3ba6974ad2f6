"""Reports the dashboard tests draw: real fixtures imported once per session, a tiny engine run,
and a copy of a real report whose strings carry HTML/JS (the escaping tests)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from perfscope.analysis.readers.detect import import_file
from perfscope.device import DeviceSpec, Roof
from perfscope.report import Report
from tests.conftest import _fixtures_dir

XSS = "<script>alert(1)</script>"
QWEN = "kineto/tracelens_h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
HTA = "kineto/hta_negative_queue_length_values_check__rank0.json.gz"
NSYS = "nsys/nvfuser_h100_matmul.sqlite"


def fixture_path(rel: str) -> Path:
    return _fixtures_dir() / rel


@functools.cache
def imported(rel: str) -> Report:
    """A fixture file imported once per test session."""
    return import_file(fixture_path(rel))


@functools.lru_cache(maxsize=1)
def engine() -> Report:
    """A real CPU profile of the tiny reference engine (steps, requests, prefill/decode phases).

    The roofs are given rather than measured, to keep the test fast and deterministic.
    """
    from perfscope.sessions.profile import EngineRun, profile_engine

    roofs = DeviceSpec("test CPU", "cpu", compute={"fp32": Roof(2e11, "datasheet", "given by the test")},
                       memory={"dram": Roof(2e10, "datasheet", "given by the test")})
    run = EngineRun(model="tiny", batch=2, prompt_len=16, gen_len=4, device="cpu")
    return profile_engine(run, roofs=roofs).with_manifest(name="tiny-engine")


@functools.lru_cache(maxsize=1)
def hostile() -> Report:
    """The Qwen H100 report with its longest placed kernel, a range and the warnings renamed to
    HTML/JS payloads."""
    base = imported(QWEN)
    k = base.kernels.copy()
    placed = np.flatnonzero((k["arith_intensity"] > 0).to_numpy(dtype=bool, na_value=False))
    longest = placed[np.argmax(k["duration_ns"].to_numpy()[placed])]
    k["name"] = k["name"].astype("object")
    k.loc[longest, "name"] = XSS
    k["range"] = k["range"].astype("object")
    k.loc[longest, "range"] = XSS
    r = base.ranges.copy()
    r["name"] = r["name"].astype("object")
    r.loc[0, "name"] = XSS
    report = base.replace(kernels=k, ranges=r)
    return report.with_manifest(name=f"evil {XSS}", warnings=[f"warning {XSS}"])
