"""Host code under a JIT compiler is advised as compilation, from the trace's own ranges (docs/idle.md).

The nvFuser H100 matmul export spends most of its idle time with the host in NVRTC's ``CompileProgram`` and
nvFuser's lowering (its NVTX ranges): the gpu-idle advice says that share is kernels being compiled, a cost of a
first run, with the share computed here directly from the idle table. The same items with the compiler's names
taken out get the usual host-code advice: the sentence is chosen by the names, not by the trace.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from perfscope.analysis.findings import run_rules
from perfscope.analysis.idle import idle_of
from perfscope.analysis.readers.detect import import_file
from perfscope.analysis.rules._gaps import JIT_NAMES, jit_time, kind_advice

NVFUSER = Path(__file__).parents[1] / "fixtures/nsys/nvfuser_h100_matmul.sqlite"


@pytest.fixture(scope="module")
def report():  # type: ignore[no-untyped-def]
    return import_file(NVFUSER)


def test_compilation_share_is_the_idle_tables(report) -> None:  # type: ignore[no-untyped-def]
    idle = idle_of(report)
    host = idle[(idle["cause"] == "host") & (idle["host_kind"] == "host code")]

    def compiler(row) -> bool:  # type: ignore[no-untyped-def]
        return any(isinstance(row[c], str) and JIT_NAMES.search(row[c]) for c in ("range", "function", "op"))

    under = host[host.apply(compiler, axis=1)]
    share = 100 * float(under["duration_ns"].sum()) / float(host["duration_ns"].sum())
    assert share > 50
    (f,) = [f for f in run_rules(report) if f.id == "gpu-idle"]
    jit, total, names = jit_time(idle[idle["device"] == f.evidence["device"]])
    assert jit == pytest.approx(float(under["duration_ns"].sum())) and total == pytest.approx(float(host["duration_ns"].sum()))
    assert names[0] == "executor_utils::Nvrtc::CompileProgram"
    assert f"; {share:.0f}% of that is under a compiler: kernels being compiled (JIT), a cost of a first run" in \
        f.recommendation
    assert "Run the step once before profiling" in f.recommendation
    assert "Move or overlap this host work" not in f.recommendation


def test_the_same_rows_without_a_compilers_names_get_the_host_code_advice(report) -> None:  # type: ignore[no-untyped-def]
    (f,) = [f for f in run_rules(report) if f.id == "gpu-idle"]
    idle = idle_of(report)
    plain = idle.assign(**{c: idle[c].astype(object).where(idle[c].isna(), "step_loop") for c in ("range", "function", "op")})
    assert jit_time(plain)[0] == 0 and jit_time(plain)[1] == jit_time(idle)[1] > 0
    text = kind_advice("host code", 89.0, f.items, plain)
    assert "Move or overlap this host work" in text and "compiler" not in text
    assert "under a compiler" in kind_advice("host code", 89.0, f.items, idle)
