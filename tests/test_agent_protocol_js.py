"""The official JavaScript SDK, `@langchain/langgraph-sdk` from the npm registry, against
Ferryman's Agent Protocol under Node's own test runner: tests/js/agent_protocol/protocol.test.mjs
creates assistants and threads, streams runs with tool calls token by token, reads state and
history, answers an interrupt, cancels a run, and joins runs' streams after the API process
restarted and after the worker was SIGKILLed, every event seen exactly once.

The server side is real: `ferryman serve` (keys mode, the SDK's `x-api-key`) on an ephemeral
port and a `ferryman worker`, on a database of the module's own. The JavaScript asks for the
restart and the SIGKILL at the moment it wants them through a control server of this module
(tests/agent_protocol_js.py), which answers once they are done.

Without node >= 20 and npm these tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator

import pytest

from tests.agent_protocol_js import PACKAGE, Stack, control_server, running_stack, sdk_node
from tests.npm import Node

pytestmark = [pytest.mark.timeout(420), pytest.mark.once]

WHAT = "the JavaScript SDK's tests of the Agent Protocol"
# protocol.test.mjs's tests, each of which must pass (not be skipped, not be missing).
TESTS = [
    "an assistant and a thread: a run streams its tokens and a tool call, then state and history",
    "an interrupt: ask_user shows as the thread's interrupt and command.resume answers it",
    "cancel: a run in a long tool call is cancelled and the thread says so",
    "join after the API process restarted mid-reply: every event exactly once",
    "the SDK's own reconnect rides out an API restart within one runs.stream",
    "join after the worker was SIGKILLed mid-tool: every event exactly once, the takeover as"
    " custom",
    "crons: create, createForThread, search, count, update and delete over the caller's schedules",
]


@pytest.fixture(scope="module")
def node() -> Node:
    return sdk_node(WHAT)


@pytest.fixture(scope="module")
def served(isolated_db: str) -> Iterator[Stack]:
    with running_stack(isolated_db) as stack:
        yield stack


def passed(tap: str) -> list[str]:
    """The names of the tests a TAP report says passed (`ok N - name`, not skipped)."""
    return [
        m[1]
        for m in re.finditer(r"^\s*ok \d+ - (.*?)\s*$", tap, re.MULTILINE)
        if "# SKIP" not in m[1]
    ]


def failures(tap: str, lines: int = 40) -> str:
    """The TAP report's failed tests, each with the start of what it says went wrong (a
    deepEqual's diff runs to pages), and its summary."""
    blocks = re.split(r"(?m)^(?=\s*# Subtest: )", tap)
    failed = ["\n".join(b.splitlines()[:lines]) for b in blocks if re.search(r"(?m)^\s*not ok ", b)]
    tail = "\n".join(line for line in tap.splitlines() if re.match(r"^# (tests|pass|fail)", line))
    return "\n".join([*failed, tail])


def test_the_javascript_sdk(node: Node, served: Stack) -> None:
    with control_server(served) as control_url:
        env = {
            **{k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")},
            "FERRYMAN_AGENT_PROTOCOL_URL": served.protocol_url,
            "FERRYMAN_API_KEY": served.key,
            "FERRYMAN_CONTROL_URL": control_url,
        }
        result = subprocess.run(
            [
                node.node,
                "--test",
                "--test-concurrency=1",
                "--test-timeout=120000",
                "--test-reporter=tap",
                "protocol.test.mjs",
            ],
            cwd=PACKAGE,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=400,
        )
    report = f"{failures(result.stdout)}\n{result.stderr[-4000:]}"
    report += f"\n{served.logs()}" if result.returncode else ""
    assert result.returncode == 0, f"node --test exited {result.returncode}:\n{report}"
    assert sorted(passed(result.stdout)) == sorted(TESTS), report
