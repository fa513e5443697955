"""Log lines carry what was said, not a library's internals."""

from __future__ import annotations

import logging

import pytest

from app import logs


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_uvicorns_color_message_is_dropped(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("info", fmt)
    try:
        logging.getLogger("uvicorn.error").info(
            "Started server process [%d]",
            42,
            extra={"color_message": "Started server process [\x1b[36m%d\x1b[0m]"},
        )
        line = capsys.readouterr().err
    finally:
        logging.getLogger().handlers.clear()
    assert "Started server process [42]" in line
    assert "color_message" not in line and "\x1b" not in line and "\\x1b" not in line
