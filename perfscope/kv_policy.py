"""KV-cache sparsification policies: what ``--kv-policy`` means, parsed once, and what each keeps.

``full | streaming:sink=S,window=W | h2o:budget=B[,recent=R] | quest:budget=B[,page=P]``
(docs/kv-policies.md). This module is pure arithmetic (no torch): the engine's caches
(:mod:`perfscope.engine.kv_policies`), ``capacity --kv-policy`` and ``whatif --kv-policy`` all
count kept entries with the same functions, so their figures agree.

- ``streaming`` (StreamingLLM, Xiao et al. 2023): the first ``sink`` tokens plus the last
  ``window`` (the current token among them); every query of a prompt sees the same pattern.
- ``h2o`` (Heavy-Hitter Oracle, Zhang et al. 2023): ``budget`` entries per sequence and KV head,
  the ``recent`` most recent tokens plus the ``budget - recent`` with the highest attention
  accumulated so far (default ``recent = budget // 2``, the paper's even split).
- ``quest`` (Tang et al. 2024): nothing is evicted; each decode query reads the ``budget // page``
  pages whose keys can score highest (per-page min/max keys), except in the first
  :data:`QUEST_DENSE_LAYERS` layers, which stay dense as in the reference implementation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import UsageError

KINDS = ("full", "streaming", "h2o", "quest")
SYNTAX = "full | streaming:sink=S,window=W | h2o:budget=B[,recent=R] | quest:budget=B[,page=P]"
KEYS = {"full": (), "streaming": ("sink", "window"), "h2o": ("budget", "recent"), "quest": ("budget", "page")}
REQUIRED = {"full": (), "streaming": ("window",), "h2o": ("budget",), "quest": ("budget",)}
DEFAULT_SINK = 4
"""StreamingLLM's attention sinks: four initial tokens suffice (Xiao et al. 2023, section 3.2)."""
DEFAULT_PAGE = 16
"""Quest's page (chunk) size in its evaluation scripts."""
QUEST_DENSE_LAYERS = 2
"""Quest leaves the first two layers dense (their attention is not sparse; reference implementation)."""
MAX_TOKENS = 1 << 20


@dataclass(frozen=True)
class KVPolicy:
    """One parsed ``--kv-policy``. Sizes are tokens per sequence (and per KV head for H2O)."""

    kind: str = "full"
    sink: int = 0
    window: int = 0
    budget: int = 0
    recent: int = 0
    page: int = 0

    @property
    def is_full(self) -> bool:
        return self.kind == "full"

    @property
    def evicts(self) -> bool:
        """Whether the cache drops entries (streaming, h2o); Quest keeps them all and selects."""
        return self.kind in ("streaming", "h2o")

    def text(self) -> str:
        """The canonical spelling (``streaming:sink=4,window=64``)."""
        if self.kind == "full":
            return "full"
        return f"{self.kind}:" + ",".join(f"{k}={getattr(self, k)}" for k in KEYS[self.kind])

    def kept(self) -> int | None:
        """Entries a sequence holds at most (streaming, h2o); None when it holds every token."""
        if self.kind == "streaming":
            return self.sink + self.window
        if self.kind == "h2o":
            return self.budget
        return None

    def held(self, length: int) -> int:
        """KV entries (tokens) one sequence of ``length`` tokens holds, per layer."""
        cap = self.kept()
        return length if cap is None else min(length, cap)

    def pages(self, length: int) -> int:
        """Quest's pages for ``length`` tokens (0 for the other policies)."""
        return -(-length // self.page) if self.kind == "quest" else 0

    def attended(self, length: int, layer: int = QUEST_DENSE_LAYERS) -> int:
        """KV entries one decode query reads in ``layer`` at a context of ``length`` tokens (the new
        one included): Quest's selected pages (whole pages: a partial last page is read whole),
        or every entry while the context fits the budget."""
        if self.kind != "quest":
            return self.held(length)
        n_sel = self.budget // self.page
        if layer < QUEST_DENSE_LAYERS or self.pages(length) <= n_sel:
            return length
        return n_sel * self.page

    def metadata_entries(self, length: int, layer: int = QUEST_DENSE_LAYERS) -> int:
        """Quest's page metadata a decode query reads, in K+V entry equivalents: one min and one max
        key per page (2 x head_dim elements, the size of one K and V entry)."""
        if self.kind != "quest" or layer < QUEST_DENSE_LAYERS or self.pages(length) <= self.budget // self.page:
            return 0
        return self.pages(length)

    def read_entries(self, length: int, n_layers: int) -> float:
        """Mean over ``n_layers`` layers of the K+V entries a decode query reads at ``length`` tokens,
        Quest's page metadata included (the KV bytes of a decode step, per sequence and layer)."""
        total = sum(self.attended(length, i) + self.metadata_entries(length, i) for i in range(n_layers))
        return total / max(n_layers, 1)

    def held_bytes_per_sequence(self, length: int, bytes_per_token_layer: float, n_layers: int) -> float:
        """KV-cache bytes one sequence of ``length`` tokens holds over ``n_layers`` layers (Quest adds
        one min and one max key per page: as many elements as one token's K and V)."""
        meta = self.pages(length) * bytes_per_token_layer
        return float(n_layers) * (self.held(length) * bytes_per_token_layer + meta)


FULL = KVPolicy()


def _int(key: str, value: str, text: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise UsageError(f"--kv-policy {text!r}: {key}={value!r} is not a whole number", hint=SYNTAX) from None
    if not 0 <= n <= MAX_TOKENS:
        raise UsageError(f"--kv-policy {text!r}: {key}={n} is out of range (0..{MAX_TOKENS})", hint=SYNTAX)
    return n


def parse_kv_policy(text: str | KVPolicy | None) -> KVPolicy:
    """``streaming:sink=4,window=64`` -> :class:`KVPolicy` (None and ``full``: the full cache).

    Raises:
        UsageError: an unknown policy or key, a missing or out-of-range value (one line, exit 2).
    """
    if text is None:
        return FULL
    if isinstance(text, KVPolicy):
        return text
    raw = str(text).strip()
    kind, _, rest = raw.partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise UsageError(f"--kv-policy {raw!r}: unknown policy {kind!r}", hint=f"use {SYNTAX}")
    values: dict[str, int] = {}
    for part in (p.strip() for p in rest.split(",") if p.strip()):
        key, eq, value = part.partition("=")
        key = key.strip().lower()
        if not eq or key not in KEYS[kind]:
            allowed = ", ".join(KEYS[kind]) or "no options"
            raise UsageError(f"--kv-policy {raw!r}: {kind} takes {allowed}, not {part!r}", hint=f"use {SYNTAX}")
        if key in values:
            raise UsageError(f"--kv-policy {raw!r}: {key} is given twice", hint=SYNTAX)
        values[key] = _int(key, value.strip(), raw)
    missing = [k for k in REQUIRED[kind] if k not in values]
    if missing:
        raise UsageError(f"--kv-policy {raw!r}: {kind} needs {', '.join(missing)}", hint=f"use {SYNTAX}")
    if kind == "streaming":
        p = KVPolicy("streaming", sink=values.get("sink", DEFAULT_SINK), window=values["window"])
        if p.window < 1:
            raise UsageError(f"--kv-policy {raw!r}: window must be at least 1 token (the current one)", hint=SYNTAX)
        return p
    if kind == "h2o":
        budget = values["budget"]
        recent = values.get("recent", budget // 2)
        if budget < 1 or recent > budget:
            raise UsageError(f"--kv-policy {raw!r}: h2o needs budget >= 1 and 0 <= recent <= budget", hint=SYNTAX)
        return KVPolicy("h2o", budget=budget, recent=recent)
    if kind == "quest":
        page = values.get("page", DEFAULT_PAGE)
        budget = values["budget"]
        if page < 1 or budget < page:
            raise UsageError(f"--kv-policy {raw!r}: quest needs page >= 1 and a budget of at least one page "
                             f"(budget >= page)", hint=SYNTAX)
        return KVPolicy("quest", budget=budget, page=page)
    return FULL


def check_engine_options(policy: KVPolicy, *, compile: bool = False, speculative: str | None = None) -> None:
    """Refuse, in one line each, what a policy cache does not run with."""
    if policy.is_full:
        return
    if compile:
        raise UsageError(f"--kv-policy {policy.text()} runs eagerly (its eviction and selection change shapes "
                         "step by step)", hint="drop --compile, or use --kv-policy full")
    if speculative:
        raise UsageError(f"--kv-policy {policy.text()} does not combine with --speculative (a rejected draft "
                         "would have to bring back evicted entries)", hint="drop one of the two")


def kv_policy_text(text: str | KVPolicy | None) -> str:
    """The canonical spelling of a policy given in any form (``full`` for None)."""
    return parse_kv_policy(text).text()


def read_ratio(policy: KVPolicy, length: int, n_layers: int) -> float:
    """A decode step's KV bytes under ``policy`` over the full cache's, at ``length`` tokens."""
    return policy.read_entries(length, n_layers) / length if length > 0 else math.nan


__all__ = ["DEFAULT_PAGE", "DEFAULT_SINK", "FULL", "KINDS", "QUEST_DENSE_LAYERS", "SYNTAX", "KVPolicy", "check_engine_options",
           "kv_policy_text", "parse_kv_policy", "read_ratio"]
