"""`ferryman assistants`: stored agent definitions, each edit a new version, which
`ferryman run --assistant ID` runs. Like every client command, on the SDK's raw JSON."""

from __future__ import annotations

import json
from typing import Any

import click

from ferryman.cli.commands import (
    _client,
    _print_json,
    _short,
    _when,
    api_key_option,
    json_option,
    url_option,
)
from ferryman.cli.common import Group, fail, table_console

assistant_id_argument = click.argument("assistant_id", metavar="ID", help="The assistant's id.")
limit_option = click.option(
    "--limit",
    "-n",
    type=click.IntRange(1, 200),
    default=20,
    show_default=True,
    metavar="N",
    help="At most N rows.",
)


def _json_object(option: str, text: str | None) -> dict[str, Any] | None:
    """The JSON object an option gives (None when it is not given)."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        fail(f"{option}: not JSON: {exc}")
    if not isinstance(value, dict):
        fail(f'{option}: must be a JSON object, such as \'{{"team": "a"}}\'')
    return value


def definition_options(command: Any) -> Any:
    """The options of a definition, shared by create and edit."""
    for option in reversed(
        [
            click.option("--description", metavar="TEXT", help="What it is for."),
            click.option("--instructions", metavar="TEXT", help="The system prompt."),
            click.option(
                "--model-settings",
                metavar="JSON",
                help="Provider settings, as the API takes them: '{\"temperature\": 0.2}'.",
            ),
            click.option(
                "--tool",
                "tool",
                multiple=True,
                metavar="NAME",
                help="A tool the agent may use (repeat; default: all).",
            ),
            click.option(
                "--approval-required",
                "approval_required",
                multiple=True,
                metavar="NAME",
                help="A tool whose every call waits for approval (repeat).",
            ),
            click.option("--metadata", metavar="JSON", help="A JSON object of your own."),
        ]
    ):
        command = option(command)
    return command


@click.group("assistants", cls=Group, no_args_is_help=True)
def assistants_cli() -> None:
    """Stored agent definitions: list, create, show, edit, versions, delete."""


def _table(assistants: list[dict[str, Any]]) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("ID", no_wrap=True)
    table.add_column("NAME", overflow="ellipsis", no_wrap=True, ratio=1)
    table.add_column("MODEL", no_wrap=True)
    table.add_column("VERSION", justify="right", no_wrap=True)
    table.add_column("UPDATED", no_wrap=True)
    for assistant in assistants:
        table.add_row(
            str(assistant["id"]),
            Text(str(assistant["name"])),  # a name is text, not rich markup
            Text(str(assistant["model"])),
            str(assistant["version"]),
            _when(assistant["updatedAt"]),
        )
    return table


def _print_table(assistants: list[dict[str, Any]], page: dict[str, Any], limit: int) -> None:
    console = table_console()
    console.print(_table(assistants), soft_wrap=False)
    if page.get("nextPageToken"):
        console.print(f"[dim]… more: --limit {min(limit * 2, 200)}[/]")


@assistants_cli.command("list")
@click.option("--name", metavar="TEXT", help="Only those whose name contains TEXT (any case).")
@click.option("--metadata", metavar="JSON", help="Only those whose metadata contains this.")
@limit_option
@json_option("The API's page: {assistants, nextPageToken}.")
@url_option
@api_key_option
def assistants_list(
    name: str | None,
    metadata: str | None,
    limit: int,
    as_json: bool,
    url: str | None,
    api_key: str | None,
) -> None:
    """The newest assistants first."""
    contains = _json_object("--metadata", metadata)
    with _client(url, api_key) as client:
        page = client.raw.list_assistants(name=name, metadata=contains, limit=limit)
    if as_json:
        _print_json(page)
        return
    if not page["assistants"]:
        click.echo("no assistants")
        return
    _print_table(page["assistants"], page, limit)


@assistants_cli.command("create")
@click.argument("name", metavar="NAME", help="Its name.")
@click.option(
    "--model",
    metavar="MODEL",
    required=True,
    help="scripted, openai:NAME or anthropic:NAME.",
)
@definition_options
@json_option()
@url_option
@api_key_option
def assistants_create(
    name: str,
    model: str,
    description: str | None,
    instructions: str | None,
    model_settings: str | None,
    tool: tuple[str, ...],
    approval_required: tuple[str, ...],
    metadata: str | None,
    as_json: bool,
    url: str | None,
    api_key: str | None,
) -> None:
    """Store an agent definition (version 1); prints its id."""
    with _client(url, api_key) as client:
        assistant = client.raw.create_assistant(
            name,
            model=model,
            description=description,
            instructions=instructions,
            model_settings=_json_object("--model-settings", model_settings),
            tools=list(tool) or None,
            approval_required=list(approval_required) or None,
            metadata=_json_object("--metadata", metadata),
        )
    if as_json:
        _print_json(assistant)
    else:
        click.echo(assistant["id"])


def _show(assistant: dict[str, Any]) -> None:
    tools = assistant.get("tools")
    rows: list[tuple[str, Any]] = [
        ("id", assistant["id"]),
        ("name", assistant["name"]),
        ("version", assistant["version"]),
        ("model", assistant["model"]),
        ("tools", "all" if tools is None else ", ".join(tools) or "none"),
        ("approval", ", ".join(assistant.get("approvalRequired") or []) or "none"),
        ("settings", json.dumps(assistant.get("modelSettings") or {})),
        ("created", _when(assistant["createdAt"])),
        ("updated", _when(assistant["updatedAt"])),
    ]
    if assistant.get("description"):
        rows.insert(2, ("about", _short(assistant["description"], 200)))
    if assistant.get("metadata"):
        rows.append(("metadata", json.dumps(assistant["metadata"])))
    if assistant.get("instructions"):
        rows.append(("prompt", _short(assistant["instructions"], 200)))
    for name, value in rows:
        click.echo(f"{name + ':':<9} {value}")


@assistants_cli.command("show")
@assistant_id_argument
@json_option()
@url_option
@api_key_option
def assistants_show(assistant_id: str, as_json: bool, url: str | None, api_key: str | None) -> None:
    """One assistant, at its latest version."""
    with _client(url, api_key) as client:
        assistant = client.raw.get_assistant(assistant_id)
    if as_json:
        _print_json(assistant)
    else:
        _show(assistant)


@assistants_cli.command("edit")
@assistant_id_argument
@click.option("--name", metavar="TEXT", help="A new name.")
@click.option("--model", metavar="MODEL", help="scripted, openai:NAME or anthropic:NAME.")
@definition_options
@click.option("--all-tools", is_flag=True, help="Let the agent use every tool (clears --tool).")
@json_option()
@url_option
@api_key_option
def assistants_edit(
    assistant_id: str,
    name: str | None,
    model: str | None,
    description: str | None,
    instructions: str | None,
    model_settings: str | None,
    tool: tuple[str, ...],
    approval_required: tuple[str, ...],
    metadata: str | None,
    all_tools: bool,
    as_json: bool,
    url: str | None,
    api_key: str | None,
) -> None:
    """Write a new version with the options given changed (sessions keep theirs)."""
    from ferryman import UNSET

    if all_tools and tool:
        fail("--all-tools and --tool: give one of them")
    changes: dict[str, Any] = {
        "name": name,
        "model": model,
        "description": description,
        "instructions": instructions,
        "model_settings": _json_object("--model-settings", model_settings),
        "tools": list(tool) or None,
        "approval_required": list(approval_required) or None,
        "metadata": _json_object("--metadata", metadata),
    }
    given = {key: value for key, value in changes.items() if value is not None}
    if all_tools:
        given["tools"] = None
    if not given:
        fail("nothing to change: give at least one option (see --help)")
    with _client(url, api_key) as client:
        assistant = client.raw.update_assistant(
            assistant_id, **{key: given.get(key, UNSET) for key in changes}
        )
    if as_json:
        _print_json(assistant)
    else:
        click.echo(f"{assistant['id']} version {assistant['version']}")


@assistants_cli.command("versions")
@assistant_id_argument
@limit_option
@json_option("The API's page: {versions, nextPageToken}.")
@url_option
@api_key_option
def assistants_versions(
    assistant_id: str, limit: int, as_json: bool, url: str | None, api_key: str | None
) -> None:
    """An assistant's versions, newest first."""
    with _client(url, api_key) as client:
        page = client.raw.assistant_versions(assistant_id, limit=limit)
    if as_json:
        _print_json(page)
        return
    _print_table(page["versions"], page, limit)


@assistants_cli.command("delete")
@assistant_id_argument
@url_option
@api_key_option
def assistants_delete(assistant_id: str, url: str | None, api_key: str | None) -> None:
    """Delete an assistant (the sessions created from it go on with their version)."""
    with _client(url, api_key) as client:
        client.raw.delete_assistant(assistant_id)
    click.echo(f"{assistant_id} deleted")
