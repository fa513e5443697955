"""Every bad input answers a 4xx `application/problem+json` with a stable `code`; never a 5xx."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import (
    PROBLEM,
    ServerProcess,
    assert_problem,
    client,
    create_owner_key,
    new_session,
)

JSON = {"Content-Type": "application/json"}
MiB = 1024 * 1024


def raw_json(text: str) -> bytes:
    """A body sent byte for byte, for what a JSON encoder will not produce."""
    return text.encode()


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def token(data: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


@pytest.fixture(scope="module")
def module_key(database_url: str) -> str:
    """One owner for the module: almost every request here is refused, so none of them leaves
    anything another test could see."""
    return create_owner_key(database_url)[1]


@pytest.fixture(scope="module")
async def http(server: ServerProcess, module_key: str) -> AsyncIterator[httpx.AsyncClient]:
    async with client(server.url, module_key) as http:
        yield http


# --- create bodies --------------------------------------------------------------------------

BAD_CREATE_JSON: dict[str, Any] = {
    "empty prompt": {"prompt": ""},
    "prompt too long": {"prompt": "x" * 100_001},
    "prompt with NUL": {"prompt": "a\u0000b"},
    "prompt is a number": {"prompt": 5},
    "prompt is a list": {"prompt": ["x"]},
    "prompt is an object": {"prompt": {"text": "x"}},
    "unknown field": {"prompt": "x", "colour": "red"},
    "unknown camel field": {"prompt": "x", "Prompt": "x"},
    "tools is a string": {"prompt": "x", "tools": "x"},
    "tools has a number": {"prompt": "x", "tools": [1]},
    "tool name with space": {"prompt": "x", "tools": ["bad name"]},
    "empty tool name": {"prompt": "x", "tools": [""]},
    "too many tools": {"prompt": "x", "tools": [f"t{i}" for i in range(65)]},
    "metadata is a list": {"prompt": "x", "metadata": []},
    "metadata is a string": {"prompt": "x", "metadata": "x"},
    "metadata over 16 KiB": {"prompt": "x", "metadata": {"blob": "x" * 16_400}},
    "metadata too deep": {"prompt": "x", "metadata": nested(40)},
    "metadata key with NUL": {"prompt": "x", "metadata": {"a\u0000": 1}},
    "metadata value with NUL": {"prompt": "x", "metadata": {"a": ["ok", "b\u0000"]}},
    "title empty": {"prompt": "x", "title": ""},
    "title too long": {"prompt": "x", "title": "t" * 201},
    "title is a number": {"prompt": "x", "title": 5},
    "title with NUL": {"prompt": "x", "title": "a\u0000"},
    "model is a number": {"prompt": "x", "model": 5},
    "model unknown": {"prompt": "x", "model": "gpt-4"},
    "model empty": {"prompt": "x", "model": ""},
    "model openai without name": {"prompt": "x", "model": "openai:"},
    "model openai with space": {"prompt": "x", "model": "openai:bad name"},
    "model upper case": {"prompt": "x", "model": "SCRIPTED"},
    "model trailing space": {"prompt": "x", "model": "scripted "},
    "model too long": {"prompt": "x", "model": "openai:" + "m" * 300},
    "script is an object": {"prompt": "x", "script": {}},
    "script turn is a number": {"prompt": "x", "script": [1]},
    "script unknown field": {"prompt": "x", "script": [{"txt": "x"}]},
    "script bad stopReason": {"prompt": "x", "script": [{"stopReason": "nope"}]},
    "script negative delay": {"prompt": "x", "script": [{"delayMs": -1}]},
    "script zero chunks": {"prompt": "x", "script": [{"chunks": 0}]},
    "script tool call without name": {"prompt": "x", "script": [{"toolCalls": [{}]}]},
    "script tool arguments a list": {
        "prompt": "x",
        "script": [{"toolCalls": [{"name": "sleep", "arguments": [1]}]}],
    },
    "script too long": {"prompt": "x", "script": [{"text": "t"}] * 201},
    "body is a list": [{"prompt": "x"}],
    "body is a string": "prompt",
    "body is null": None,
    "body is a number": 42,
}

BAD_CREATE_RAW: dict[str, bytes] = {
    "lone high surrogate": raw_json('{"prompt": "\\ud800"}'),
    "lone low surrogate": raw_json('{"prompt": "ok \\udfff"}'),
    "surrogate in title": raw_json('{"prompt": "x", "title": "\\ud800"}'),
    "surrogate in metadata key": raw_json('{"prompt": "x", "metadata": {"\\udc00": 1}}'),
    "surrogate in metadata value": raw_json('{"prompt": "x", "metadata": {"k": ["\\ud83d"]}}'),
    "surrogate in script": raw_json('{"prompt": "x", "script": [{"text": "\\ud800"}]}'),
    "NaN in metadata": raw_json('{"prompt": "x", "metadata": {"n": NaN}}'),
    "Infinity in metadata": raw_json('{"prompt": "x", "metadata": {"n": -Infinity}}'),
    "overflowing float in metadata": raw_json('{"prompt": "x", "metadata": {"n": 1e999}}'),
    "NaN in tool arguments": raw_json(
        '{"prompt": "x", "script": [{"toolCalls": [{"name": "sleep", "arguments": {"s": NaN}}]}]}'
    ),
    "NaN as delayMs": raw_json('{"prompt": "x", "script": [{"delayMs": NaN}]}'),
}

MALFORMED: dict[str, bytes] = {
    "truncated": b'{"prompt": ',
    "unquoted key": b'{prompt: "x"}',
    "not json": b"hello",
    "trailing garbage": b'{"prompt": "x"} x',
    "single quotes": b"{'prompt': 'x'}",
    "trailing comma": b'{"prompt": "x",}',
    "invalid UTF-8": b'{"prompt": "\xff\xfe"}',
    "deeper than any parser": b'{"prompt": "x", "metadata": {"a": '
    + b"[" * 100_000
    + b"]" * 100_000
    + b"}}",
    "a 5000-digit number": b'{"prompt": "x", "metadata": {"n": ' + b"9" * 5000 + b"}}",
}


@pytest.mark.parametrize("body", BAD_CREATE_JSON.values(), ids=BAD_CREATE_JSON.keys())
async def test_create_rejects_invalid_bodies(http: httpx.AsyncClient, body: Any) -> None:
    response = await http.post("/api/agent", content=json.dumps(body).encode(), headers=JSON)
    assert_problem(response, 422, "VALIDATION_ERROR")


@pytest.mark.parametrize("body", BAD_CREATE_RAW.values(), ids=BAD_CREATE_RAW.keys())
async def test_create_rejects_unstorable_text(http: httpx.AsyncClient, body: bytes) -> None:
    response = await http.post("/api/agent", content=body, headers=JSON)
    assert_problem(response, 422, "VALIDATION_ERROR")


async def test_rejected_creates_leave_nothing_behind(
    server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    bodies = [json.dumps(b).encode() for b in BAD_CREATE_JSON.values()]
    bodies += [*BAD_CREATE_RAW.values(), *MALFORMED.values()]
    async with client(server.url, owner_key[1]) as http:
        for body in bodies:
            response = await http.post("/api/agent", content=body, headers=JSON)
            assert 400 <= response.status_code < 500
        listed = (await http.get("/api/agent")).json()
        assert listed["sessions"] == []
        assert listed["cursor"] == "0"  # not even an owner event


@pytest.mark.parametrize("body", MALFORMED.values(), ids=MALFORMED.keys())
async def test_malformed_json(http: httpx.AsyncClient, body: bytes) -> None:
    sid = await new_session(http, "target")
    assert_problem(await http.post("/api/agent", content=body, headers=JSON), 400, "MALFORMED_JSON")
    assert_problem(
        await http.patch(f"/api/agent/{sid}", content=body, headers=JSON), 400, "MALFORMED_JSON"
    )
    response = await http.post(f"/api/agent/{sid}/messages", content=body, headers=JSON)
    assert_problem(response, 400, "MALFORMED_JSON")


async def test_validation_errors_name_the_field(http: httpx.AsyncClient) -> None:
    body = assert_problem(
        await http.post("/api/agent", json={"prompt": ""}), 422, "VALIDATION_ERROR"
    )
    assert [e["field"] for e in body["errors"]] == ["prompt"]
    body = assert_problem(
        await http.post("/api/agent", json={"prompt": "x", "metadata": {"n": "x" * 17_000}}),
        422,
        "VALIDATION_ERROR",
    )
    assert body["errors"][0]["field"] == "metadata"
    body = assert_problem(
        await http.post("/api/agent", json={"prompt": "x", "extra": 1}), 422, "VALIDATION_ERROR"
    )
    assert body["errors"][0]["field"] == "extra"


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"prompt": "x", "title": ""}, "title: must be at least 1 character(s) long"),
        ({"prompt": "x", "title": "t" * 201}, "title: must be at most 200 characters long"),
        ({"prompt": "x", "modelSettings": {"temperature": 3}}, "modelSettings.temperature: must"),
        ({"prompt": "x", "modelSettings": {"stop": [""]}}, "modelSettings.stop.0: must be at"),
        ({"prompt": "x", "tools": "sleep"}, "tools: must be a list"),
        ({"prompt": "x", "extra": 1}, "extra: is not a field this request takes"),
        ({"script": [{"toolCalls": [{}]}]}, "script.0.toolCalls.0.name: is required"),
    ],
)
async def test_validation_errors_say_the_field_and_the_rule_in_plain_words(
    http: httpx.AsyncClient, body: dict[str, Any], detail: str
) -> None:
    problem = assert_problem(await http.post("/api/agent", json=body), 422, "VALIDATION_ERROR")
    assert problem["detail"].startswith(detail), problem
    assert "Value should" not in problem["detail"] and "after validation" not in problem["detail"]


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
async def test_a_body_that_is_not_json_is_a_415_that_says_so(
    http: httpx.AsyncClient, content_type: str | None
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    request = http.build_request("POST", "/api/agent", content=b'{"prompt": "x"}', headers=headers)
    assert ("content-type" in request.headers) == (content_type is not None)
    problem = assert_problem(await http.send(request), 415, "UNSUPPORTED_MEDIA_TYPE")
    assert "application/json" in problem["detail"]
    # A JSON body of the wrong shape is still a 422 about the body.
    problem = assert_problem(await http.post("/api/agent", json=[1]), 422, "VALIDATION_ERROR")
    assert problem["errors"][0]["field"] == "body"


async def test_a_bad_last_event_id_is_echoed_as_sent(http: httpx.AsyncClient) -> None:
    headers = {"Last-Event-ID": "\uff11\uff12".encode()}  # sent as UTF-8
    response = await http.get("/api/agent/owner-events", headers=headers)
    assert "'\uff11\uff12'" in assert_problem(response, 400, "INVALID_CURSOR")["detail"]


async def test_limits_are_inclusive(http: httpx.AsyncClient) -> None:
    """Just inside every limit is accepted."""
    big_metadata = {"blob": "x" * (16_384 - len('{"blob":""}'))}
    for body in (
        {"prompt": "x" * 100_000},
        {"prompt": "x", "title": "t" * 200},
        {"prompt": "x", "metadata": big_metadata},
        {"prompt": "x", "metadata": nested(20)},
        {"prompt": "x", "tools": ["get_note", "put_note", "sleep", "ask_user"] * 16},
        {"prompt": "x", "model": "openai:org/model-name:v1.2"},
        {"prompt": "x", "script": [{"text": "t"}] * 200},
        {"prompt": "x", "metadata": {"float": 1.5e300, "int": 10**30, "neg": -0.0}},
    ):
        response = await http.post("/api/agent", json=body)
        assert response.status_code == 201, (list(body), response.text[:300])
    response = await http.post(
        "/api/agent", json={"prompt": "x"}, headers={"Idempotency-Key": "k" * 255}
    )
    assert response.status_code == 201


async def test_non_json_content_types(http: httpx.AsyncClient) -> None:
    for headers in ({"Content-Type": "text/plain"}, {"Content-Type": "application/xml"}, {}):
        response = await http.post("/api/agent", content=b'{"prompt": "x"}', headers=headers)
        assert 400 <= response.status_code < 500
        assert response.headers["content-type"].startswith(PROBLEM)
    form = await http.post("/api/agent", data={"prompt": "x"})
    assert 400 <= form.status_code < 500
    empty = await http.post("/api/agent", content=b"", headers=JSON)
    assert_problem(empty, 422, "VALIDATION_ERROR")


# --- rename and messages --------------------------------------------------------------------


async def test_rename_rejects_bad_titles(http: httpx.AsyncClient) -> None:
    sid = await new_session(http, "target")
    for body in (
        {"title": ""},
        {"title": "t" * 201},
        {"title": None},
        {"title": 5},
        {},
        {"title": "ok", "status": "succeeded"},
        {"title": "a\u0000"},
        ["title"],
    ):
        response = await http.patch(f"/api/agent/{sid}", json=body)
        assert_problem(response, 422, "VALIDATION_ERROR")
    response = await http.patch(
        f"/api/agent/{sid}", content=raw_json('{"title": "\\ud800"}'), headers=JSON
    )
    assert_problem(response, 422, "VALIDATION_ERROR")
    assert (await http.get(f"/api/agent/{sid}")).json()["title"] == "target"


async def test_messages_reject_bad_text(http: httpx.AsyncClient) -> None:
    sid = await new_session(http, "target")
    for body in (
        {"text": ""},
        {"text": "x" * 100_001},
        {"text": None},
        {"text": 5},
        {},
        {"text": "ok", "delivery": "steer"},
        {"text": "a\u0000"},
    ):
        response = await http.post(f"/api/agent/{sid}/messages", json=body)
        assert_problem(response, 422, "VALIDATION_ERROR")
    response = await http.post(
        f"/api/agent/{sid}/messages", content=raw_json('{"text": "\\udfff"}'), headers=JSON
    )
    assert_problem(response, 422, "VALIDATION_ERROR")
    assert (await http.get(f"/api/agent/{sid}")).json()["lastSeq"] == 1


# --- ids, cursors, query parameters ---------------------------------------------------------

BAD_IDS = [
    "not-a-uuid",
    "123",
    "%20",
    "%00",
    "%ED%A0%80",
    "%FF",
    "00000000-0000-0000-0000-00000000000g",
    "00000000-0000-0000-0000-0000000000000",
    "a" * 300,
    "null",
    "..",
]


@pytest.mark.parametrize("bad_id", BAD_IDS)
async def test_non_uuid_ids_are_404_on_every_path(http: httpx.AsyncClient, bad_id: str) -> None:
    for method, path, kwargs in (
        ("GET", "", {}),
        ("PATCH", "", {"json": {"title": "x"}}),
        ("DELETE", "", {}),
        ("POST", "/cancel", {}),
        ("POST", "/messages", {"json": {"text": "x"}}),
        ("GET", "/transcript", {}),
        ("GET", "/events", {"params": {"follow": "false"}}),
    ):
        response = await http.request(method, f"/api/agent/{bad_id}{path}", **kwargs)
        if bad_id == ".." and response.status_code == 404:
            # `..` may resolve to another route; either way it is a 404 problem.
            assert response.headers["content-type"].startswith(PROBLEM)
            continue
        assert_problem(response, 404, "SESSION_NOT_FOUND")


async def test_owner_events_is_not_a_session_id(http: httpx.AsyncClient) -> None:
    for method in ("PATCH", "DELETE"):
        response = await http.request(
            method,
            "/api/agent/owner-events",
            json={"title": "x"} if method == "PATCH" else None,
        )
        assert_problem(response, 404, "SESSION_NOT_FOUND")


BAD_CURSORS = [
    "abc",
    "-1",
    "1.5.2",
    "1.",
    ".5",
    "99999999999999999999999",
    "9223372036854775808",
    "1e3",
    "0x10",
    "+5",
    "²",
    "١٢",
]


async def test_a_chunk_cursor_only_on_a_session_stream(http: httpx.AsyncClient) -> None:
    """`<seq>.<chunk>` is a token delta's id: a session stream's cursor, never an owner's."""
    sid = await new_session(http, "target")
    response = await http.get("/api/agent/owner-events", params={"lastEventId": "1.5"})
    assert_problem(response, 400, "INVALID_CURSOR")
    response = await http.get(
        f"/api/agent/{sid}/events", params={"lastEventId": "1.5", "follow": "false"}
    )
    assert response.status_code == 200
    assert "event: caught_up" in response.text


@pytest.mark.parametrize("cursor", BAD_CURSORS)
async def test_bad_cursors_on_both_streams(http: httpx.AsyncClient, cursor: str) -> None:
    sid = await new_session(http, "target")
    for path in ("/api/agent/owner-events", f"/api/agent/{sid}/events"):
        response = await http.get(path, params={"lastEventId": cursor})
        assert_problem(response, 400, "INVALID_CURSOR")
        if cursor.isascii():
            response = await http.get(path, headers={"Last-Event-ID": cursor})
            assert_problem(response, 400, "INVALID_CURSOR")
        # The header wins over the query: a bad header is refused whatever the query says.
        response = await http.get(
            path, params={"lastEventId": "0", "follow": "false"}, headers={"Last-Event-ID": "x"}
        )
        assert_problem(response, 400, "INVALID_CURSOR")
    # ... and a good header makes a bad query irrelevant.
    response = await http.get(
        f"/api/agent/{sid}/events",
        params={"lastEventId": "abc", "follow": "false"},
        headers={"Last-Event-ID": "0"},
    )
    assert response.status_code == 200
    assert "event: caught_up" in response.text


@pytest.mark.parametrize(
    "params",
    [
        {"status": "bogus"},
        {"status": "QUEUED"},
        {"status": ""},
        [("status", "queued"), ("status", "nope")],
        {"limit": 0},
        {"limit": 201},
        {"limit": -1},
        {"limit": "abc"},
        {"limit": "1.5"},
        {"limit": "99999999999999999999999"},
        {"pageToken": "x" * 600},
    ],
    ids=repr,
)
async def test_bad_list_parameters(http: httpx.AsyncClient, params: Any) -> None:
    assert_problem(await http.get("/api/agent", params=params), 422, "VALIDATION_ERROR")


@pytest.mark.parametrize(
    "page_token",
    [
        "garbage",
        "!!!",
        "é",
        "%00",
        token([1]),
        token("x"),
        token(None),
        token({"t": "2024-01-01T00:00:00+00:00"}),
        token({"t": "not a time", "i": str(uuid.uuid4())}),
        token({"t": 5, "i": str(uuid.uuid4())}),
        token({"t": "2024-01-01T00:00:00+00:00", "i": "not-a-uuid"}),
        token({"t": "2024-01-01T00:00:00+00:00", "i": 123}),
        token({"t": "2024-01-01T00:00:00+00:00", "i": [1]}),
        token({"t": ["x"], "i": {"a": 1}}),
        base64.urlsafe_b64encode(b"\xff\xfe\xfd").decode(),
    ],
)
async def test_garbage_page_tokens(http: httpx.AsyncClient, page_token: str) -> None:
    response = await http.get("/api/agent", params={"pageToken": page_token})
    assert_problem(response, 400, "INVALID_PAGE_TOKEN")


async def test_odd_but_valid_page_tokens_do_not_fail(http: httpx.AsyncClient) -> None:
    zero = str(uuid.UUID(int=0))
    for t in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "2024-01-01"):
        response = await http.get("/api/agent", params={"pageToken": token({"t": t, "i": zero})})
        assert response.status_code in (200, 400), response.text


@pytest.mark.parametrize(
    "params",
    [
        {"limit": 0},
        {"limit": 1001},
        {"after": -1},
        {"after": "x"},
        {"after": "99999999999999999999999"},
    ],
    ids=repr,
)
async def test_bad_transcript_parameters(http: httpx.AsyncClient, params: Any) -> None:
    sid = await new_session(http, "target")
    response = await http.get(f"/api/agent/{sid}/transcript", params=params)
    assert_problem(response, 422, "VALIDATION_ERROR")


async def test_bad_booleans(http: httpx.AsyncClient) -> None:
    sid = await new_session(http, "target")
    response = await http.post(f"/api/agent/{sid}/cancel", params={"wait": "maybe"})
    assert_problem(response, 422, "VALIDATION_ERROR")
    response = await http.get(f"/api/agent/{sid}/events", params={"follow": "nah"})
    assert_problem(response, 422, "VALIDATION_ERROR")
    assert (await http.get(f"/api/agent/{sid}")).json()["status"] == "queued"


# --- headers, sizes, routes -----------------------------------------------------------------


async def test_idempotency_key_bounds(server: ServerProcess, owner_key: tuple[str, str]) -> None:
    async with client(server.url, owner_key[1]) as http:
        for value in ("k" * 256, ""):
            response = await http.post(
                "/api/agent", json={"prompt": "x"}, headers={"Idempotency-Key": value}
            )
            assert_problem(response, 422, "VALIDATION_ERROR")
        assert (await http.get("/api/agent")).json()["sessions"] == []


async def test_body_over_the_limit(server: ServerProcess, owner_key: tuple[str, str]) -> None:
    async with client(server.url, owner_key[1]) as http:
        await _body_over_the_limit(http)


async def _body_over_the_limit(http: httpx.AsyncClient) -> None:
    sid = await new_session(http, "target")
    huge = json.dumps({"prompt": "x" * (MiB + 10)}).encode()

    async def chunked() -> AsyncIterator[bytes]:
        for i in range(0, len(huge), 64 * 1024):
            yield huge[i : i + 64 * 1024]

    for method, path in (
        ("POST", "/api/agent"),
        ("PATCH", f"/api/agent/{sid}"),
        ("POST", f"/api/agent/{sid}/messages"),
    ):
        # With a Content-Length, and streamed without one.
        response = await http.request(method, path, content=huge, headers=JSON)
        assert_problem(response, 413, "PAYLOAD_TOO_LARGE")
        async with httpx.AsyncClient(base_url=http.base_url, headers=http.headers) as fresh:
            response = await fresh.request(method, path, content=chunked(), headers=JSON)
            assert "content-length" not in response.request.headers
            assert_problem(response, 413, "PAYLOAD_TOO_LARGE")
    # A body under the limit but with a prompt over its own limit is a 422.
    response = await http.post("/api/agent", json={"prompt": "x" * 200_000})
    assert_problem(response, 422, "VALIDATION_ERROR")
    sessions = (await http.get("/api/agent")).json()["sessions"]
    assert [s["id"] for s in sessions] == [sid]
    assert sessions[0]["title"] == "target"


async def test_unknown_routes_and_methods(http: httpx.AsyncClient) -> None:
    sid = await new_session(http, "target")
    for path in (
        "/nope",
        "/api/agents",
        "/api",
        f"/api/agent/{sid}/unknown",
        "/api/agent/a/b/c",
    ):
        assert_problem(await http.get(path), 404, "NOT_FOUND")
    session_methods = {"GET", "PATCH", "DELETE"}
    for method, path, allowed in (
        ("PUT", "/api/agent", {"GET", "POST"}),
        ("DELETE", "/api/agent", {"GET", "POST"}),
        ("OPTIONS", "/api/agent", {"GET", "POST"}),
        ("PUT", f"/api/agent/{sid}", session_methods),
        ("POST", f"/api/agent/{sid}", session_methods),
        ("GET", f"/api/agent/{sid}/cancel", {"POST"}),
        ("GET", f"/api/agent/{sid}/messages", {"POST"}),
        ("POST", f"/api/agent/{sid}/transcript", {"GET"}),
        ("POST", "/api/agent/owner-events", session_methods),  # also a session path
        ("POST", "/healthz", {"GET"}),
    ):
        response = await http.request(method, path)
        assert_problem(response, 405, "METHOD_NOT_ALLOWED")
        # Every method of every route at the path (RFC 9110), not just the first route's.
        assert set(response.headers["allow"].split(", ")) == allowed, (method, path)


# --- fuzz -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sync_http(server: ServerProcess) -> Iterator[httpx.Client]:
    """One client for every example: a new client per request costs more than the request."""
    with httpx.Client(base_url=server.url, timeout=30) as http:
        yield http


# Any JSON value, including lone surrogates (sent as \\uXXXX escapes), NUL and non-finite floats.
any_text = st.text(st.characters(exclude_categories=()), max_size=30)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | any_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=20,
)
plausible = st.fixed_dictionaries(
    {},
    optional={
        "prompt": any_text | json_values,
        "title": any_text | json_values,
        "model": st.sampled_from(["scripted", "openai:x", "openai:", "nope"]) | json_values,
        "tools": st.lists(any_text, max_size=3) | json_values,
        "metadata": st.dictionaries(any_text, json_values, max_size=4) | json_values,
        "script": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "text": any_text | json_values,
                    "toolCalls": st.lists(
                        st.fixed_dictionaries(
                            {"name": any_text},
                            optional={"arguments": st.dictionaries(any_text, json_values)},
                        ),
                        max_size=2,
                    )
                    | json_values,
                    "stopReason": st.sampled_from(["stop", "tool_use", "x"]) | json_values,
                    "delayMs": st.integers() | json_values,
                    "chunks": st.integers() | json_values,
                },
            ),
            max_size=3,
        )
        | json_values,
        "extra": json_values,
    },
)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=plausible | json_values, idempotency=st.none() | any_text.filter(lambda s: s.isascii()))
def test_fuzz_create_never_5xx(
    sync_http: httpx.Client, owner_key: tuple[str, str], body: Any, idempotency: str | None
) -> None:
    content = json.dumps(body, ensure_ascii=True, allow_nan=True).encode()
    headers = {**JSON, "Authorization": f"Bearer {owner_key[1]}"}
    # A header value h11 can send: printable, without surrounding whitespace (it refuses " ").
    if (
        idempotency is not None
        and all(c.isprintable() for c in idempotency)
        and idempotency == idempotency.strip()
    ):
        headers["Idempotency-Key"] = idempotency
    response = sync_http.post("/api/agent", content=content, headers=headers)
    assert response.status_code < 500, (content[:300], response.text[:300])
    if response.status_code >= 400:
        assert response.headers["content-type"].startswith(PROBLEM)
        assert response.json()["code"]
    else:
        # Whatever was accepted can be read back, listed and streamed.
        session = response.json()
        assert sync_http.get(f"/api/agent/{session['id']}", headers=headers).status_code == 200
        assert sync_http.get("/api/agent", headers=headers).status_code == 200
        streamed = sync_http.get(
            f"/api/agent/{session['id']}/events", params={"follow": "false"}, headers=headers
        )
        assert streamed.status_code == 200
        assert "event: caught_up" in streamed.text


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    params=st.dictionaries(
        st.sampled_from(["status", "limit", "pageToken", "lastEventId", "after", "wait"]),
        st.text(max_size=40),
        max_size=4,
    )
)
def test_fuzz_query_parameters_never_5xx(
    sync_http: httpx.Client, owner_key: tuple[str, str], params: dict[str, str]
) -> None:
    headers = {"Authorization": f"Bearer {owner_key[1]}"}
    for path in ("/api/agent", f"/api/agent/{uuid.UUID(int=0)}/transcript"):
        response = sync_http.get(path, params=params, headers=headers)
        assert response.status_code < 500, (path, params, response.text[:300])
    with sync_http.stream(
        "GET", "/api/agent/owner-events", params=params, headers=headers
    ) as response:
        assert response.status_code < 500, (params, response.read()[:300])
