"""Nsight Compute command construction (pure), top-N ranking on real profiler outputs, and
failure paths without ncu."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
from perfscope.collectors import COLLECTORS, NcuCollector, NcuOptions
from perfscope.collectors.ncu import (
    choose_first_pass,
    escape_regex,
    function_base_name,
    kernel_regex,
    kernel_times_from_nsys_sqlite,
    ncu_hint,
    parse_kernel_times_csv,
    profile_command,
    second_pass_options,
    timing_pass_command,
    top_kernels,
)

from perfscope.errors import InputFormatError, ToolNotFoundError, UsageError

TARGET = ["python", "bench.py", "--steps", "4"]
NSYS_FIXTURES = ("nvfuser_h100_matmul.sqlite", "aws_t4_softmax.sqlite")


def _value_after(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def test_default_command_is_roofline_at_base_clocks_into_the_output() -> None:
    cmd = profile_command(TARGET, NcuOptions(output_base="/o/ncu"))
    assert cmd == [
        "ncu", "--set", "roofline", "--clock-control", "base", "--target-processes", "all",
        "--export", "/o/ncu", "--force-overwrite", "--log-file", "/o/ncu.log",
        "python", "bench.py", "--steps", "4",
    ]


def test_bounded_replay_and_nvtx_filters() -> None:
    opts = NcuOptions(section_set="full", clock_control="none", kernel_name="regex:gemm",
                      kernel_name_base="demangled", launch_skip=10, launch_count=3,
                      nvtx_include=("decode/", "engine@prefill/"), nvtx_exclude=("warmup/",))
    cmd = profile_command(TARGET, opts)
    assert cmd[cmd.index("python"):] == TARGET
    assert _value_after(cmd, "--set") == "full"
    assert _value_after(cmd, "--clock-control") == "none"
    assert _value_after(cmd, "--kernel-name-base") == "demangled"
    assert _value_after(cmd, "--kernel-name") == "regex:gemm"
    assert _value_after(cmd, "--launch-skip") == "10"
    assert _value_after(cmd, "--launch-count") == "3"
    assert "--nvtx" in cmd
    includes = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--nvtx-include"]
    assert includes == ["decode/", "engine@prefill/"]
    assert _value_after(cmd, "--nvtx-exclude") == "warmup/"


def test_no_filter_flags_unless_asked() -> None:
    cmd = profile_command(TARGET, NcuOptions())
    for flag in ("--kernel-name", "--launch-skip", "--launch-count", "--nvtx", "--kernel-name-base"):
        assert flag not in cmd


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"section_set": "everything"}, "--set"),
        ({"clock_control": "boost"}, "--clock-control"),
        ({"launch_count": 0}, "launch_count"),
        ({"launch_skip": -1}, "launch_skip"),
        ({"top_n": 0}, "top_n"),
        ({"top_n": 3, "kernel_name": "regex:x"}, "either --top-n or --kernel-name"),
        ({"first_pass": "torch"}, "first pass"),
    ],
)
def test_bad_options_are_usage_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        NcuOptions(**kwargs)  # type: ignore[arg-type]


def test_timing_pass_keeps_nvtx_and_skip_but_not_the_count() -> None:
    opts = NcuOptions(top_n=3, launch_skip=5, launch_count=9, nvtx_include=("decode/",),
                      clock_control="none")
    cmd = timing_pass_command(TARGET, opts, "/o/topn_pass.csv")
    assert cmd[:8] == ["ncu", "--metrics", "gpu__time_duration.sum", "--csv",
                       "--print-units", "base", "--print-kernel-base", "function"]
    assert _value_after(cmd, "--clock-control") == "none"
    assert _value_after(cmd, "--launch-skip") == "5"
    assert "--launch-count" not in cmd and "--kernel-name" not in cmd
    assert _value_after(cmd, "--nvtx-include") == "decode/"
    assert _value_after(cmd, "--log-file") == "/o/topn_pass.csv"
    assert cmd[-len(TARGET):] == TARGET


def test_kernel_regex_escapes_and_matches_exactly() -> None:
    names = ["gemv_kernel", "flash::fwd", "a.b(c)", "x+y|z"]
    value = kernel_regex(names)
    assert value.startswith("regex:^(") and value.endswith(")$")
    pattern = re.compile(value[len("regex:"):])
    for name in names:
        assert pattern.fullmatch(name)
    for other in ("gemv_kernel2", "axb(c)", "x+y", "flash::fwdX", "z"):
        assert not pattern.fullmatch(other)
    assert escape_regex("a.b") == r"a\.b"
    with pytest.raises(UsageError):
        kernel_regex([])


@pytest.mark.parametrize("fixture", NSYS_FIXTURES)
def test_function_base_name_matches_nsys_short_names(fixtures_dir: Path, fixture: str) -> None:
    with sqlite3.connect(fixtures_dir / "nsys" / fixture) as con:
        rows = con.execute(
            "SELECT s.value, d.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
            "JOIN StringIds s ON s.id = k.shortName JOIN StringIds d ON d.id = k.demangledName"
        ).fetchall()
    assert rows
    for short, demangled in rows:
        assert function_base_name(demangled) == short
        assert function_base_name(short) == short


@pytest.mark.parametrize("fixture", NSYS_FIXTURES)
def test_kernel_times_from_nsys_sqlite_match_a_pandas_sum(fixtures_dir: Path, fixture: str) -> None:
    path = fixtures_dir / "nsys" / fixture
    with sqlite3.connect(path) as con:
        kernels = pd.read_sql("SELECT shortName, start, end FROM CUPTI_ACTIVITY_KIND_KERNEL", con)
        names = pd.read_sql("SELECT id, value FROM StringIds", con).set_index("id")["value"]
    kernels["name"] = kernels["shortName"].map(names)
    expected = (kernels["end"] - kernels["start"]).groupby(kernels["name"]).sum()
    got = kernel_times_from_nsys_sqlite(path)
    assert got == {name: float(total) for name, total in expected.items()}
    top = top_kernels(got, 2)
    assert [n for n, _ in top] == list(expected.sort_values(ascending=False).index[:2])


def test_kernel_times_reject_a_file_that_is_not_an_nsys_export(tmp_path: Path) -> None:
    db = tmp_path / "other.sqlite"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE t (x)")
    with pytest.raises(InputFormatError, match="not an nsys SQLite export"):
        kernel_times_from_nsys_sqlite(db)
    text = tmp_path / "text.sqlite"
    text.write_text("hello")
    with pytest.raises(InputFormatError, match="unreadable SQLite"):
        kernel_times_from_nsys_sqlite(text)


def _csv_fixture(fixtures_dir: Path) -> Path:
    return fixtures_dir / "ncu" / "esmm_a10g_roofline_metrics.csv"


def test_parse_kernel_times_csv_matches_a_pandas_reading(fixtures_dir: Path) -> None:
    path = _csv_fixture(fixtures_dir)
    df = pd.read_csv(path, dtype=str)
    rows = df[df["Metric Name"] == "gpu__time_duration.sum"]
    assert set(rows["Metric Unit"]) == {"nsecond"}
    values = rows["Metric Value"].str.replace(",", "").astype(float)
    expected = values.groupby(rows["Kernel Name"]).sum().to_dict()
    got = parse_kernel_times_csv(path.read_text())
    assert got == expected
    assert len(got) == 8


def test_parse_kernel_times_csv_skips_program_output_before_the_header(fixtures_dir: Path) -> None:
    text = _csv_fixture(fixtures_dir).read_text()
    noisy = "step 1 loss 0.5\n==PROF== Connected to process 17333\n" + text
    assert parse_kernel_times_csv(noisy) == parse_kernel_times_csv(text)


def test_parse_kernel_times_csv_without_header_names_the_file() -> None:
    with pytest.raises(InputFormatError, match="run.csv: no ncu CSV header"):
        parse_kernel_times_csv("==PROF== Disconnected\n", source="run.csv")


def test_top_kernels_merge_demangled_names_and_rank(fixtures_dir: Path) -> None:
    times = parse_kernel_times_csv(_csv_fixture(fixtures_dir).read_text())
    top = top_kernels(times, 3)
    by_base: dict[str, float] = {}
    for name, total in times.items():
        base = re.sub(r"^(void )?(\w+).*$", r"\2", name)
        by_base[base] = by_base.get(base, 0.0) + total
    expected = sorted(by_base.items(), key=lambda kv: -kv[1])[:3]
    assert top == expected
    assert top[0][0] == "basic"


def test_second_pass_is_limited_to_the_top_names_with_a_launch_bound() -> None:
    opts = NcuOptions(top_n=3, launches_per_kernel=2, nvtx_include=("decode/",))
    second = second_pass_options(opts, ["basic", "gmem_coalesce", "smem_blocking"])
    assert second.top_n is None
    assert second.kernel_name == "regex:^(basic|gmem_coalesce|smem_blocking)$"
    assert second.kernel_name_base == "function"
    assert second.launch_count == 6
    cmd = profile_command(TARGET, second)
    assert _value_after(cmd, "--kernel-name") == second.kernel_name
    assert _value_after(cmd, "--nvtx-include") == "decode/"
    explicit = second_pass_options(NcuOptions(top_n=3, launch_count=4), ["a"])
    assert explicit.launch_count == 4


def test_first_pass_prefers_nsys_unless_nvtx_filters_need_ncu() -> None:
    assert choose_first_pass(NcuOptions(top_n=2), nsys_available=True) == "nsys"
    assert choose_first_pass(NcuOptions(top_n=2), nsys_available=False) == "ncu"
    with_nvtx = NcuOptions(top_n=2, nvtx_include=("decode/",))
    assert choose_first_pass(with_nvtx, nsys_available=True) == "ncu"
    forced = NcuOptions(top_n=2, first_pass="nsys", nvtx_include=("decode/",))
    assert choose_first_pass(forced, nsys_available=False) == "nsys"


def test_ncu_hint_recognises_permission_and_empty_runs() -> None:
    perm = ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA "
            "GPU Performance Counters on the target device 0.")
    assert "NVreg_RestrictProfilingToAdminUsers=0" in (ncu_hint(perm) or "")
    assert "filters" in (ncu_hint("==WARNING== No kernels were profiled.") or "")
    assert ncu_hint("==PROF== Disconnected from process 1") is None


def test_collect_without_ncu_raises_tool_not_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert not COLLECTORS["ncu"].is_available()
    with pytest.raises(ToolNotFoundError, match="Nsight Compute"):
        NcuCollector().collect(TARGET, tmp_path / "out", NcuOptions())
    with pytest.raises(ToolNotFoundError):
        NcuCollector().collect(TARGET, tmp_path / "out", NcuOptions(top_n=3))
