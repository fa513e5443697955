"""Database URLs in logs: passwords never leak, whatever characters they hold (pure)."""

from __future__ import annotations

import pytest

from app.db.urls import redact


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("postgresql://app:s3cret@db.example:5432/ferryman", "s3cret"),
        ("postgresql://app:p%40ss%20word@db/ferryman", "p@ss word"),
        ("postgresql://app:p%40ss@db/ferryman", "p%40ss"),
        ("host=/tmp user=app password='a b@c d' dbname=ferryman", "a b@c"),
        ("host=db password=x@y@z dbname=ferryman", "x@y"),
        ("postgresql://app:pw@db/ferryman?password=other", "other"),
    ],
)
def test_passwords_are_masked(url: str, secret: str) -> None:
    shown = redact(url)
    assert secret not in shown
    assert "password=***" in shown
    assert "ferryman" in shown  # the rest is still there to read


def test_a_url_without_a_password_is_shown_whole() -> None:
    assert (
        redact("postgresql://app@db:5433/ferryman") == "user=app dbname=ferryman host=db port=5433"
    )


@pytest.mark.parametrize(
    "url", ["postgresql://app:pass word@db/x", "host=db password='unterminated", "nonsense"]
)
def test_what_libpq_cannot_parse_is_not_shown(url: str) -> None:
    assert redact(url) == "<a connection string libpq cannot parse>"
