"""Secrets kept out of everything perfscope records: the one redaction of a command line or a URL.

A profiled command (``perfscope profile -- python gen.py --hf-token hf_... --api-key sk-...``) and
a load test's ``--endpoint http://user:PASS@host/v1`` are recorded in the report (manifest, HTML,
name, default folder name, trace export). Before they are, :func:`redact_argv` /
:func:`redact_url` / :func:`redact_text` replace with :data:`REDACTED`:

- values that look like tokens wherever they appear: Hugging Face ``hf_...``, OpenAI
  ``sk-...``, GitHub ``ghp_``/``gho_``/``ghu_``/``ghs_``/``ghr_``/``github_pat_...``, Slack
  ``xox?-...``, AWS access key ids ``AKIA...``, JSON web tokens ``eyJ....eyJ....sig``;
- the value of a flag named for a secret: ``--password``/``--passwd``/``--pwd`` always; a flag
  whose last word is ``token``, ``key``, ``secret``, ``apikey``, ``credential(s)`` or ``auth``
  (``--hf-token``, ``--api-key``, ``--client-secret``) always; any other flag with ``token``,
  ``key`` or ``secret`` in its name (``--max-tokens``, ``--kv-key-dtype``) only when its value
  is a long high-entropy string; as ``--flag value`` or ``--flag=value``;
- ``NAME=value`` environment-style arguments named the same way (``HF_TOKEN=...``);
- a URL's userinfo (``http://***@host``) and the values of its secret-named query parameters.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

if TYPE_CHECKING:
    from collections.abc import Sequence

REDACTED = "***"

TOKEN = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"hf_[A-Za-z0-9]{16,}"
    r"|sk-[A-Za-z0-9_\-]{16,}"
    r"|gh[pousr]_[A-Za-z0-9]{16,}|github_pat_[A-Za-z0-9_]{16,}"
    r"|xox[abposr]-[A-Za-z0-9\-]{10,}"
    r"|AKIA[0-9A-Z]{16}"
    r"|eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"
    r")")
"""Values that are tokens by their form, wherever they appear."""

ALWAYS = re.compile(r"(?:^|[-_.])(?:passw(?:or)?d|pwd|token|key|secret|apikey|credentials?|auth)$", re.IGNORECASE)
"""A flag or variable name whose value is a secret, whatever it looks like (its last word)."""

MAYBE = re.compile(r"token|key|secret|passw|credential", re.IGNORECASE)
"""A name that may hold a secret: its value is one when it looks random (:func:`high_entropy`)."""

URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s\"'<>]+")
FLAG = re.compile(r"^--?([A-Za-z0-9][A-Za-z0-9_.\-]*)$")
ASSIGN = re.compile(r"^(--?)?([A-Za-z_][A-Za-z0-9_.\-]*)=(.*)$", re.DOTALL)


def high_entropy(value: str) -> bool:
    """A long random-looking string: 16+ characters of a token alphabet, letters and digits both,
    and at least 3.5 bits of entropy per character (a word or a number is not; an API key is)."""
    if len(value) < 16 or not re.fullmatch(r"[A-Za-z0-9_\-+/=.~]+", value):
        return False
    if not (re.search(r"[A-Za-z]", value) and re.search(r"[0-9]", value)):
        return False
    counts = Counter(value)
    bits = -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())
    return bits >= 3.5


def _secret_value(name: str, value: str) -> bool:
    if ALWAYS.search(name):
        return bool(value)
    return bool(MAYBE.search(name)) and high_entropy(value)


def redact_url(text: str) -> str:
    """``text`` (a URL) without its userinfo and with its secret-named query values redacted."""
    try:
        parts = urlsplit(text)
    except ValueError:
        return redact_text_tokens(text)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rpartition('@')[2]}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_secret_value(k, v) for k, v in pairs):
            query = urlencode([(k, REDACTED if _secret_value(k, v) else v) for k, v in pairs], safe="*")
    if (netloc, query) == (parts.netloc, parts.query):
        return redact_text_tokens(text)
    return redact_text_tokens(urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment)))


def redact_text_tokens(text: str) -> str:
    """``text`` with every token-shaped value (:data:`TOKEN`) replaced."""
    return TOKEN.sub(REDACTED, text)


def redact_text(text: str) -> str:
    """Free text (a report name, a message): token-shaped values and URL userinfo redacted."""
    return redact_text_tokens(URL.sub(lambda m: redact_url(m.group(0)), text))


def redact_argv(argv: Sequence[object]) -> list[str]:
    """A command line with its secrets replaced by :data:`REDACTED` (see the module doc)."""
    out: list[str] = []
    pending = False  # the previous argument was a flag named for a secret
    for raw in argv:
        arg = str(raw)
        if pending:
            pending = False
            if not arg.startswith("-") or re.fullmatch(r"-\d+(\.\d+)?", arg):
                out.append(REDACTED if arg else arg)
                continue
        flag = FLAG.match(arg)
        if flag and ALWAYS.search(flag.group(1)):
            out.append(arg)
            pending = True
            continue
        assign = ASSIGN.match(arg)
        if assign and _secret_value(assign.group(2), assign.group(3)):
            out.append(f"{assign.group(1) or ''}{assign.group(2)}={REDACTED}")
            continue
        out.append(redact_text(arg))
    return _maybe_pass(argv, out)


def _maybe_pass(argv: Sequence[object], out: list[str]) -> list[str]:
    """Second look at the values after flags that only may name a secret (``--max-tokens 128``
    stays, ``--kv-key 9f8a...`` goes): redacted when high-entropy."""
    args = [str(a) for a in argv]
    for i in range(1, len(args)):
        flag = FLAG.match(args[i - 1])
        if flag and not ALWAYS.search(flag.group(1)) and MAYBE.search(flag.group(1)) and high_entropy(args[i]):
            out[i] = REDACTED
    return out


__all__ = ["REDACTED", "high_entropy", "redact_argv", "redact_text", "redact_url"]
