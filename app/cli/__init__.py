"""The `ferryman` command.

Server commands (`serve`, `worker`, `migrate`, `keys`: app/cli/server.py) run Ferryman itself;
client commands (`run`, `sessions`, `follow`, `watch`: app/cli/client.py) talk to a running one
over HTTP through the SDK (app.client) alone, never the server's modules.

Start-up stays fast: at import time only typer and the standard library load; every command
imports what it needs when it runs. The help is click's plain formatter (`rich_markup_mode=None`):
typer's rich help would import rich's markdown and traceback machinery on every invocation.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from app.cli import client, server

cli = typer.Typer(
    help="Ferryman: durable LLM agent sessions on PostgreSQL.",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from app import __version__

        typer.echo(f"ferryman {__version__}")
        raise typer.Exit()


@cli.callback()
def options(
    debug: Annotated[
        bool,
        typer.Option(
            "--debug", help="Debug logs, and the traceback of a failure [FERRYMAN_LOG_LEVEL=debug]."
        ),
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_version, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    if debug:
        # One switch, not two: the settings read the level, and the commands ask it too.
        os.environ["FERRYMAN_LOG_LEVEL"] = "debug"


server.register(cli)
client.register(cli)


def main() -> None:
    cli(sys.argv[1:])
