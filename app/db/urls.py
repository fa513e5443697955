"""Database URL helpers."""

from __future__ import annotations

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo


def redact(url: str) -> str:
    """The connection string, parsed as libpq parses it, with any password masked: safe to
    log. One that libpq cannot parse is not shown at all (a guess could leak a password)."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<a connection string libpq cannot parse>"
    if params.get("password"):
        params["password"] = "***"
    return make_conninfo("", **params)
