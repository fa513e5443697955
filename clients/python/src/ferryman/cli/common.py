"""What every `ferryman` command shares (the server's too): the one-line failure, the exit, the
debug switch and the console tables print to.

Imports only the standard library and click (rich when a table is printed): everything here is
loaded by `ferryman --help`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, NoReturn

import click
from click.exceptions import Exit

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["DEBUG_HINT", "Exit", "Group", "debugging", "fail", "one_line", "table_console"]

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


def table_console() -> Console:
    """A console for tables: the terminal's width, or, piped, no width to fit, so that no
    column is cut (ids must stay whole to be pasted back)."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=10_000)
