"""The client commands of `ferryman` (run, follow, sessions, watch), end to end: the installed
`ferryman` script in a child process, against a real server and real workers, as a person or a
shell script would use it (FERRYMAN_URL, FERRYMAN_API_KEY)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import app
import ferryman as sdk
from tests.support import (
    TERMINAL,
    ServerProcess,
    StartWorker,
    WorkerProcess,
    client,
    free_port,
    ready,
    running,
    wait_for_status,
)

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

# Retries of a failed model call, fast: the scripted faults are retried where a test wants it.
RETRYING = {
    "FERRYMAN_MODEL_MAX_RETRIES": "2",
    "FERRYMAN_MODEL_RETRY_INITIAL_DELAY": "0.1",
    "FERRYMAN_MODEL_RETRY_MAX_DELAY": "0.2",
}


def command() -> list[str]:
    """The `ferryman` script installed beside this interpreter (`python -m app` without one)."""
    script = Path(sys.executable).with_name("ferryman")
    return [str(script)] if script.exists() else [sys.executable, "-m", "app"]


def cli_env(url: str, key: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRYMAN_")}
    env["FERRYMAN_URL"] = url
    if key is not None:
        env["FERRYMAN_API_KEY"] = key
    return env


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        return self.stdout.splitlines()

    def json(self) -> Any:
        return json.loads(self.stdout)

    def ndjson(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines]

    def __str__(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout}--- stderr\n{self.stderr}"


@dataclass
class Ferryman:
    """Runs `ferryman` commands against one server as one owner."""

    url: str
    key: str | None

    async def __call__(self, *args: str, timeout: float = 60, stdin: str | None = None) -> Result:
        proc = await asyncio.create_subprocess_exec(
            *command(),
            *args,
            env=cli_env(self.url, self.key),
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(stdin.encode() if stdin is not None else None), timeout
            )
        except TimeoutError:
            proc.kill()
            out, err = await proc.communicate()
            raise AssertionError(
                f"`ferryman {' '.join(args)}` still running after {timeout}s:\n"
                f"{out.decode()[-2000:]}\n{err.decode()[-2000:]}"
            ) from None
        assert proc.returncode is not None
        return Result(proc.returncode, out.decode(), err.decode())

    @contextlib.asynccontextmanager
    async def running(self, *args: str) -> AsyncIterator[Running]:
        """A command left running, its output read as it comes; killed if still running at
        the end."""
        proc = await asyncio.create_subprocess_exec(
            *command(),
            *args,
            env=cli_env(self.url, self.key),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        running = Running(proc)
        try:
            yield running
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


@dataclass
class Running:
    proc: asyncio.subprocess.Process
    seen: str = ""  # stdout so far
    read_to: int = 0  # where the next `expect` starts looking

    async def expect(self, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        """Read stdout until a line after the last one matched matches `pattern` (a regex,
        multi-line); the match."""
        assert self.proc.stdout is not None
        regex = re.compile(pattern, re.M)
        deadline = time.monotonic() + timeout
        while True:
            match = regex.search(self.seen, self.read_to)
            if match:
                end = self.seen.find("\n", match.end())
                self.read_to = end + 1 if end >= 0 else len(self.seen)
                return match
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line matching {pattern!r} in:\n{self.seen}")
            try:
                line = await asyncio.wait_for(self.proc.stdout.readline(), left)
            except TimeoutError:
                continue
            if not line:
                await self.proc.wait()
                err = await self.stderr()
                raise AssertionError(
                    f"exited {self.proc.returncode} before {pattern!r}:\n{self.seen}\n{err}"
                )
            self.seen += line.decode()

    async def stderr(self) -> str:
        assert self.proc.stderr is not None
        return (await self.proc.stderr.read()).decode()

    async def finish(self, timeout: float = 60.0) -> Result:
        """Wait for the exit; everything it printed."""
        out, err = await asyncio.wait_for(self.proc.communicate(), timeout)
        assert self.proc.returncode is not None
        return Result(self.proc.returncode, self.seen + out.decode(), err.decode())


@pytest.fixture
def ferryman(api: ServerProcess, key: str) -> Ferryman:
    return Ferryman(api.url, key)


@pytest.fixture
async def worker(start_worker: StartWorker) -> WorkerProcess:
    """A worker on the module's database for this test alone, retrying model faults fast."""
    started = start_worker(env=RETRYING)
    await ready(started)
    return started


def write_script(tmp_path: Path, turns: list[dict[str, Any]]) -> str:
    path = tmp_path / f"script-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps(turns))
    return str(path)


def assert_one_error_line(result: Result, code: int, *needles: str) -> None:
    assert result.returncode == code, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], result


# --- run ----------------------------------------------------------------------------------------

NOTE_SCRIPT = [
    {
        "text": "Saving it. ",
        "toolCalls": [{"name": "put_note", "arguments": {"key": "a", "text": "b"}}],
    },
    # The first delta 0.2 s after the tool's result: a delta sent at once can overtake it.
    {"text": "All done: the note is saved.", "chunks": 3, "delayMs": 600},
]


async def test_run_streams_the_reply_and_tool_calls(
    ferryman: Ferryman, worker: WorkerProcess, tmp_path: Path
) -> None:
    result = await ferryman("run", "save a note", "--script", write_script(tmp_path, NOTE_SCRIPT))
    assert result.returncode == 0, result
    lines = result.lines
    match = re.fullmatch(rf"· session ({UUID.pattern})", lines[0])
    assert match, result
    assert lines[1:] == [
        "Saving it. ",
        '→ tool put_note {"key":"a","text":"b"}',
        "✓ put_note ok",
        "All done: the note is saved.",
        "· session succeeded",
    ], result
    # The streamed deltas and the recorded message make one reply, not two.
    assert result.stdout.count("All done") == 1
    assert "save a note" not in result.stdout  # the prompt is not echoed back
    async with client(ferryman.url, ferryman.key) as http:
        session = await wait_for_status(http, match.group(1), TERMINAL)
    assert session["status"] == "succeeded"


async def test_run_exit_codes_say_how_the_session_ended(
    ferryman: Ferryman, worker: WorkerProcess, tmp_path: Path
) -> None:
    failing = write_script(tmp_path, [{"text": "no", "fault": {"kind": "bad_request"}}])
    asking = write_script(
        tmp_path,
        [{"toolCalls": [{"name": "ask_user", "arguments": {"question": "Which colour?"}}]}],
    )
    sleeping = write_script(
        tmp_path, [{"toolCalls": [{"name": "sleep", "arguments": {"seconds": 60}}]}]
    )
    failed, waiting = await asyncio.gather(
        ferryman("run", "fail", "--script", failing),
        ferryman("run", "ask", "--script", asking),
    )
    assert failed.returncode == 3, failed
    assert failed.lines[-1].startswith("· session failed: MODEL_BAD_REQUEST"), failed
    assert waiting.returncode == 5, waiting
    assert "? Which colour?" in waiting.lines
    assert waiting.lines[-1].startswith("· session waiting; answer with `ferryman sessions send")

    # Cancelled while a tool runs: `sessions cancel --wait` answers once it has ended, and
    # the `run` following it exits 4.
    async with ferryman.running("run", "sleep", "--script", sleeping) as run:
        session_id = (await run.expect(rf"· session ({UUID.pattern})")).group(1)
        await run.expect(r'→ tool sleep \{"seconds":60\}')
        cancelled = await ferryman("sessions", "cancel", session_id, "--wait")
        assert cancelled.returncode == 0, cancelled
        assert cancelled.stdout == f"{session_id} cancelled\n"
        result = await run.finish()
    assert result.returncode == 4, result
    assert result.lines[-1] == "· session cancelled", result


async def test_run_without_follow_and_as_json(
    ferryman: Ferryman, worker: WorkerProcess, tmp_path: Path
) -> None:
    quiet = await ferryman("run", "hello", "--no-follow", "--title", "greeting")
    assert quiet.returncode == 0, quiet
    assert UUID.fullmatch(quiet.stdout.strip()), quiet

    created = await ferryman("run", "hello again", "--no-follow", "--json", "--model", "scripted")
    assert created.returncode == 0, created
    session = created.json()
    assert session["title"] == "hello again" and session["model"] == "scripted"
    assert {"id", "status", "attempt", "lastSeq", "createdAt", "usage"} <= set(session)

    script = write_script(tmp_path, NOTE_SCRIPT)
    streamed = await ferryman("run", "as json", "--json", "--script", script)
    assert streamed.returncode == 0, streamed
    frames = streamed.ndjson()
    durable = [f for f in frames if "seq" in f]
    assert [f["seq"] for f in durable] == list(range(1, len(durable) + 1))  # the whole log
    assert durable[0]["type"] == "user_message" and durable[0]["data"]["text"] == "as json"
    assert durable[-1]["type"] == "session_end" and durable[-1]["data"] == {"status": "succeeded"}
    assert frames[-1] is durable[-1]
    types = [f["type"] for f in frames]
    assert "caught_up" in types  # control frames are typed too
    assert {"tool_call_start", "tool_result", "assistant_message"} <= set(types)
    assert all(f["sessionId"] == durable[0]["sessionId"] for f in durable)


async def test_run_tells_of_a_model_retry(
    ferryman: Ferryman, worker: WorkerProcess, tmp_path: Path
) -> None:
    script = write_script(
        tmp_path,
        [
            {
                "text": "A first try that breaks off.",
                "chunks": 4,
                "delayMs": 800,
                "fault": {"kind": "server_error"},
            }
        ],
    )
    async with ferryman.running("run", "retry", "--script", script) as run:
        await run.expect(r"A first")  # the partial reply streamed before the fault
        result = await run.finish()
    assert result.returncode == 0, result
    lines = result.lines
    retry = next(i for i, line in enumerate(lines) if line.startswith("! model call failed"))
    assert "server_error" in lines[retry] and "retry 1 in" in lines[retry], result
    assert lines[retry - 1] == "! the reply above was discarded (the model call is retried)"
    # The retried turn's reply follows, whole and once.
    assert lines[retry + 1 :] == ["A first try that breaks off.", "· session succeeded"], result


async def test_run_tells_of_a_worker_crash(
    ferryman: Ferryman, start_worker: StartWorker, tmp_path: Path
) -> None:
    first = start_worker()
    await ready(first)
    script = write_script(
        tmp_path,
        [
            {"toolCalls": [{"name": "sleep", "arguments": {"seconds": 3}}]},
            # Deltas come after the tool's result (a delta sent at once can overtake it).
            {"text": "Back after the crash.", "chunks": 2, "delayMs": 400},
        ],
    )
    async with ferryman.running("run", "crash", "--script", script) as run:
        await run.expect(r'→ tool sleep \{"seconds":3\}')
        first.signal(signal.SIGKILL)
        second = start_worker()  # claims the dead worker's session
        await run.expect(r"took the session over", timeout=60)
        result = await run.finish()
    await ready(second)
    assert result.returncode == 0, result
    lines = result.lines
    resumed = next(line for line in lines if "took the session over" in line)
    match = re.fullmatch(
        r"! another worker took the session over after a crash \(run 2\); interrupted: (\S+)",
        resumed,
    )
    assert match, result
    assert "✗ sleep interrupted: its worker stopped" in lines
    # The idempotent call is made again, and the session goes on.
    assert lines.count('→ tool sleep {"seconds":3}') == 2
    assert lines[-3:] == ["✓ sleep ok", "Back after the crash.", "· session succeeded"], result
    # The list and `show` mark the takeover (a server that counts them: `resumes`).
    session_id = lines[0].removeprefix("· session ")
    session = (await ferryman("sessions", "show", session_id, "--json")).json()
    shown = await ferryman("sessions", "show", session_id)
    listed = await ferryman("sessions", "list", "--json")
    row = next(line for line in (await ferryman("sessions", "list")).lines if session_id in line)
    resumes = session.get("resumes", 0)
    assert [s.get("resumes", 0) for s in listed.json()["sessions"] if s["id"] == session_id] == [
        resumes
    ]
    assert row.split()[3] == str(resumes), row
    if "resumes" in session:
        assert resumes == 1, session
        assert "resumes:  1 (taken over after a worker's crash or shutdown)" in shown.lines
    assert f"runs:     {session['attempt']}" in shown.lines, shown


async def test_run_waits_for_an_approval(
    ferryman: Ferryman, worker: WorkerProcess, tmp_path: Path
) -> None:
    script = write_script(tmp_path, NOTE_SCRIPT)
    run = await ferryman("run", "approve", "--script", script, "--approval-required", "put_note")
    assert run.returncode == 5, run  # waiting
    session_id = run.lines[0].removeprefix("· session ")
    asked = next(line for line in run.lines if "waits for approval" in line)
    match = re.fullmatch(
        r'\? tool put_note \{"key":"a","text":"b"\} waits for approval: '
        rf"ferryman sessions approve {session_id} (\S+) \[--deny\]",
        asked,
    )
    assert match, run
    # Waiting for a decision: the hint names the approval, and what a message would do.
    assert run.lines[-1] == (
        f"· session waiting; decide with `ferryman sessions approve {session_id} CALL_ID "
        "[--deny]` (a message, `ferryman sessions send`, denies every tool call waiting for "
        "approval)"
    ), run
    approved = await ferryman("sessions", "approve", session_id, match.group(1))
    assert approved.returncode == 0, approved
    assert approved.stdout == f"{match.group(1)} approved; session {session_id} is queued\n"
    followed = await ferryman("follow", session_id)
    assert followed.returncode == 0, followed
    lines = followed.lines
    decided = lines.index(f"· tool call {match.group(1)} approved")
    assert lines[decided:] == [
        lines[decided],
        "· continuing (run 2)",  # a new run after the decision, not a takeover
        '→ tool put_note {"key":"a","text":"b"}',
        "✓ put_note ok",
        "All done: the note is saved.",
        "· session succeeded",
    ], followed


async def waiting_for_approval(ferryman: Ferryman, tmp_path: Path) -> str:
    """A session whose put_note call waits for approval: its id."""
    script = write_script(tmp_path, NOTE_SCRIPT)
    run = await ferryman("run", "ask", "--script", script, "--approval-required", "put_note")
    assert run.returncode == 5, run
    return run.lines[0].removeprefix("· session ")


async def test_a_message_to_a_session_waiting_for_approval_says_it_denies_it(
    ferryman: Ferryman, worker: WorkerProcess, tmp_path: Path
) -> None:
    session_id = await waiting_for_approval(ferryman, tmp_path)
    events = (await ferryman("follow", session_id, "--json", "--no-follow")).ndjson()
    (call_id,) = [e["data"]["toolCallId"] for e in events if e["type"] == "tool_approval_requested"]
    message_seq = max(e["seq"] for e in events if "seq" in e) + 1

    # No terminal: the warning, then the message is sent (scripts keep working).
    sent = await ferryman("sessions", "send", session_id, "never mind")
    assert sent.returncode == 0, sent
    assert sent.stdout == f"sent as event {message_seq} (queued)\n", sent
    assert sent.stderr == (
        "! this message denies every tool call waiting for approval: "
        f"put_note ({call_id}); to decide instead: "
        f"`ferryman sessions approve {session_id} CALL_ID [--deny]`\n"
    ), sent
    followed = await ferryman("follow", session_id, "--after", str(message_seq))
    assert followed.returncode == 0, followed
    assert "✗ put_note denied: the user sent a message instead of deciding" in followed.lines
    assert followed.lines[-1] == "· session succeeded", followed

    # Nothing waits any more: a message says nothing of approvals.
    again = await ferryman("sessions", "send", session_id, "thanks")
    assert again.returncode == 0 and again.stderr == "", again


@dataclass
class Terminal:
    """A shell command at a terminal of its own: a tmux server for this test alone."""

    socket: str

    @classmethod
    @contextlib.contextmanager
    def running(cls, shell_command: str) -> Iterator[Terminal]:
        terminal = cls(f"ferryman-test-{uuid.uuid4().hex[:8]}")
        terminal.tmux("new-session", "-d", "-x", "200", "-y", "50", shell_command)
        try:
            yield terminal
        finally:
            subprocess.run(["tmux", "-L", terminal.socket, "kill-server"], capture_output=True)

    def tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=True
        )
        return done.stdout

    def type(self, text: str) -> None:
        self.tmux("send-keys", text, "Enter")

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-J")

    async def expect(self, text: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while text not in (screen := self.screen()):
            assert time.monotonic() < deadline, f"no {text!r} on the screen:\n{screen}"
            await asyncio.sleep(0.1)
        return screen


async def test_at_a_terminal_sessions_send_asks_before_denying_approvals(
    ferryman: Ferryman, worker: WorkerProcess, tmp_path: Path
) -> None:
    session_id = await waiting_for_approval(ferryman, tmp_path)
    last_seq = (await ferryman("sessions", "show", session_id, "--json")).json()["lastSeq"]
    settings = {k: v for k, v in cli_env(ferryman.url, ferryman.key).items() if "FERRYMAN" in k}
    send = shlex.join(
        ["env", *(f"{k}={v}" for k, v in settings.items()), *command(), "sessions", "send"]
    )
    for answer, code in (("n", 1), ("y", 0)):
        shell = f"{send} {session_id} 'never mind'; echo EXIT=$?; sleep 60"
        with Terminal.running(shell) as terminal:
            asked = await terminal.expect("Send it and deny them? [y/N]")
            assert "! this message denies every tool call waiting for approval" in asked
            terminal.type(answer)
            screen = await terminal.expect("EXIT=")
        assert f"EXIT={code}" in screen, screen
        shown = (await ferryman("sessions", "show", session_id, "--json")).json()
        if answer == "n":  # nothing was sent
            assert (shown["status"], shown["lastSeq"]) == ("waiting", last_seq), shown
        else:
            assert f"sent as event {last_seq + 1} (queued)" in screen, screen


async def test_ctrl_c_leaves_the_session_running_and_says_so(
    ferryman: Ferryman, worker: WorkerProcess, tmp_path: Path
) -> None:
    sleeping = write_script(
        tmp_path, [{"toolCalls": [{"name": "sleep", "arguments": {"seconds": 60}}]}]
    )
    async with ferryman.running("run", "sleep", "--script", sleeping) as run:
        session_id = (await run.expect(rf"· session ({UUID.pattern})")).group(1)
        await run.expect(r'→ tool sleep \{"seconds":60\}')
        run.proc.send_signal(signal.SIGINT)
        interrupted = await run.finish()
    async with ferryman.running("follow", session_id) as follow:
        await follow.expect(r'→ tool sleep \{"seconds":60\}')
        follow.proc.send_signal(signal.SIGINT)
        interrupted_follow = await follow.finish()
    for result in (interrupted, interrupted_follow):
        assert result.returncode == 130, result
        assert "Traceback" not in result.stderr
        assert result.stderr == (
            f"· interrupted; session {session_id} goes on on the server: "
            f"`ferryman follow {session_id}` follows it again, "
            f"`ferryman sessions cancel {session_id}` cancels it\n"
        ), result
    shown = (await ferryman("sessions", "show", session_id, "--json")).json()
    assert shown["status"] == "running", shown
    cancelled = await ferryman("sessions", "cancel", session_id, "--wait")
    assert cancelled.stdout == f"{session_id} cancelled\n", cancelled


async def test_run_refuses_bad_input(ferryman: Ferryman, tmp_path: Path) -> None:
    not_json = tmp_path / "bad.json"
    not_json.write_text("[{")
    not_a_list = tmp_path / "object.json"
    not_a_list.write_text('{"text": "x"}')
    missing, bad, wrong_shape, invalid, from_stdin = await asyncio.gather(
        ferryman("run", "x", "--script", str(tmp_path / "missing.json")),
        ferryman("run", "x", "--script", str(not_json)),
        ferryman("run", "x", "--script", str(not_a_list)),
        ferryman("run", "x", "--tool", "not a tool name", "--no-follow"),
        ferryman("run", "x", "--script", "-", "--no-follow", "--json", stdin='[{"text": "hi"}]'),
    )
    assert_one_error_line(missing, 2, "--script", "cannot read")
    assert_one_error_line(bad, 2, "--script", "is not JSON")
    assert_one_error_line(wrong_shape, 2, "--script", "JSON list")
    # The API's 422 names the field.
    assert_one_error_line(invalid, 1, "422 VALIDATION_ERROR", "tools.0")
    assert from_stdin.returncode == 0, from_stdin
    assert from_stdin.json()["status"] == "queued"


# --- sessions -----------------------------------------------------------------------------------


async def test_sessions_commands(ferryman: Ferryman) -> None:
    # No worker: the sessions stay queued.
    first = (await ferryman("run", "first prompt", "--no-follow", "--title", "First")).stdout
    second = (await ferryman("run", "second prompt", "--no-follow", "--title", "Second")).stdout
    first_id, second_id = first.strip(), second.strip()

    listed = await ferryman("sessions", "list", "--json")
    assert listed.returncode == 0, listed
    page = listed.json()
    assert [s["id"] for s in page["sessions"]] == [second_id, first_id]  # newest first
    assert page["cursor"] and page["nextPageToken"] is None

    table = await ferryman("sessions", "list")
    assert table.returncode == 0, table
    header, *rows = table.lines
    assert header.split() == ["ID", "TITLE", "STATUS", "RESUMES", "UPDATED"]
    assert [row.split()[:4] for row in rows] == [
        [second_id, "Second", "queued", "0"],
        [first_id, "First", "queued", "0"],
    ]
    limited = await ferryman("sessions", "list", "-n", "1")
    assert [row.split()[0] for row in limited.lines[1:-1]] == [second_id]
    assert limited.lines[-1].startswith("… more")

    shown = await ferryman("sessions", "show", first_id)
    assert shown.returncode == 0, shown
    fields = dict(line.split(":", 1) for line in shown.lines)
    assert fields["id"].strip() == first_id
    assert fields["status"].strip() == "queued"
    assert fields["prompt"].strip() == "first prompt"
    assert (fields["runs"].strip(), fields["resumes"].strip()) == ("0", "0")
    as_json = (await ferryman("sessions", "show", first_id, "--json")).json()
    assert as_json["id"] == first_id and as_json["lastSeq"] == 1

    renamed = await ferryman("sessions", "rename", first_id, "Renamed")
    assert renamed.stdout == f"{first_id} Renamed\n", renamed
    sent = await ferryman("sessions", "send", first_id, "one more thing")
    assert sent.returncode == 0, sent
    assert sent.stdout == "sent as event 2 (queued)\n"
    sent_json = (await ferryman("sessions", "send", first_id, "and another", "--json")).json()
    assert sent_json["message"] == {"seq": 3, "text": "and another", "delivery": "queued"}

    cancelled = await ferryman("sessions", "cancel", first_id)
    assert cancelled.stdout == f"{first_id} cancelled\n", cancelled
    again = await ferryman("sessions", "cancel", first_id)
    assert_one_error_line(again, 1, "409 SESSION_ALREADY_TERMINAL")
    only_cancelled = (await ferryman("sessions", "list", "--status", "cancelled", "--json")).json()
    assert [s["id"] for s in only_cancelled["sessions"]] == [first_id]

    deleted = await ferryman("sessions", "delete", second_id)
    assert deleted.stdout == f"{second_id} deleted\n", deleted
    gone = await ferryman("sessions", "show", second_id)
    assert_one_error_line(gone, 1, "404")
    remaining = (await ferryman("sessions", "list", "--json")).json()["sessions"]
    assert [s["id"] for s in remaining] == [first_id]


async def test_assistants_commands(ferryman: Ferryman) -> None:
    created = await ferryman(
        "assistants",
        "create",
        "Helper",
        "--model",
        "scripted",
        "--instructions",
        "Be brief.",
        "--tool",
        "get_note",
        "--model-settings",
        '{"temperature": 0.2}',
        "--metadata",
        '{"team": "a"}',
    )
    assert created.returncode == 0, created
    aid = created.stdout.strip()
    assert UUID.fullmatch(aid), created

    table = await ferryman("assistants", "list", "--name", "help")
    header, *rows = table.lines
    assert header.split() == ["ID", "NAME", "MODEL", "VERSION", "UPDATED"]
    assert [row.split()[:4] for row in rows] == [[aid, "Helper", "scripted", "1"]]
    empty = await ferryman("assistants", "list", "--metadata", '{"team": "b"}')
    assert empty.stdout == "no assistants\n", empty

    edited = await ferryman("assistants", "edit", aid, "--instructions", "Be kind.", "--all-tools")
    assert edited.stdout == f"{aid} version 2\n", edited
    shown = await ferryman("assistants", "show", aid)
    fields = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in shown.lines)}
    assert (fields["version"], fields["tools"], fields["prompt"]) == ("2", "all", "Be kind.")
    assert (await ferryman("assistants", "show", aid, "--json")).json()["metadata"] == {"team": "a"}
    versions = (await ferryman("assistants", "versions", aid, "--json")).json()["versions"]
    assert [(v["version"], v["instructions"]) for v in versions] == [
        (2, "Be kind."),
        (1, "Be brief."),
    ]

    run = await ferryman(
        "run", "hi", "--assistant", aid, "--assistant-version", "1", "--no-follow", "--json"
    )
    assert run.returncode == 0, run
    session = run.json()
    assert session["assistant"] == {"id": aid, "version": 1}
    assert session["instructions"] == "Be brief." and session["modelSettings"] == {
        "temperature": 0.2
    }

    nothing = await ferryman("assistants", "edit", aid)
    assert nothing.returncode == 2 and "nothing to change" in nothing.stderr, nothing
    bad = await ferryman("assistants", "create", "X", "--model", "scripted", "--metadata", "[1]")
    assert bad.returncode == 2 and "--metadata" in bad.stderr, bad
    refused = await ferryman("assistants", "create", "X", "--model", "gpt-4")
    assert_one_error_line(refused, 1, "422 VALIDATION_ERROR")

    deleted = await ferryman("assistants", "delete", aid)
    assert deleted.stdout == f"{aid} deleted\n", deleted
    assert_one_error_line(await ferryman("assistants", "show", aid), 1, "404 ASSISTANT_NOT_FOUND")
    gone = await ferryman("run", "hi", "--assistant", aid, "--no-follow")
    assert_one_error_line(gone, 1, "404 ASSISTANT_NOT_FOUND")
    async with client(ferryman.url, ferryman.key) as http:
        await http.post(f"/api/agent/{session['id']}/cancel")


async def test_connection_and_auth_errors(api: ServerProcess) -> None:
    nowhere = Ferryman(f"http://127.0.0.1:{free_port()}", "fm_whatever")
    unreachable = await asyncio.gather(
        nowhere("sessions", "list"),
        nowhere("run", "x"),
        nowhere("follow", str(uuid.uuid4())),
        nowhere("watch"),
    )
    for result in unreachable:
        assert_one_error_line(result, 2, "cannot reach Ferryman at http://127.0.0.1:")
    wrong_key = await Ferryman(api.url, "fm_not_a_key")("sessions", "list")
    assert_one_error_line(wrong_key, 1, "401 INVALID_API_KEY", "--api-key", "FERRYMAN_API_KEY")


async def test_no_key_in_keys_mode_names_the_option_and_the_variable(isolated_db: str) -> None:
    with running(ServerProcess(isolated_db, env={"FERRYMAN_AUTH": "keys"})) as keys_mode:
        anonymous = Ferryman(keys_mode.url, None)
        results = await asyncio.gather(
            anonymous("sessions", "list"), anonymous("run", "x"), anonymous("tools")
        )
    for result in results:
        assert_one_error_line(result, 1, "401 AUTH_REQUIRED", "--api-key", "FERRYMAN_API_KEY")
        assert "Authorization" not in result.stderr  # the CLI's words, not HTTP's


# --- follow -------------------------------------------------------------------------------------


async def test_follow_from_any_point(
    ferryman: Ferryman, worker: WorkerProcess, tmp_path: Path
) -> None:
    script = write_script(tmp_path, NOTE_SCRIPT)
    run = await ferryman("run", "note this", "--script", script)
    assert run.returncode == 0, run
    session_id = run.lines[0].removeprefix("· session ")

    whole = await ferryman("follow", session_id)
    assert whole.returncode == 0, whole
    assert whole.lines == ["» note this", *run.lines[1:]]  # the prompt too, from seq 1

    events = (await ferryman("follow", session_id, "--json")).ndjson()
    result_seq = next(e["seq"] for e in events if e["type"] == "tool_result")
    later = await ferryman("follow", session_id, "--after", str(result_seq))
    assert later.returncode == 0, later
    assert later.lines == ["All done: the note is saved.", "· session succeeded"]
    later_json = (
        await ferryman("follow", session_id, "--after", str(result_seq), "--json")
    ).ndjson()
    seqs = [e["seq"] for e in later_json if "seq" in e]
    assert seqs and seqs[0] == result_seq + 1

    last_seq = max(e["seq"] for e in events if "seq" in e)
    ahead = await ferryman("follow", session_id, "--after", str(last_seq + 5))
    assert_one_error_line(ahead, 2, f"--after {last_seq + 5}", f"(seq {last_seq})")
    unknown = await ferryman("follow", str(uuid.uuid4()))
    assert_one_error_line(unknown, 1, "404")


async def test_follow_waits_for_the_end_unless_told_not_to(
    ferryman: Ferryman, start_worker: StartWorker, tmp_path: Path
) -> None:
    queued = (await ferryman("run", "later", "--no-follow")).stdout.strip()
    caught_up = await ferryman("follow", queued, "--no-follow")
    assert caught_up.returncode == 6, caught_up  # still queued
    assert caught_up.lines == ["» later"]

    async with ferryman.running("follow", queued) as following:
        await following.expect(r"» later")
        started = start_worker()  # the session runs only now, while it is followed
        result = await following.finish()
    await ready(started)
    assert result.returncode == 0, result
    assert result.lines == ["» later", "You said: later", "· session succeeded"]

    # A follow-up re-queues the ended session: following it again stops at the new end, not
    # at the first one.
    sent = await ferryman("sessions", "send", queued, "and then?", "--follow")
    assert sent.returncode == 0, sent
    assert sent.lines[0] == "sent as event 5 (queued)"
    assert sent.lines[-1] == "· session succeeded"
    assert "· continuing (run 2)" in sent.lines  # never announced as a resume
    assert not any("resumed" in line or "took the session over" in line for line in sent.lines)
    again = await ferryman("follow", queued)
    assert again.lines.count("· session succeeded") == 2, again
    assert again.returncode == 0


# --- watch --------------------------------------------------------------------------------------


async def test_watch_prints_changes_until_interrupted(
    isolated_db: str, key: str, start_worker: StartWorker
) -> None:
    # A server of the test's own, to stop and start again under the watcher.
    server = ServerProcess(isolated_db, env={"FERRYMAN_POLL_INTERVAL": "1"}).start()
    try:
        ferryman = Ferryman(server.url, key)
        old = (await ferryman("run", "before watching", "--no-follow")).stdout.strip()
        async with ferryman.running("watch") as watch:
            await watch.expect(rf"{old} queued +resumes 0 before watching")
            await watch.expect(r"\d\d:\d\d:\d\d connected")
            worker = start_worker()
            await watch.expect(rf"{old} succeeded +resumes 0 before watching")
            new = (await ferryman("run", "while watching", "--no-follow")).stdout.strip()
            await watch.expect(rf"{new} \w+ +resumes \d while watching")
            await watch.expect(rf"{new} succeeded +resumes 0 while watching")
            await ferryman("sessions", "delete", old)
            await watch.expect(rf"{old} deleted")

            # The server goes away and comes back: the watcher says so, and catches up.
            server.stop()
            await watch.expect(r"reconnecting…")
            server = ServerProcess(
                isolated_db, env={"FERRYMAN_POLL_INTERVAL": "1"}, port=server.port
            ).start()
            await watch.expect(r"^\d\d:\d\d:\d\d connected$", timeout=60)
            await ferryman("sessions", "rename", new, "renamed while watching")
            await watch.expect(rf"{new} succeeded +resumes 0 renamed while watching")

            watch.proc.send_signal(signal.SIGINT)
            result = await watch.finish()
        await ready(worker)
    finally:
        server.stop()
    assert result.returncode == 0, result
    assert "Traceback" not in result.stderr and result.stderr == "", result


# --- tools --------------------------------------------------------------------------------------


async def test_tools_lists_the_live_catalog(ferryman: Ferryman, worker: WorkerProcess) -> None:
    table, as_json = await asyncio.gather(ferryman("tools"), ferryman("tools", "--json"))
    assert table.returncode == 0 and as_json.returncode == 0, (table, as_json)
    catalog = as_json.json()
    names = [tool["name"] for tool in catalog["tools"]]
    assert {"sleep", "put_note", "get_note", "ask_user"} <= set(names)
    header, *rows = table.lines
    columns = ["NAME", "SOURCE", "APPROVAL", "IDEMPOTENT"]
    by_name = {row.split()[0]: row.split() for row in rows}
    assert list(by_name) == names, table
    if "workers" in catalog:
        # A server that counts live workers: this test's worker at least offers every tool.
        assert header.split() == [*columns, "WORKERS"], table
        total = catalog["workers"]
        assert total >= 1
        for tool in catalog["tools"]:
            assert by_name[tool["name"]][-1] == f"{tool['workers']}/{total}", table
    else:
        assert header.split() == columns, table
    assert by_name["get_note"][:4] == ["get_note", "builtin", "-", "yes"], table
    assert by_name["ask_user"][1] == "builtin", table


async def test_tools_says_when_no_worker_is_alive(ferryman: Ferryman) -> None:
    catalog = (await ferryman("tools", "--json")).json()
    result = await ferryman("tools")
    assert result.returncode == 0, result
    if catalog.get("workers") == 0:
        assert result.lines[0].startswith("no worker is alive: sessions stay queued"), result
    else:  # a server that does not count them: the catalog as it has it
        assert "no worker is alive" not in result.stdout, result


# --- the command itself -------------------------------------------------------------------------


async def test_version_and_help(api: ServerProcess) -> None:
    ferryman = Ferryman(api.url, None)
    version, help_, run_help = await asyncio.gather(
        ferryman("--version"), ferryman("--help"), ferryman("run", "--help")
    )
    assert version.returncode == 0, version
    # Each distribution that makes up the command: the client's, then the server's.
    assert version.stdout == f"ferryman-client {sdk.__version__}\nferryman {app.__version__}\n"
    for name in ("serve", "worker", "migrate", "keys", "run", "follow", "sessions", "watch"):
        assert re.search(rf"^  {name} ", help_.stdout, re.M), help_
    assert "Exit status:" in run_help.stdout
    assert re.search(r"^    3 +the session failed$", run_help.stdout, re.M), run_help
