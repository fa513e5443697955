"""A session's agent definition over HTTP: instructions, model settings, approvals, usage on the
Session, their validation, and GET /api/tools (SPEC section 6.1, 6.2).

The sessions made here name providers no test worker can reach, so they stay on a database of
this module's own (`api`, no worker): a worker on the shared one would spend its slots
retrying them."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import ServerProcess, assert_problem, client, create_session, running


async def test_the_definition_is_stored_and_shown(api: ServerProcess, key: str) -> None:
    settings = {
        "temperature": 0.2,
        "topP": 0.9,
        "maxTokens": 512,
        "toolChoice": "get_note",
        "parallelToolCalls": False,
        "stop": ["END", "\n\n"],
        "reasoningEffort": "low",
    }
    async with client(api.url, key) as http:
        created = await create_session(
            http,
            "hi",
            model="openai:gpt-test",
            instructions="You are terse.",
            modelSettings=settings,
            tools=["get_note", "put_note"],
            approvalRequired=["put_note"],
        )
        fetched = (await http.get(f"/api/agent/{created['id']}")).json()
    for session in (created, fetched):
        assert session["instructions"] == "You are terse."
        assert session["modelSettings"] == settings
        assert session["approvalRequired"] == ["put_note"]
        assert session["usage"] == {"inputTokens": 0, "outputTokens": 0, "cachedTokens": 0}
        assert session["model"] == "openai:gpt-test"


async def test_defaults(api: ServerProcess, key: str) -> None:
    async with client(api.url, key) as http:
        session = await create_session(http, "hi", modelSettings={"temperature": 0})
    assert session["instructions"] is None
    assert session["modelSettings"] == {"temperature": 0}  # unset ones are left out
    assert session["approvalRequired"] == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"instructions": ""}, "instructions"),
        ({"instructions": "x" * 100_001}, "instructions"),
        ({"instructions": "nul\x00"}, "instructions"),
        ({"modelSettings": {"temperature": 2.5}}, "modelSettings.temperature"),
        ({"modelSettings": {"topP": 0}}, "modelSettings.topP"),
        ({"modelSettings": {"maxTokens": 0}}, "modelSettings.maxTokens"),
        ({"modelSettings": {"stop": ["a", "b", "c", "d", "e"]}}, "modelSettings.stop"),
        ({"modelSettings": {"stop": [""]}}, "modelSettings.stop.0"),
        ({"modelSettings": {"reasoningEffort": "max"}}, "modelSettings.reasoningEffort"),
        ({"modelSettings": {"toolChoice": "no such tool!"}}, "modelSettings.toolChoice"),
        ({"modelSettings": {"parallelToolCalls": "maybe"}}, "modelSettings.parallelToolCalls"),
        ({"modelSettings": {"seed": 1}}, "modelSettings.seed"),
        ({"modelSettings": {"toolChoice": "sleep"}, "tools": ["get_note"]}, ""),
        ({"approvalRequired": ["bad name"]}, "approvalRequired.0"),
        ({"approvalRequired": ["t"] * 65}, "approvalRequired"),
        ({"model": "anthropic:"}, "model"),
        ({"model": "gemini:pro"}, "model"),
        ({"script": [{"fault": {"kind": "meteor"}}]}, "script.0.fault.kind"),
        ({"script": [{"fault": {"kind": "server_error", "times": 0}}]}, "script.0.fault.times"),
    ],
)
async def test_bad_definitions_are_refused(
    api: ServerProcess, key: str, body: dict[str, Any], field: str
) -> None:
    async with client(api.url, key) as http:
        response = await http.post("/api/agent", json={"prompt": "hi", **body})
    problem = assert_problem(response, 422, "VALIDATION_ERROR")
    assert any(e["field"].startswith(field) for e in problem["errors"]), problem


async def test_unknown_tool_names_are_refused_with_the_closest_ones(
    api: ServerProcess, key: str
) -> None:
    body = {
        "prompt": "hi",
        "tools": ["get_nte", "put_note"],
        "approvalRequired": ["xyzzy", "put_nte"],
        "modelSettings": {"toolChoice": "get_nte"},
    }
    async with client(api.url, key) as http:
        response = await http.post("/api/agent", json=body)
        problem = assert_problem(response, 422, "VALIDATION_ERROR")
        errors = {e["field"]: e for e in problem["errors"]}
        assert set(errors) == {"tools", "approvalRequired", "modelSettings.toolChoice"}
        assert errors["tools"]["type"] == "unknown_tool"
        assert "'get_nte' (closest: get_note" in errors["tools"]["message"]
        assert "put_note" not in errors["tools"]["message"].split("closest")[0]
        assert "'xyzzy' (none close)" in errors["approvalRequired"]["message"]
        assert "'put_nte' (closest: put_note" in errors["approvalRequired"]["message"]
        for name in ("get_nte", "xyzzy", "put_nte", "get_note", "put_note"):
            assert name in problem["detail"], problem["detail"]
        listed = (await http.get("/api/agent")).json()["sessions"]
        assert listed == []  # nothing was made


async def test_a_model_of_the_wrong_form_is_said_in_words(api: ServerProcess, key: str) -> None:
    async with client(api.url, key) as http:
        response = await http.post("/api/agent", json={"prompt": "hi", "model": "gpt-4o"})
    problem = assert_problem(response, 422, "VALIDATION_ERROR")
    (error,) = problem["errors"]
    assert error["field"] == "model"
    assert "`scripted`, `openai:<model>` or `anthropic:<model>`" in error["message"]
    assert "^" not in problem["detail"] and "[A-Za-z" not in problem["detail"]


async def test_models_of_every_provider_are_accepted(api: ServerProcess, key: str) -> None:
    async with client(api.url, key) as http:
        for name in ("scripted", "openai:gpt-5.1-mini", "anthropic:claude-sonnet-4-5@20250929"):
            assert (await create_session(http, "hi", model=name))["model"] == name


async def test_the_tool_list(api: ServerProcess, key: str) -> None:
    async with client(api.url, key) as http:
        response = await http.get("/api/tools")
    assert response.status_code == 200
    tools = {t["name"]: t for t in response.json()["tools"]}
    assert {"sleep", "put_note", "get_note", "ask_user"} <= set(tools)
    note = tools["put_note"]
    assert note["source"] == "builtin"
    assert note["idempotent"] is True
    assert note["requiresApproval"] is False
    assert note["parameters"]["required"] == ["key", "text"]
    assert note["description"]


async def test_the_tool_list_needs_a_key_in_keys_mode(isolated_db: str) -> None:
    with running(ServerProcess(isolated_db, env={"FERRYMAN_AUTH": "keys"})) as keyed:
        async with client(keyed.url) as http:
            assert_problem(await http.get("/api/tools"), 401, "AUTH_REQUIRED")
