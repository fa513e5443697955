"""The Agent Protocol's assistants through the official Python client, `langgraph-sdk`, against a
real `ferryman serve`: create, get, search, count, update (a new version), versions, set latest,
delete, schemas, graph, subgraphs; the definition in `context` and `config.configurable`; owner
isolation (404), validation as the native API's (422, unknown tools), and a path the protocol has
but Ferryman does not serve (501 AGENT_PROTOCOL_NOT_SERVED)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any, get_type_hints

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import ConflictError, NotFoundError, UnprocessableEntityError
from langgraph_sdk.schema import Assistant

from tests.support import ServerProcess, assert_problem, create_owner_key

PREFIX = "/agent-protocol"
ASSISTANT_NOT_FOUND = "ASSISTANT_NOT_FOUND"
NOT_SERVED = "NOT_SERVED"
DEFINITION = {
    "model": "scripted",
    "instructions": "Answer briefly.",
    "modelSettings": {"temperature": 0.2},
    "tools": ["put_note", "get_note"],
    "approvalRequired": ["put_note"],
}


@pytest.fixture
async def lg(server: ServerProcess, owner_key: tuple[str, str]) -> AsyncIterator[LangGraphClient]:
    client = get_client(url=server.url + PREFIX, api_key=owner_key[1])
    yield client
    await client.http.client.aclose()


@pytest.fixture
async def raw(
    server: ServerProcess, owner_key: tuple[str, str]
) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=server.url + PREFIX, headers={"x-api-key": owner_key[1]}, timeout=30
    ) as http:
        yield http


def assert_assistant_shape(assistant: dict[str, Any]) -> None:
    """Every key of the SDK's `Assistant` TypedDict, and no other."""
    assert set(assistant) == set(get_type_hints(Assistant)), assistant
    assert assistant["graph_id"] == "ferryman"
    assert assistant["config"]["configurable"] == assistant["context"]


async def test_create_get_update_versions_delete(lg: LangGraphClient) -> None:
    created = await lg.assistants.create(
        "ferryman",
        context=DEFINITION,
        metadata={"team": "docs"},
        name="Notes helper",
        description="Keeps notes.",
    )
    assert_assistant_shape(created)
    assert created["version"] == 1
    assert created["context"] == DEFINITION
    assert created["name"] == "Notes helper" and created["description"] == "Keeps notes."
    assert created["metadata"] == {"team": "docs"}
    uuid.UUID(created["assistant_id"])
    aid = created["assistant_id"]

    assert await lg.assistants.get(aid) == created

    updated = await lg.assistants.update(
        aid, context={"instructions": "Answer in French.", "approvalRequired": None}
    )
    assert_assistant_shape(updated)
    assert updated["version"] == 2
    assert updated["context"]["instructions"] == "Answer in French."
    assert "approvalRequired" not in updated["context"]  # null clears it
    assert updated["context"]["tools"] == DEFINITION["tools"]  # left out: kept
    assert updated["name"] == "Notes helper"

    versions = await lg.assistants.get_versions(aid)
    assert [v["version"] for v in versions] == [2, 1]
    assert versions[1]["context"] == DEFINITION
    assert "updated_at" not in versions[0]

    # Back to version 1's definition, as a new version (Ferryman's versions only move forward).
    latest = await lg.assistants.set_latest(aid, 1)
    assert latest["version"] == 3 and latest["context"] == DEFINITION

    await lg.assistants.delete(aid)
    with pytest.raises(NotFoundError):
        await lg.assistants.get(aid)
    with pytest.raises(NotFoundError):
        await lg.assistants.update(aid, name="gone")


async def test_the_definition_in_config_configurable(lg: LangGraphClient) -> None:
    created = await lg.assistants.create(
        "ferryman",
        config={"configurable": {"model": "scripted", "tools": ["sleep"]}},
        context={"tools": ["get_note"]},  # context wins where both name a key
    )
    assert created["context"] == {"model": "scripted", "tools": ["get_note"]}
    assert created["name"] == "Untitled"
    # Without a model, the server's default.
    bare = await lg.assistants.create("ferryman")
    assert bare["context"] == {"model": "scripted"}


async def test_search_count_and_select(lg: LangGraphClient, raw: httpx.AsyncClient) -> None:
    tag = uuid.uuid4().hex
    made = [
        await lg.assistants.create("ferryman", name=f"{name} {tag}", metadata={"tag": tag, "n": i})
        for i, name in enumerate(["Alpha", "beta", "Gamma"])
    ]
    found = await lg.assistants.search(metadata={"tag": tag}, limit=10)
    assert [a["assistant_id"] for a in found] == [m["assistant_id"] for m in reversed(made)]
    assert await lg.assistants.count(metadata={"tag": tag}) == 3

    by_name = await lg.assistants.search(metadata={"tag": tag}, sort_by="name", sort_order="asc")
    assert [a["name"].split()[0] for a in by_name] == ["Alpha", "Gamma", "beta"]
    assert [a["name"] for a in await lg.assistants.search(name="BETA " + tag)] == [f"beta {tag}"]
    assert await lg.assistants.count(name="gamma " + tag) == 1
    assert await lg.assistants.search(metadata={"tag": tag}, graph_id="agent") == []

    page = await lg.assistants.search(
        metadata={"tag": tag}, limit=2, sort_by="created_at", sort_order="asc",
        response_format="object",
    )  # fmt: skip
    assert [a["assistant_id"] for a in page["assistants"]] == [m["assistant_id"] for m in made[:2]]
    assert page["next"] == "2"
    rest = await lg.assistants.search(metadata={"tag": tag}, limit=2, offset=2, sort_order="asc")
    assert [a["assistant_id"] for a in rest] == [made[2]["assistant_id"]]

    picked = await lg.assistants.search(metadata={"tag": tag}, select=["assistant_id", "name"])
    assert all(set(a) == {"assistant_id", "name"} for a in picked)

    response = await raw.post("/assistants/search", json={"limit": 0})
    assert_problem(response, 422, "VALIDATION_ERROR")


async def test_if_exists(lg: LangGraphClient, server: ServerProcess) -> None:
    chosen = str(uuid.uuid4())
    first = await lg.assistants.create("ferryman", assistant_id=chosen, name="First")
    assert first["assistant_id"] == chosen
    again = await lg.assistants.create("ferryman", assistant_id=chosen, if_exists="do_nothing")
    assert again == first
    with pytest.raises(ConflictError):
        await lg.assistants.create("ferryman", assistant_id=chosen)
    # Another owner cannot take the id, nor see the assistant behind it.
    other = get_client(url=server.url + PREFIX, api_key=create_owner_key(server.database_url)[1])
    with pytest.raises(ConflictError):
        await other.assistants.create("ferryman", assistant_id=chosen, if_exists="do_nothing")


async def test_another_owner_sees_nothing(lg: LangGraphClient, server: ServerProcess) -> None:
    mine = await lg.assistants.create("ferryman", name="Mine", metadata={"secret": "yes"})
    aid = mine["assistant_id"]
    other = get_client(url=server.url + PREFIX, api_key=create_owner_key(server.database_url)[1])
    for call in (
        other.assistants.get(aid),
        other.assistants.update(aid, name="Theirs"),
        other.assistants.get_versions(aid),
        other.assistants.get_schemas(aid),
        other.assistants.get_graph(aid),
        other.assistants.set_latest(aid, 1),
        other.assistants.delete(aid),
    ):
        with pytest.raises(NotFoundError):
            await call
    assert await other.assistants.search(metadata={"secret": "yes"}) == []
    assert (await lg.assistants.get(aid))["name"] == "Mine"


async def test_validation_as_the_native_api(lg: LangGraphClient, raw: httpx.AsyncClient) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"graph_id": "agent"}, "graph_id"),
        ({"graph_id": "ferryman", "context": {"tools": ["get_nte"]}}, "context.tools"),
        (
            {"graph_id": "ferryman", "config": {"configurable": {"approvalRequired": ["nope"]}}},
            "config.configurable.approvalRequired",
        ),
        ({"graph_id": "ferryman", "context": {"model": "gpt-4o"}}, "context.model"),
        ({"graph_id": "ferryman", "context": {"temperature": 1}}, "context.temperature"),
        ({"graph_id": "ferryman", "context": {"modelSettings": {"topP": 9}}},
         "context.modelSettings.topP"),
        ({"graph_id": "ferryman", "config": {"tags": ["x"]}}, "config.tags"),
    ]  # fmt: skip
    for body, field in cases:
        problem = assert_problem(await raw.post("/assistants", json=body), 422, "VALIDATION_ERROR")
        assert field in [e["field"] for e in problem["errors"]], (body, problem)
    unknown = assert_problem(
        await raw.post("/assistants", json=cases[1][0]), 422, "VALIDATION_ERROR"
    )
    assert "get_note" in unknown["detail"]  # the closest name
    with pytest.raises(UnprocessableEntityError):
        await lg.assistants.create("ferryman", context={"tools": ["no_such_tool"]})
    made = await lg.assistants.create("ferryman")
    with pytest.raises(UnprocessableEntityError):
        await lg.assistants.update(made["assistant_id"], context={"tools": ["no_such_tool"]})
    assert (await lg.assistants.get(made["assistant_id"]))["version"] == 1
    assert_problem(await raw.get("/assistants/not-a-uuid"), 404, ASSISTANT_NOT_FOUND)


async def test_schemas_graph_and_subgraphs(lg: LangGraphClient) -> None:
    aid = (await lg.assistants.create("ferryman"))["assistant_id"]
    schemas = await lg.assistants.get_schemas(aid)
    assert schemas["graph_id"] == "ferryman"
    assert set(schemas["context_schema"]["properties"]) >= set(DEFINITION)
    assert schemas["config_schema"]["properties"]["configurable"] == schemas["context_schema"]
    assert "messages" in schemas["input_schema"]["properties"]
    assert "messages" in schemas["state_schema"]["properties"]
    graph = await lg.assistants.get_graph(aid)
    assert {node["id"] for node in graph["nodes"]} == {"__start__", "model", "tools", "__end__"}
    assert await lg.assistants.get_subgraphs(aid) == {}


async def test_paths_not_served(raw: httpx.AsyncClient, lg: LangGraphClient) -> None:
    for method, path in [("POST", "/runs/batch"), ("POST", "/store/items/search")]:
        assert_problem(await raw.request(method, path, json={}), 501, NOT_SERVED)
    # What no route names: the catch-all, which names the path.
    for method, path in [("GET", "/mcp"), ("POST", "/a2a/x"), ("GET", "/threads/x/y/z")]:
        problem = assert_problem(await raw.request(method, path, json={}), 501, NOT_SERVED)
        assert problem["path"] == PREFIX + path
    assert_problem(await raw.get("/no/such/thing"), 404, "NOT_FOUND")
    response = await raw.put("/assistants/search", json={})
    assert_problem(response, 405, "METHOD_NOT_ALLOWED")
    assert "POST" in response.headers["allow"].split(", ")  # and /assistants/{id}'s methods
    aid = (await lg.assistants.create("ferryman"))["assistant_id"]
    problem = assert_problem(
        await raw.delete(f"/assistants/{aid}", params={"delete_threads": "true"}),
        501, NOT_SERVED,
    )  # fmt: skip
    assert "delete_threads" in problem["detail"]


async def test_keys_ride_in_x_api_key_or_authorization(server: ServerProcess) -> None:
    _, key = create_owner_key(server.database_url)
    async with httpx.AsyncClient(base_url=server.url + PREFIX, timeout=30) as http:
        made = await http.post(
            "/assistants", json={"graph_id": "ferryman"}, headers={"x-api-key": key}
        )
        assert made.status_code == 200, made.text
        aid = made.json()["assistant_id"]
        bearer = await http.get(f"/assistants/{aid}", headers={"Authorization": f"Bearer {key}"})
        assert bearer.status_code == 200
        bad = await http.get(f"/assistants/{aid}", headers={"x-api-key": "fm_wrong"})
        assert_problem(bad, 401, "INVALID_API_KEY")


async def test_the_default_assistant(lg: LangGraphClient, raw: httpx.AsyncClient) -> None:
    """`ferryman`, as the SDKs' examples name a graph's assistant: the server's own definition."""
    by_name = await lg.assistants.get("ferryman")
    assert_assistant_shape(by_name)
    assert by_name["context"] == {"model": "scripted"}
    assert by_name["metadata"] == {"created_by": "system"}
    assert await lg.assistants.get(by_name["assistant_id"]) == by_name
    assert [v["version"] for v in await lg.assistants.get_versions("ferryman")] == [1]
    assert (await lg.assistants.get_schemas("ferryman"))["graph_id"] == "ferryman"
    for response in (
        await raw.patch("/assistants/ferryman", json={"name": "mine"}),
        await raw.delete(f"/assistants/{by_name['assistant_id']}"),
        await raw.post("/assistants/ferryman/latest", json={"version": 1}),
    ):
        assert_problem(response, 501, NOT_SERVED)


async def test_a_run_pins_the_assistant_made_through_the_protocol(
    lg: LangGraphClient, server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    """A run names an assistant by the id the protocol gave it (or the default one's id); the
    thread's session keeps the version it started with (no worker: the run stays queued)."""
    made = await lg.assistants.create("ferryman", context={"instructions": "One."})
    aid = made["assistant_id"]
    await lg.assistants.update(aid, context={"instructions": "Two."})
    message = {"messages": [{"role": "user", "content": "hi"}]}
    pinned = (await lg.threads.create())["thread_id"]
    await lg.runs.create(pinned, aid, input=message)
    await lg.assistants.update(aid, context={"instructions": "Three."})
    native = httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {owner_key[1]}"}
    )
    session = (await native.get(f"/api/agent/{pinned}")).json()
    assert session["assistant"] == {"id": aid, "version": 2}
    assert session["instructions"] == "Two."

    default_id = (await lg.assistants.get("ferryman"))["assistant_id"]
    plain = (await lg.threads.create())["thread_id"]
    await lg.runs.create(plain, default_id, input=message)
    assert (await native.get(f"/api/agent/{plain}")).json()["assistant"] is None
    await native.aclose()


async def test_a_later_run_with_another_assistant_redefines_the_thread(
    lg: LangGraphClient, server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    """A thread takes the definition of each run that names another stored assistant, or
    definition fields in its context, once no run is in progress; a run naming the thread's
    own assistant keeps the version the thread pinned (no worker: runs stay queued and a
    cancel ends them)."""
    one = (await lg.assistants.create("ferryman", context={"instructions": "One."}))["assistant_id"]
    two = (await lg.assistants.create("ferryman", context={"instructions": "Two."}))["assistant_id"]
    message = {"messages": [{"role": "user", "content": "hi"}]}
    thread = (await lg.threads.create())["thread_id"]
    native = httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {owner_key[1]}"}
    )

    async def session() -> dict[str, Any]:
        return dict((await native.get(f"/api/agent/{thread}")).json())

    async def end(run: dict[str, Any]) -> None:
        await lg.runs.cancel(thread, run["run_id"], wait=True)

    first = await lg.runs.create(thread, one, input=message)
    with pytest.raises(ConflictError):
        await lg.runs.create(thread, two, input=message, multitask_strategy="enqueue")
    assert (await session())["assistant"] == {"id": one, "version": 1}
    await end(first)

    await lg.assistants.update(one, context={"instructions": "One, edited."})
    await end(await lg.runs.create(thread, one, input=message))
    assert (await session())["instructions"] == "One."  # the pinned version, not the edit
    await end(await lg.runs.create(thread, one, input=message, context={"instructions": "Now."}))
    now = await session()
    assert (now["assistant"], now["instructions"]) == ({"id": one, "version": 1}, "Now.")

    await lg.runs.create(thread, two, input=message)
    now = await session()
    assert (now["assistant"], now["instructions"]) == ({"id": two, "version": 1}, "Two.")
    await native.aclose()
