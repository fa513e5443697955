"""The client commands: run, follow, watch, tools, sessions ... (assistants: cli/assistants.py;
schedules: cli/schedules.py).

They stand on the SDK alone, never on the server's modules, so they start fast and
work against any Ferryman URL: FERRYMAN_URL (default http://127.0.0.1:8000) and
FERRYMAN_API_KEY, or --url and --api-key. The SDK, rich and asyncio are imported inside the
commands: `ferryman --help` loads none of them. The commands take the API's JSON as it comes
(`Ferryman.raw`), not the SDK's models: a command line does not pay for importing pydantic
(only `watch`, on `OwnerSessionClient`, does).

A request the API refuses prints `error: <status> <CODE>: <detail>` and exits 1; a server that
cannot be reached, or bad usage, exits 2; Ctrl-C exits 130 without a traceback (a command that
follows a session says that the session goes on, and how to follow or cancel it). Commands that
follow a session exit with a code that says how it ended (`exit_codes_help`).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ferryman.cli.common import DEBUG_HINT, Exit, Group, debugging, fail, one_line, table_console

if TYPE_CHECKING:
    from rich.table import Table
    from rich.text import Text

    from ferryman import (
        ApiError,
        AsyncFerryman,
        Ferryman,
        OwnerSessionClient,
        Session,
        StreamEvent,
    )


# --- exit codes ---------------------------------------------------------------------------------

EXIT_API_ERROR = 1  # the API refused a request
EXIT_USAGE = 2  # bad usage, or the server cannot be reached
EXIT_INTERRUPTED = 130  # Ctrl-C
STATUS_EXIT = {"succeeded": 0, "failed": 3, "cancelled": 4, "waiting": 5}
EXIT_NOT_FINISHED = 6  # idle, queued or running when the command stopped following
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


def exit_codes_help(*, created: str = "", not_finished: bool = True) -> str:
    """The exit statuses of a command that follows a session: `created`, what the status 0
    also means; `not_finished`, whether 6 can happen."""
    lines = [
        "\b",
        "Exit status:",
        f"  0    the session succeeded{created}",
        "  1    the API refused a request (the error line says why)",
        "  2    bad usage, or the server cannot be reached",
        "  3    the session failed",
        "  4    the session was cancelled",
        "  5    the session is waiting: for a message (`ferryman sessions send`),",
        "       or for an approval (`ferryman sessions approve`)",
    ]
    if not_finished:
        lines.append("  6    the session is still idle, queued or running (--no-follow)")
    lines.append("  130  interrupted (Ctrl-C); the session goes on on the server")
    return "\n".join(lines)


def status_exit(status: str) -> int:
    """The exit code that tells how a session stands: STATUS_EXIT, else EXIT_NOT_FINISHED."""
    return STATUS_EXIT.get(status, EXIT_NOT_FINISHED)


# --- options ------------------------------------------------------------------------------------

url_option = click.option(
    "--url",
    metavar="URL",
    envvar="FERRYMAN_URL",
    show_envvar=True,
    help="The Ferryman server [default: http://127.0.0.1:8000].",
)
api_key_option = click.option(
    "--api-key",
    metavar="KEY",
    envvar="FERRYMAN_API_KEY",
    show_envvar=True,
    help="An API key (`ferryman keys create`); none in local mode.",
)


def json_option(help: str = "Print the API's JSON.") -> Callable[[Any], Any]:
    return click.option("--json", "as_json", is_flag=True, help=help)


session_id_argument = click.argument("session_id", metavar="ID", help="The session's id.")


@contextlib.contextmanager
def _quick_imports() -> Iterator[None]:
    """Import the SDK without two costs a command line does not need (about 0.1 s and
    0.03 s of the 0.3 s it takes here):

    - httpx imports its own command-line client (click, rich, pygments) whenever those are
      installed, and here they are (uvicorn brings them): marked absent, `httpx.main`
      is httpx's stand-in for it;
    - pydantic looks for plugins in every installed distribution's entry points when the first
      model is defined: skipped (only `watch` defines models; the other commands take the API's
      JSON as it comes)."""
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
    previous = os.environ.get("PYDANTIC_DISABLE_PLUGINS")
    os.environ["PYDANTIC_DISABLE_PLUGINS"] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["PYDANTIC_DISABLE_PLUGINS"]
        else:
            os.environ["PYDANTIC_DISABLE_PLUGINS"] = previous


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """The SDK's failures as one line and an exit code (with the traceback too under
    `--debug`); Ctrl-C as a quiet 130."""
    with _quick_imports():
        from ferryman import ApiError, FerrymanConnectionError

    try:
        yield
    except (Exit, click.Abort, BrokenPipeError):
        raise  # a closed pipe (`| head`): click exits 1 quietly
    except KeyboardInterrupt:
        _end_line()
        raise Exit(EXIT_INTERRUPTED) from None
    except Exception as exc:
        _end_line()
        if debugging():
            traceback.print_exc()
        if isinstance(exc, FerrymanConnectionError):
            fail(str(exc), EXIT_USAGE)
        if isinstance(exc, ApiError):
            fail(_refusal(exc), EXIT_API_ERROR)
        # Not the SDK's word: an answer it could not read, say.
        hint = "" if debugging() else f" ({DEBUG_HINT})"
        fail(f"{type(exc).__name__}: {one_line(exc)}{hint}", EXIT_API_ERROR)


# A refusal the command line's user answers with an option, not an HTTP header.
AUTH_HINTS = {
    "AUTH_REQUIRED": "the server requires an API key: pass --api-key KEY or set FERRYMAN_API_KEY"
    " (`ferryman keys create --owner NAME` on the server makes one)",
    "INVALID_API_KEY": "the API key (--api-key or FERRYMAN_API_KEY) is unknown or revoked",
}


def _refusal(error: ApiError) -> str:
    hint = AUTH_HINTS.get(error.code)
    return f"{error.status} {error.code}: {hint}" if hint else str(error)


@contextlib.contextmanager
def _client(url: str | None, api_key: str | None) -> Iterator[Ferryman]:
    with _errors():
        from ferryman import Ferryman

        with Ferryman(url or None, api_key=api_key or None) as client:
            yield client


def _end_line() -> None:
    """Leave the terminal at the start of a line (after a reply cut by Ctrl-C)."""
    if _View.mid_line:
        click.echo()
        _View.mid_line = False


def _print_json(value: Any, *, indent: int | None = 2) -> None:
    separators = None if indent else (",", ":")
    click.echo(json.dumps(value, ensure_ascii=False, indent=indent, separators=separators))


# --- a session's events, for a person -----------------------------------------------------------

MAX_ARGUMENTS_CHARS = 200  # of a tool call's arguments, on its line
# What a message does to the calls that wait for approval (the API's rule).
DENIES = "denies every tool call waiting for approval"
MAX_RESULT_CHARS = 200  # of a failed tool call's result


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _arguments(arguments: Any) -> str:
    text = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    return _short(text, MAX_ARGUMENTS_CHARS)


class _View:
    """Renders a session's events as they come: the reply as it streams (`message_delta`),
    completed by its `assistant_message` without repeating what was shown; one line per tool
    call started and ended; notices for retries, resumes and the end.

    Deltas are ephemeral: a stream that joins in the middle of a turn misses its first ones.
    So they are shown only once a durable event has come live (after `caught_up`), which a turn
    begins with; before that, a turn's text shows when its `assistant_message` comes. Streamed
    text that will not be the reply (a `model_retry` or a resume drops the partial turn) is
    followed by a notice saying so; text that came with gaps anyway is followed by the reply as
    recorded."""

    mid_line = False  # class-wide: Ctrl-C ends the line whichever view wrote last

    def __init__(self, *, in_step: bool = False) -> None:
        self.partial = ""  # this turn's text streamed so far
        self.pending_approvals: set[str] = set()  # the calls seen waiting for a decision
        # Whether a durable event came live: deltas from then on are whole turns. `run`
        # streams a session from its creation: before any turn.
        self.in_step = in_step
        self.handlers: dict[str, Callable[[StreamEvent], None]] = {
            "message_delta": self.delta,
            "assistant_message": self.assistant_message,
            "user_message": self.user_message,
            "tool_call_start": self.tool_call_start,
            "tool_result": self.tool_result,
            "tool_approval_requested": self.approval_requested,
            "tool_approval_decided": self.approval_decided,
            "user_question": self.user_question,
            "model_retry": self.model_retry,
            "session_resumed": self.resumed,
            "session_interrupted": self.interrupted,
            "session_end": self.end,
        }

    def show(self, event: StreamEvent) -> None:
        if event.durable and event.envelope.get("phase") == "live":
            self.in_step = True
        handler = self.handlers.get(event.type)
        if handler is not None:
            handler(event)

    # -- output

    def write(self, text: str) -> None:
        if text:
            click.echo(text, nl=False)
            sys.stdout.flush()
            _View.mid_line = not text.endswith("\n")

    def line(self, text: str, **style: Any) -> None:
        _end_line()
        click.secho(text, **style)

    def notice(self, text: str) -> None:
        self.line(f"· {text}", dim=True)

    def warning(self, text: str) -> None:
        self.line(f"! {text}", fg="yellow")

    def drop_partial(self, why: str) -> None:
        if self.partial:
            self.warning(f"the reply above was discarded ({why})")
            self.partial = ""

    # -- events

    def delta(self, event: StreamEvent) -> None:
        if not self.in_step:
            return  # maybe the middle of a turn: its message shows it whole
        text = str(event.data.get("text", ""))
        self.write(text)
        self.partial += text

    def assistant_message(self, event: StreamEvent) -> None:
        text = str(event.data.get("text") or "")
        if not text:
            self.drop_partial("the turn recorded no text")
        elif text.startswith(self.partial):
            self.write(text[len(self.partial) :])
        else:
            self.notice("some of the streamed text was missed; the reply as recorded:")
            self.write(text)
        self.partial = ""
        _end_line()
        stop = event.data.get("stopReason")
        if stop == "length":
            self.notice("the reply stopped at the output limit; send a message to continue it")
        elif stop == "aborted":
            self.notice("the reply was cut short")

    def user_message(self, event: StreamEvent) -> None:
        self.pending_approvals.clear()  # a message denies them
        self.line(f"» {event.data.get('text', '')}", fg="cyan")

    def tool_call_start(self, event: StreamEvent) -> None:
        data = event.data
        self.line(f"→ tool {data.get('name')} {_arguments(data.get('arguments', {}))}")

    def tool_result(self, event: StreamEvent) -> None:
        data = event.data
        self.pending_approvals.discard(str(data.get("toolCallId")))
        name = data.get("name")
        content = _short(str(data.get("content", "")), MAX_RESULT_CHARS)
        if not data.get("isError"):
            self.line(f"✓ {name} ok", fg="green")
        elif data.get("interrupted"):
            self.line(f"✗ {name} interrupted: its worker stopped", fg="red")
        elif data.get("timedOut"):
            self.line(f"✗ {name} timed out", fg="red")
        elif data.get("denied"):
            self.line(f"✗ {name} {content}", fg="red")
        else:
            self.line(f"✗ {name} error: {content}", fg="red")

    def approval_requested(self, event: StreamEvent) -> None:
        data = event.data
        call = data.get("toolCallId")
        self.pending_approvals.add(str(call))
        self.line(
            f"? tool {data.get('name')} {_arguments(data.get('arguments', {}))} waits for "
            f"approval: ferryman sessions approve {event.session_id} {call} [--deny]",
            fg="yellow",
        )

    def approval_decided(self, event: StreamEvent) -> None:
        data = event.data
        self.pending_approvals.discard(str(data.get("toolCallId")))
        verdict = "approved" if data.get("approved") else "denied"
        reason = f": {data['reason']}" if data.get("reason") else ""
        self.notice(f"tool call {data.get('toolCallId')} {verdict}{reason}")

    def user_question(self, event: StreamEvent) -> None:
        options = event.data.get("options") or []
        self.line(f"? {event.data.get('question', '')}", fg="yellow")
        if options:
            self.line(f"  options: {' | '.join(str(option) for option in options)}")

    def model_retry(self, event: StreamEvent) -> None:
        data = event.data
        self.drop_partial("the model call is retried")
        delay = float(data.get("delayMs", 0)) / 1000
        reason = data.get("reason", "fault")
        message = f": {_short(str(data['message']), 200)}" if data.get("message") else ""
        self.warning(
            f"model call failed ({reason}{message}); retry {data.get('attempt')} in {delay:.1f} s"
        )

    def resumed(self, event: StreamEvent) -> None:
        data = event.data
        self.drop_partial("the session was resumed")
        run = data.get("attempt")
        if data.get("reason") == "follow_up":
            # Re-queued by a message or an approval decision: a new run, not a takeover.
            self.notice(f"continuing (run {run})")
            return
        repaired = data.get("repairedToolCalls") or []
        interrupted = ", ".join(str(call) for call in repaired) if repaired else "none"
        self.warning(
            f"another worker took the session over after a {data.get('reason', 'crash')} "
            f"(run {run}); interrupted: {interrupted}"
        )

    def interrupted(self, event: StreamEvent) -> None:
        self.drop_partial("its worker stopped")
        reason = event.data.get("reason", "unknown")
        self.warning(f"the worker stopped ({reason}); another one resumes the session")

    def end(self, event: StreamEvent) -> None:
        data = event.data
        self.drop_partial("the turn did not finish")
        status = str(data.get("status"))
        error = data.get("error") or {}
        detail = ""
        if isinstance(error, dict) and error:
            detail = ": " + ": ".join(
                str(part) for part in (error.get("code"), error.get("message")) if part
            )
        if data.get("note"):
            detail += f" ({data['note']})"
        if status == "waiting" and self.pending_approvals:
            detail += (
                f"; decide with `ferryman sessions approve {event.session_id} CALL_ID [--deny]`"
                f" (a message, `ferryman sessions send`, {DENIES})"
            )
        elif status == "waiting":
            detail += f"; answer with `ferryman sessions send {event.session_id} TEXT`"
        color = {"succeeded": "green", "failed": "red"}.get(status)
        self.line(f"· session {status}{detail}", fg=color, dim=color is None)


def _follow(
    client: Ferryman,
    session_id: str,
    *,
    after: int | None,
    follow: bool = True,
    as_json: bool = False,
    from_creation: bool = False,
) -> int:
    """Print the session's events after seq `after` (None: all) and, with `follow`, live ones
    until it ends; the exit code of how it stands then.

    It stops at a `session_end` that is the log's last event: one met in the backlog only once
    `caught_up` confirms nothing came after it (a follow-up re-queues an ended session).
    `from_creation`: the stream starts as the session was created, before any turn, so token
    deltas can be shown from the first one (see `_View`)."""
    try:
        return _show_events(client, session_id, after, follow, as_json, from_creation)
    except KeyboardInterrupt:
        _end_line()
        click.secho(
            f"· interrupted; session {session_id} goes on on the server: "
            f"`ferryman follow {session_id}` follows it again, "
            f"`ferryman sessions cancel {session_id}` cancels it",
            err=True,
            dim=True,
        )
        raise Exit(EXIT_INTERRUPTED) from None


def _show_events(
    client: Ferryman,
    session_id: str,
    after: int | None,
    follow: bool,
    as_json: bool,
    from_creation: bool,
) -> int:
    view = _View(in_step=from_creation)
    ended: str | None = None  # the status of a session_end that is the last event seen
    live = False
    for event in client.session_events(session_id, after=after, follow=follow):
        if as_json:
            # Control frames (caught_up, resync_required) are their payload: typed here too.
            envelope = event.envelope
            if "type" not in envelope:
                envelope = {"type": event.type, "data": event.data}
            _print_json(envelope, indent=None)
            sys.stdout.flush()
        else:
            view.show(event)
        if event.type == "resync_required":
            _end_line()
            fail(_resync_problem(client, session_id, after, event), EXIT_USAGE)
        if event.durable:
            ended = str(event.data.get("status")) if event.type == "session_end" else None
        live = live or event.type == "caught_up"
        if live and ended is not None:
            return status_exit(ended)
    _end_line()
    # A --no-follow stream that caught up before the end, or a session deleted meanwhile
    # (asking for it then answers 404).
    if ended is not None:
        return status_exit(ended)
    return status_exit(client.raw.get_session(session_id)["status"])


def _resync_problem(
    client: Ferryman, session_id: str, after: int | None, event: StreamEvent
) -> str:
    reason = event.data.get("reason", "resync_required")
    if reason == "cursor_ahead":
        last = client.raw.get_session(session_id)["lastSeq"]
        return f"--after {after} is past the session's last event (seq {last})"
    return f"the stream cannot resume after seq {after} ({reason}); try a smaller --after"


# --- run ----------------------------------------------------------------------------------------


def _read_script(path: Path) -> list[dict[str, Any]]:
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    except OSError as exc:
        fail(f"--script: cannot read {path}: {exc.strerror}")
    try:
        turns = json.loads(text)
    except ValueError as exc:
        fail(f"--script: {path} is not JSON: {exc}")
    if not isinstance(turns, list) or not all(isinstance(turn, dict) for turn in turns):
        fail(f"--script: {path} must hold a JSON list of turns ({{text?, toolCalls?, ...}})")
    return turns


@click.command(short_help="Start a session and stream it.")
@click.argument("prompt", metavar="PROMPT", help="The opening user message.")
@click.option(
    "--model",
    metavar="MODEL",
    help="scripted, openai:NAME or anthropic:NAME [server's FERRYMAN_MODEL].",
)
@click.option("--instructions", metavar="TEXT", help="The system prompt.")
@click.option(
    "--script",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="A JSON file (- for stdin) with the scripted model's turns: "
    '[{"text": ..., "toolCalls": [{"name": ..., "arguments": {...}}]}, ...].',
)
@click.option(
    "--assistant",
    metavar="ID",
    help="Run this assistant's definition (`ferryman assistants`); the options given override it.",
)
@click.option(
    "--assistant-version",
    type=click.IntRange(min=1),
    metavar="N",
    help="The assistant's version to run [its latest].",
)
@click.option("--title", metavar="TEXT", help="The title [the prompt's first line].")
@click.option(
    "--tool",
    "tool",
    multiple=True,
    metavar="NAME",
    help="A tool the agent may use (repeat; default: all).",
)
@click.option(
    "--approval-required",
    "approval_required",
    multiple=True,
    metavar="NAME",
    help="A tool whose every call waits for your approval (repeat).",
)
@click.option(
    "--follow/--no-follow",
    default=True,
    show_default=True,
    help="Stream the session until it ends, or print its id.",
)
@json_option("The session's JSON; with --follow, one event envelope a line (NDJSON).")
@url_option
@api_key_option
def run(
    prompt: str,
    model: str | None,
    instructions: str | None,
    script: Path | None,
    assistant: str | None,
    assistant_version: int | None,
    title: str | None,
    tool: tuple[str, ...],
    approval_required: tuple[str, ...],
    follow: bool,
    as_json: bool,
    url: str | None,
    api_key: str | None,
) -> None:
    """Start a session and stream it: the reply as it comes, tool calls, retries and resumes.

    With --no-follow, print the new session's id (or, with --json, the session) and exit 0
    once it is created, whatever comes of it.
    """
    turns = _read_script(script) if script is not None else None
    if assistant_version is not None and assistant is None:
        fail("--assistant-version needs --assistant")
    with _client(url, api_key) as client:
        session = client.raw.create_session(
            prompt,
            assistant_id=assistant,
            assistant_version=assistant_version,
            title=title,
            model=model,
            instructions=instructions,
            script=turns,
            tools=list(tool) or None,
            approval_required=list(approval_required) or None,
        )
        if not follow:
            if as_json:
                _print_json(session)
            else:
                click.echo(session["id"])
            return
        if not as_json:
            click.secho(f"· session {session['id']}", dim=True)
        # JSON: the whole log (its user_message first); a person: what comes after the prompt.
        after = None if as_json else session["lastSeq"]
        code = _follow(client, session["id"], after=after, as_json=as_json, from_creation=True)
    raise Exit(code)


# --- follow -------------------------------------------------------------------------------------


@click.command("follow", short_help="Stream a session's events, live.")
@session_id_argument
@click.option(
    "--after",
    type=click.IntRange(min=0),
    metavar="SEQ",
    help="Start after this event number [from the start].",
)
@click.option(
    "--follow/--no-follow",
    default=True,
    show_default=True,
    help="Go on live until the session ends, or stop caught up.",
)
@json_option("One event envelope a line (NDJSON).")
@url_option
@api_key_option
def follow_command(
    session_id: str,
    after: int | None,
    follow: bool,
    as_json: bool,
    url: str | None,
    api_key: str | None,
) -> None:
    """Stream a session's events from any point, as `ferryman run` shows them."""
    with _client(url, api_key) as client:
        client.raw.get_session(session_id)  # 404, or an unreachable server, fails here at once
        code = _follow(client, session_id, after=after, follow=follow, as_json=as_json)
    raise Exit(code)


# --- sessions -----------------------------------------------------------------------------------


@click.group("sessions", cls=Group, no_args_is_help=True)
def sessions_cli() -> None:
    """List, inspect, steer, fork, cancel and delete sessions."""


STATUS_STYLES = {
    "idle": "dim",
    "queued": "dim",
    "running": "blue",
    "waiting": "yellow",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "magenta",
}


def _when(moment: str) -> str:
    """An RFC 3339 time of the API as local time; the date too unless it is today."""
    local = datetime.fromisoformat(moment).astimezone()
    if local.date() == datetime.now().astimezone().date():
        return local.strftime("%H:%M:%S")
    return local.strftime("%Y-%m-%d %H:%M")


def _resumes(session: dict[str, Any]) -> Text:
    """How many times another worker took the session over (a crash or a shutdown): marked
    when any. Not `attempt`, which counts every run, a follow-up's too."""
    from rich.text import Text

    resumes = int(session.get("resumes", 0))  # a server before `resumes` counted none
    return Text(str(resumes), style="yellow" if resumes else "dim")


def _sessions_table(sessions: list[dict[str, Any]]) -> Table:
    """Sessions as the API shows them (camelCase JSON), a row each."""
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("ID", no_wrap=True)
    table.add_column("TITLE", overflow="ellipsis", no_wrap=True, ratio=1)
    table.add_column("STATUS", no_wrap=True)
    table.add_column("RESUMES", justify="right", no_wrap=True)
    table.add_column("UPDATED", no_wrap=True)
    for session in sessions:
        status = str(session["status"])
        table.add_row(
            str(session["id"]),
            Text(str(session["title"])),  # a title is text, not rich markup
            Text(status, style=STATUS_STYLES.get(status, "")),
            _resumes(session),
            _when(session["updatedAt"]),
        )
    return table


@sessions_cli.command("list")
@click.option(
    "--status",
    "-s",
    "status",
    multiple=True,
    metavar="STATUS",
    help="Only sessions in this status (repeat): idle, queued, running, waiting, "
    "succeeded, failed, cancelled.",
)
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(1, 200),
    default=20,
    show_default=True,
    metavar="N",
    help="At most N rows.",
)
@json_option("The API's page: {sessions, cursor, nextPageToken}.")
@url_option
@api_key_option
def sessions_list(
    status: tuple[str, ...], limit: int, as_json: bool, url: str | None, api_key: str | None
) -> None:
    """The newest sessions first."""
    with _client(url, api_key) as client:
        page = client.raw.list_sessions(status=list(status) or None, limit=limit)
    if as_json:
        _print_json(page)
        return
    if not page["sessions"]:
        click.echo("no sessions")
        return
    console = table_console()
    console.print(_sessions_table(page["sessions"]), soft_wrap=False)
    if page.get("nextPageToken"):
        console.print(f"[dim]… more: --limit {min(limit * 2, 200)}[/]")


@sessions_cli.command("show")
@session_id_argument
@json_option()
@url_option
@api_key_option
def sessions_show(session_id: str, as_json: bool, url: str | None, api_key: str | None) -> None:
    """One session: status, runs and takeovers, model, usage, error, lease."""
    with _client(url, api_key) as client:
        session = client.raw.get_session(session_id)
    if as_json:
        _print_json(session)
        return
    usage = session.get("usage") or {}
    cancel_requested = " (cancel requested)" if session.get("cancelRequested") else ""
    rows: list[tuple[str, Any]] = [
        ("id", session["id"]),
        ("title", session["title"]),
        ("status", session["status"] + cancel_requested),
        ("runs", session["attempt"]),
        ("resumes", _resumes_line(session)),
        ("model", session["model"]),
        ("events", session["lastSeq"]),
        ("created", _when(session["createdAt"])),
        ("updated", _when(session["updatedAt"])),
        (
            "usage",
            f"{usage.get('inputTokens', 0)} in, {usage.get('outputTokens', 0)} out, "
            f"{usage.get('cachedTokens', 0)} cached",
        ),
    ]
    if session.get("activeStage"):
        rows.append(("stage", session["activeStage"]))
    lease = session.get("lease")
    if lease is not None:
        pid = f" (pid {lease['pid']})" if lease.get("pid") else ""
        rows.append(("worker", f"{lease['workerId']}{pid}"))
    error = session.get("error")
    if error:
        rows.append(("error", f"{error.get('code', '')}: {error.get('message', '')}"))
    forked_from = session.get("forkedFrom")
    if forked_from:
        rows.append(("forked", f"from {forked_from['sessionId']} at event {forked_from['seq']}"))
    parent = session.get("parent")
    if parent:  # a delegate's child (docs/delegation.md)
        rows.append(("parent", f"{parent['sessionId']} (call {parent['toolCallId']})"))
    rows.append(("prompt", _short(session["prompt"], 200)))
    for name, value in rows:
        click.echo(f"{name + ':':<9} {value}")


def _resumes_line(session: dict[str, Any]) -> str:
    resumes = int(session.get("resumes", 0))
    if not resumes:
        return "0"
    return click.style(f"{resumes} (taken over after a worker's crash or shutdown)", fg="yellow")


@sessions_cli.command("cancel")
@session_id_argument
@click.option("--wait", is_flag=True, help="Wait (at most 30 s) until the session has ended.")
@json_option()
@url_option
@api_key_option
def sessions_cancel(
    session_id: str, wait: bool, as_json: bool, url: str | None, api_key: str | None
) -> None:
    """Cancel a session: at once if queued or waiting, else once its worker has stopped."""
    with _client(url, api_key) as client:
        answer = client.raw.cancel_session(session_id, wait=wait)
    if as_json:
        _print_json(answer)
    elif answer["status"] in TERMINAL:
        click.echo(f"{answer['id']} {answer['status']}")
    else:
        click.echo(f"{answer['id']} cancel requested (still {answer['status']})")


def _pending_approvals(client: Ferryman, session_id: str) -> list[dict[str, Any]]:
    """The `tool_approval_requested` data of the calls that wait for a decision now: requested,
    neither decided nor answered since, and no user message after them (one denies them)."""
    pending: dict[str, dict[str, Any]] = {}
    after: int | None = 0
    while after is not None:
        page = client.raw.transcript(session_id, after=after, limit=1000)
        for event in page["events"]:
            data, kind = event.get("data") or {}, event.get("type")
            if kind == "tool_approval_requested":
                pending[str(data.get("toolCallId"))] = data
            elif kind in ("tool_approval_decided", "tool_result"):
                pending.pop(str(data.get("toolCallId")), None)
            elif kind == "user_message":
                pending.clear()
        after = page.get("nextAfter")
    return list(pending.values())


def _warn_of_denials(client: Ferryman, session_id: str, yes: bool) -> None:
    """Say, before a message goes to a session that waits for approvals, that it denies them;
    ask first when a person is at the terminal (unless --yes)."""
    if client.raw.get_session(session_id)["status"] != "waiting":
        return
    pending = _pending_approvals(client, session_id)
    if not pending:
        return
    calls = ", ".join(f"{call.get('name')} ({call.get('toolCallId')})" for call in pending)
    click.secho(
        f"! this message {DENIES}: {calls}; to decide instead: "
        f"`ferryman sessions approve {session_id} CALL_ID [--deny]`",
        fg="yellow",
        err=True,
    )
    if not yes and sys.stdin.isatty() and sys.stderr.isatty():
        click.confirm("Send it and deny them?", abort=True, err=True)


@sessions_cli.command("send")
@session_id_argument
@click.argument("text", metavar="TEXT", help="The message.")
@click.option(
    "--follow", is_flag=True, help="Then stream the session until it ends, as `run` does."
)
@click.option(
    "--yes",
    "-y",
    is_flag=True,
    help="Send without asking, even if the message denies tool calls waiting for approval.",
)
@json_option()
@url_option
@api_key_option
def sessions_send(
    session_id: str,
    text: str,
    follow: bool,
    yes: bool,
    as_json: bool,
    url: str | None,
    api_key: str | None,
) -> None:
    """Send a message: steers a running session, re-queues a waiting or ended one.

    A message to a session that waits for approvals denies every call still waiting (the
    model then reads your message): the command says so first, and at a terminal asks
    (--yes does not). `ferryman sessions approve` decides a call instead.
    """
    with _client(url, api_key) as client:
        _warn_of_denials(client, session_id, yes)
        accepted = client.raw.send_message(session_id, text)
        if as_json and not follow:
            _print_json(accepted)
            return
        message = accepted["message"]
        if not as_json:
            click.echo(f"sent as event {message['seq']} ({message['delivery']})")
        if not follow:
            return
        code = _follow(client, session_id, after=message["seq"], as_json=as_json)
    raise Exit(code)


@sessions_cli.command("approve")
@session_id_argument
@click.argument("tool_call_id", metavar="CALL_ID", help="The call's id (tool_approval_requested).")
@click.option("--deny", is_flag=True, help="Deny the call instead.")
@click.option("--reason", metavar="TEXT", help="Why (the model sees it).")
@url_option
@api_key_option
def sessions_approve(
    session_id: str,
    tool_call_id: str,
    deny: bool,
    reason: str | None,
    url: str | None,
    api_key: str | None,
) -> None:
    """Approve (or --deny) a tool call that waits for approval."""
    with _client(url, api_key) as client:
        decided = client.raw.decide_tool_call(session_id, tool_call_id, not deny, reason=reason)
    verdict = "approved" if decided["approved"] else "denied"
    click.echo(f"{decided['toolCallId']} {verdict}; session {decided['id']} is {decided['status']}")


@sessions_cli.command("rename")
@session_id_argument
@click.argument("title", metavar="TITLE", help="The new title.")
@json_option()
@url_option
@api_key_option
def sessions_rename(
    session_id: str, title: str, as_json: bool, url: str | None, api_key: str | None
) -> None:
    """Give a session a new title."""
    with _client(url, api_key) as client:
        session = client.raw.rename_session(session_id, title)
    if as_json:
        _print_json(session)
    else:
        click.echo(f"{session['id']} {session['title']}")


@sessions_cli.command("fork")
@session_id_argument
@click.option(
    "--at-seq",
    "at_seq",
    type=click.IntRange(min=1),
    required=True,
    metavar="N",
    help="The last event of its log the fork keeps (`ferryman sessions show` gives the count).",
)
@click.option(
    "--message", metavar="TEXT", help="Replace the user message at N (edit and regenerate)."
)
@click.option("--title", metavar="TEXT", help="The fork's title (default: the session's).")
@click.option("--follow", is_flag=True, help="Then stream the fork until it ends, as `run` does.")
@json_option("The new session.")
@url_option
@api_key_option
def sessions_fork(
    session_id: str,
    at_seq: int,
    message: str | None,
    title: str | None,
    follow: bool,
    as_json: bool,
    url: str | None,
    api_key: str | None,
) -> None:
    """A new session whose history is this one's through event N; the session is left as it
    is. With --message, the user message at N is replaced and answered anew."""
    with _client(url, api_key) as client:
        fork = client.raw.fork_session(session_id, at_seq, message=message, title=title)
        if as_json and not follow:
            _print_json(fork)
            return
        if not as_json:
            click.echo(
                f"{fork['id']} forked from {session_id} at event {at_seq} ({fork['status']})"
            )
        if not follow or fork["status"] == "idle":  # idle: nothing to answer until a message
            return
        code = _follow(client, fork["id"], after=fork["lastSeq"], as_json=as_json)
    raise Exit(code)


@sessions_cli.command("delete")
@session_id_argument
@url_option
@api_key_option
def sessions_delete(session_id: str, url: str | None, api_key: str | None) -> None:
    """Delete a session (cancelling it first if it runs)."""
    with _client(url, api_key) as client:
        client.raw.delete_session(session_id)
    click.echo(f"{session_id} deleted")


# --- watch --------------------------------------------------------------------------------------


@click.command(short_help="A live table of your sessions.")
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(1, 200),
    default=20,
    show_default=True,
    metavar="N",
    help="Rows shown (the newest).",
)
@url_option
@api_key_option
def watch(limit: int, url: str | None, api_key: str | None) -> None:
    """A live table of your sessions, until Ctrl-C.

    When the output is not a terminal, one line per change instead:
    `TIME ID STATUS resumes N TITLE` (N: takeovers after a crash or a shutdown),
    `TIME ID deleted`, and `TIME reconnecting…` /
    `TIME connected` when the stream goes down and comes back.
    """
    import asyncio

    with _errors():
        from ferryman import AsyncFerryman

        client = AsyncFerryman(url or None, api_key=api_key or None)
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_watch(client, limit))


async def _watch(client: AsyncFerryman, limit: int) -> None:
    with _quick_imports():
        # Its live picture is of the SDK's models: the one client command that loads pydantic.
        from ferryman import OwnerSessionClient

    async with client, OwnerSessionClient(client) as live:
        if sys.stdout.isatty():
            await _watch_table(live, limit)
        else:
            await _watch_lines(live, limit)


def _newest(picture: dict[str, Session], limit: int) -> list[Session]:
    """The `limit` newest sessions, newest first (as `sessions list` orders them): rows keep
    their places while their sessions change."""
    return sorted(picture.values(), key=lambda s: (s.created_at, s.id), reverse=True)[:limit]


async def _watch_table(live: OwnerSessionClient, limit: int) -> None:
    from rich.console import Console
    from rich.live import Live

    console = Console()
    with Live(console=console, auto_refresh=False, redirect_stdout=False) as view:
        async for picture in live.changes():
            # Bounded by the screen too: a table taller than it would scroll at each refresh.
            rows = max(1, min(limit, console.size.height - 4))
            shown = _newest(picture, rows)
            state = "[green]●[/] live" if live.connected else "[yellow]reconnecting…[/]"
            caption = (
                f"{state}   {len(shown)} of {len(picture)} sessions, newest first"
                "   [dim]Ctrl-C to quit[/]"
            )
            table = _sessions_table([s.model_dump(mode="json", by_alias=True) for s in shown])
            table.caption = caption
            table.caption_justify = "left"
            view.update(table, refresh=True)


async def _watch_lines(live: OwnerSessionClient, limit: int) -> None:
    """One line per change, for a pipe or a log."""
    known: dict[str, tuple[str, int, str]] = {}  # every session's state as last printed
    connected = False  # not connected yet is not worth a line; losing the stream is
    first = True
    async for picture in live.changes():
        now = datetime.now().astimezone().strftime("%H:%M:%S")
        if live.connected != connected:
            connected = live.connected
            click.echo(f"{now} {'connected' if connected else 'reconnecting…'}")
        # At first the newest `limit` sessions, oldest first; then every change.
        shown = {s.id for s in _newest(picture, limit)} if first else set(picture)
        first = False
        for session in sorted(picture.values(), key=lambda s: (s.created_at, s.id)):
            state = (session.status, session.resumes, session.title)
            if known.get(session.id) != state:
                known[session.id] = state
                if session.id in shown:
                    click.echo(
                        f"{now} {session.id} {session.status:<9} resumes {session.resumes} "
                        f"{session.title}"
                    )
        for session_id in [known_id for known_id in known if known_id not in picture]:
            del known[session_id]
            click.echo(f"{now} {session_id} deleted")
        sys.stdout.flush()


# --- tools --------------------------------------------------------------------------------------


@click.command("tools", short_help="The tools the live workers offer.")
@json_option("The API's catalog: {tools, workers}.")
@url_option
@api_key_option
def tools_command(as_json: bool, url: str | None, api_key: str | None) -> None:
    """The live tool catalog: each tool the workers alive now offer, where it comes from,
    whether its calls wait for approval, whether it may run twice, and how many of the
    workers have it (marked when only some have it)."""
    with _client(url, api_key) as client:
        catalog = client.raw.list_tools()
    if as_json:
        _print_json(catalog)
        return
    workers = catalog.get("workers")  # None: a server that does not count them
    if workers == 0:
        click.secho(
            "no worker is alive: sessions stay queued until one starts "
            "(`ferryman worker`, or `ferryman serve` with its worker)",
            fg="yellow",
        )
    if not catalog["tools"]:
        if workers != 0:
            click.echo("no tools")
        return
    table_console().print(_tools_table(catalog["tools"], workers), soft_wrap=False)


def _tools_table(tools: list[dict[str, Any]], workers: int | None) -> Table:
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("NAME", "SOURCE", "APPROVAL", "IDEMPOTENT"):
        table.add_column(column, no_wrap=True)
    if workers is not None:
        table.add_column("WORKERS", justify="right", no_wrap=True)
    for tool in tools:
        row: list[str | Text] = [
            Text(str(tool["name"])),
            Text(str(tool.get("source", ""))),
            "required" if tool.get("requiresApproval") else "-",
            "yes" if tool.get("idempotent") else "no",
        ]
        if workers is not None:
            offering = int(tool.get("workers") or 0)
            row.append(Text(f"{offering}/{workers}", style="yellow" if offering < workers else ""))
        table.add_row(*row)
    return table


# --- the group ----------------------------------------------------------------------------------


def _with_exit_codes(command: click.Command, exit_codes: str) -> str:
    return f"{inspect.cleandoc(command.help or '')}\n\n{exit_codes}"


# `run` follows until the end, unless --no-follow, which only creates the session.
run.help = _with_exit_codes(
    run, exit_codes_help(created=" (--no-follow: it was created)", not_finished=False)
)
follow_command.help = _with_exit_codes(follow_command, exit_codes_help())


def register(cli: click.Group) -> None:
    """Add the client commands to `cli`."""
    from ferryman.cli.assistants import assistants_cli
    from ferryman.cli.schedules import schedules_cli

    commands = (run, follow_command, watch, tools_command, sessions_cli, assistants_cli)
    for command in (*commands, schedules_cli):
        cli.add_command(command)
