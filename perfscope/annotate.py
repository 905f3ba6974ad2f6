"""``perfscope.annotate(name)``: one range that both nsys (NVTX) and torch.profiler
(``record_function``) see, usable as a context manager or a decorator.

It costs next to nothing when no profiler is attached: the torch range is entered only while
torch's profiler is enabled, and NVTX ranges go through the ``nvtx`` package (a no-op domain
when no NVTX tool is injected) or, without it, ``torch.cuda.nvtx`` when CUDA is initialised.

``perfscope.annotate.step(phase, batch=, tokens=, context=)`` marks one inference step by hand,
for a framework perfscope does not hook: a range named ``perfscope.step[PHASE bs=B toks=T ctx=C]``
(``ctx=`` left out when the context is unknown), read back as a step like vLLM's and SGLang's.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from types import TracebackType

F = TypeVar("F", bound=Callable[..., Any])

DOMAIN = "perfscope"
STEP_PHASES = ("prefill", "decode", "mixed")
"""Phases a hand-marked step may have (``mixed``: prefill and decode tokens in one step)."""


def step_label(phase: str, batch: int, tokens: int, context: int | None = None) -> str:
    """The range name of a hand-marked step: ``perfscope.step[PHASE bs=B toks=T ctx=C]``.

    Args:
        phase: ``prefill``, ``decode`` or ``mixed``.
        batch: sequences in the step.
        tokens: new tokens the step processes (all sequences together).
        context: context (KV) tokens the step attends, over all sequences; None when unknown.

    Raises:
        UsageError: an unknown phase, or a count that is not a non-negative integer.

    Examples:
        >>> step_label("decode", 8, 8, 4096)
        'perfscope.step[decode bs=8 toks=8 ctx=4096]'
        >>> step_label("prefill", batch=1, tokens=512)
        'perfscope.step[prefill bs=1 toks=512]'
    """
    from .errors import UsageError

    if phase not in STEP_PHASES:
        raise UsageError(f"a step's phase is one of {', '.join(STEP_PHASES)}, got {phase!r}")
    counts = {"batch": batch, "tokens": tokens, "context": context}
    for name, value in counts.items():
        if value is None and name == "context":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UsageError(f"perfscope.annotate.step: {name} must be a non-negative integer, got {value!r}")
    ctx = "" if context is None else f" ctx={context}"
    return f"perfscope.step[{phase} bs={batch} toks={tokens}{ctx}]"


def _nvtx_domain() -> Any:
    """The default NVTX domain, or None when no NVTX tool (nsys, ncu) is attached to the process:
    the nvtx package then hands out a do-nothing domain, and skipping it saves its call cost."""
    try:
        import nvtx  # type: ignore[import-not-found]
    except ImportError:
        return None
    domain = nvtx.get_domain(None)
    return None if type(domain).__name__ == "DummyDomain" else domain


@functools.lru_cache(maxsize=4096)
def _attributes(domain: Any, name: str) -> Any:
    return domain.get_event_attributes(message=name)


@functools.lru_cache(maxsize=1)
def _domain() -> Any:
    return _nvtx_domain()


def _torch() -> Any:
    return sys.modules.get("torch")


def profiler_enabled() -> bool:
    """True while a torch.profiler session is recording on this thread."""
    torch = _torch()
    if torch is None:
        return False
    try:
        return bool(torch.autograd.profiler._is_profiler_enabled)
    except AttributeError:  # older torch
        return bool(torch._C._autograd._profiler_enabled())


class annotate:  # lower case: reads like nvtx.annotate / record_function
    """A named range for NVTX and torch.profiler.

    Examples:
        >>> with annotate("prefill"):
        ...     pass
        >>> @annotate("step")
        ... def step():
        ...     return 1
        >>> step()
        1
    """

    __slots__ = ("_nvtx", "_rf", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._rf: Any = None
        self._nvtx: Any = None

    def __enter__(self) -> annotate:
        domain = _domain()
        if domain is not None:
            domain.push_range(_attributes(domain, self.name))
            self._nvtx = domain
        else:
            torch = _torch()
            if torch is not None and torch.cuda.is_initialized():
                torch.cuda.nvtx.range_push(self.name)
                self._nvtx = torch.cuda.nvtx
        if profiler_enabled():
            torch = _torch()
            self._rf = torch.profiler.record_function(self.name)
            self._rf.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._rf is not None:
            self._rf.__exit__(exc_type, exc, tb)
            self._rf = None
        if self._nvtx is not None:
            if hasattr(self._nvtx, "pop_range"):
                self._nvtx.pop_range()
            else:
                self._nvtx.range_pop()
            self._nvtx = None

    @staticmethod
    def step(phase: str, *, batch: int, tokens: int, context: int | None = None) -> annotate:
        """A range marking one inference step: ``perfscope.step[PHASE bs=B toks=T ctx=C]``
        (see :func:`step_label`).

        Examples:
            >>> with annotate.step("decode", batch=4, tokens=4, context=1024):
            ...     pass
        """
        return annotate(step_label(phase, batch, tokens, context))

    def __call__(self, func: F) -> F:
        name = self.name

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with annotate(name):
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]
