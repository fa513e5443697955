"""What a key may use (docs/tenants.md): the pure matching of a policy's `tools` and `models`,
and, on real servers in keys mode with keys written to the database, each refusal (403 with a
stable code naming what was refused) and each allowed path: native sessions, assistants,
forks, schedules, Agent Protocol runs, AG-UI runs; the scripted model off in keys mode without
FERRYMAN_SCRIPTED_MODEL."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.errors import ModelNotAllowed, ToolNotAllowed
from app.scopes import (
    Scopes,
    check_definition,
    check_scopes,
    model_allowed,
    parse_scopes,
    tool_allowed,
)
from tests.support import ServerProcess, assert_problem, client, create_owner_key
from tests.test_cli import cli_env, ferryman

# --- the matching, pure ------------------------------------------------------------------------

names = st.text("abcdefgh_-.0123456789", min_size=1, max_size=12)
servers = st.text("abcdefgh-0123456789", min_size=1, max_size=8)  # no `_`: unambiguous


@given(st.lists(names, max_size=6), names)
def test_a_listed_tool_and_only_a_listed_tool_is_allowed(listed: list[str], name: str) -> None:
    scopes = parse_scopes({"tools": listed})
    assert tool_allowed(scopes, name) == (name in listed)
    assert tool_allowed(Scopes(), name)  # no `tools`: every tool


@given(servers, servers, names)
def test_an_mcp_server_allows_its_own_tools_alone(server: str, other: str, tool: str) -> None:
    scopes = parse_scopes({"tools": [f"mcp:{server}"]})
    assert tool_allowed(scopes, f"{server}__{tool}")
    assert not tool_allowed(scopes, server)
    assert not tool_allowed(scopes, f"{server}__")
    assert tool_allowed(scopes, f"{other}__{tool}") == (
        f"{other}__{tool}".startswith(f"{server}__")
    )


providers = st.sampled_from(["openai", "anthropic"])
model_ids = st.text("abcdefgh-.0123456789", min_size=1, max_size=12)


@given(providers, providers, model_ids, st.lists(model_ids, max_size=3))
def test_a_provider_prefix_allows_that_provider_alone(
    allowed: str, asked: str, model: str, exact: list[str]
) -> None:
    scopes = parse_scopes({"models": [f"{allowed}:", *(f"anthropic:{m}" for m in exact)]})
    expected = asked == allowed or (asked == "anthropic" and model in exact)
    assert model_allowed(scopes, f"{asked}:{model}") == expected
    assert not model_allowed(scopes, "scripted")
    assert model_allowed(Scopes(), f"{asked}:{model}")


@given(st.lists(st.sampled_from(["put_note", "get_note", "mcp:time", "put_note"]), max_size=6))
def test_checking_a_policy_is_idempotent_and_drops_repeats(tools: list[str]) -> None:
    once = check_scopes({"tools": tools, "limits": {"other": "helper's"}})
    assert once == {"tools": list(dict.fromkeys(tools))}
    assert check_scopes(once) == once


@pytest.mark.parametrize(
    "policy",
    [
        {"tools": "put_note"},
        {"tools": ["a b"]},
        {"tools": ["mcp:"]},
        {"models": ["gpt-4o"]},
        {"models": ["openai"]},
        {"approverFor": ["not an owner"]},
        {"tools": [f"t{i}" for i in range(201)]},
    ],
)
def test_a_bad_policy_is_refused(policy: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        check_scopes(policy)


def test_a_definition_outside_the_scopes_names_what_is_refused() -> None:
    scopes = parse_scopes({"tools": ["put_note", "mcp:time"], "models": ["openai:"]})
    check_definition(scopes, ["put_note", "time__now"], "openai:gpt-4o", False)
    with pytest.raises(ToolNotAllowed) as refused:
        check_definition(scopes, ["put_note", "sleep", "crm__x"], "openai:gpt-4o", False)
    assert refused.value.extra == {"tools": ["sleep", "crm__x"]}
    with pytest.raises(ToolNotAllowed):  # unset: every tool
        check_definition(scopes, None, "openai:gpt-4o", False)
    with pytest.raises(ModelNotAllowed) as model:
        check_definition(scopes, [], "anthropic:claude", True)
    assert model.value.extra == {"model": "anthropic:claude"}
    with pytest.raises(ModelNotAllowed):
        check_definition(Scopes(), None, "scripted", False)
    check_definition(Scopes(), None, "scripted", True)


# --- on a server in keys mode ------------------------------------------------------------------

OPENAI = "openai:gpt-4o-mini"


@pytest.fixture(scope="module")
def keys_server(database_url: str) -> Iterator[ServerProcess]:
    """Keys mode as deployed: the scripted model off."""
    env = {"FERRYMAN_AUTH": "keys", "FERRYMAN_SCRIPTED_MODEL": "false"}
    proc = ServerProcess(database_url, env=env).start()
    yield proc
    proc.stop()


@pytest.fixture
def limited_key(database_url: str) -> tuple[str, str]:
    """An owner and a key of it that may use put_note and the `time` MCP server's tools, and
    OpenAI's models."""
    policy = {"tools": ["put_note", "mcp:time"], "models": ["openai:"]}
    return create_owner_key(database_url, policy=policy)


@pytest.fixture
async def limited(
    keys_server: ServerProcess, limited_key: tuple[str, str]
) -> AsyncIterator[httpx.AsyncClient]:
    async with client(keys_server.url, limited_key[1]) as http:
        yield http


def session(**body: Any) -> dict[str, Any]:
    return {"prompt": "hello", "model": OPENAI, "tools": ["put_note"], **body}


async def test_the_scripted_model_is_off_in_keys_mode(
    keys_server: ServerProcess, database_url: str
) -> None:
    _, key = create_owner_key(database_url)
    async with client(keys_server.url, key) as http:
        for body in ({"prompt": "hi"}, {"prompt": "hi", "model": "scripted", "script": []}):
            refused = assert_problem(
                await http.post("/api/agent", json=body), 403, "MODEL_NOT_ALLOWED"
            )
            assert refused["model"] == "scripted"
            assert "FERRYMAN_SCRIPTED_MODEL" in refused["detail"]
        assistant = {"name": "a", "model": "scripted"}
        assert_problem(await http.post("/api/assistants", json=assistant), 403, "MODEL_NOT_ALLOWED")
        # A provider's model is any key's without a `models` policy.
        created = await http.post("/api/agent", json={"prompt": "hi", "model": OPENAI})
        assert created.status_code == 201, created.text


async def test_the_setting_turns_the_scripted_model_on(database_url: str) -> None:
    env = {"FERRYMAN_AUTH": "keys", "FERRYMAN_SCRIPTED_MODEL": "true"}
    proc = ServerProcess(database_url, env=env).start()
    try:
        _, key = create_owner_key(database_url)
        async with client(proc.url, key) as http:
            response = await http.post("/api/agent", json={"prompt": "hi", "script": []})
            assert response.status_code == 201, response.text
    finally:
        proc.stop()


async def test_a_session_of_other_tools_or_models_is_refused(limited: httpx.AsyncClient) -> None:
    created = await limited.post("/api/agent", json=session())
    assert created.status_code == 201, created.text
    tools = assert_problem(
        await limited.post("/api/agent", json=session(tools=["put_note", "sleep", "get_note"])),
        403,
        "TOOL_NOT_ALLOWED",
    )
    assert tools["tools"] == ["sleep", "get_note"]
    assert "sleep" in tools["detail"]
    # Unset `tools` is every tool: a key limited in tools names them.
    unset = {"prompt": "hello", "model": OPENAI}
    assert_problem(await limited.post("/api/agent", json=unset), 403, "TOOL_NOT_ALLOWED")
    model = assert_problem(
        await limited.post("/api/agent", json=session(model="anthropic:claude-sonnet-4")),
        403,
        "MODEL_NOT_ALLOWED",
    )
    assert model["model"] == "anthropic:claude-sonnet-4"
    # Nothing refused was stored.
    listed = (await limited.get("/api/agent")).json()["sessions"]
    assert [s["id"] for s in listed] == [created.json()["id"]]


async def test_assistants_and_the_sessions_made_from_them_are_checked(
    limited: httpx.AsyncClient,
    limited_key: tuple[str, str],
    keys_server: ServerProcess,
    database_url: str,
) -> None:
    wide = {"name": "wide", "model": OPENAI, "tools": ["sleep"]}
    assert_problem(await limited.post("/api/assistants", json=wide), 403, "TOOL_NOT_ALLOWED")
    narrow = {"name": "narrow", "model": OPENAI, "tools": ["put_note"]}
    made = await limited.post("/api/assistants", json=narrow)
    assert made.status_code == 201, made.text
    aid = made.json()["id"]
    widened = await limited.patch(f"/api/assistants/{aid}", json={"tools": ["sleep"]})
    assert_problem(widened, 403, "TOOL_NOT_ALLOWED")
    remodeled = await limited.patch(f"/api/assistants/{aid}", json={"model": "anthropic:x"})
    assert_problem(remodeled, 403, "MODEL_NOT_ALLOWED")
    ok = await limited.post("/api/agent", json={"prompt": "hi", "assistantId": aid})
    assert ok.status_code == 201, ok.text
    # The owner's other, unlimited key widens it; the limited key may not use that version.
    _, other = create_owner_key(database_url, limited_key[0])
    async with client(keys_server.url, other) as wide_key:
        response = await wide_key.patch(f"/api/assistants/{aid}", json={"tools": ["sleep"]})
        assert response.status_code == 200, response.text
    refused = await limited.post("/api/agent", json={"prompt": "hi", "assistantId": aid})
    assert assert_problem(refused, 403, "TOOL_NOT_ALLOWED")["tools"] == ["sleep"]


async def test_forks_and_schedules_are_checked(
    limited: httpx.AsyncClient,
    limited_key: tuple[str, str],
    keys_server: ServerProcess,
    database_url: str,
) -> None:
    owner_sid = (await limited.post("/api/agent", json=session())).json()["id"]
    fork = await limited.post(f"/api/agent/{owner_sid}/fork", json={"atSeq": 1})
    assert fork.status_code == 201, fork.text
    # A session the owner's unlimited key made with other tools: the limited key may not fork.
    _, other = create_owner_key(database_url, limited_key[0])
    async with client(keys_server.url, other) as wide_key:
        wide = await wide_key.post("/api/agent", json=session(tools=["sleep"]))
        assert wide.status_code == 201, wide.text
    refused = await limited.post(f"/api/agent/{wide.json()['id']}/fork", json={"atSeq": 1})
    assert assert_problem(refused, 403, "TOOL_NOT_ALLOWED")["tools"] == ["sleep"]
    # Nor send it a message, which would run those tools; its own session takes one.
    message = {"text": "and then?"}
    steered = await limited.post(f"/api/agent/{wide.json()['id']}/messages", json=message)
    assert assert_problem(steered, 403, "TOOL_NOT_ALLOWED")["tools"] == ["sleep"]
    own = await limited.post(f"/api/agent/{owner_sid}/messages", json=message)
    assert own.status_code == 202, own.text

    schedule = {"cron": "0 3 * * *", **session()}
    made = await limited.post("/api/schedules", json=schedule)
    assert made.status_code == 201, made.text
    wider = {**schedule, "tools": ["sleep"]}
    assert_problem(await limited.post("/api/schedules", json=wider), 403, "TOOL_NOT_ALLOWED")
    sid = made.json()["id"]
    remodeled = await limited.patch(f"/api/schedules/{sid}", json={"model": "anthropic:x"})
    assert_problem(remodeled, 403, "MODEL_NOT_ALLOWED")


async def test_protocol_runs_are_checked(limited: httpx.AsyncClient) -> None:
    message = {"messages": [{"role": "user", "content": "hi"}]}
    context = {"model": OPENAI, "tools": ["put_note"]}
    ok = await limited.post(
        "/agent-protocol/runs",
        json={"assistant_id": "ferryman", "input": message, "context": context},
    )
    assert ok.status_code == 200, ok.text
    refused = await limited.post(
        "/agent-protocol/runs",
        json={
            "assistant_id": "ferryman",
            "input": message,
            "context": {**context, "tools": ["sleep"]},
        },
    )
    assert_problem(refused, 403, "TOOL_NOT_ALLOWED")
    # AG-UI: the definition in forwardedProps.ferryman.
    thread = str(uuid.uuid4())
    body = {
        "threadId": thread,
        "runId": str(uuid.uuid4()),
        "messages": [{"id": str(uuid.uuid4()), "role": "user", "content": "hi"}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {"ferryman": {"model": "anthropic:claude-x", "tools": ["put_note"]}},
    }
    assert_problem(await limited.post("/ag-ui/agent", json=body), 403, "MODEL_NOT_ALLOWED")
    # Nothing was made of the refused first run.
    assert (await limited.get(f"/api/agent/{thread}")).status_code == 404


# --- ferryman keys create ----------------------------------------------------------------------


async def test_keys_create_takes_the_scopes(keys_server: ServerProcess, database_url: str) -> None:
    env = cli_env(database_url)
    owner = f"owner-{uuid.uuid4().hex[:12]}"
    made, bad = await asyncio.gather(
        ferryman(
            "keys",
            "create",
            "--owner",
            owner,
            "--tools",
            "put_note, mcp:time",
            "--models",
            "openai:",
            "--approver-for",
            "alice,bob",
            env=env,
        ),
        ferryman("keys", "create", "--owner", owner, "--models", "gpt-4o", env=env),
    )
    assert made.returncode == 0, made.stderr
    assert bad.returncode != 0 and "models" in bad.stderr and "Traceback" not in bad.stderr
    key = made.stdout.strip()
    with psycopg.connect(database_url) as conn:
        [(policy,)] = conn.execute(
            "SELECT policy FROM api_keys WHERE owner_id = %s", (owner,)
        ).fetchall()
    assert policy == {
        "tools": ["put_note", "mcp:time"],
        "models": ["openai:"],
        "approverFor": ["alice", "bob"],
    }
    async with client(keys_server.url, key) as http:
        refused = await http.post("/api/agent", json=session(tools=["sleep"]))
        assert_problem(refused, 403, "TOOL_NOT_ALLOWED")
        assert (await http.post("/api/agent", json=session())).status_code == 201
