"""The engine profiled on a real CUDA GPU (skipped without one): run on a lent GPU machine with
`pytest tests/gpu -m gpu`."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu_roofs(tmp_path_factory):
    import os

    from perfscope.collectors.roofs import device_roofs

    os.environ.setdefault("PERFSCOPE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    return device_roofs("cuda")


def test_cuda_roofs_are_measured_with_datasheet_fallback(gpu_roofs):
    assert gpu_roofs.kind == "cuda"
    for prec in ("fp32", "tf32", "bf16", "fp16"):
        assert gpu_roofs.compute[prec].provenance == "measured" and gpu_roofs.compute[prec].value > 1e12
    assert gpu_roofs.memory["dram"].provenance == "measured" and gpu_roofs.memory["dram"].value > 1e11
    assert gpu_roofs.compute["bf16"].value > 2 * gpu_roofs.compute["fp32"].value  # tensor cores


def test_engine_on_cuda_links_kernels_to_ops(gpu_roofs):
    from perfscope.sessions.profile import EngineRun, profile_engine

    r = profile_engine(EngineRun(model="tiny", batch=2, prompt_len=32, gen_len=8, device="cuda",
                                 dtype="bfloat16", compile=False), roofs=gpu_roofs)  # eager: ops on every kernel
    k = r.kernels
    assert len(k) and k["device"].str.startswith("cuda").all()
    assert set(k["phase"].dropna()) == {"prefill", "decode"}
    gemm = k[k["category"] == "gemm"]
    assert len(gemm) and gemm["flops"].notna().all() and (gemm["precision"] == "bf16").all()
    assert (gemm[gemm["phase"] == "decode"]["bound"] == "memory").all()
    assert len(r.steps) == 8 and len(r.requests) == 2


def test_small_model_prefill_mfu_and_decode_mbu_are_plausible(gpu_roofs):
    from perfscope.analysis.summaries.serving import phase_summary
    from perfscope.sessions.profile import EngineRun, profile_engine

    r = profile_engine(EngineRun(model="small", batch=1, prompt_len=512, gen_len=16, device="cuda",
                                 dtype="bfloat16"), roofs=gpu_roofs)
    ph = phase_summary(r).set_index("phase")
    assert 0 < ph.loc["decode", "mbu"] <= 1.2
    assert 0 < ph.loc["prefill", "mfu"] <= 1.2


def test_compiled_decode_on_cuda_matches_eager_and_is_the_default(gpu_roofs):
    """Decode compiled into CUDA graphs by default: same greedy tokens as eager, compile time apart,
    steps timed with CUDA events (headline from the warm unprofiled run)."""
    import itertools

    import torch

    from perfscope.analysis.summaries.serving import phase_summary
    from perfscope.engine import build_model, generate, random_prompts
    from perfscope.sessions.profile import EngineRun, profile_engine

    model = build_model("tiny", device="cuda", dtype=torch.float32)
    prompts = random_prompts(2, 16, model.args.vocab_size)
    eager = generate(model, prompts, 8)
    torch._dynamo.reset()
    compiled = [generate(model, prompts, 8, compile=True) for _ in range(3)]
    assert all(c.generated_ids == eager.generated_ids for c in compiled)
    steps = compiled[-1].steps
    assert all(a.end_ns <= b.start_ns for a, b in itertools.pairwise(steps)) and all(s.end_ns > s.start_ns for s in steps)
    r = profile_engine(EngineRun(model="tiny", batch=1, prompt_len=32, gen_len=8, device="cuda"), roofs=gpu_roofs)
    p = r.params
    assert p["compile"] is True and p["compile_s"] is not None and p["compile_s"] > 0
    assert len(r.steps_unprofiled) == len(r.steps) == 8
    assert set(phase_summary(r)["timing"]) == {"unprofiled"}
