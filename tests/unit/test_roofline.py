"""Roofline classification against a device with known roofs."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.costs.roofline import classify, precision_of
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
                 dtype=["float32", "float32", "int8"])  # DEV lists no int8 (nor a wider roof for it)
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


def test_fp32_ops_on_tf32_tensor_core_kernels_use_the_tf32_roof():
    dev = DeviceSpec("a100", "cuda", {"fp32": Roof(19.5e12, "datasheet"), "tf32": Roof(156e12, "datasheet")},
                     {"dram": Roof(1.5e12, "datasheet")})
    df = kernels(name=["cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4", "ampere_sgemm_128x64_nn",
                       "sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n"],
                 flops=[1e9] * 3, dram_bytes=[1e6] * 3, duration_ns=[1e5] * 3, dtype=["float32"] * 3)
    out = classify(df, dev)
    assert out["precision"].tolist() == ["tf32", "fp32", "tf32"]
    assert out["roof_flops_per_s"].tolist() == [156e12, 19.5e12, 156e12]


def test_aggregate_by_short_name():
    from perfscope.analysis.summaries.kernels import aggregate_by_name

    df = classify(kernels(name=["a<int>", "a<float>", "b"], short_name=["a", "a", "b"], flops=[1.0, 2.0, 3.0],
                          dram_bytes=[1.0, 1.0, 1.0], duration_ns=[10, 20, 30], dtype=["float32"] * 3), DEV)
    agg = aggregate_by_name(df, DEV, key="short_name").set_index("name")
    assert agg.loc["a", "count"] == 2 and agg.loc["a", "flops"] == 3.0 and agg.loc["a", "duration_ns"] == 30


def test_cached_cpu_roofs_are_measured_again_on_another_cpu(tmp_path, monkeypatch) -> None:
    """A VM that moves to a host with another CPU keeps its model name ("AMD EPYC") and hostname;
    its cached roofs must not be reused there."""
    from perfscope.collectors import roofs

    monkeypatch.setenv("PERFSCOPE_CACHE_DIR", str(tmp_path))
    measured: list[str] = []

    def measure() -> DeviceSpec:
        measured.append(roofs.cpu_signature())
        return DeviceSpec("AMD EPYC", "cpu", {"fp32": Roof(1e11, "measured", "test")},
                          {"dram": Roof(3e10, "measured", "test")})

    first = roofs.device_roofs("cpu", measure=measure)
    assert "cached" not in first.properties
    assert "cached" in roofs.device_roofs("cpu", measure=measure).properties  # same CPU: the cache
    assert len(measured) == 1
    signature = roofs.cpu_signature()
    assert signature.endswith(f"|{os.cpu_count()}")
    monkeypatch.setattr(roofs, "cpu_signature", lambda: signature.replace("|", "|other ", 1))
    again = roofs.device_roofs("cpu", measure=measure)  # another host's CPU: measured again
    assert "cached" not in again.properties and len(measured) == 2


def test_bound_columns_are_the_shared_object_text_the_stored_table_holds():
    """``bound`` / ``roofline_bound`` are built as object columns of str (one shared str per bound), the form the
    import's stored kernel table holds, with or without a device."""
    df = kernels(flops=[50e6, 200e6, np.nan], dram_bytes=[10e6, 10e6, 1e6], duration_ns=[1e6] * 3,
                 dtype=["float32", "float32", "float32"])
    for dev, want in ((DEV, ["memory", "compute", "unknown"]), (None, ["unknown"] * 3)):
        out = classify(df, dev)
        for col in ("bound", "roofline_bound"):
            assert out[col].dtype == object
            assert out[col].tolist() == want
            assert all(type(v) is str for v in out[col])
