"""OpenTelemetry traces after the GenAI semantic conventions (docs/tracing.md): a span per run
(`invoke_agent`), per model call (`chat <model>`) and per tool call (`execute_tool <name>`).

Off unless the standard `OTEL_*` variables name an exporter: then `setup` installs the SDK's
tracer provider. Off, nothing here makes a span or imports the SDK, and every helper returns at
once (the span helpers a shared no-op context manager), so tracing that is off costs a flag
test per step.

A run's span ids are derived from its session and attempt (`run_ids`), so the run that resumes
a session links to the run it took over without either storing anything: the first run's start
is logged by the claim, before any span exists.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any
from uuid import UUID

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from app.agent.conversation import (
    AssistantMessage,
    Message,
    Summary,
    ToolCall,
    ToolResult,
    UserMessage,
    model_visible,
)

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
    from opentelemetry.sdk.trace.export import SpanExporter

    from app.agent.models.base import DeltaSink, Model, ModelRequest
    from app.agent.tools import Tool

# The exporters OTEL_TRACES_EXPORTER may name, and the OTLP protocols.
EXPORTERS = ("otlp", "console")
PROTOCOLS = ("http/protobuf", "grpc")
# Query parameters never put in a span: the streams take a token in `access_token` (a browser's
# EventSource cannot send headers).
SECRET_PARAMETERS = frozenset({"access_token", "token", "api_key", "key"})
# Routes whose requests make no span: probes and scrapes, every few seconds.
UNTRACED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
# Characters an attribute keeps (a conversation in `gen_ai.input.messages` grows with the
# session) unless OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT or OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT
# says otherwise.
ATTRIBUTE_MAX_CHARS = 65_536
_LENGTH_LIMITS = ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT")

_NOOP: AbstractContextManager[None] = contextlib.nullcontext()
# Set while a run's span starts: the ids it takes (`RunIds`).
_next_ids: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "ferryman_run_ids", default=None
)


class TracingError(ValueError):
    """The OTEL_* variables ask for what cannot be had; the message says what to change."""


class _State:
    tracer: trace.Tracer | None = None
    content = False  # FERRYMAN_TRACE_CONTENT


_state = _State()


def enabled() -> bool:
    return _state.tracer is not None


def setup(trace_content: bool, environ: Mapping[str, str] | None = None) -> bool:
    """Install the SDK's tracer provider with the exporters the OTEL_* variables name; False
    (nothing installed: the API's no-op tracer stays) when they name none."""
    env = os.environ if environ is None else environ
    exporters = [_exporter(name, env) for name in exporter_names(env)]
    if not exporters:
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from app import __version__

    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "ferryman"}))
    # SpanLimits reads the variables itself when given no length.
    length = None if any(env.get(n) for n in _LENGTH_LIMITS) else ATTRIBUTE_MAX_CHARS
    provider = TracerProvider(
        resource=resource,
        id_generator=_run_id_generator(),
        span_limits=SpanLimits(max_span_attribute_length=length),
    )
    provider.add_span_processor(_query_redactor())  # first: before any exporter sees a span
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _state.tracer = provider.get_tracer("ferryman", __version__)
    _state.content = trace_content
    return True


def exporter_names(env: Mapping[str, str]) -> list[str]:
    """The exporters asked for: OTEL_TRACES_EXPORTER, or `otlp` when only an OTLP endpoint is
    set; none when neither is, or OTEL_SDK_DISABLED is true."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    named = env.get("OTEL_TRACES_EXPORTER")
    if named is None:
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        return ["otlp"] if endpoint else []
    names = [n.strip().lower() for n in named.split(",") if n.strip()]
    if "none" in names:
        return []
    for name in names:
        if name not in EXPORTERS:
            raise TracingError(
                f"OTEL_TRACES_EXPORTER={named!r}: Ferryman exports traces with "
                f"{' or '.join(EXPORTERS)} (or none)"
            )
    return names


def _exporter(name: str, env: Mapping[str, str]) -> SpanExporter:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError as exc:
            raise TracingError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the gRPC exporter: "
                "pip install 'ferryman[otel-grpc]'"
            ) from exc
        return GrpcExporter()  # endpoint, headers, timeout: from the OTEL_* variables
    if protocol != "http/protobuf":
        raise TracingError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: Ferryman speaks {' or '.join(PROTOCOLS)}"
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _run_id_generator() -> Any:
    from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator

    class RunIds(IdGenerator):
        """Random ids, but a run's span takes the ids `run_ids` derives (`_next_ids`)."""

        random = RandomIdGenerator()

        def generate_span_id(self) -> int:
            ids = _next_ids.get()
            return ids[1] if ids else self.random.generate_span_id()

        def generate_trace_id(self) -> int:
            ids = _next_ids.get()
            return ids[0] if ids else self.random.generate_trace_id()

    return RunIds()


def _query_redactor() -> SpanProcessor:
    from opentelemetry.sdk.trace import SpanProcessor

    class RedactQuery(SpanProcessor):
        """Blanks the secret parameters of a server span's `url.query` as the span starts
        (FastAPI's own HTTP spans record the query; a stream's carries its token)."""

        def on_start(self, span: Span, parent_context: Any = None) -> None:
            query = (span.attributes or {}).get("url.query")
            if isinstance(query, str):
                span.set_attribute("url.query", redact_query(query))

        def on_end(self, span: ReadableSpan) -> None:
            pass

    return RedactQuery()


def redact_query(query: str) -> str:
    """`query` with the value of every parameter named in SECRET_PARAMETERS replaced."""
    parts = []
    for part in query.split("&"):
        name, equals, _ = part.partition("=")
        secret = name.lower() in SECRET_PARAMETERS
        parts.append(f"{name}{equals}REDACTED" if secret and equals else part)
    return "&".join(parts)


def untraced(scope: Mapping[str, Any]) -> bool:
    """FastAPI's `telemetry.exclude`: requests that make no span."""
    return scope.get("path") in UNTRACED_PATHS


# --- runs ------------------------------------------------------------------------------------


def run_ids(session_id: UUID, attempt: int) -> tuple[int, int]:
    """The trace id and span id of the run of `session_id` at `attempt`."""
    digest = hashlib.sha256(f"{session_id}:{attempt}".encode()).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:24], "big") or 1
    return trace_id, span_id


def invoke_agent(row: Mapping[str, Any]) -> AbstractContextManager[None]:
    """The span of a run of the claimed session `row`, current while the run goes on."""
    if _state.tracer is None:
        return _NOOP
    return _run_span(_state.tracer, row)


@contextlib.contextmanager
def _run_span(tracer: trace.Tracer, row: Mapping[str, Any]) -> Iterator[None]:
    session_id, attempt = row["id"], int(row["attempt"])
    agent = row.get("assistant_id")
    provider, model = provider_and_model(str(row["model"]))
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.conversation.id": str(session_id),
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": model,
        "ferryman.session.id": str(session_id),
        "ferryman.run.attempt": attempt,
    }
    if agent is not None:
        attributes["gen_ai.agent.id"] = str(agent)
    if row.get("lease_worker_id"):
        attributes["ferryman.worker.id"] = str(row["lease_worker_id"])
    token = _next_ids.set(run_ids(session_id, attempt))
    try:
        span = tracer.start_span(
            f"invoke_agent {agent or session_id}",
            context=trace.set_span_in_context(trace.INVALID_SPAN),  # a trace of its own
            kind=SpanKind.INTERNAL,
            attributes=attributes,
        )
    finally:
        _next_ids.reset(token)
    with trace.use_span(span, end_on_exit=True):
        yield


def link_run(session_id: UUID, attempt: int, reason: str) -> None:
    """Link the current run's span to the span of the run at `attempt`, which it continues
    (`reason`: crash, shutdown, follow_up)."""
    if _state.tracer is None:
        return
    trace_id, span_id = run_ids(session_id, attempt)
    taken_over = trace.SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED)
    )
    attributes: dict[str, AttributeValue] = {
        "ferryman.resume.reason": reason,
        "ferryman.run.attempt": attempt,
    }
    trace.get_current_span().add_link(taken_over, attributes)


def run_ended(status: str) -> None:
    """The current run's outcome: the session's status, or why the run stopped."""
    if _state.tracer is None:
        return
    span = trace.get_current_span()
    span.set_attribute("ferryman.run.outcome", status)
    if status == "failed":
        span.set_status(Status(StatusCode.ERROR, "the session failed"))


def retried(attempt: int, delay: float, reason: str, message: str) -> None:
    """A model call that failed is tried again (`model_retry`): an event of the run's span."""
    if _state.tracer is None:
        return
    attributes: dict[str, AttributeValue] = {
        "ferryman.retry.attempt": attempt,
        "ferryman.retry.delay_ms": round(delay * 1000),
        "error.type": reason,
        "exception.message": message,
    }
    trace.get_current_span().add_event("model_retry", attributes)


# --- model calls -----------------------------------------------------------------------------


def provider_and_model(name: str) -> tuple[str, str]:
    """`openai:gpt-4o` → (`openai`, `gpt-4o`); `scripted` → (`ferryman`, `scripted`)."""
    provider, colon, model = name.partition(":")
    return (provider, model) if colon else ("ferryman", name)


def traced_model(name: str, model: Model) -> Model:
    """`model`, each of whose calls is a `chat` span (as it is, when tracing is off)."""
    return model if _state.tracer is None else TracedModel(name, model)


class TracedModel:
    def __init__(self, name: str, model: Model) -> None:
        self.provider, self.name = provider_and_model(name)
        self.model = model

    async def complete(self, request: ModelRequest, on_delta: DeltaSink) -> AssistantMessage:
        tracer = _state.tracer
        if tracer is None:
            return await self.model.complete(request, on_delta)
        attributes = self.request_attributes(request)
        with tracer.start_as_current_span(
            f"chat {self.name}", kind=SpanKind.CLIENT, attributes=attributes
        ) as span:
            try:
                reply = await self.model.complete(request, on_delta)
            except Exception as exc:
                kind = getattr(exc, "kind", None) or type(exc).__qualname__
                span.set_attribute("error.type", str(kind))
                raise
            span.set_attributes(reply_attributes(reply))
            if reply.stop_reason == "error":
                span.set_status(Status(StatusCode.ERROR, "the model answered an error"))
            return reply

    def request_attributes(self, request: ModelRequest) -> dict[str, Any]:
        settings = request.settings
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": self.provider,
            "gen_ai.request.model": self.name,
        }
        for key, value in (
            ("gen_ai.request.temperature", settings.temperature),
            ("gen_ai.request.top_p", settings.top_p),
            ("gen_ai.request.max_tokens", settings.max_tokens),
            ("gen_ai.request.stop_sequences", list(settings.stop) if settings.stop else None),
        ):
            if value is not None:
                attributes[key] = value
        if request.compacting:
            attributes["ferryman.compaction"] = True
        if _state.content:
            attributes["gen_ai.input.messages"] = _json(input_messages(request.conversation))
            if request.instructions:
                attributes["gen_ai.system_instructions"] = _json(
                    [{"type": "text", "content": request.instructions}]
                )
            if request.tools:
                attributes["gen_ai.tool.definitions"] = _json(
                    [{"type": "function", "name": t.name} for t in request.tools]
                )
        return attributes


# Our stop reasons as the conventions name them.
_FINISH_REASONS = {"tool_use": "tool_call"}


def reply_attributes(reply: AssistantMessage) -> dict[str, Any]:
    reason = _FINISH_REASONS.get(reply.stop_reason, reply.stop_reason)
    attributes: dict[str, Any] = {"gen_ai.response.finish_reasons": [reason]}
    if reply.usage is not None:
        attributes["gen_ai.usage.input_tokens"] = reply.usage.input_tokens
        attributes["gen_ai.usage.output_tokens"] = reply.usage.output_tokens
    if _state.content:
        output = {**_message_parts(reply), "finish_reason": reason}
        attributes["gen_ai.output.messages"] = _json([output])
    return attributes


def input_messages(conversation: tuple[Message, ...]) -> list[dict[str, Any]]:
    """The conversation a provider is shown, in the conventions' message form."""
    return [_message_parts(m) for m in model_visible(conversation)]


def _message_parts(message: Message) -> dict[str, Any]:
    if isinstance(message, UserMessage):
        return {"role": "user", "parts": [{"type": "text", "content": message.text}]}
    if isinstance(message, Summary):
        return {"role": "user", "parts": [{"type": "text", "content": message.prompt_text()}]}
    if isinstance(message, ToolResult):
        part = {"type": "tool_call_response", "id": message.tool_call_id}
        return {"role": "tool", "parts": [{**part, "response": message.content}]}
    assert isinstance(message, AssistantMessage)
    parts: list[dict[str, Any]] = []
    if message.text:
        parts.append({"type": "text", "content": message.text})
    for call in message.tool_calls:
        parts.append(
            {"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments}
        )
    return {"role": "assistant", "parts": parts}


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


# --- tool calls ------------------------------------------------------------------------------


def execute_tool(call: ToolCall, tool: Tool | None) -> AbstractContextManager[None]:
    """The span of one tool call (of `tool`, None: unknown), current while the tool runs."""
    if _state.tracer is None:
        return _NOOP
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": call.name,
        "gen_ai.tool.call.id": call.id,
        "gen_ai.tool.type": "function",
    }
    if tool is not None and tool.description:
        attributes["gen_ai.tool.description"] = tool.description
    if _state.content:
        attributes["gen_ai.tool.call.arguments"] = _json(call.arguments)
    return _state.tracer.start_as_current_span(
        f"execute_tool {call.name}", kind=SpanKind.INTERNAL, attributes=attributes
    )  # type: ignore[return-value]  # yields the span, which callers ignore


def tool_result(result: ToolResult) -> None:
    """How the current tool call ended."""
    if _state.tracer is None:
        return
    span = trace.get_current_span()
    if _state.content:
        span.set_attribute("gen_ai.tool.call.result", result.content)
    if result.is_error:
        kind = "timeout" if result.timed_out else "tool_error"
        span.set_attribute("error.type", kind)
        span.set_status(Status(StatusCode.ERROR, kind))
