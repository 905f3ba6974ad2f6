"""perfscope.annotate: one range for torch.profiler (record_function) and NVTX."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

import perfscope
from perfscope.annotate import annotate, profiler_enabled


def test_context_manager_and_decorator_emit_ranges_under_the_profiler():
    @perfscope.annotate("step")
    def step(x):
        return x + 1

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        assert profiler_enabled()
        with annotate("outer"):
            step(torch.ones(2))
    names = [e.name for e in prof.events()]
    assert "outer" in names and "step" in names
    outer = next(e for e in prof.events() if e.name == "outer")
    inner = next(e for e in prof.events() if e.name == "step")
    assert outer.time_range.start <= inner.time_range.start <= inner.time_range.end <= outer.time_range.end


def test_no_profiler_means_no_range_and_no_error():
    assert not profiler_enabled()
    with annotate("idle") as a:
        assert a._rf is None
    assert a.name == "idle"


def test_exceptions_propagate_and_close_the_range():
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof, annotate("boom"):
            raise ValueError("x")
    except ValueError:
        pass
    assert any(e.name == "boom" for e in prof.events())


def test_decorator_keeps_the_function_name():
    @annotate("f")
    def work():
        """doc"""
        return 3

    assert work() == 3 and work.__name__ == "work" and work.__doc__ == "doc"
