"""benchmarks/ncu_topn_workload.py runs (CPU smoke run) and ncu_topn_check.py judges reports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from perfscope.report import Report

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_workload_runs_on_cpu() -> None:
    pytest.importorskip("torch")
    run = subprocess.run([sys.executable, str(BENCH / "ncu_topn_workload.py"), "--device", "cpu", "--size", "64",
                          "--seq", "32", "--steps", "2"], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    assert "2 steps on cpu" in run.stdout


def _check(path: Path) -> tuple[int, str]:
    run = subprocess.run([sys.executable, str(BENCH / "ncu_topn_check.py"), str(path)], capture_output=True,
                         text=True, timeout=300, check=False)
    return run.returncode, run.stdout + run.stderr


def _top_n_report(load, tmp_path: Path, names: list[str], per_kernel: int) -> Path:
    full: Report = load("h200/h200_engine_gemm_attn_full.ncu-rep")
    params = {**full.params, "top_kernels": [{"name": n, "total_ns": 1.0} for n in names],
              "launches_per_kernel": per_kernel}
    path = tmp_path / "topn.perfscope"
    full.with_manifest(params=params).save(path)
    return path


def test_check_passes_on_gemms_and_sdpa_k_launches_each(load, tmp_path: Path) -> None:
    pytest.importorskip("ncu_report")
    names = list(dict.fromkeys(load("h200/h200_engine_gemm_attn_full.ncu-rep").kernels["name"]))
    code, out = _check(_top_n_report(load, tmp_path, names, per_kernel=2))
    assert code == 0, out
    assert "ncu_topn_check: OK" in out and "attention" in out


def test_check_fails_on_unranked_kernels_and_too_many_launches(load, tmp_path: Path) -> None:
    pytest.importorskip("ncu_report")
    names = list(dict.fromkeys(load("h200/h200_engine_gemm_attn_full.ncu-rep").kernels["name"]))
    code, out = _check(_top_n_report(load, tmp_path, names[:2], per_kernel=1))
    assert code == 1
    assert "did not rank" in out and "launches of" in out
