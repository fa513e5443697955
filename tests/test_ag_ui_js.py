"""AG-UI's own JavaScript client, `@ag-ui/client`'s HttpAgent from the npm registry, against
Ferryman's AG-UI endpoint under Node's test runner (tests/js/ag_ui/ag_ui.test.mjs): the
client's event verifier must accept every event of every run, for text, a tool call, an
approval answered through `resume`, a provider retry, a worker SIGKILLed mid-tool and a
frontend tool whose result the client sends as a `tool` message. A real
API server (keys mode) and worker (tests/agent_protocol_js.py's stack, whose control server
the JavaScript asks for the SIGKILL).

Without node >= 20 and npm these tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent_protocol_js import Stack, control_server, running_stack
from tests.npm import node_tools
from tests.test_agent_protocol_js import failures, passed

pytestmark = [pytest.mark.timeout(300)]

PACKAGE = Path(__file__).resolve().parent / "js" / "ag_ui"
WHAT = "the AG-UI JavaScript client's tests"
MIN_NODE = (20, 0)
NODE_TIMEOUT = 240
TESTS = [
    "text streams token by token, the resent history is matched, a new agent sent it",
    "a tool call and its result",
    "an approval ends the run as an interrupt, answered through resume",
    "a provider retry is a CUSTOM event named after Ferryman's",
    "a worker SIGKILLed mid-tool: the stream goes on from the log",
    "a frontend tool: the run ends waiting for the client's tool message",
]


@pytest.fixture(scope="module")
def served(isolated_db: str) -> Iterator[Stack]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FERRYMAN_MODEL_MAX_RETRIES", "2")  # the workers' provider retries
        with running_stack(isolated_db) as stack:
            yield stack


async def test_the_ag_ui_client(served: Stack) -> None:
    node = node_tools(PACKAGE, WHAT, MIN_NODE)
    with control_server(served) as control_url:
        env = {
            **{k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")},
            "FERRYMAN_URL": served.api.url,
            "FERRYMAN_API_KEY": served.key,
            "FERRYMAN_CONTROL_URL": control_url,
        }
        proc = await asyncio.create_subprocess_exec(
            node.node,
            "--test",
            "--test-concurrency=1",
            "--test-timeout=60000",
            "--test-reporter=tap",
            "ag_ui.test.mjs",
            cwd=PACKAGE,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), NODE_TIMEOUT)
    tap, errors = out.decode(), err.decode()
    report = f"{failures(tap)}\n{errors[-4000:]}"
    report += f"\n{served.logs()}" if proc.returncode else ""
    assert proc.returncode == 0, f"node --test exited {proc.returncode}:\n{report}"
    assert sorted(passed(tap)) == sorted(TESTS), report
