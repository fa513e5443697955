"""Database URL helpers."""

from __future__ import annotations

import re

_PASSWORD = re.compile(r"(://[^:/@]*:)([^@]*)@")
_KV_PASSWORD = re.compile(r"(password\s*=\s*)(\S+)")


def redact(url: str) -> str:
    """The connection string with any password replaced, safe to log."""
    url = _PASSWORD.sub(lambda m: f"{m.group(1)}***@" if m.group(2) else m.group(0), url)
    return _KV_PASSWORD.sub(r"\1***", url)
