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
    exact_name_regex,
    function_base_name,
    kernel_regex,
    kernel_times_from_nsys_sqlite,
    ncu_hint,
    parse_kernel_times_csv,
    per_kernel_options,
    profile_command,
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
        ({"top_n": 3, "launch_count": 2}, "--top-n-launches"),
        ({"top_n": 3, "launches_per_kernel": 0}, "launches_per_kernel"),
        ({"first_pass": "torch"}, "first pass"),
    ],
)
def test_bad_options_are_usage_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        NcuOptions(**kwargs)  # type: ignore[arg-type]


def test_timing_pass_keeps_nvtx_and_skip_but_not_the_count() -> None:
    opts = NcuOptions(top_n=3, launch_skip=5, launches_per_kernel=9, nvtx_include=("decode/",),
                      clock_control="none")
    cmd = timing_pass_command(TARGET, opts, "/o/topn_pass.csv")
    assert cmd[:8] == ["ncu", "--metrics", "gpu__time_duration.sum", "--csv",
                       "--print-units", "base", "--print-kernel-base", "demangled"]
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


@pytest.mark.parametrize("fixture", NSYS_FIXTURES)
def test_kernel_times_by_demangled_name_keep_instances_apart(fixtures_dir: Path, fixture: str) -> None:
    path = fixtures_dir / "nsys" / fixture
    exact = kernel_times_from_nsys_sqlite(path, by="demangledName")
    short = kernel_times_from_nsys_sqlite(path)
    assert sum(exact.values()) == pytest.approx(sum(short.values()))
    assert len(exact) >= len(short)
    assert {function_base_name(n) for n in exact} == set(short)
    with pytest.raises(UsageError):
        kernel_times_from_nsys_sqlite(path, by="mangledName")


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


def test_each_top_kernel_gets_its_own_run_with_k_launches() -> None:
    names = ["void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<float>>(int, T2)",
             "nvjet_sm90_tst_96x128_64x7_2x1_v_bz_TNN"]
    opts = NcuOptions(top_n=2, launches_per_kernel=3, launch_skip=1, nvtx_include=("decode/",),
                      output_base="/o/ncu")
    runs = per_kernel_options(opts, names)
    assert [r.output_base for r in runs] == ["/o/ncu_top1", "/o/ncu_top2"]
    for run, name in zip(runs, names):
        assert run.top_n is None and run.launch_count == 3 and run.launch_skip == 1
        assert run.kernel_name_base == "demangled" and run.kernel_name == exact_name_regex(name)
        cmd = profile_command(TARGET, run)
        assert _value_after(cmd, "--kernel-name") == run.kernel_name
        assert _value_after(cmd, "--nvtx-include") == "decode/"
        assert _value_after(cmd, "--export") == run.output_base


def test_exact_name_regex_matches_one_template_instance_only() -> None:
    name = "void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<float>, " \
           "std::array<char *, (unsigned long)1>>(int, T2, T3)"
    value = exact_name_regex(name)
    assert value.startswith("regex:^") and value.endswith("$")
    pattern = re.compile(value[len("regex:"):])
    assert pattern.fullmatch(name)
    assert pattern.fullmatch(name.replace("char *", "char*").replace(">>(", "> >("))  # demangler spacing
    for other in (name.replace("(int)4", "(int)8"), name.replace("FillFunctor<float>", "FillFunctor<c10::Half>"),
                  name + "x", "void at::native::vectorized_elementwise_kernel"):
        assert not pattern.fullmatch(other)
    with pytest.raises(UsageError):
        exact_name_regex("  ")


def test_top_kernels_exact_keeps_template_instances_apart() -> None:
    times = {"void k<(int)1>(int)": 5.0, "void k<(int)2>(int)": 4.0, "void g(int)": 7.0}
    assert top_kernels(times, 2) == [("k", 9.0), ("g", 7.0)]
    assert top_kernels(times, 2, exact=True) == [("void g(int)", 7.0), ("void k<(int)1>(int)", 5.0)]


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
