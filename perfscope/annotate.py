"""``perfscope.annotate(name)``: one range that both nsys (NVTX) and torch.profiler
(``record_function``) see, usable as a context manager or a decorator.

It costs next to nothing when no profiler is attached: the torch range is entered only while
torch's profiler is enabled, and NVTX ranges go through the ``nvtx`` package (a no-op domain
when no NVTX tool is injected) or, without it, ``torch.cuda.nvtx`` when CUDA is initialised.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

DOMAIN = "perfscope"


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

    def __call__(self, func: F) -> F:
        name = self.name

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with annotate(name):
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]
