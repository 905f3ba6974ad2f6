"""The one reader of a kernel's base name (perfscope.kernel_names), on the name forms real profilers write.

Every distinct kernel name of the committed Kineto, Nsight Compute and rocprof fixtures gets a base name
that is an identifier of the name itself (never ``void``, a number or an empty string), and the forms that
used to defeat the two earlier readers (``(anonymous namespace)`` scopes, lambda template arguments, a
``std::enable_if<!(false), void>::type`` return type, Itanium-mangled symbols) give the function's own name.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from perfscope.analysis.readers.detect import import_file
from perfscope.kernel_names import short_kernel_name

FIXTURES = Path(__file__).parents[1] / "fixtures"


@pytest.mark.parametrize(("name", "base"), [
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, false, false>(float*, float const*, "
     "int, int, int, bool const*, int, bool)", "softmax_warp_forward"),
    ("void at::native::(anonymous namespace)::distribution_elementwise_grid_stride_kernel<float, 4, "
     "at::native::templates::cuda::uniform_and_transform<float, float, at::CUDAGeneratorImpl*, "
     "at::native::templates::cuda::uniform_kernel<at::CUDAGeneratorImpl*>(at::TensorIteratorBase&, double, double, "
     "at::CUDAGeneratorImpl*)::{lambda()#1}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}>"
     "(at::TensorIteratorBase&, at::CUDAGeneratorImpl*, at::native::templates::cuda::uniform_kernel<at::"
     "CUDAGeneratorImpl*>(at::TensorIteratorBase&, double, double, at::CUDAGeneratorImpl*)::{lambda()#1}::operator()() "
     "const::{lambda()#2}::operator()() const::{lambda(float)#1})::{lambda(curandStatePhilox4_32_10*)#2}>(long, "
     "at::PhiloxCudaState, at::native::templates::cuda::uniform_and_transform)", "distribution_elementwise_grid_stride_kernel"),
    ("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, float, float, float, float, false, true, "
     "true, false, 7, false, cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, "
     "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float> >(cublasGemvParamsEx<"
     "int, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, "
     "cublasGemvTensorStridedBatched<float>, float>)", "kernel"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, "
     "at::native::FillFunctor<float>, std::array<char*, 1ul>)", "vectorized_elementwise_kernel"),
    ("_Z32flash_fwd_splitkv_mla_kernel_ldsI19FlashMlaKernelTraitILi576ELi512ELi64ELi16ELi4EEDF16_fLb1EEv17FlashMlaFwdParams",
     "flash_fwd_splitkv_mla_kernel_lds"),
    ("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_",
     "vectorized_elementwise_kernel"),
    ("void ns::k<(int)4>(float *)", "k"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"),
    ("triton_poi_fused_add_0", "triton_poi_fused_add_0"),
    # nothing to read: the name itself, never a made-up one
    ("", ""), ("(unnamed kernel)", "(unnamed kernel)"), ("_Z", "_Z"), ("_Z99abc", "_Z99abc"),
])
def test_base_name_of_each_form(name: str, base: str) -> None:
    assert short_kernel_name(name) == base


DEGENERATE = re.compile(r"void|\d*|std|\(.*")

TRACES = ["kineto/tracelens_b200__eager_trace.json.gz", "rocprof/aiter_fmla_MI308X_rocprof_compute",
          "ncu/esmm_a10g_all_metrics.ncu-rep", "rocprof/llamacpp_r9700_rocpd/32432_results.db"]


@pytest.mark.parametrize("trace", TRACES)
def test_every_kernel_of_a_real_trace_gets_its_own_identifier(trace: str) -> None:
    path = FIXTURES / trace
    if not path.exists():
        pytest.skip(f"{trace} not committed")
    k = import_file(path).kernels
    pairs = set(zip(k["name"].astype(str), k["short_name"].astype(str)))
    assert pairs
    for name, short in pairs:
        assert short and not DEGENERATE.fullmatch(short), (name, short)
        assert short in name or name.startswith("_Z"), (name, short)
        if name.startswith("_Z") and short != name:
            assert re.search(rf"(?<!\d){len(short)}{re.escape(short)}", name), (name, short)
