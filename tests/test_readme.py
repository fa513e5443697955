"""The README's tour, run in order as a reader would, against `ferryman serve` (API and
worker) on a fresh database: each does what its comment says."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import ServerProcess, client, running, wait_event

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _block(heading: str, language: str) -> str:
    """The first `language` code block after `heading`."""
    after = README[README.index(heading) :]
    match = re.search(rf"```{language}\n(.*?)```", after, re.S)
    assert match, f"no {language} block after {heading!r}"
    return match.group(1)


def _steps(block: str) -> list[tuple[str, str]]:
    """(comment, commands) per paragraph of a shell block."""
    steps = []
    for paragraph in block.strip().split("\n\n"):
        lines = paragraph.splitlines()
        comment = " ".join(line.lstrip("# ") for line in lines if line.startswith("#"))
        commands = "\n".join(line for line in lines if not line.startswith("#"))
        steps.append((comment, commands))
    return steps


def test_the_readme_is_one_screen_whose_links_resolve() -> None:
    assert len(README.encode()) <= 12 * 1024, "the README is the front door: keep it under 12 KB"
    linked = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    assert "docs/architecture.md" in linked and "docs/reference.md" in linked
    for target in linked:
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), target
    docs = {f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md")}
    assert docs <= set(linked), f"the map of docs/ misses {sorted(docs - set(linked))}"


@pytest.fixture(scope="module")
def served(isolated_db: str) -> Iterator[ServerProcess]:
    with running(ServerProcess(isolated_db, worker=True)) as proc:
        yield proc


def _run(commands: str, served: ServerProcess, session_id: str | None) -> str:
    script = commands.replace("localhost:8000", f"127.0.0.1:{served.port}")
    script = script.replace("curl -N", "curl -N --max-time 5")  # a followed stream never ends
    if session_id is not None:
        script = script.replace("SESSION_ID", session_id)
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    following = "curl -N" in commands and "follow=false" not in commands
    assert done.returncode == (28 if following else 0), (commands, done.stderr)  # 28: timed out
    return done.stdout


async def test_the_tour_does_what_it_says(served: ServerProcess) -> None:
    session_id: str | None = None
    seen: list[str] = []
    for comment, commands in _steps(_block("## A ten-line tour", "sh")):
        output = _run(commands, served, session_id)
        seen.append(comment.split(" (")[0].split(":")[0])
        if comment.startswith("Create a session"):
            session: dict[str, Any] = json.loads(output)
            assert session["status"] in ("queued", "running"), session
            session_id = session["id"]
            async with client(served.url) as http:  # the reader takes a breath here
                await wait_event(
                    http,
                    session_id,
                    lambda e: e["type"] == "tool_call_start" and e["data"]["name"] == "sleep",
                )
        elif comment.startswith("List sessions"):
            listed = json.loads(output)
            assert [s["id"] for s in listed["sessions"]] == [session_id] and listed["cursor"]
        elif comment.startswith("The owner stream"):
            assert "event: session_created" in output and "event: caught_up" in output
        elif comment.startswith("One session's log"):
            assert "id: 1\nevent: user_message" in output and output.count("id: 1\n") == 1
            assert "event: caught_up" in output  # and then it ended: ?follow=false
        elif comment.startswith("Steer"):
            assert json.loads(output)["message"]["delivery"] == "steer"
        elif comment.startswith("Cancel"):
            cancelled = json.loads(output)
            assert cancelled["id"] == session_id and cancelled["status"] == "cancelled", output
        elif comment.startswith("The transcript"):
            page = json.loads(output)
            assert page["events"][-1]["type"] == "session_end", page
            assert page["events"][-1]["data"]["status"] == "cancelled"
        else:
            raise AssertionError(f"a README step this test does not know: {comment!r}")
    assert len(seen) == 7, seen


def test_the_sdk_example_runs(served: ServerProcess) -> None:
    code = _block("### The Python SDK", "python")
    env = {**os.environ, "FERRYMAN_URL": served.url}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("user_message") and lines[-1] == "SESSION_NOT_FOUND", lines
    assert any(line.startswith("session_end") for line in lines), lines
