"""Roofline classification against a device with known roofs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.roofline import classify, precision_of
from perfscope.device import DeviceSpec, Roof

DEV = DeviceSpec("d", "cuda", {"fp32": Roof(100e9, "measured"), "bf16": Roof(400e9, "datasheet")},
                 {"dram": Roof(10e9, "measured")})


def kernels(**cols):
    n = len(next(iter(cols.values())))
    base = {"name": [f"k{i}" for i in range(n)], "device": ["cuda:0"] * n, "start_ns": [0] * n}
    base.update(cols)
    base.setdefault("end_ns", base["duration_ns"])
    return pd.DataFrame(base)


def test_bound_follows_the_ridge_point_per_precision():
    # fp32 ridge = 10 FLOP/B, bf16 ridge = 40 FLOP/B
    df = kernels(flops=[50e6, 200e6, 200e6], dram_bytes=[10e6, 10e6, 10e6], duration_ns=[1e6, 1e6, 1e6],
                 dtype=["float32", "float32", "bfloat16"])
    out = classify(df, DEV)
    assert out["precision"].tolist() == ["fp32", "fp32", "bf16"]
    assert out["arith_intensity"].tolist() == [5.0, 20.0, 20.0]
    assert out["bound"].tolist() == ["memory", "compute", "memory"]
    assert out["roof_flops_per_s"].tolist() == [50e9, 100e9, 200e9]
    # achieved: 50 GFLOP/s at AI 5 on a 10 GB/s roof -> bytes/s = 10 GB/s = 100% of bandwidth
    assert out["pct_of_roof"].tolist() == pytest.approx([100.0, 200.0, 100.0])


def test_unknown_work_or_precision_stays_unknown():
    df = kernels(flops=[np.nan, 1e6, 1e6], dram_bytes=[1e6, np.nan, 1e6], duration_ns=[1e3] * 3,
                 dtype=["float32", "float32", "float8_e4m3fn"])
    out = classify(df, DEV)
    assert out["bound"].tolist() == ["unknown", "unknown", "unknown"]
    assert out["pct_of_roof"].isna().all()
    assert out["arith_intensity"].isna().tolist() == [True, True, False]


def test_pure_data_movement_is_memory_bound_with_pct_of_bandwidth():
    out = classify(kernels(flops=[0.0], dram_bytes=[5e6], duration_ns=[1e6], dtype=["float32"]), DEV)
    assert out.loc[0, "bound"] == "memory"
    assert out.loc[0, "pct_of_roof"] == pytest.approx(50.0)


def test_no_device_means_no_bound():
    out = classify(kernels(flops=[1.0], dram_bytes=[1.0], duration_ns=[1]), None)
    assert out.loc[0, "bound"] == "unknown"


def test_precision_names():
    assert precision_of("c10::BFloat16") == "bf16"
    assert precision_of("float") == "fp32"
    assert precision_of("torch.float16") == "fp16"
    assert precision_of("long int") is None
