"""The `ferryman` command.

The client commands (`run`, `follow`, `watch`, `tools`, `sessions`: ferryman/cli/commands.py)
talk to a running Ferryman over HTTP through the SDK alone. Other distributions add command
groups through the `ferryman.cli` entry-point group, each entry a `register(cli)` callable: the
server (`pip install` of the Ferryman checkout) adds `serve`, `worker`, `migrate` and `keys`
that way, so there is one `ferryman` command whatever is installed, and this distribution owns
its script.

Start-up stays fast: at import time only click and the standard library load, and every command
imports what it needs when it runs (the SDK, rich, asyncio; the server's modules), so
`ferryman --help` or `ferryman sessions list` loads neither pydantic nor the server (the
server's tests/test_cli_imports.py holds it). The entry points are read only when a command is
not one of the client's own, or for the help. The commands are declared with click, not typer:
typer (0.29) imports pydantic to build a validator per parameter, a third of a client command's
start-up.
"""

from __future__ import annotations

import os
import sys
from importlib import metadata
from typing import Any

import click

from ferryman import __version__
from ferryman.cli import commands
from ferryman.cli.common import Group, fail, one_line

ENTRY_POINTS = "ferryman.cli"
DISTRIBUTION = "ferryman-client"
# What the server adds: named when asked for without it.
SERVER_COMMANDS = frozenset({"serve", "worker", "migrate", "keys"})


class Root(Group):
    """The top group: the client's commands, and those the `ferryman.cli` entry points add,
    loaded the first time a name is not found here or the whole list is asked for."""

    plugins: list[metadata.EntryPoint] | None = None

    def load_plugins(self) -> list[metadata.EntryPoint]:
        if self.plugins is None:
            self.plugins = list(metadata.entry_points(group=ENTRY_POINTS))
            for entry_point in self.plugins:
                try:
                    entry_point.load()(self)
                except Exception as exc:  # a broken install may raise anything
                    fail(
                        f"cannot load the `ferryman` commands of {entry_point.value} "
                        f"({type(exc).__name__}: {one_line(exc)}); reinstall that distribution"
                    )
        return self.plugins

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands:
            self.load_plugins()
        return super().get_command(ctx, name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self.load_plugins()
        return super().list_commands(ctx)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name in SERVER_COMMANDS and self.get_command(ctx, name) is None:
            ctx.fail(
                f"`ferryman {name}` is a server command, and only the client ({DISTRIBUTION}) "
                "is installed: install the Ferryman server beside it (`pip install .` in its "
                "checkout)"
            )
        return super().resolve_command(ctx, args)


def _version(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        root = ctx.command
        assert isinstance(root, Root)
        click.echo(f"{DISTRIBUTION} {__version__}")
        for entry_point in root.load_plugins():
            if entry_point.dist is not None:
                click.echo(f"{entry_point.dist.name} {entry_point.dist.version}")
        ctx.exit()


def _completion(action: str) -> Any:
    def callback(ctx: click.Context, param: click.Parameter, value: bool) -> None:
        if value:
            from ferryman.cli import completion

            getattr(completion, action)(ctx, param, value)

    return callback


@click.group(
    cls=Root,
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
    help="Print the versions installed and exit.",
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
        # One switch, not two: the server's settings read the level, and the commands ask it too.
        os.environ["FERRYMAN_LOG_LEVEL"] = "debug"


commands.register(cli)


def main() -> None:
    cli.main(sys.argv[1:], prog_name="ferryman")
