"""OpenTelemetry traces (docs/tracing.md) from real `ferryman serve` and `ferryman worker`
processes, exported over OTLP/HTTP to a receiver inside the test that decodes the protobuf with
opentelemetry-proto: the span tree of a session with a provider retry and a tool call, a crash
takeover's link, content only when FERRYMAN_TRACE_CONTENT asks, the streams' token never in a
span; and once over OTLP/gRPC. Plus the pure parts: which OTEL_* variables turn tracing on,
the query's redaction, the runs' ids."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from app import tracing
from tests.support import (
    ServerProcess,
    WorkerProcess,
    client,
    fresh_database,
    new_session,
    transcript,
    wait_event,
    wait_for_status,
)

# --- the receiver ----------------------------------------------------------------------------


@dataclass
class Span:
    name: str
    service: str
    trace_id: str
    span_id: str
    parent: str
    kind: int
    status: int  # 0 unset, 1 ok, 2 error
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str, dict[str, Any]]]
    start: int


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, which) if which else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


@dataclass
class Receiver:
    """An OTLP/HTTP endpoint: POST /v1/traces, protobuf in, protobuf out."""

    spans: list[Span] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    def take(self, body: bytes) -> None:
        self.take_request(ExportTraceServiceRequest.FromString(body))

    def take_request(self, request: ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            service = _attributes(resource_spans.resource.attributes).get("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    span = Span(
                        s.name,
                        service,
                        s.trace_id.hex(),
                        s.span_id.hex(),
                        s.parent_span_id.hex(),
                        s.kind,
                        s.status.code,
                        _attributes(s.attributes),
                        [(e.name, _attributes(e.attributes)) for e in s.events],
                        [
                            (x.trace_id.hex(), x.span_id.hex(), _attributes(x.attributes))
                            for x in s.links
                        ],
                        s.start_time_unix_nano,
                    )
                    with self.lock:
                        self.spans.append(span)

    def all(self) -> list[Span]:
        with self.lock:
            return list(self.spans)

    async def wait(self, predicate: Any, what: str, timeout: float = 20.0) -> list[Span]:
        deadline = time.monotonic() + timeout
        while True:
            found = [s for s in self.all() if predicate(s)]
            if found:
                return found
            if time.monotonic() > deadline:
                names = sorted({s.name for s in self.all()})
                raise AssertionError(f"no span {what} after {timeout}s; spans seen: {names}")
            await asyncio.sleep(0.1)


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    found = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            found.take(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    found.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield found
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def grpc_receiver() -> Iterator[Receiver]:
    """The same over OTLP/gRPC."""
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    found = Receiver()

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> ExportTraceServiceResponse:
            found.take_request(request)
            return ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    found.url = f"http://127.0.0.1:{port}"
    yield found
    server.stop(grace=None)


def otel_env(receiver: Receiver, service: str, **more: str) -> dict[str, str]:
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms: spans reach the receiver before a SIGKILL
        "OTEL_SERVICE_NAME": service,
        "FERRYMAN_MODEL_MAX_RETRIES": "2",  # conftest sets 0
        "FERRYMAN_MODEL_RETRY_INITIAL_DELAY": "0.05",
        **more,
    }


@pytest.fixture(scope="module")
def tracing_db() -> Iterator[str]:
    with fresh_database("ferryman_tracing") as url:
        yield url


@pytest.fixture(scope="module")
def api(tracing_db: str, receiver: Receiver) -> Iterator[ServerProcess]:
    server = ServerProcess(tracing_db, env=otel_env(receiver, "ferryman-api")).start()
    yield server
    server.stop()


@contextlib.contextmanager
def worker(url: str, receiver: Receiver, **env: str) -> Iterator[WorkerProcess]:
    process = WorkerProcess(url, env=otel_env(receiver, "ferryman-worker", **env)).start()
    try:
        yield process
    finally:
        process.stop()


def run_span_of(spans: list[Span], session_id: str, attempt: int) -> Span:
    (run,) = [
        s
        for s in spans
        if s.attributes.get("gen_ai.operation.name") == "invoke_agent"
        and s.attributes.get("ferryman.session.id") == session_id
        and s.attributes.get("ferryman.run.attempt") == attempt
    ]
    return run


def children(spans: list[Span], parent: Span) -> list[Span]:
    return sorted(
        (s for s in spans if s.parent == parent.span_id and s.trace_id == parent.trace_id),
        key=lambda s: s.start,
    )


def hex_ids(session_id: str, attempt: int) -> tuple[str, str]:
    trace_id, span_id = tracing.run_ids(uuid.UUID(session_id), attempt)
    return f"{trace_id:032x}", f"{span_id:016x}"


CALLER_TRACE, CALLER_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
PROMPT = "the secret plan is pineapples"
SCRIPT = [
    {
        "text": "noting it",
        "toolCalls": [{"name": "put_note", "arguments": {"key": "plan", "text": "pineapples"}}],
        "usage": {"inputTokens": 12, "outputTokens": 7},
        # The first play of this turn fails as a provider's 5xx would: retried once.
        "fault": {"kind": "server_error", "times": 1},
    },
    {"text": "all noted", "usage": {"inputTokens": 30, "outputTokens": 3}},
]


# --- the span tree ---------------------------------------------------------------------------


async def test_a_session_with_a_retry_and_a_tool_call(
    tracing_db: str, api: ServerProcess, receiver: Receiver
) -> None:
    with worker(tracing_db, receiver):
        async with client(api.url) as http:
            # A caller's W3C trace context: the API's span of its request is a child of it.
            response = await http.post(
                "/api/agent",
                json={
                    "prompt": PROMPT,
                    "script": SCRIPT,
                    "modelSettings": {"temperature": 0.25, "maxTokens": 200},
                },
                headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"},
            )
            assert response.status_code == 201, response.text
            session_id = response.json()["id"]
            await wait_for_status(http, session_id, {"succeeded"})
            # A stream opened as a browser's EventSource would, with its token in the query.
            response = await http.get(
                f"/api/agent/{session_id}/events",
                params={"access_token": "tok-sesame-123", "follow": "false"},
            )
            assert response.status_code == 401, response.text  # no such key: still a span
            events = await transcript(http, session_id)
        spans = await receiver.wait(
            lambda s: (
                s.attributes.get("ferryman.session.id") == session_id
                and s.attributes.get("ferryman.run.outcome") == "succeeded"
            ),
            "for the finished run",
        )
        run = run_span_of(receiver.all(), session_id, 1)

    assert run.name == f"invoke_agent {session_id}" and run.service == "ferryman-worker"
    assert (run.trace_id, run.span_id) == hex_ids(session_id, 1)
    assert run.parent == "" and run.links == []  # a trace of its own; no run before it
    assert run.attributes["gen_ai.conversation.id"] == session_id
    assert run.attributes["gen_ai.request.model"] == "scripted"
    # The provider's fault: an event of the run, with what the session's model_retry says.
    (retry,) = [attributes for name, attributes in run.events if name == "model_retry"]
    assert retry["error.type"] == "server_error" and retry["ferryman.retry.attempt"] == 1

    tree = children(receiver.all(), run)
    assert [s.name for s in tree] == [
        "chat scripted",
        "chat scripted",
        "execute_tool put_note",
        "chat scripted",
    ]
    failed, first, tool, last = tree
    assert failed.status == 2 and failed.attributes["error.type"] == "server_error"
    for chat in (failed, first, last):
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.provider.name"] == "ferryman"
        assert chat.attributes["gen_ai.request.model"] == "scripted"
        assert chat.attributes["gen_ai.request.temperature"] == 0.25
        assert chat.attributes["gen_ai.request.max_tokens"] == 200
        assert chat.kind == 3  # CLIENT
    assert first.attributes["gen_ai.response.finish_reasons"] == ["tool_call"]
    assert first.attributes["gen_ai.usage.input_tokens"] == 12
    assert first.attributes["gen_ai.usage.output_tokens"] == 7
    assert last.attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert last.attributes["gen_ai.usage.input_tokens"] == 30
    (start,) = [e for e in events if e["type"] == "tool_call_start"]
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == "put_note"
    assert tool.attributes["gen_ai.tool.call.id"] == start["data"]["toolCallId"]
    assert tool.status != 2

    # FastAPI's HTTP server spans, from the API process.
    created = await receiver.wait(
        lambda s: s.service == "ferryman-api" and s.name == "POST /api/agent", "POST /api/agent"
    )
    assert created[0].attributes["http.response.status_code"] == 201
    assert created[0].kind == 2  # SERVER
    assert (created[0].trace_id, created[0].parent) == (CALLER_TRACE, CALLER_SPAN)
    streamed = await receiver.wait(
        lambda s: s.service == "ferryman-api" and s.name == "GET /api/agent/{session_id}/events",
        "of the stream",
    )
    assert "access_token=REDACTED" in streamed[0].attributes["url.query"]
    # Neither the token nor, by default, any content is in any span.
    everything = repr([(s.attributes, s.events) for s in receiver.all()])
    assert "tok-sesame-123" not in everything
    assert "pineapples" not in everything
    assert "gen_ai.input.messages" not in everything
    assert not any(s.name in {"GET /healthz", "GET /readyz"} for s in receiver.all())
    assert spans


async def test_content_is_recorded_when_asked(
    tracing_db: str, api: ServerProcess, receiver: Receiver
) -> None:
    with worker(tracing_db, receiver, FERRYMAN_TRACE_CONTENT="true"):
        async with client(api.url) as http:
            session_id = await new_session(http, PROMPT, script=SCRIPT, instructions="Be brief.")
            await wait_for_status(http, session_id, {"succeeded"})
        await receiver.wait(
            lambda s: (
                s.attributes.get("ferryman.session.id") == session_id
                and s.attributes.get("ferryman.run.outcome") == "succeeded"
            ),
            "for the finished run",
        )
    run = run_span_of(receiver.all(), session_id, 1)
    _failed, first, tool, last = children(receiver.all(), run)

    asked = json.loads(first.attributes["gen_ai.input.messages"])
    assert asked == [{"role": "user", "parts": [{"type": "text", "content": PROMPT}]}]
    assert json.loads(first.attributes["gen_ai.system_instructions"]) == [
        {"type": "text", "content": "Be brief."}
    ]
    (said,) = json.loads(first.attributes["gen_ai.output.messages"])
    assert said["role"] == "assistant" and said["finish_reason"] == "tool_call"
    assert said["parts"][0] == {"type": "text", "content": "noting it"}
    assert said["parts"][1]["name"] == "put_note"
    assert json.loads(tool.attributes["gen_ai.tool.call.arguments"]) == {
        "key": "plan",
        "text": "pineapples",
    }
    assert "gen_ai.tool.call.result" in tool.attributes
    history = json.loads(last.attributes["gen_ai.input.messages"])
    assert [m["role"] for m in history] == ["user", "assistant", "tool"]


async def test_traces_over_grpc(
    tracing_db: str, api: ServerProcess, grpc_receiver: Receiver
) -> None:
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_INSECURE": "true"}
    with worker(tracing_db, grpc_receiver, **env):
        async with client(api.url) as http:
            session_id = await new_session(http, PROMPT, script=SCRIPT)
            await wait_for_status(http, session_id, {"succeeded"})
        await grpc_receiver.wait(
            lambda s: (
                s.attributes.get("ferryman.session.id") == session_id
                and s.attributes.get("ferryman.run.outcome") == "succeeded"
            ),
            "for the finished run",
        )
    run = run_span_of(grpc_receiver.all(), session_id, 1)
    assert [s.name for s in children(grpc_receiver.all(), run)] == [
        "chat scripted",
        "chat scripted",
        "execute_tool put_note",
        "chat scripted",
    ]


# --- a takeover ------------------------------------------------------------------------------


async def test_the_resumed_run_links_to_the_run_it_took_over(
    tracing_db: str, api: ServerProcess, receiver: Receiver
) -> None:
    script = [
        {"toolCalls": [{"name": "sleep", "arguments": {"seconds": 5}}]},
        {"text": "woke up"},
    ]
    async with client(api.url) as http:
        with worker(tracing_db, receiver) as first:
            session_id = await new_session(http, "nap", script=script)
            await wait_event(
                http,
                session_id,
                lambda e: e["type"] == "tool_call_start" and e["data"]["name"] == "sleep",
            )
            # The first run's model call ended before the tool began: exported before the kill.
            await receiver.wait(
                lambda s: s.name == "chat scripted" and s.trace_id == hex_ids(session_id, 1)[0],
                "of the first run's model call",
            )
            first.stop(signal.SIGKILL)
        with worker(tracing_db, receiver):
            await wait_for_status(http, session_id, {"succeeded"}, timeout=40)
            await receiver.wait(
                lambda s: (
                    s.attributes.get("ferryman.session.id") == session_id
                    and s.attributes.get("ferryman.run.attempt") == 2
                ),
                "of the resumed run",
            )
    spans = receiver.all()
    resumed = run_span_of(spans, session_id, 2)
    first_trace, first_span = hex_ids(session_id, 1)
    ((trace_id, span_id, attributes),) = resumed.links
    assert (trace_id, span_id) == (first_trace, first_span)
    assert attributes == {"ferryman.resume.reason": "crash", "ferryman.run.attempt": 1}
    assert resumed.trace_id != first_trace
    # The link names a span that exists: the killed run's, parent of its exported model call.
    (first_chat,) = [s for s in spans if s.trace_id == first_trace and s.name == "chat scripted"]
    assert first_chat.parent == first_span
    # The killed run's span never ended, so was never exported; its tool's neither.
    assert not any(s.span_id == first_span for s in spans)
    assert [s.name for s in children(spans, resumed)][-1] == "chat scripted"


async def test_a_follow_up_links_to_the_run_before(
    tracing_db: str, api: ServerProcess, receiver: Receiver
) -> None:
    with worker(tracing_db, receiver):
        async with client(api.url) as http:
            session_id = await new_session(http, "first")
            await wait_for_status(http, session_id, {"succeeded"})
            sent = await http.post(f"/api/agent/{session_id}/messages", json={"text": "again"})
            assert sent.status_code < 300, sent.text
            await receiver.wait(
                lambda s: (
                    s.attributes.get("ferryman.session.id") == session_id
                    and s.attributes.get("ferryman.run.attempt") == 2
                    and "ferryman.run.outcome" in s.attributes
                ),
                "of the follow-up's run",
            )
    followed = run_span_of(receiver.all(), session_id, 2)
    ((trace_id, span_id, attributes),) = followed.links
    assert (trace_id, span_id) == hex_ids(session_id, 1)
    assert attributes["ferryman.resume.reason"] == "follow_up"
    assert run_span_of(receiver.all(), session_id, 1).trace_id == trace_id


def test_a_bad_exporter_stops_the_command_at_start_up() -> None:
    # Refused before the database is looked at: the URL leads nowhere.
    env = {**os.environ, "DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none"}
    env["OTEL_TRACES_EXPORTER"] = "zipkin"
    done = subprocess.run(
        [sys.executable, "-m", "app", "worker"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "OTEL_TRACES_EXPORTER='zipkin'" in done.stderr and "Traceback" not in done.stderr


# --- pure ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({}, []),
        ({"OTEL_TRACES_EXPORTER": "none"}, []),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, ["otlp", "console"]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, []),
    ],
)
def test_which_variables_turn_tracing_on(env: dict[str, str], names: list[str]) -> None:
    assert tracing.exporter_names(env) == names


def test_an_unknown_exporter_or_protocol_is_refused() -> None:
    with pytest.raises(tracing.TracingError, match="zipkin"):
        tracing.exporter_names({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(tracing.TracingError, match="http/json"):
        tracing.setup(
            False, {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}
        )
    assert not tracing.enabled()


def test_off_by_default_the_helpers_do_nothing() -> None:
    assert not tracing.setup(False, {})
    assert not tracing.enabled()
    with tracing.invoke_agent({"id": uuid.uuid4(), "attempt": 1, "model": "scripted"}):
        pass
    model = object()
    assert tracing.traced_model("scripted", model) is model  # type: ignore[arg-type]


def test_secret_parameters_are_redacted() -> None:
    query = "after=3&access_token=abc&Token=x&plain=access_token"
    assert tracing.redact_query(query) == (
        "after=3&access_token=REDACTED&Token=REDACTED&plain=access_token"
    )


def test_run_ids_are_stable_and_distinct() -> None:
    session = uuid.uuid4()
    assert tracing.run_ids(session, 1) == tracing.run_ids(session, 1)
    assert tracing.run_ids(session, 1) != tracing.run_ids(session, 2)
    trace_id, span_id = tracing.run_ids(session, 3)
    assert 0 < trace_id < 2**128 and 0 < span_id < 2**64
