"""Shared test fixtures: the real profiler outputs in tests/fixtures (or $PERFSCOPE_FIXTURES),
temp report folders, and the gpu / browser markers (skipped when the hardware or browser is absent)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _restore_terminal_ctrl_c() -> None:
    """A shell that starts jobs without job control (as CI runners do) starts them with SIGINT
    ignored, and Python then installs no KeyboardInterrupt handler: Ctrl-C tests would see their
    SIGINT dropped, in this process and in the `perfscope` processes they start. Restore what a
    terminal gives: Python's handler here, so children start with the default disposition."""
    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


_restore_terminal_ctrl_c()


FIXTURES = REPO / "tests" / "fixtures"


def _fixtures_dir() -> Path:
    """The real profiler outputs the tests read: tests/fixtures, committed with the repository
    (tests/fixtures/README.md lists their sources and licences); $PERFSCOPE_FIXTURES overrides it."""
    env = os.environ.get("PERFSCOPE_FIXTURES")
    return Path(env) if env else FIXTURES


def pytest_configure(config: pytest.Config) -> None:
    try:
        spec = importlib.util.find_spec("perfscope.analysis")
    except ImportError:
        spec = None
    if spec is None:
        pytest.exit(
            "perfscope is imported without its mapped subpackages: install it with "
            "`pip install -e .` and run `pytest` (not `python -m pytest`) from the repo root",
            returncode=4,
        )


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def smollm2_skip_reason() -> str | None:
    """Why the tests of the real SmolLM2-135M model cannot run here, or None when they can.

    The one check every ``smollm2``-marked test goes through: the engine's own locator
    (``smollm2_path``), so a test skips exactly when ``--model smollm2-135m`` would fail to find
    the GGUF file (package not installed, or its file missing)."""
    from perfscope.engine.gguf_model import SMOLLM2_INSTALL, smollm2_path
    from perfscope.errors import ToolNotFoundError

    try:
        smollm2_path()
    except ToolNotFoundError as exc:
        return f"needs {exc.tool}, not found: {SMOLLM2_INSTALL}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    has_cuda = _cuda_available()
    smollm2_missing = (smollm2_skip_reason() if any(item.get_closest_marker("smollm2") for item in items)
                       else None)
    has_browser = shutil.which("chromium") is not None and shutil.which("chromedriver") is not None
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        if "browser" in item.keywords and not has_browser and not os.environ.get("PERFSCOPE_REQUIRE_BROWSER"):
            item.add_marker(pytest.mark.skip(reason="needs chromium and chromedriver"))
        if smollm2_missing and item.get_closest_marker("smollm2"):
            item.add_marker(pytest.mark.skip(reason=smollm2_missing))


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """The real profiler outputs (read in place). A missing folder fails the test: the fixtures are
    part of the repository, so their absence is a broken checkout, not a reason to skip."""
    path = _fixtures_dir()
    if not path.is_dir():
        pytest.fail(f"fixtures not found at {path}: they are committed under tests/fixtures "
                    "(is the checkout complete?) or PERFSCOPE_FIXTURES names a missing folder",
                    pytrace=False)
    return path


@pytest.fixture(scope="session")
def sample_reports_dir() -> Path:
    """The checked-in sample reports."""
    return REPO / "sample_reports"


_IMPORTED: dict[str, object] = {}


@pytest.fixture(scope="session")
def load(fixtures_dir: Path):
    """``load("kineto/x.json.gz")``: a fixture imported once per test session (reports are immutable)."""
    from perfscope.analysis.readers.detect import import_file

    def get(name: str):
        if name not in _IMPORTED:
            _IMPORTED[name] = import_file(fixtures_dir / name)
        return _IMPORTED[name]

    return get
