"""A stdio MCP server gets a minimal environment plus its config's `env`, never the worker's
secrets: a real worker with a database URL and provider keys set runs a real server whose tool
returns its own environment."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from app.agent.tools.mcp import INHERITED_ENV
from tests.support import (
    REPO,
    TERMINAL,
    ServerProcess,
    StartWorker,
    client,
    new_session,
    of_type,
    ready,
    transcript,
    wait_for_status,
)

SECRETS = {
    "FERRYMAN_OPENAI_API_KEY": "sk-ferryman-openai-secret",
    "FERRYMAN_ANTHROPIC_API_KEY": "sk-ferryman-anthropic-secret",
    "FERRYMAN_SOME_FUTURE_TOKEN": "ferryman-future-secret",
    "OPENAI_API_KEY": "sk-openai-secret",
    "ANTHROPIC_API_KEY": "sk-anthropic-secret",
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
}
# What the config hands the server on purpose.
CONFIGURED = {"ENV_SERVER_GREETING": "hello"}
# Python itself sets LC_CTYPE in a child whose locale is C (PEP 538).
SET_BY_PYTHON = {"LC_CTYPE"}


async def test_a_stdio_server_gets_none_of_the_workers_secrets(
    api: ServerProcess, key: str, isolated_db: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    config = tmp_path / "mcp.json"
    server = {
        "name": "envsrv",
        "transport": "stdio",
        "command": sys.executable,
        "args": ["-m", "tests.mcp_servers.env_server"],
        "cwd": REPO,
        "env": CONFIGURED,
    }
    config.write_text(json.dumps({"servers": [server]}))
    worker = start_worker({"FERRYMAN_MCP_SERVERS": str(config), **SECRETS})
    await ready(worker)
    async with client(api.url, key) as http:
        call = {"name": "envsrv__environment", "arguments": {}}
        sid = await new_session(http, script=[{"toolCalls": [call]}, {"text": "done"}])
        assert (await wait_for_status(http, sid, TERMINAL))["status"] == "succeeded"
        (result,) = of_type(await transcript(http, sid), "tool_result")
    assert result["data"]["isError"] is False, result
    text = result["data"]["content"]
    child = json.loads(text)
    assert set(child) - SET_BY_PYTHON <= set(INHERITED_ENV) | set(CONFIGURED), sorted(child)
    assert child["ENV_SERVER_GREETING"] == "hello"
    assert "PATH" in child
    for secret in [isolated_db, *SECRETS.values()]:
        assert secret not in text
