"""ncu top-N end to end on the CPU, with a stand-in ``ncu`` on PATH.

The stand-in is a small Python script: it records its arguments, answers ``--version``, writes a
timing-pass CSV whose launch order is the issue's workload (``torch.randn`` and scaling kernels at
start-up, then bf16 GEMMs, an SDPA and elementwise ops), and for a profiled run copies a real
``--set full`` H200 report (``h200_engine_gemm_attn_full.ncu-rep``) to its ``--export`` path.
"""

from __future__ import annotations

import csv
import io
import json
import re
import stat
import sys
from pathlib import Path

import pytest

from perfscope.collectors import NcuOptions
from perfscope.collectors.ncu import NcuCollector
from perfscope.report import Report

RANDN = ("void at::native::(anonymous namespace)::distribution_elementwise_grid_stride_kernel<float, (int)4, "
         "at::native::templates::cuda::normal_and_transform<float, float>>(long, at::PhiloxCudaState, T3, T4)")
SCALE = ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::AUnaryFunctor<c10::BFloat16, "
         "c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float>>, std::array<char *, "
         "(unsigned long)2>>(int, T2, T3)")
ADD = ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_add<c10::BFloat16>, "
       "std::array<char *, (unsigned long)3>>(int, T2, T3)")
GEMM_BIG = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"
GEMM_SMALL = "nvjet_sm90_tst_128x64_64x8_1x2_h_bz_TNT"
SDPA = ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0")
LAUNCHES = (  # (name, ns): start-up kernels first, many of them, each short
    [(RANDN, 3_000.0)] * 40 + [(SCALE, 2_000.0)] * 40
    + [(GEMM_BIG, 46_000.0), (SDPA, 10_000.0), (GEMM_SMALL, 30_000.0), (ADD, 2_500.0)] * 4
)
TOP = [GEMM_BIG, GEMM_SMALL, RANDN, SCALE, SDPA]  # by total time: 184 us, 120, 120 (ties by name), 80, 40

STANDIN = """#!{python}
import json, os, shutil, sys
args = sys.argv[1:]
with open(os.environ["NCU_STANDIN_LOG"], "a") as fh:
    fh.write(json.dumps(args) + "\\n")
if args == ["--version"]:
    print("NVIDIA (R) Nsight Compute Command Line Profiler\\nVersion 2025.3.1.0 (build 0) (public-release)")
    sys.exit(0)
def after(flag):
    return args[args.index(flag) + 1]
if "--csv" in args:
    with open(after("--log-file"), "w") as fh:
        fh.write(open(os.environ["NCU_STANDIN_CSV"]).read())
else:
    shutil.copyfile(os.environ["NCU_STANDIN_REPORT"], after("--export") + ".ncu-rep")
    with open(after("--log-file"), "w") as fh:
        fh.write("==PROF== Disconnected from process 1\\n")
"""


def _timing_csv() -> str:
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL)
    writer.writerow(["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
                     "Block Size", "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit",
                     "Metric Value"])
    for i, (name, ns) in enumerate(LAUNCHES):
        writer.writerow([i, 1, "python3", "host", name, 1, 7, "(128, 1, 1)", "(132, 1, 1)", 0, "9.0",
                         "Command line profiler metrics", "gpu__time_duration.sum", "nsecond", f"{ns:,.0f}"])
    return "==PROF== Connected to process 1\n" + out.getvalue()


@pytest.fixture
def standin(tmp_path: Path, fixtures_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pytest.importorskip("ncu_report")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ncu = bin_dir / "ncu"
    ncu.write_text(STANDIN.format(python=sys.executable))
    ncu.chmod(ncu.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "timing.csv").write_text(_timing_csv())
    log = tmp_path / "args.jsonl"
    monkeypatch.setenv("PATH", str(bin_dir))  # no nsys: the first pass is ncu's
    monkeypatch.setenv("NCU_STANDIN_LOG", str(log))
    monkeypatch.setenv("NCU_STANDIN_CSV", str(tmp_path / "timing.csv"))
    monkeypatch.setenv("NCU_STANDIN_REPORT", str(fixtures_dir / "h200" / "h200_engine_gemm_attn_full.ncu-rep"))
    return log


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines() if json.loads(line) != ["--version"]]


def _after(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_each_top_kernel_is_profiled_k_times_by_its_exact_name(standin: Path, tmp_path: Path) -> None:
    options = NcuOptions(top_n=5, launches_per_kernel=2, section_set="full", clock_control="none",
                         stream_stderr=False)
    capture = NcuCollector().collect(["python", "workload.py"], tmp_path / "out", options)
    calls = _calls(standin)
    assert len(calls) == 6  # the timing pass, then one run per top kernel
    timing, runs = calls[0], calls[1:]
    assert "--csv" in timing and _after(timing, "--print-kernel-base") == "demangled"
    assert "--launch-count" not in timing and "--kernel-name" not in timing
    assert [k["name"] for k in capture.params["top_kernels"]] == TOP
    everything = {name for name, _ in LAUNCHES}
    for rank, (args, name) in enumerate(zip(runs, TOP), start=1):
        assert args[-2:] == ["python", "workload.py"]
        assert _after(args, "--set") == "full" and _after(args, "--clock-control") == "none"
        assert _after(args, "--kernel-name-base") == "demangled"
        assert _after(args, "--launch-count") == "2"
        assert _after(args, "--export") == str(tmp_path / "out" / f"ncu_top{rank}")
        value = _after(args, "--kernel-name")
        assert value.startswith("regex:")
        pattern = re.compile(value[len("regex:"):])
        assert {n for n in everything if pattern.search(n)} == {name}  # exactly this kernel, no other
    assert [p.name for p in capture.files if p.suffix == ".ncu-rep"] == [f"ncu_top{i}.ncu-rep" for i in range(1, 6)]
    assert capture.params["launches_per_kernel"] == 2 and len(capture.commands) == 6


def test_top_n_full_set_imports_as_one_report_with_stall_findings(standin: Path, tmp_path: Path) -> None:
    from perfscope.analysis.findings import run_rules
    from perfscope.sessions.profile import profile_external

    options = NcuOptions(top_n=2, section_set="full", stream_stderr=False)
    report, raw = profile_external(["python", "workload.py"], collector="ncu", options=options,
                                   work_dir=tmp_path / "work")
    k = report.kernels
    assert len(k) == 12  # the stand-in's report holds 6 launches; one per top kernel's run
    assert k["ncu_id"].tolist() == list(range(12))
    assert report.params["reports"] == ["ncu_top1.ncu-rep", "ncu_top2.ncu-rep"]
    assert report.params["top_n"] == 2 and len(report.manifest["command"]) == 3
    assert set(k["phase"]) == {"prefill"} and k["stall_top1"].notna().all()
    assert {"raw/ncu_top1.ncu-rep", "raw/ncu_top2.ncu-rep"} <= set(raw)
    assert any(f.id.startswith("occupancy") or "stall" in f.title.lower() for f in run_rules(report))


def test_top_n_and_launch_count_together_are_refused() -> None:
    from perfscope.errors import UsageError

    with pytest.raises(UsageError, match="--top-n-launches"):
        NcuOptions(top_n=2, launch_count=3)


def test_cli_profile_top_n_full_set(standin: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from perfscope.cli import main

    out = tmp_path / "topn.perfscope"
    code = main(["profile", "--collector", "ncu", "--set", "full", "--top-n", "3", "--top-n-launches", "2",
                 "--out", str(out), "--no-html", "-q", "--", "python", "workload.py"])
    assert code == 0, capsys.readouterr().err
    runs = _calls(standin)[1:]
    assert len(runs) == 3 and all(_after(a, "--launch-count") == "2" and _after(a, "--set") == "full" for a in runs)
    report = Report.load(out)
    assert report.params["launches_per_kernel"] == 2 and len(report.params["top_kernels"]) == 3
    assert sorted(p.name for p in (out / "raw").iterdir() if p.suffix == ".ncu-rep") == \
        ["ncu_top1.ncu-rep", "ncu_top2.ncu-rep", "ncu_top3.ncu-rep"]
    capsys.readouterr()
    assert main(["analyze", str(out)]) == 0
    assert "top stall" in capsys.readouterr().out
