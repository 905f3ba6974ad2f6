"""Speculative decoding, what if: tokens/s for each draft length K from one run with drafting.

From the measured run (the engine's ``--speculative``: ``draft`` and ``verify`` steps with
``drafted`` / ``accepted``):

- **acceptance per draft position**: ``a_i`` = the share of verify steps that reached position i
  (drafted at least i tokens, accepted the i - 1 before it) and accepted it. Positions past the
  measured K take the last measured ``a_K`` (stated: the acceptance of deeper drafts is not measured);
- **tokens per cycle** at K: the measured cycles replayed at K (:func:`cycles_replayed`: a draft from
  the same context proposes the same tokens, so a cycle of another K accepts what the measured run's
  tokens say, up to the first rejection; past a draft cut by the measured K, the last measured
  acceptance); a run of several sequences per step: ``1 + p_draft * sum_{i<=K} prod_{m<=i} a_m``,
  ``p_draft`` the share of cycles that had a draft (prompt lookup finds none in some);
- **cost per cycle** at K: the draft's (a self-draft runs one forward per drafted token: K x its
  mean draft step; a prompt lookup costs its measured lookup step whatever K) plus the verify
  forward of K + 1 tokens, projected by :func:`.project.project` (``draft_len=K``: the verify steps'
  shapes at K + 1 tokens, the family's fitted time line), or a plain decode step when there was no
  draft; on another GPU with ``gpu``;
- **tokens/s** = tokens per cycle / cost per cycle; the best K is the largest.
Times come from the unprofiled run where it was recorded (each phase scaled by its projected /
measured ratio in the profiled run), else from the profiled one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.errors import UsageError

from .project import Question, project

if TYPE_CHECKING:
    from collections.abc import Sequence

    from perfscope.report import Report


@dataclass(frozen=True)
class SpeculativeTable:
    """tokens/s per draft length K, projected from one run with drafting."""

    measured_k: int
    method: str | None
    acceptance: list[float]
    rows: pd.DataFrame
    notes: list[str] = field(default_factory=list)

    @property
    def best_k(self) -> int:
        return int(self.rows.loc[self.rows["tokens_per_s"].idxmax(), "draft_len"])

    def to_dict(self) -> dict[str, Any]:
        return {"measured_draft_len": self.measured_k, "method": self.method, "acceptance_per_position": self.acceptance,
                "best_draft_len": self.best_k, "projected": True, "rows": self.rows.to_dict(orient="records"),
                "notes": self.notes}

    def render(self) -> str:
        from perfscope.format import duration, si

        lines = [f"speculative decoding ({self.method or '?'}), measured at K={self.measured_k}; "
                 f"acceptance per position: {', '.join(f'{a:.2f}' for a in self.acceptance)}",
                 f"{'K':>3} {'tokens/cycle':>13} {'draft':>10} {'verify':>10} {'cycle':>10} {'tokens/s':>10}"]
        for r in self.rows.itertuples(index=False):
            lines.append(f"{r.draft_len:>3} {r.tokens_per_cycle:>13.2f} {duration(r.draft_s * 1e9):>10} "
                         f"{duration(r.verify_s * 1e9):>10} {duration(r.cycle_s * 1e9):>10} {si(r.tokens_per_s):>10}"
                         + ("  (measured K)" if r.draft_len == self.measured_k else ""))
        lines.append(f"best K: {self.best_k} (projected)")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def acceptance_per_position(steps: pd.DataFrame) -> list[float]:
    """``a_i`` for i = 1..max drafted (see the module docstring)."""
    v = steps[steps["phase"] == "verify"]
    drafted = pd.to_numeric(v["drafted"], errors="coerce").to_numpy(np.float64, na_value=np.nan)
    accepted = pd.to_numeric(v["accepted"], errors="coerce").to_numpy(np.float64, na_value=np.nan)
    ok = ~np.isnan(drafted) & ~np.isnan(accepted)
    drafted, accepted = drafted[ok], accepted[ok]
    out = []
    for i in range(1, int(drafted.max()) + 1 if len(drafted) else 1):
        reached = (drafted >= i) & (accepted >= i - 1)
        if not reached.any():
            break
        out.append(float((accepted[reached] >= i).mean()))
    return out


def cycles_replayed(steps: pd.DataFrame, ks: Sequence[int], measured_k: int, tail: float) -> dict[int, float] | None:
    """Tokens per cycle at each K, by replaying one sequence's measured cycles (batch 1); None where the
    run had several sequences per step or no ordered cycles.

    The measured cycles cover the generated tokens: a cycle starting at token t drafted ``d`` and
    accepted ``a`` (a decode step: ``d = a = 0``), then the target model emitted token t + a. A draft
    from the same context proposes the same tokens (a greedy self-draft, a prompt lookup), so a cycle
    of another K starting at a token u in [t, t + a) accepts exactly the t + a - u tokens to the
    rejection when there was one (a < d), and a cycle starting at the rejected token t + a accepts
    none; where the measured draft was cut by K itself (a = d = K) what follows is not measured: the
    next token is accepted with probability ``tail`` (the last measured acceptance) and the run goes on
    as the next measured cycle's. A lookup that found fewer than K tokens (d < K) had no more to offer.
    Expected cycles from each token are solved backwards; tokens per cycle = tokens / cycles. At the
    measured K it gives back the measured cycles exactly."""
    cyc = steps[steps["phase"].isin(("verify", "decode"))].sort_values("start_ns", kind="stable")
    if not len(cyc) or (pd.to_numeric(cyc["batch"], errors="coerce") > 1).any():
        return None
    d = pd.to_numeric(cyc["drafted"], errors="coerce").fillna(0).astype(int).to_numpy()
    a = pd.to_numeric(cyc["accepted"], errors="coerce").fillna(0).astype(int).to_numpy()
    a = np.minimum(a, d)
    n = int((a + 1).sum())
    kmax = max(int(max(ks)), 1)
    # S[u, j-1] = P(a cycle starting at token u accepts at least j drafts), j = 1..kmax
    run = np.zeros(n + 1, np.int64)  # measured accepted tokens from u to the run's end
    cut = np.zeros(n + 1, bool)  # the run ends where the measured draft was cut by K (not measured past)
    t = 0
    for dc, ac in zip(d, a):
        for u in range(t, t + ac):
            run[u] = t + ac - u
            cut[u] = ac == dc == measured_k
        run[t + ac] = 0
        cut[t + ac] = ac == dc == measured_k  # the target's token after a fully accepted draft: not measured
        t += ac + 1
    surv = np.zeros((n + 2, kmax), np.float64)
    for u in range(n - 1, -1, -1):
        r = int(run[u])
        surv[u, :min(r, kmax)] = 1.0
        if cut[u] and r < kmax:
            e = u + r  # the unmeasured token: accepted with probability tail, then the next run's
            surv[u, r] = tail
            if r + 1 < kmax:
                surv[u, r + 1:] = tail * surv[min(e + 1, n + 1), :kmax - r - 1]
    out: dict[int, float] = {}
    for k in ks:
        k = int(k)
        g = np.zeros(n + k + 2, np.float64)
        for u in range(n - 1, -1, -1):
            s_ = np.concatenate([[1.0], surv[u, :k], [0.0]])  # P(A >= 0..k+1)
            p = s_[:-1] - s_[1:]  # P(A = 0..k)
            g[u] = 1.0 + float(np.dot(p, g[u + 1:u + k + 2]))
        out[k] = n / g[0] if g[0] > 0 else float("nan")
    return out


def _phase_mean_s(steps: pd.DataFrame, phase: str) -> float:
    s = steps[steps["phase"] == phase]
    return float(s["duration_ns"].mean()) / 1e9 if len(s) else float("nan")


def speculative_sweep(report: Report, ks: Sequence[int], *, gpu: str | None = None) -> SpeculativeTable:
    """tokens/s for each draft length in ``ks`` (see the module docstring).

    Raises:
        UsageError: the report has no verify steps with drafted / accepted counts (one line naming it)."""
    steps = report.steps
    if not len(steps) or not (steps["phase"] == "verify").any() or steps["drafted"].isna().all():
        raise UsageError(f"{report.name}: no speculative verify steps with drafted/accepted counts, so --draft-len "
                         "cannot be answered", hint="profile a run with drafting: perfscope profile --speculative ngram")
    spec = report.params.get("speculation") or {}
    method = spec.get("method") or report.params.get("speculative")
    measured_k = int(spec.get("draft_len") or report.params.get("draft_len") or pd.to_numeric(steps["drafted"]).max())
    acc = acceptance_per_position(steps)
    notes = []
    if not acc:
        raise UsageError(f"{report.name}: its verify steps drafted no token, so no acceptance was measured")
    decode_like = steps[steps["phase"].isin(("verify", "decode"))]
    p_draft = float((decode_like["phase"] == "verify").mean()) if len(decode_like) else 1.0
    self_draft = isinstance(method, str) and method.startswith("self")
    head = report.steps_unprofiled if len(report.steps_unprofiled) else steps
    # draft cost per drafted token (self) or per cycle (lookup), from the headline run
    drafts = head[head["phase"] == "draft"]
    n_verify = max(int((head["phase"] == "verify").sum()), 1)
    if self_draft:
        per_token = float(drafts["duration_ns"].sum()) / 1e9 / max(float(pd.to_numeric(drafts["tokens"]).sum()), 1.0)
    else:
        per_cycle = float(drafts["duration_ns"].sum()) / 1e9 / max(len(decode_like), 1) if len(drafts) else 0.0
    replay = cycles_replayed(steps, ks, measured_k, acc[-1])
    rows = []
    for k in ks:
        proj = project(report, Question(gpu=gpu, draft_len=int(k)))
        ratio_v = _phase_mean_s(proj.steps, "verify") / _phase_mean_s(steps, "verify")
        ratio_d = _phase_mean_s(proj.steps, "decode") / _phase_mean_s(steps, "decode") \
            if (steps["phase"] == "decode").any() else 1.0
        ratio_draft = _phase_mean_s(proj.steps, "draft") / _phase_mean_s(steps, "draft") \
            if (steps["phase"] == "draft").any() else 1.0
        verify_s = _phase_mean_s(head, "verify") * ratio_v
        decode_s = _phase_mean_s(head, "decode") * ratio_d if (head["phase"] == "decode").any() else verify_s
        draft_s = (k * per_token if self_draft else per_cycle) * (1.0 if np.isnan(ratio_draft) else ratio_draft)
        if replay:
            tokens = replay[int(k)]
        else:  # several sequences per step: the acceptance per position, positions past K_measured its last
            tokens = 1.0 + p_draft * float(np.sum(np.cumprod([acc[min(i, len(acc) - 1)] for i in range(k)])))
        cycle = draft_s + p_draft * verify_s + (1.0 - p_draft) * decode_s
        rows.append({"draft_len": int(k), "tokens_per_cycle": tokens, "draft_s": draft_s, "verify_s": verify_s,
                     "cycle_s": cycle, "tokens_per_s": tokens / cycle if cycle > 0 else float("nan"),
                     "acceptance_measured": k <= len(acc)})
    if any(k > len(acc) for k in ks):
        notes.append(f"positions past {len(acc)} take the last measured acceptance ({acc[-1]:.2f}): not measured")
    del n_verify
    return SpeculativeTable(measured_k, method, acc, pd.DataFrame(rows), notes)
