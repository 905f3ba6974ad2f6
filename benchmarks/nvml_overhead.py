"""NVML sampler overhead: CPU time of the sampling thread as a percentage of one core.

Runs :class:`perfscope.collectors.NvmlSampler` at ``--rate`` Hz (default 100, the maximum)
for ``--seconds`` while the main thread sleeps, and reads the thread's own CPU clock
(``time.thread_time``) against the wall time it ran. Goal: under 1% of one core at 100 Hz.

In the same run it measures the floor: a thread that only waits at the same rate, doing
nothing. Where waking a thread is expensive (microVMs and sandboxed kernels make every timer
and futex wake-up slow) the floor alone can approach the goal; the difference between the two
is the sampler's own cost.

With a working NVIDIA driver it reads the real GPUs. Where NVML cannot run (no driver), it
measures the same loop with the reading function replaced by one that returns constant
values, and says so: that number is the loop and storage cost alone, without the NVML calls.

Usage::

    python benchmarks/nvml_overhead.py [--rate 100] [--seconds 10]
"""

from __future__ import annotations

import argparse
import math
import threading
import time
from collections.abc import Sequence

from perfscope.collectors.nvml import METRICS, NvmlSampler, NvmlSource, SampleSource
from perfscope.errors import ToolNotFoundError

GOAL_PCT = 1.0


class ConstantSource:
    """Replaces NVML where it cannot run: one device, constant values, no driver calls."""

    def __init__(self) -> None:
        self.unavailable: dict[str, str] = {}
        self.warnings: list[str] = []
        self._values = tuple(float(i) for i in range(len(METRICS)))

    def open(self, devices: Sequence[int] | None) -> list[str]:
        return ["cuda:0"]

    def read(self, position: int) -> tuple[float, ...]:
        return self._values

    def close(self) -> None:
        pass


def pick_source() -> tuple[SampleSource, str]:
    """The real NVML source when it initialises, else the constant one, with a label."""
    source = NvmlSource()
    try:
        labels = source.open(None)
    except ToolNotFoundError as exc:
        return ConstantSource(), f"reading function REPLACED (NVML unavailable: {exc})"
    source.close()
    return NvmlSource(), f"real NVML, driver {source.driver_version}, {len(labels)} GPU(s)"


def idle_loop_pct(rate_hz: float, seconds: float) -> float:
    """CPU % of one core of a thread that wakes at ``rate_hz`` and does nothing else."""
    stop, result = threading.Event(), {}

    def loop() -> None:
        period_ns, cpu0, start = int(1e9 / rate_hz), time.thread_time_ns(), time.perf_counter_ns()
        due = start
        while not stop.is_set():
            due += period_ns
            stop.wait(max(0, due - time.perf_counter_ns()) / 1e9)
        wall = time.perf_counter_ns() - start
        result["pct"] = 100.0 * (time.thread_time_ns() - cpu0) / wall

    thread = threading.Thread(target=loop)
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join()
    return result["pct"]


def measure(rate_hz: float, seconds: float) -> None:
    """Run the sampler and print its overhead."""
    source, label = pick_source()
    with NvmlSampler(rate_hz=rate_hz, source=source) as sampler:
        time.sleep(seconds)
    stats = sampler.stats
    per_sample_us = 1e6 * stats.thread_cpu_s / stats.samples if stats.samples else math.nan
    print(f"source:            {label}")
    print(f"rate asked:        {rate_hz:g} Hz; achieved {stats.samples / stats.wall_s:.1f} Hz "
          f"({stats.samples} rounds in {stats.wall_s:.2f} s, {stats.late_ticks} late)")
    print(f"rows stored:       {len(sampler.to_frame())}")
    print(f"thread CPU time:   {stats.thread_cpu_s * 1e3:.1f} ms ({per_sample_us:.1f} us per round)")
    verdict = "OK" if stats.cpu_pct_of_core < GOAL_PCT else "OVER GOAL"
    print(f"overhead:          {stats.cpu_pct_of_core:.3f}% of one core (goal < {GOAL_PCT:g}%): {verdict}")
    floor = idle_loop_pct(rate_hz, seconds)
    print(f"floor:             {floor:.3f}% of one core for a thread that only wakes at {rate_hz:g} Hz")
    print(f"sampler / floor:   {stats.cpu_pct_of_core / floor:.2f}x "
          f"(sampler's own work: {stats.cpu_pct_of_core - floor:+.3f}% of one core)")
    if sampler.unavailable_metrics:
        print(f"unavailable:       {', '.join(sampler.unavailable_metrics)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=100.0, help="samples per second per GPU")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to sample")
    args = parser.parse_args()
    measure(args.rate, args.seconds)


if __name__ == "__main__":
    main()
