"""``perfscope doctor``: what this machine can profile, and how to fix what is missing.

Each check returns a :class:`Check` (status ``ok``, ``missing`` or ``error``, a detail line and,
when not ok, the fix). Only checks marked ``required`` (Python and perfscope's own
dependencies) make the doctor fail; GPUs, drivers and profilers are optional: perfscope
profiles on the CPU without them.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

OK, MISSING, ERROR = "ok", "missing", "error"
MIN_PYTHON = (3, 10)
CORE_PACKAGES = ("click", "numpy", "pandas", "pyarrow", "plotly", "tqdm")
PARAMS_FILE = Path("/proc/driver/nvidia/params")
_VERSION_RE = re.compile(r"\b(\d{4}\.\d+(?:\.\d+)*)")
_GATE_RE = re.compile(r"^\s*(RmProfilingAdminOnly|NVreg_RestrictProfilingToAdminUsers)\s*[:=]\s*(\d+)",
                      re.MULTILINE)


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report.

    Attributes:
        name: what was checked.
        status: ``ok``, ``missing`` or ``error``.
        detail: what was found (a version, a device name, the error).
        fix: what to do when the status is not ok.
        required: perfscope itself cannot work without it.
    """

    name: str
    status: str
    detail: str
    fix: str | None = None
    required: bool = False


def check_python() -> Check:
    """Python version (required: 3.10 or newer)."""
    version = platform.python_version()
    if sys.version_info[:2] >= MIN_PYTHON:
        return Check("python", OK, f"{version} ({sys.executable})", required=True)
    return Check("python", ERROR, version, f"use Python {'.'.join(map(str, MIN_PYTHON))} or newer",
                 required=True)


def check_core_packages() -> Check:
    """perfscope's own dependencies import (required)."""
    broken = []
    for name in CORE_PACKAGES:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any import failure is the finding
            broken.append(f"{name} ({type(exc).__name__}: {exc})")
    if broken:
        return Check("core packages", ERROR, "; ".join(broken),
                     "reinstall perfscope from its checkout: pip install -e .", required=True)
    return Check("core packages", OK, ", ".join(f"{n} {_dist_version(n)}" for n in CORE_PACKAGES),
                 required=True)


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def check_torch() -> list[Check]:
    """torch, the CUDA version it was built for, and the GPUs it sees."""
    try:
        import torch
    except ImportError:
        fix = "pip install torch (a CUDA build from https://pytorch.org for GPU profiling)"
        return [Check("torch", MISSING, "not installed", fix),
                Check("cuda (torch)", MISSING, "torch not installed", fix)]
    build = torch.version.cuda
    torch_check = Check("torch", OK, f"{torch.__version__} (CUDA build: {build or 'none, CPU only'})")
    if not build:
        return [torch_check, Check("cuda (torch)", MISSING, "this torch is a CPU-only build",
                                   "install a CUDA build of torch to profile GPUs")]
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        names = [torch.cuda.get_device_name(i) for i in range(count)]
    except Exception as exc:  # noqa: BLE001 - a broken CUDA setup is the finding
        return [torch_check, Check("cuda (torch)", ERROR, f"{type(exc).__name__}: {exc}",
                                   "check the NVIDIA driver matches torch's CUDA build")]
    if not names:
        return [torch_check, Check("cuda (torch)", MISSING, "torch.cuda.is_available() is False",
                                   "no GPU visible: check the driver, CUDA_VISIBLE_DEVICES")]
    return [torch_check, Check("cuda (torch)", OK, ", ".join(f"cuda:{i} {n}" for i, n in enumerate(names)))]


def check_nvml() -> Check:
    """NVML through pynvml: driver version and GPU names (needed for --nvml sampling)."""
    try:
        import pynvml
    except ImportError:
        return Check("nvml", MISSING, "nvidia-ml-py is not installed", "pip install nvidia-ml-py")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return Check("nvml", MISSING, f"{exc}", "install the NVIDIA driver (libnvidia-ml.so.1)")
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        names = [_text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)))
                 for i in range(pynvml.nvmlDeviceGetCount())]
    except pynvml.NVMLError as exc:
        return Check("nvml", ERROR, f"{exc}", "check the NVIDIA driver installation")
    finally:
        pynvml.nvmlShutdown()
    return Check("nvml", OK, f"driver {driver}; {len(names)} GPU(s): {', '.join(names) or 'none'}")


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def probe_version(tool: str, *, timeout_s: float = 10.0) -> tuple[str, str]:
    """``(status, detail)`` of ``<tool> --version``: ok with the version, missing, or error."""
    path = shutil.which(tool)
    if path is None:
        return MISSING, "not on PATH"
    try:
        run = subprocess.run([path, "--version"], capture_output=True, text=True,
                             timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ERROR, f"{path}: {type(exc).__name__}: {exc}"
    match = _VERSION_RE.search(run.stdout + run.stderr)
    if run.returncode != 0 or match is None:
        return ERROR, f"{path} --version exited with {run.returncode}: {run.stderr.strip()[-200:]}"
    return OK, f"{match.group(1)} ({path})"


TOOL_FIXES = {
    "nsys": "install Nsight Systems (https://developer.nvidia.com/nsight-systems) and add it to PATH",
    "ncu": "install Nsight Compute (https://developer.nvidia.com/nsight-compute) and add it to PATH",
    "rocprofv3": "install ROCm (rocprofiler-sdk provides /opt/rocm/bin/rocprofv3) and add /opt/rocm/bin to PATH",
    "rocprof-compute": "install rocprofiler-compute (apt install rocprofiler-compute; then pip install -r "
                       "/opt/rocm/libexec/rocprofiler-compute/requirements.txt) and add /opt/rocm/bin to PATH",
}


def check_tool(tool: str, *, timeout_s: float = 10.0) -> Check:
    """An Nsight profiler on PATH and its version."""
    status, detail = probe_version(tool, timeout_s=timeout_s)
    return Check(tool, status, detail, None if status == OK else TOOL_FIXES[tool])


def profiling_gate(text: str) -> bool | None:
    """True when the driver's params restrict GPU performance counters to admins.

    Both spellings are read: ``RmProfilingAdminOnly`` (what current drivers publish) and
    ``NVreg_RestrictProfilingToAdminUsers`` (the module option). None when neither appears.
    """
    values = [int(m.group(2)) for m in _GATE_RE.finditer(text)]
    return any(v != 0 for v in values) if values else None


def check_counters(params_file: Path = PARAMS_FILE) -> Check:
    """Permission to read GPU performance counters (what ncu needs)."""
    name = "gpu performance counters"
    try:
        gate = profiling_gate(params_file.read_text(errors="replace"))
    except OSError:
        return Check(name, MISSING, f"{params_file} not found (no NVIDIA driver loaded)",
                     "install and load the NVIDIA driver")
    if gate is None:
        return Check(name, OK, f"no admin-only setting in {params_file}")
    if not gate:
        return Check(name, OK, "readable by all users (RmProfilingAdminOnly: 0)")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Check(name, OK, "admin-only, and perfscope runs as root (a container may still "
                     "lack CAP_SYS_ADMIN)")
    return Check(name, MISSING, "admin-only (RmProfilingAdminOnly: 1) and this user is not root",
                 "run ncu as root, or set `options nvidia NVreg_RestrictProfilingToAdminUsers=0` in "
                 "/etc/modprobe.d and reboot (https://developer.nvidia.com/ERR_NVGPUCTRPERM)")


OPTIONAL_PACKAGES: dict[str, tuple[str, str, str]] = {
    "nvtx": ("nvtx", "nvtx", "NVTX ranges from perfscope.annotate"),
    "ncu-report": ("ncu_report", "ncu-report", "reading .ncu-rep files"),
    "dash": ("dash", "dash", "the interactive dashboard"),
}
"""Check name -> (import name, PyPI name, what it is for)."""


def check_package(name: str) -> Check:
    """An optional Python package perfscope uses when present."""
    module, dist, purpose = OPTIONAL_PACKAGES[name]
    try:
        importlib.import_module(module)
    except ImportError:
        return Check(name, MISSING, f"not installed (needed for {purpose})", f"pip install {dist}")
    except Exception as exc:  # noqa: BLE001 - a broken install is the finding
        return Check(name, ERROR, f"{type(exc).__name__}: {exc}", f"pip install --force-reinstall {dist}")
    return Check(name, OK, f"{_dist_version(dist)} ({purpose})")


def run_checks(*, timeout_s: float = 10.0) -> list[Check]:
    """Every check, in report order."""
    steps: list[Callable[[], Check | list[Check]]] = [
        check_python, check_core_packages, check_torch, check_nvml,
        lambda: check_tool("nsys", timeout_s=timeout_s),
        lambda: check_tool("ncu", timeout_s=timeout_s),
        lambda: check_tool("rocprofv3", timeout_s=timeout_s),
        lambda: check_tool("rocprof-compute", timeout_s=timeout_s),
        check_counters,
        *[(lambda n=n: check_package(n)) for n in OPTIONAL_PACKAGES],
    ]
    checks: list[Check] = []
    for step in steps:
        result = step()
        checks.extend(result if isinstance(result, list) else [result])
    return checks


def healthy(checks: list[Check]) -> bool:
    """True unless a required check is not ok."""
    return all(c.status == OK for c in checks if c.required)


CAPABILITIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("profile on the CPU: the engine, your script (perfscope profile --device cpu)", ("python", "core packages", "torch")),
    ("import traces and write reports (Kineto, nsys SQLite, ncu CSV, rocprof; HTML, Perfetto)",
     ("python", "core packages")),
    ("the interactive dashboard (perfscope dashboard)", ("python", "core packages", "dash")),
    ("profile NVIDIA GPUs with torch.profiler (perfscope profile --device cuda)", ("torch", "cuda (torch)")),
    ("sample GPU power, clocks and memory (--nvml)", ("nvml",)),
    ("capture with Nsight Systems (--collector nsys)", ("nsys",)),
    ("measure kernels with Nsight Compute (--collector ncu)", ("ncu", "gpu performance counters")),
    ("read .ncu-rep files", ("ncu-report",)),
    ("capture on AMD GPUs (--collector rocprofv3 / rocprof-compute)", ("rocprofv3",)),
)
"""What a user can do, and the checks each needs (all ok: it works here)."""


def capabilities(checks: list[Check]) -> list[dict[str, Any]]:
    """What works on this machine and what does not, from the checks: ``{"what", "works", "needs"}``
    (``needs``: the checks that are not ok)."""
    status = {c.name: c.status for c in checks}
    out = []
    for what, needs in CAPABILITIES:
        missing = [n for n in needs if status.get(n) != OK]
        out.append({"what": what, "works": not missing, "needs": missing})
    return out


def to_json(checks: list[Check]) -> dict[str, Any]:
    """The ``--json`` document: ``{"ok": bool, "works": [...], "checks": [...]}``."""
    return {"ok": healthy(checks), "works": capabilities(checks), "checks": [asdict(c) for c in checks]}


def render_text(checks: list[Check]) -> str:
    """What works here and what does not (a line each), then one line per check with an indented fix
    under each that is not ok."""
    from .format import terminal_text

    lines = ["what works here:"]
    for cap in capabilities(checks):
        lines.append(f"  {'yes' if cap['works'] else 'no ':<3}  {cap['what']}"
                     + (f" (needs: {', '.join(cap['needs'])})" if cap["needs"] else ""))
    lines += ["", "checks:"]
    width = max(len(c.name) for c in checks)
    for c in checks:
        lines.append(f"{c.status:<7}  {c.name:<{width}}  {c.detail}")
        if c.fix and c.status != OK:
            lines.append(f"{'':<7}  {'':<{width}}  fix: {c.fix}")
    return terminal_text("\n".join(lines))
