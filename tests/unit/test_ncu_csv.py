"""ncu CSV shapes and quirks, built in tmp_path from the real long-format fixture's values."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from perfscope.analysis.readers.detect import detect_format
from perfscope.analysis.readers.ncu.csv_launches import parse_number, unit_scale
from perfscope.analysis.readers.ncu.reader import read_ncu_csv
from perfscope.errors import InputFormatError

IDENTITY = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
            "Block Size", "Grid Size", "Device", "CC"]
PROGRAM_OUTPUT = "==PROF== Connected to process 17333 (/tmp/a.out)\nresult ok: 1024x1024\n==PROF== Disconnected\n"


def write_csv(path: Path, rows: list[list[str]], preamble: str = "") -> Path:
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    path.write_text(preamble + buf.getvalue())
    return path


@pytest.fixture(scope="module")
def long_csv(fixtures_dir: Path) -> Path:
    return fixtures_dir / "ncu" / "esmm_a10g_roofline_metrics.csv"


@pytest.fixture(scope="module")
def long_rows(long_csv: Path) -> list[dict[str, str]]:
    with open(long_csv, newline="") as fh:
        return list(csv.DictReader(fh))


def key_columns(path: Path) -> list[tuple]:
    k = read_ncu_csv(path).kernels
    return list(zip(k["ncu_id"], k["name"], k["duration_ns"], k["flops"], k["dram_bytes"], k["grid"]))


def wide_rows(long_rows: list[dict[str, str]], scale: dict[str, tuple[str, float]] | None = None) -> list[list[str]]:
    """``--page raw`` layout of the same results: header, units row, one row per launch."""
    scale = scale or {}
    metrics = sorted({r["Metric Name"] for r in long_rows})
    units = {r["Metric Name"]: r["Metric Unit"] for r in long_rows}
    by_id: dict[str, dict[str, str]] = {}
    for r in long_rows:
        launch = by_id.setdefault(r["ID"], {c: r[c] for c in IDENTITY})
        value = r["Metric Value"]
        if r["Metric Name"] in scale:
            _, factor = scale[r["Metric Name"]]
            value = f"{float(value.replace(',', '')) / factor:.6f}"
        launch[r["Metric Name"]] = value
    unit_row = [""] * len(IDENTITY) + [scale.get(m, (units[m], 1))[0] for m in metrics]
    return [IDENTITY + metrics, unit_row] + [[v[c] for c in IDENTITY + metrics] for v in by_id.values()]


def test_wide_raw_page_with_program_output_equals_long(long_csv: Path, long_rows: list, tmp_path: Path) -> None:
    wide = write_csv(tmp_path / "raw.csv", wide_rows(long_rows), PROGRAM_OUTPUT)
    assert detect_format(wide) == "ncu-csv"
    assert key_columns(wide) == key_columns(long_csv)
    assert read_ncu_csv(wide).params["csv_shape"] == "wide"


@pytest.mark.parametrize("shape", ["long", "wide"])
def test_a_csv_rewritten_with_minimal_quoting_reads_the_same(shape: str, long_csv: Path, long_rows: list,
                                                              tmp_path: Path) -> None:
    """ncu quotes every field; a CSV writer that rewrote the file (pandas ``to_csv``, Python's csv module, a
    spreadsheet) quotes only the fields that need it, so the header reads ``ID,Process ID,...``. Found by
    fuzzing the readers: the rewritten file was 'format not recognised'."""
    pd = pytest.importorskip("pandas")
    if shape == "long":
        rows = [list(long_rows[0])] + [list(r.values()) for r in long_rows]
    else:
        rows = wide_rows(long_rows)
    minimal = tmp_path / f"{shape}_minimal.csv"
    with open(minimal, "w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    assert minimal.read_text().startswith("ID,Process ID,")
    frame = tmp_path / f"{shape}_pandas.csv"
    pd.read_csv(minimal, dtype=str, keep_default_na=False).to_csv(frame, index=False)
    for path in (minimal, frame):
        assert detect_format(path) == "ncu-csv"
        assert key_columns(path) == key_columns(long_csv)
        assert read_ncu_csv(path).params["csv_shape"] == shape


def test_wide_with_scaled_units(long_csv: Path, long_rows: list, tmp_path: Path) -> None:
    scale = {"gpu__time_duration.sum": ("usecond", 1e3), "dram__bytes.sum": ("Mbyte", 1e6)}
    wide = write_csv(tmp_path / "scaled.csv", wide_rows(long_rows, scale))
    for got, want in zip(key_columns(wide), key_columns(long_csv)):
        assert got[3] == want[3]
        assert got[2] == pytest.approx(want[2], abs=1)  # 6 decimals of a microsecond
        assert got[4] == pytest.approx(want[4], rel=1e-9)


def test_decimal_comma_locale_grouping(long_csv: Path, long_rows: list, tmp_path: Path) -> None:
    rows = [list(long_rows[0])] + [[v.replace(",", ".") if k == "Metric Value" else v for k, v in r.items()]
                                   for r in long_rows]
    dotted = write_csv(tmp_path / "de.csv", rows)
    assert "1.073.741.824" in dotted.read_text()
    assert key_columns(dotted) == key_columns(long_csv)


def test_details_page_labels_units_and_rule_rows(fixtures_dir: Path, tmp_path: Path) -> None:
    """Details-page rows (section labels, auto-scaled units, rule rows) from a real launch's values."""
    ncu_report = pytest.importorskip("ncu_report")
    action = ncu_report.load_report(str(fixtures_dir / "ncu" / "esmm_a10g_sol_partial.ncu-rep")).range_by_idx(0).action_by_idx(1)
    m = {n: action.metric_by_name(n).as_double() for n in (
        "gpu__time_duration.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
        "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread",
        "gpc__cycles_elapsed.avg.per_second")}
    ident = ["0", "17333", "a.out", "host", "void gmem_coalesce<(int)32>(int, int, int, const float *, const float *, float *)",
             "1", "7", "(32, 32, 1)", "(32, 32, 1)", "NVIDIA A10G", "8.6"]
    header = IDENTITY + ["Section Name", "Metric Name", "Metric Unit", "Metric Value", "Rule Name", "Rule Type",
                         "Rule Description", "Estimated Speedup Type", "Estimated Speedup"]
    body = [
        ["GPU Speed Of Light Throughput", "Duration", "msecond", f"{m['gpu__time_duration.sum'] / 1e6:.6f}"],
        ["GPU Speed Of Light Throughput", "Compute (SM) Throughput", "%", f"{m['sm__throughput.avg.pct_of_peak_sustained_elapsed']:.2f}"],
        ["GPU Speed Of Light Throughput", "Memory Throughput", "%", f"{m['gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed']:.2f}"],
        ["GPU Speed Of Light Throughput", "SM Frequency", "cycle/nsecond", f"{m['gpc__cycles_elapsed.avg.per_second'] / 1e9:.4f}"],
        ["Memory Workload Analysis", "Memory Throughput", "Gbyte/second", "4.12"],
        ["Occupancy", "Achieved Occupancy", "%", f"{m['sm__warps_active.avg.pct_of_peak_sustained_active']:.2f}"],
        ["Launch Statistics", "Registers Per Thread", "register/thread", f"{m['launch__registers_per_thread']:.0f}"],
        ["SpeedOfLight", "", "", "", "SOLBottleneck", "OPT", "Memory is more heavily utilized than Compute", "global", "42"],
    ]
    rows = [header] + [ident + (b + [""] * 5)[:9] for b in body]
    k = read_ncu_csv(write_csv(tmp_path / "details.csv", rows)).kernels
    row = k.iloc[0]
    assert row["duration_ns"] == round(m["gpu__time_duration.sum"])
    assert row["sm_throughput_pct"] == pytest.approx(m["sm__throughput.avg.pct_of_peak_sustained_elapsed"], abs=5e-3)
    assert row["memory_throughput_pct"] == pytest.approx(
        m["gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"], abs=5e-3)  # not clobbered
    assert row["achieved_occupancy_pct"] == pytest.approx(m["sm__warps_active.avg.pct_of_peak_sustained_active"], abs=5e-3)
    assert row["sm_clock_hz"] == pytest.approx(m["gpc__cycles_elapsed.avg.per_second"], rel=1e-4)
    assert row["registers_per_thread"] == m["launch__registers_per_thread"]
    assert (row["short_name"], row["device"]) == ("gmem_coalesce", "cuda")
    assert read_ncu_csv(tmp_path / "details.csv").device.name == "NVIDIA A10G"


def test_broken_rows_give_a_warning_and_partial_data(long_csv: Path, tmp_path: Path) -> None:
    lines = long_csv.read_text().splitlines()
    lines.insert(3, '"zero","17333","a.out"')  # a cut-off row with a non-numeric ID
    lines.insert(8, lines[8] + ',"stray","fields"')  # extra non-empty fields
    bad = tmp_path / "broken.csv"
    bad.write_text("\n".join(lines) + "\n")
    report = read_ncu_csv(bad)
    assert len(report.kernels) == 9
    assert any("2 malformed CSV row(s) skipped (line 4, 9)" in w for w in report.warnings)


def test_nothing_usable_names_the_line(long_csv: Path, tmp_path: Path) -> None:
    header = long_csv.read_text().splitlines()[0]
    bad = tmp_path / "allbad.csv"
    bad.write_text(header + '\n"x","1"\n"y","2"\n')
    with pytest.raises(InputFormatError, match=r"no usable Nsight Compute results \(line 2 is malformed\)"):
        read_ncu_csv(bad)


def test_csv_without_header(tmp_path: Path) -> None:
    junk = tmp_path / "notes.csv"
    junk.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(InputFormatError, match="no Nsight Compute CSV header"):
        read_ncu_csv(junk)


@pytest.mark.parametrize(("text", "value"), [
    ("1,073,741,824", 1073741824.0), ("27.595.520", 27595520.0), ("1,215,000,000.00", 1215000000.0),
    ("3995313115.40", 3995313115.4), ("45,7", 45.7), ("0", 0.0), ("n/a", None), ("", None),
    ("CachePreferNone", "CachePreferNone"), ("1.5e+09", 1.5e9),
])
def test_parse_number(text: str, value: object) -> None:
    assert parse_number(text) == value


def test_parse_number_decimal_comma_file() -> None:
    assert parse_number("1.234", decimal_comma=True) == 1234.0
    assert parse_number("12,5", decimal_comma=True) == 12.5


@pytest.mark.parametrize(("unit", "factor"), [
    ("nsecond", 1), ("usecond", 1e3), ("msecond", 1e6), ("byte", 1), ("Kbyte", 1e3), ("Gbyte", 1e9),
    ("Gbyte/second", 1e9), ("cycle/nsecond", 1e9), ("cycle/usecond", 1e6), ("Ghz", 1e9), ("hz", 1),
    ("%", 1), ("register/thread", 1), ("inst/cycle", 1), ("", 1), ("ns", 1), ("byte/s", 1),
])
def test_unit_scale(unit: str, factor: float) -> None:
    assert unit_scale(unit) == factor
