"""Database URL helpers: redaction for logs and the SQLAlchemy form Alembic needs."""

from __future__ import annotations

import re

_PASSWORD = re.compile(r"(://[^:/@]*:)([^@]*)@")


def redact(url: str) -> str:
    """The URL with any password replaced, safe to log."""
    return _PASSWORD.sub(lambda m: f"{m.group(1)}***@" if m.group(2) else m.group(0), url)


def sqlalchemy_url(url: str) -> str:
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url
