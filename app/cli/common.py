"""What every `ferryman` command shares: the one-line failure, the exit, and the debug switch.

Imports only the standard library and click: everything here is loaded by `ferryman --help`.
"""

from __future__ import annotations

import os
from typing import NoReturn

import click
from click.exceptions import Exit

__all__ = ["DEBUG_HINT", "Exit", "Group", "debugging", "fail", "one_line"]

DEBUG_HINT = "FERRYMAN_LOG_LEVEL=debug or `ferryman --debug COMMAND` shows the traceback"


class Group(click.Group):
    """A group whose help lists its commands as they were added, then its groups."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = list(self.commands)
        return sorted(names, key=lambda name: isinstance(self.commands[name], click.Group))


def fail(message: str, code: int = 2) -> NoReturn:
    """`error: MESSAGE` on one line of stderr, and exit with `code`."""
    click.secho(f"error: {message}", fg="red", err=True)
    raise Exit(code)


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def debugging() -> bool:
    # Read from the environment, not the settings: settings that fail to load need it too.
    return os.environ.get("FERRYMAN_LOG_LEVEL", "").strip().lower() == "debug"
