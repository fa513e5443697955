"""AG-UI's own JavaScript client, `@ag-ui/client`'s HttpAgent from the npm registry, against
Ferryman's AG-UI endpoint under Node's test runner (tests/js/ag_ui/ag_ui.test.mjs): the
client's event verifier must accept every event of every run, for text, a tool call, an
approval answered through `resume` and a provider retry. A real API server and worker.

Without node >= 20 and npm these tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.npm import node_tools
from tests.support import ServerProcess, StartWorker, ready
from tests.test_agent_protocol_js import failures, passed

pytestmark = [pytest.mark.timeout(300)]

PACKAGE = Path(__file__).resolve().parent / "js" / "ag_ui"
WHAT = "the AG-UI JavaScript client's tests"
MIN_NODE = (20, 0)
NODE_TIMEOUT = 240
TESTS = [
    "text streams token by token and the resent history is matched",
    "a tool call and its result",
    "an approval ends the run as an interrupt, answered through resume",
    "a provider retry is a CUSTOM event named after Ferryman's",
]


async def test_the_ag_ui_client(api: ServerProcess, key: str, start_worker: StartWorker) -> None:
    node = node_tools(PACKAGE, WHAT, MIN_NODE)
    await ready(start_worker({"FERRYMAN_MODEL_MAX_RETRIES": "2"}))
    env = {
        **{k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")},
        "FERRYMAN_URL": api.url,
        "FERRYMAN_API_KEY": key,
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
    assert proc.returncode == 0, f"node --test exited {proc.returncode}:\n{report}"
    assert sorted(passed(tap)) == sorted(TESTS), report
