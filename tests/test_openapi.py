"""The OpenAPI document: committed, in step with the app, and true to what the server sends.

Every answer and every stream frame of a varied set of sessions (tool calls, an approval, a
provider retry, a question, a handover to another worker, a cancel, a rename, a delete, and the
errors) is validated against the schema the document gives for it.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from app.api.openapi import COMMITTED, render
from app.main import create_app
from tests.support import (
    ServerProcess,
    StartWorker,
    client,
    of_type,
    sse,
    wait_event,
    wait_for_status,
)

DOCUMENT: dict[str, Any] = json.loads(Path(COMMITTED).read_text())
_REGISTRY = Registry().with_resource(
    "urn:openapi", Resource.from_contents(DOCUMENT, default_specification=DRAFT202012)
)


def test_committed_document_is_the_apps() -> None:
    assert render(create_app().openapi()) == COMMITTED.read_text(), (
        "docs/openapi.json is behind the app: run `python -m app.api.openapi --write` and commit"
    )


def test_every_error_answer_is_a_problem_and_local_mode_needs_no_key() -> None:
    assert DOCUMENT["security"] == [{"apiKey": []}, {}]
    for path, item in DOCUMENT["paths"].items():
        for method, operation in item.items():
            assert "security" not in operation or operation["security"] == [], (method, path)
            for status, response in operation["responses"].items():
                if int(status) >= 400:
                    content = response["content"]
                    assert content == {
                        "application/problem+json": {
                            "schema": {"$ref": "#/components/schemas/Problem"}
                        }
                    }, (method, path, status)
    codes = DOCUMENT["components"]["schemas"]["ProblemCode"]["enum"]
    assert {"SESSION_NOT_FOUND", "SESSION_ALREADY_TERMINAL", "VALIDATION_ERROR"} <= set(codes)


def _validate(value: Any, schema_name: str) -> None:
    schema = {"$ref": f"urn:openapi#/components/schemas/{schema_name}"}
    errors = list(Draft202012Validator(schema, registry=_REGISTRY).iter_errors(value))
    assert not errors, f"{schema_name}: {[e.message for e in errors][:3]}\n{value}"


def _operation(method: str, path: str) -> dict[str, Any]:
    for template, item in DOCUMENT["paths"].items():
        pattern = template.split("/")
        parts = path.split("?")[0].split("/")
        matches = len(pattern) == len(parts) and all(
            p == q or p.startswith("{") for p, q in zip(pattern, parts, strict=True)
        )
        if matches and method.lower() in item:
            operation: dict[str, Any] = item[method.lower()]
            return operation
    raise AssertionError(f"{method} {path} is not in the document")


def check(response: httpx.Response) -> httpx.Response:
    """Validate an answer against the document's schema for its operation and status."""
    request = response.request
    operation = _operation(request.method, request.url.path)
    status = str(response.status_code)
    assert status in operation["responses"], (
        f"{request.method} {request.url.path} answered {status}, which the document does not "
        f"list: {response.text[:300]}"
    )
    content = operation["responses"][status].get("content")
    if not content:
        assert not response.content
        return response
    media_type = response.headers["content-type"].split(";")[0]
    assert media_type in content, (media_type, list(content))
    ref = content[media_type]["schema"]["$ref"]
    _validate(response.json(), ref.rsplit("/", 1)[1])
    return response


def check_frame(stream: str, event: str, data: str) -> None:
    payload = json.loads(data)
    if event in ("caught_up", "resync_required"):
        _validate(payload, "CaughtUp" if event == "caught_up" else "ResyncRequired")
    elif event == "message_delta":
        _validate(payload, "MessageDelta")
    else:
        assert payload["type"] == event
        _validate(payload, "SessionEvent" if stream == "session" else "OwnerEvent")


async def _watch(http: httpx.AsyncClient, session_id: str) -> list[str]:
    """A session's stream, live, until it succeeds; the event names seen."""
    seen: list[str] = []
    async with sse(http, f"/api/agent/{session_id}/events") as events:
        async for event in events:
            check_frame("session", event.event, event.data)
            seen.append(event.event)
            if (
                event.event == "session_end"
                and json.loads(event.data)["data"]["status"] != "waiting"
            ):
                return seen
    raise AssertionError(f"the stream ended first: {seen}")


@pytest.mark.slow
async def test_what_the_server_sends_fits_the_document(
    api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    # One provider retry, at once (Retry-After 0); the test processes allow none by default.
    worker = start_worker({"FERRYMAN_MODEL_MAX_RETRIES": "1"})
    async with client(api.url, key) as http:
        cursor = check(await http.get("/api/agent", params={"limit": 5})).json()["cursor"]
        check(await http.get("/api/tools"))

        # Tool calls behind an approval, then a turn the provider fails once.
        script = [
            {"toolCalls": [{"name": "put_note", "arguments": {"key": "k", "text": "v"}}]},
            {
                "text": "all done here",
                "chunks": 4,
                "delayMs": 200,
                "fault": {"kind": "rate_limited", "retryAfterMs": 0},
            },
        ]
        created = check(
            await http.post(
                "/api/agent",
                json={"prompt": "note it", "script": script, "approvalRequired": ["put_note"]},
            )
        ).json()
        first = created["id"]
        watching = asyncio.create_task(_watch(http, first))
        request = await wait_event(http, first, lambda e: e["type"] == "tool_approval_requested")
        await wait_for_status(http, first, {"waiting"})
        call_id = request["data"]["toolCallId"]
        check(
            await http.post(
                f"/api/agent/{first}/tool-calls/{call_id}/approval",
                json={"approved": True, "reason": "fine"},
            )
        )
        seen = await asyncio.wait_for(watching, 30)
        assert {"model_retry", "message_delta", "tool_result", "caught_up"} <= set(seen), seen
        check(await http.get(f"/api/agent/{first}"))

        # A question, a rename, a cancel while waiting, a delete.
        asked = check(
            await http.post(
                "/api/agent",
                json={
                    "prompt": "ask",
                    "script": [
                        {
                            "toolCalls": [
                                {
                                    "name": "ask_user",
                                    "arguments": {"question": "which?", "options": ["a", "b"]},
                                }
                            ]
                        }
                    ],
                },
            )
        ).json()["id"]
        await wait_for_status(http, asked, {"waiting"})
        check(await http.patch(f"/api/agent/{asked}", json={"title": "renamed"}))
        check(await http.post(f"/api/agent/{asked}/cancel", params={"wait": "true"}))
        check(await http.post(f"/api/agent/{asked}/cancel"))  # 409

        # A long tool: the worker hands the session over on SIGTERM, another resumes it, and
        # a cancel stops it mid-tool.
        sleeper = check(
            await http.post(
                "/api/agent",
                json={
                    "prompt": "sleep",
                    "script": [{"toolCalls": [{"name": "sleep", "arguments": {"seconds": 60}}]}],
                },
            )
        ).json()["id"]
        await wait_event(http, sleeper, lambda e: e["type"] == "tool_call_start")
        start_worker()
        worker.stop()  # SIGTERM: `session_interrupted {shutdown}`, then the other one resumes
        await wait_event(http, sleeper, lambda e: e["type"] == "session_resumed")
        await wait_event(
            http, sleeper, lambda e: e["type"] == "tool_call_start" and e["attempt"] == 2
        )
        check(await http.post(f"/api/agent/{sleeper}/cancel"))
        await wait_for_status(http, sleeper, {"cancelled"})
        check(await http.post(f"/api/agent/{sleeper}/messages", json={"text": "again"}))
        check(await http.post(f"/api/agent/{sleeper}/cancel", params={"wait": "true"}))
        asked_events = check(await http.get(f"/api/agent/{asked}/transcript")).json()["events"]
        assert of_type(asked_events, "user_question")
        check(await http.delete(f"/api/agent/{asked}"))
        check(await http.get(f"/api/agent/{asked}/transcript"))  # 404
        check(await http.post("/api/agent", content=b"{}", headers={"content-type": "text/plain"}))
        check(await http.post("/api/agent", json={"prompt": "x", "title": ""}))  # 422
        check(
            await http.post(
                "/api/agent", content=b"{", headers={"content-type": "application/json"}
            )
        )

        # Every event of every session, from the transcript and a replayed stream.
        types: set[str] = set()
        for session_id in (first, sleeper):
            page = check(await http.get(f"/api/agent/{session_id}/transcript"))
            types |= {e["type"] for e in page.json()["events"]}
            async with sse(http, f"/api/agent/{session_id}/events", follow="false") as events:
                async for event in events:
                    check_frame("session", event.event, event.data)
        assert {
            "user_message",
            "session_start",
            "assistant_message",
            "tool_approval_requested",
            "tool_approval_decided",
            "tool_call_start",
            "tool_result",
            "model_retry",
            "session_interrupted",
            "session_resumed",
            "session_end",
        } <= types, types

        owner_types = await _owner_events(http, cursor, until="session_deleted")
        assert {
            "session_created",
            "session_status",
            "session_title",
            "session_active_stage",
            "session_cancel_requested",
            "session_resumed",
            "session_deleted",
        } <= owner_types, owner_types


async def _owner_events(http: httpx.AsyncClient, cursor: str, until: str) -> set[str]:
    types: set[str] = set()
    async with sse(http, "/api/agent/owner-events", last_event_id=cursor) as events:
        async for event in events:
            check_frame("owner", event.event, event.data)
            if event.event != "caught_up":
                types.add(event.event)
            if event.event == until:
                return types
    raise AssertionError(f"the owner stream ended before {until}: {types}")


async def test_docs_work_offline(server: ServerProcess) -> None:
    """Swagger UI and ReDoc load their assets from the server itself, never from a CDN."""
    async with client(server.url) as http:
        for page in ("/docs", "/redoc"):
            html = (await http.get(page)).text
            assets = re.findall(r"""(?:src|href)=["']([^"']+\.(?:js|css|png))""", html)
            assert assets and all(a.startswith("/") for a in assets), (page, assets)
            for asset in assets:
                assert (await http.get(asset)).status_code == 200, asset
        assert (await http.get("/openapi.json")).json() == DOCUMENT
