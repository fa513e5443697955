"""Log lines carry what was said, not a library's internals."""

from __future__ import annotations

import logging

import pytest

from app import logs


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_uvicorns_color_message_is_dropped(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("info", fmt)
    uvicorn_error = logging.getLogger("uvicorn.error")
    # Another test's in-process uvicorn.Config may have set this logger's own level.
    level, uvicorn_error.level, uvicorn_error.disabled = uvicorn_error.level, logging.INFO, False
    try:
        uvicorn_error.info(
            "Started server process [%d]",
            42,
            extra={"color_message": "Started server process [\x1b[36m%d\x1b[0m]"},
        )
        line = capsys.readouterr().err
    finally:
        logging.getLogger().handlers.clear()
        uvicorn_error.setLevel(level)
    assert "Started server process [42]" in line
    assert "color_message" not in line and "\x1b" not in line and "\\x1b" not in line
