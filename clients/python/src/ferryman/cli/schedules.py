"""`ferryman schedules`: cron timetables whose every tick creates a session. Like every client
command, on the SDK's raw JSON."""

from __future__ import annotations

from typing import Any

import click

from ferryman.cli.assistants import _json_object, limit_option
from ferryman.cli.commands import (
    _client,
    _print_json,
    _short,
    _when,
    api_key_option,
    json_option,
    url_option,
)
from ferryman.cli.common import Group, table_console

schedule_id_argument = click.argument("schedule_id", metavar="ID", help="The schedule's id.")


@click.group("schedules", cls=Group, no_args_is_help=True)
def schedules_cli() -> None:
    """Sessions on a timetable: list, create, show, pause, resume, delete."""


def _table(schedules: list[dict[str, Any]]) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("ID", no_wrap=True)
    table.add_column("CRON", no_wrap=True)
    table.add_column("ZONE", no_wrap=True)
    table.add_column("NEXT", no_wrap=True)
    table.add_column("PROMPT", overflow="ellipsis", no_wrap=True, ratio=1)
    for schedule in schedules:
        table.add_row(
            str(schedule["id"]),
            Text(str(schedule["cron"])),
            Text(str(schedule["timezone"])),
            _when(schedule["nextRunAt"]) if schedule["nextRunAt"] else "paused",
            Text(_short(str(schedule["prompt"]), 80)),  # text, not rich markup
        )
    return table


@schedules_cli.command("list")
@limit_option
@json_option("The API's page: {schedules, nextPageToken}.")
@url_option
@api_key_option
def schedules_list(limit: int, as_json: bool, url: str | None, api_key: str | None) -> None:
    """The newest schedules first."""
    with _client(url, api_key) as client:
        page = client.raw.list_schedules(limit=limit)
    if as_json:
        _print_json(page)
        return
    if not page["schedules"]:
        click.echo("no schedules")
        return
    console = table_console()
    console.print(_table(page["schedules"]), soft_wrap=False)
    if page.get("nextPageToken"):
        console.print(f"[dim]… more: --limit {min(limit * 2, 200)}[/]")


@schedules_cli.command("create")
@click.argument("cron", metavar="CRON", help="Five fields (or six, seconds first): '30 2 * * *'.")
@click.argument("prompt", metavar="PROMPT", help="The opening message of each session.")
@click.option("--timezone", "--tz", default="UTC", show_default=True, metavar="ZONE")
@click.option(
    "--overlap",
    type=click.Choice(["skip", "queue", "allow"]),
    default="skip",
    show_default=True,
    help="While the last session runs: skip the tick, queue one, or allow it beside.",
)
@click.option("--paused", is_flag=True, help="Create it paused (`resume` starts it).")
@click.option("--title", metavar="TEXT", help="Each session's title (default: from the prompt).")
@click.option("--assistant", "assistant_id", metavar="ID", help="Run this assistant's definition.")
@click.option("--model", metavar="MODEL", help="scripted, openai:NAME or anthropic:NAME.")
@click.option("--instructions", metavar="TEXT", help="The system prompt.")
@click.option("--tool", "tool", multiple=True, metavar="NAME", help="A tool it may use (repeat).")
@click.option("--metadata", metavar="JSON", help="A JSON object of your own, on each session.")
@json_option()
@url_option
@api_key_option
def schedules_create(
    cron: str,
    prompt: str,
    timezone: str,
    overlap: str,
    paused: bool,
    title: str | None,
    assistant_id: str | None,
    model: str | None,
    instructions: str | None,
    tool: tuple[str, ...],
    metadata: str | None,
    as_json: bool,
    url: str | None,
    api_key: str | None,
) -> None:
    """A schedule; prints its id and next tick."""
    with _client(url, api_key) as client:
        schedule = client.raw.create_schedule(
            cron,
            prompt,
            timezone=timezone,
            overlap=overlap,
            enabled=not paused,
            title=title,
            assistant_id=assistant_id,
            model=model,
            instructions=instructions,
            tools=list(tool) or None,
            metadata=_json_object("--metadata", metadata),
        )
    _print_one(schedule, as_json)


def _print_one(schedule: dict[str, Any], as_json: bool) -> None:
    if as_json:
        _print_json(schedule)
        return
    next_run = schedule["nextRunAt"]
    click.echo(f"{schedule['id']} next {_when(next_run) if next_run else 'paused'}")


def _show(schedule: dict[str, Any]) -> None:
    tools = schedule.get("tools")
    rows: list[tuple[str, Any]] = [
        ("id", schedule["id"]),
        ("cron", f"{schedule['cron']} ({schedule['timezone']})"),
        ("next", _when(schedule["nextRunAt"]) if schedule["nextRunAt"] else "paused"),
        ("overlap", schedule["overlap"]),
        ("model", schedule["model"]),
        ("tools", "all" if tools is None else ", ".join(tools) or "none"),
        ("prompt", _short(schedule["prompt"], 200)),
    ]
    for index, firing in enumerate(schedule["lastFirings"]):  # newest first
        what = firing["sessionId"] or firing["detail"] or ""
        line = f"{_when(firing['tick'])} {firing['outcome']} {what}"
        rows.append(("firings" if index == 0 else "", line))
    for name, value in rows:
        click.echo(f"{name + ':' if name else '':<9} {value}")


@schedules_cli.command("show")
@schedule_id_argument
@json_option()
@url_option
@api_key_option
def schedules_show(schedule_id: str, as_json: bool, url: str | None, api_key: str | None) -> None:
    """One schedule and its last firings."""
    with _client(url, api_key) as client:
        schedule = client.raw.get_schedule(schedule_id)
    if as_json:
        _print_json(schedule)
    else:
        _show(schedule)


@schedules_cli.command("pause")
@schedule_id_argument
@json_option()
@url_option
@api_key_option
def schedules_pause(schedule_id: str, as_json: bool, url: str | None, api_key: str | None) -> None:
    """Stop firing (ticks while paused never fire)."""
    with _client(url, api_key) as client:
        _print_one(client.raw.pause_schedule(schedule_id), as_json)


@schedules_cli.command("resume")
@schedule_id_argument
@json_option()
@url_option
@api_key_option
def schedules_resume(schedule_id: str, as_json: bool, url: str | None, api_key: str | None) -> None:
    """Fire again, from the first tick after now."""
    with _client(url, api_key) as client:
        _print_one(client.raw.resume_schedule(schedule_id), as_json)


@schedules_cli.command("delete")
@schedule_id_argument
@url_option
@api_key_option
def schedules_delete(schedule_id: str, url: str | None, api_key: str | None) -> None:
    """Delete a schedule (the sessions it fired stay)."""
    with _client(url, api_key) as client:
        client.raw.delete_schedule(schedule_id)
    click.echo(f"{schedule_id} deleted")
