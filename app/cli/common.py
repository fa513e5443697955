"""What every `ferryman` command shares: the one-line failure, and the debug switch.

Imports only the standard library and typer: everything here is loaded by `ferryman --help`.
"""

from __future__ import annotations

import os
from typing import NoReturn

import typer

DEBUG_HINT = "FERRYMAN_LOG_LEVEL=debug or `ferryman --debug COMMAND` shows the traceback"


def fail(message: str, code: int = 2) -> NoReturn:
    """`error: MESSAGE` on one line of stderr, and exit with `code`."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code=code)


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def debugging() -> bool:
    # Read from the environment, not the settings: settings that fail to load need it too.
    return os.environ.get("FERRYMAN_LOG_LEVEL", "").strip().lower() == "debug"
