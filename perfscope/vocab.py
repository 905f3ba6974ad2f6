"""One vocabulary per GPU vendor: what the user reads speaks the device's own words.

NVIDIA has SMs, warps and tensor cores and names its devices ``cuda:N``; AMD has compute units
(CUs), wavefronts and matrix cores, and a ROCm trace's devices are ``gpu:N``. The device label is
decided once, at import (:func:`device_label`, the ``device`` column of kernels and transfers);
every output that writes prose about a device (findings, the terminal summary, the HTML, the
dashboard, ``--json``) passes it through :func:`speak`, so no rule has to know the vendor.

    from perfscope.vocab import speak, device_label
    device_label(9, amd=True)                       # 'gpu:9'
    speak("launch enough blocks to cover every SM", spec)   # '... every CU' on an AMD device
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["AMD_WORDS", "device_label", "device_record", "device_words", "is_amd", "is_amd_device", "speak"]

AMD_WORDS: tuple[tuple[str, str], ...] = (
    (r"\bSMs/CUs\b", "CUs"),
    (r"\bSMs\b", "CUs"),
    (r"\bSM\b", "CU"),
    (r"\bstreaming multiprocessors\b", "compute units"),
    (r"\bstreaming multiprocessor\b", "compute unit"),
    (r"\bwarps\b", "wavefronts"),
    (r"\bwarp\b", "wavefront"),
    (r"\bWarps\b", "Wavefronts"),
    (r"\bWarp\b", "Wavefront"),
    (r"\btensor cores\b", "matrix cores"),
    (r"\btensor core\b", "matrix core"),
    (r"\btensor-core\b", "matrix-core"),
    (r"\bnon-tensor\b", "non-matrix"),
    (r"\bTensor Cores\b", "Matrix Cores"),
    (r"\bcuda:(\d+)\b", r"gpu:\1"),
)
"""NVIDIA word (regular expression, whole words only: ``warp_reduce_kernel`` is a kernel name and
stays) -> the AMD word. API and library names (``cudaLaunchKernel``, CUDA graphs as torch calls
them, Nsight) are not vocabulary and are left alone."""

_AMD_NAME = re.compile(r"\b(AMD|RADEON|INSTINCT)\b|\bMI\d{3}[A-Z]?\b|\bGFX\d", re.IGNORECASE)


def is_amd(device: Any) -> bool:
    """Whether ``device`` (a DeviceSpec, its ``kind``, or None) is an AMD GPU (kind ``rocm``)."""
    kind = device if isinstance(device, str) or device is None else getattr(device, "kind", None)
    return kind == "rocm"


def is_amd_device(name: str | None = None, properties: Mapping[str, Any] | None = None,
                  meta: Mapping[str, Any] | None = None) -> bool:
    """Whether a trace's device is AMD: its runtime says HIP/ROCm (``hip_runtime_version``,
    ``roctracer_version`` in a Kineto trace's metadata), its name says AMD (``AMD Instinct MI300X``,
    ``AMD Radeon Graphics``), or its wavefront is 64 wide (``warpSize`` 64: NVIDIA's warp is 32)."""
    meta = meta or {}
    if "hip_runtime_version" in meta or "roctracer_version" in meta:
        return True
    if name and _AMD_NAME.search(str(name)):
        return True
    props = properties or {}
    return str(props.get("warpSize", props.get("warp_size", ""))) == "64" or bool(props.get("gcnArchName"))


def device_label(index: int | str, *, amd: bool) -> str:
    """The label of GPU ``index`` in a report's ``device`` column: ``gpu:N`` for AMD (a ROCm trace
    names its devices so, and ``cuda:N`` is an NVIDIA word), ``cuda:N`` for NVIDIA."""
    return f"{'gpu' if amd else 'cuda'}:{index}"


def device_words(device: Any) -> dict[str, str]:
    """The words for ``device``'s units: ``unit`` (SM / CU), ``units``, ``thread_group`` (warp /
    wavefront), ``matrix_unit`` (tensor core / matrix core), ``vendor`` (nvidia / amd; ``cpu`` for a CPU)."""
    if is_amd(device):
        return {"vendor": "amd", "unit": "CU", "units": "CUs", "thread_group": "wavefront",
                "matrix_unit": "matrix core"}
    kind = device if isinstance(device, str) or device is None else getattr(device, "kind", None)
    return {"vendor": "cpu" if kind == "cpu" else "nvidia", "unit": "SM", "units": "SMs", "thread_group": "warp",
            "matrix_unit": "tensor core"}


def speak(text: str, device: Any) -> str:
    """``text`` in ``device``'s words: unchanged for NVIDIA and CPUs; for AMD every NVIDIA word of
    :data:`AMD_WORDS` replaced (SM -> CU, warp -> wavefront, tensor core -> matrix core, cuda:N -> gpu:N)."""
    if not is_amd(device) or not text:
        return text
    for pattern, word in AMD_WORDS:
        text = re.sub(pattern, word, text)
    return text


def device_record(device: Any) -> dict[str, Any]:
    """The vendor words of ``device`` for a ``--json`` device record: ``vendor``, ``unit`` (SM / CU),
    ``unit_count`` (its SMs or CUs, None when not recorded), ``thread_group`` (warp / wavefront) and
    ``matrix_unit`` (tensor core / matrix core)."""
    words = device_words(device)
    props = getattr(device, "properties", None) or {}
    count = props.get("sm_count", props.get("numSms"))
    return {"vendor": words["vendor"], "unit": words["unit"], "unit_count": None if count is None else int(count),
            "thread_group": words["thread_group"], "matrix_unit": words["matrix_unit"]}
