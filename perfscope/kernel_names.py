"""The one reader of a kernel's base name (the ``short_name`` column), for every reader that writes it.

A kernel's name is what its profiler recorded: a demangled C++ signature (CUPTI, Kineto, Nsight Systems,
rocprof with demangling), an Itanium-mangled symbol (rocprof-compute, some Triton and HIP kernels:
``_Z32flash_fwd_splitkv_mla_kernel_ldsI19...``), or a plain name (``ampere_sgemm_128x64_tn``,
``triton_poi_fused_add_0``). The base name is the function's own identifier: no return type, namespace,
template arguments or parameters.

Demangled names hold parentheses that are not the parameter list: ``(anonymous namespace)`` as a scope,
``{lambda(int)#1}`` as a template argument, ``std::enable_if<!(false), void>::type`` as a return type.
They are read as part of the scope or template they sit in, so ``void (anonymous namespace)::softmax_warp_forward<...>(...)``
is ``softmax_warp_forward``, never ``void``.
"""

from __future__ import annotations

import re

ANONYMOUS = "(anonymous namespace)"
_MANGLED_PART = re.compile(r"(\d+)")


def short_kernel_name(name: str) -> str:
    """The base function name of a kernel ``name`` (:mod:`perfscope.kernel_names`); ``name`` itself where none
    can be read (an empty or odd name is never made up). Not cached: the readers call it once per distinct
    name (``per_distinct`` / ``map_distinct``), and a cache would keep a hostile trace's names alive."""
    if name.startswith("_Z"):
        return _mangled(name) or name
    text = name.replace(ANONYMOUS, "{anonymous}")
    # the parameter list: the first "(" outside every <...>, (...) and {...}
    depth, cut = 0, len(text)
    for i, ch in enumerate(text):
        if ch in "<({":
            if depth == 0 and ch == "(" and i > 0:
                cut = i
                break
            depth += 1
        elif ch in ">)}":
            depth = max(depth - 1, 0)
    # the last space-separated word of what is left, read outside template arguments (a return type goes)
    words: list[str] = []
    word: list[str] = []
    depth = 0
    for ch in text[:cut].strip():
        if ch in "<({":
            depth += 1
        elif ch in ">)}":
            depth = max(depth - 1, 0)
        elif depth == 0:
            if ch == " ":
                words.append("".join(word))
                word = []
            else:
                word.append(ch)
    words.append("".join(word))
    last = next((w for w in reversed(words) if w), "")
    base = last.split("::")[-1]
    return base if base and base != "{anonymous}" else name


def _mangled(name: str) -> str | None:
    """The function identifier of an Itanium-mangled ``name``: ``_Z<len><id>...`` or a nested
    ``_ZN<len><id>...<len><id>E...`` (its last identifier before the template arguments or the ``E``); None where
    the name is not of that form."""
    i = 2
    nested = name.startswith("N", i)
    if nested:
        i += 1
        while i < len(name) and name[i] in "rVKL":  # cv- and ref-qualifiers of a member function
            i += 1
    last = None
    while i < len(name):
        m = _MANGLED_PART.match(name, i)
        if m is None:
            break
        n, j = int(m.group(1)), m.end()
        if n <= 0 or j + n > len(name):
            return None
        last = name[j:j + n]
        i = j + n
        if not nested:
            break
    return last


__all__ = ["ANONYMOUS", "short_kernel_name"]
