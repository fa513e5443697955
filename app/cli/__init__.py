"""The `ferryman` command.

Server commands (`serve`, `worker`, `migrate`, `keys`: app/cli/server.py) run Ferryman itself;
client commands (`run`, `sessions`, `follow`, `watch`: app/cli/client.py) talk to a running one
over HTTP through the SDK (app.client) alone, never the server's modules.

Start-up stays fast: at import time only click and the standard library load, and every command
imports what it needs when it runs (the SDK, rich, asyncio; the server's modules), so
`ferryman --help` or `ferryman sessions list` loads neither pydantic nor the server (tests/
test_cli_imports.py holds it). The commands are declared with click, not typer: typer (0.29)
imports pydantic to build a validator per parameter, a third of a client command's start-up.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from app.cli import client, server
from app.cli.common import Group


def _version(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        from app import __version__

        click.echo(f"ferryman {__version__}")
        ctx.exit()


def _completion(action: str) -> Any:
    def callback(ctx: click.Context, param: click.Parameter, value: bool) -> None:
        if value:
            from app.cli import completion

            getattr(completion, action)(ctx, param, value)

    return callback


@click.group(
    cls=Group,
    help="Ferryman: durable LLM agent sessions on PostgreSQL.",
    no_args_is_help=True,
)
@click.option(
    "--debug",
    is_flag=True,
    help="Debug logs, and the traceback of a failure [FERRYMAN_LOG_LEVEL=debug].",
)
@click.option(
    "--version",
    is_flag=True,
    is_eager=True,
    expose_value=False,
    callback=_version,
    help="Print the version and exit.",
)
@click.option(
    "--install-completion",
    is_flag=True,
    is_eager=True,
    expose_value=False,
    callback=_completion("install"),
    help="Install completion for the current shell.",
)
@click.option(
    "--show-completion",
    is_flag=True,
    is_eager=True,
    expose_value=False,
    callback=_completion("show"),
    help="Show completion for the current shell, to copy it or customize the installation.",
)
def cli(debug: bool) -> None:
    if debug:
        # One switch, not two: the settings read the level, and the commands ask it too.
        os.environ["FERRYMAN_LOG_LEVEL"] = "debug"


server.register(cli)
client.register(cli)


def main() -> None:
    cli.main(sys.argv[1:])
