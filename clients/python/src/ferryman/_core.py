"""What `Ferryman` and `AsyncFerryman` share, so that each of them is only a transport: every
API call as a request and the parser of its answer, the settings, and the reconnect logic of
a stream."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar
from urllib.parse import quote

import httpx
from httpx_sse import ServerSentEvent

from ferryman.errors import ApiError, FerrymanConnectionError, api_error
from ferryman.events import StreamEvent

if TYPE_CHECKING:
    from ferryman.models import (
        ApprovalAccepted,
        Assistant,
        AssistantPage,
        AssistantVersions,
        CancelAccepted,
        CompactionAccepted,
        MessageAccepted,
        RunWebhookSecret,
        Schedule,
        SchedulePage,
        Session,
        SessionPage,
        ToolCatalog,
        Transcript,
        Webhook,
        WebhookDeliveryPage,
        WebhookList,
    )

DEFAULT_URL = "http://127.0.0.1:8000"
OWNER_EVENTS = "/api/agent/owner-events"
# The most a list or transcript page may hold: iterators take pages this big.
MAX_LIST_LIMIT = 200
MAX_TRANSCRIPT_LIMIT = 1000

T = TypeVar("T")


@dataclass(frozen=True)
class Settings:
    base_url: str
    api_key: str | None
    timeout: float
    reconnect_delay: float
    max_reconnect_delay: float
    # A stream silent this long is taken as dead (the server pings every 15 s).
    stream_idle_timeout: float | None

    @classmethod
    def resolve(
        cls,
        base_url: str | None,
        api_key: str | None,
        timeout: float,
        reconnect_delay: float,
        max_reconnect_delay: float,
        stream_idle_timeout: float | None,
    ) -> Settings:
        url = base_url or os.environ.get("FERRYMAN_URL") or DEFAULT_URL
        key = api_key if api_key is not None else os.environ.get("FERRYMAN_API_KEY")
        return cls(
            url.rstrip("/"),
            key or None,
            timeout,
            reconnect_delay,
            max_reconnect_delay,
            stream_idle_timeout,
        )

    def http_options(self) -> dict[str, Any]:
        """Keyword arguments for `httpx.Client` and `httpx.AsyncClient` alike."""
        headers = {"User-Agent": "ferryman-python"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        options: dict[str, Any] = {
            "base_url": self.base_url,
            "headers": headers,
            "timeout": self.timeout,
        }
        if self.base_url.startswith("http://"):
            # No TLS to verify: skip loading the CA bundle (~0.1 s of every CLI command). The
            # client follows no redirects, so it never reaches an https URL it did not verify.
            options["verify"] = False
        return options

    @property
    def stream_timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.timeout, read=self.stream_idle_timeout)


# --- calls ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request, and how to read its successful answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: dict[str, Any] | None = None
    json: Any = None
    headers: dict[str, str] | None = None

    def request_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"params": self.params, "headers": self.headers}
        if self.json is not None:
            options["json"] = self.json
        return options

    def result(self, response: httpx.Response) -> T:
        if response.status_code >= 400:
            raise api_error(response)
        return self.parse(response)

    def raw(self) -> Call[Any]:
        """This request, answering the API's JSON as it came (None for an empty body)."""
        return replace(self, parse=_json)


# The models (and so pydantic) are imported by the first answer parsed into one: a call made
# `raw()`, or a stream, never imports them.


def _models() -> Any:
    from ferryman import models

    return models


def _model(name: str) -> Callable[[httpx.Response], Any]:
    return lambda response: getattr(_models(), name).model_validate_json(response.content)


def _json(response: httpx.Response) -> Any:
    return response.json() if response.content else None


def _nothing(_: httpx.Response) -> None:
    return None


def _cancelled(response: httpx.Response) -> Session | CancelAccepted:
    # 200: with wait=true, the session once terminal; 202: the request is recorded.
    model = _models().Session if response.status_code == 200 else _models().CancelAccepted
    answer: Session | CancelAccepted = model.model_validate_json(response.content)
    return answer


def _session_path(session_id: str) -> str:
    return f"/api/agent/{_segment(session_id)}"


def create_session(
    prompt: str | None,
    *,
    title: str | None,
    model: str | None,
    instructions: str | None,
    model_settings: dict[str, Any] | None,
    tools: list[str] | None,
    approval_required: list[str] | None,
    script: list[dict[str, Any]] | None,
    metadata: dict[str, Any] | None,
    idempotency_key: str | None,
    assistant_id: str | None = None,
    assistant_version: int | None = None,
    delegates: list[str] | None = None,
    priority: int | None = None,
) -> Call[Session]:
    fields = {
        "prompt": prompt,
        "assistantId": assistant_id,
        "assistantVersion": assistant_version,
        "title": title,
        "model": model,
        "instructions": instructions,
        "modelSettings": model_settings,
        "tools": tools,
        "approvalRequired": approval_required,
        "script": script,
        "metadata": metadata,
        "delegates": delegates,
        "priority": priority,
    }
    body = {name: value for name, value in fields.items() if value is not None}
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else None
    return Call("POST", "/api/agent", _model("Session"), json=body, headers=headers)


def list_sessions(
    status: list[str] | str | None, limit: int, page_token: str | None
) -> Call[SessionPage]:
    params: dict[str, Any] = {"limit": limit}
    if status:
        params["status"] = [status] if isinstance(status, str) else list(status)
    if page_token:
        params["pageToken"] = page_token
    return Call("GET", "/api/agent", _model("SessionPage"), params=params)


def get_session(session_id: str) -> Call[Session]:
    return Call("GET", _session_path(session_id), _model("Session"))


def rename_session(session_id: str, title: str) -> Call[Session]:
    return Call("PATCH", _session_path(session_id), _model("Session"), json={"title": title})


def delete_session(session_id: str) -> Call[None]:
    return Call("DELETE", _session_path(session_id), _nothing)


def cancel_session(session_id: str, wait: bool) -> Call[Session | CancelAccepted]:
    path = f"{_session_path(session_id)}/cancel"
    return Call("POST", path, _cancelled, params={"wait": "true" if wait else "false"})


def send_message(session_id: str, text: str) -> Call[MessageAccepted]:
    path = f"{_session_path(session_id)}/messages"
    return Call("POST", path, _model("MessageAccepted"), json={"text": text})


def fork_session(
    session_id: str, at_seq: int, message: str | None, title: str | None
) -> Call[Session]:
    fields = {"atSeq": at_seq, "message": message, "title": title}
    body = {name: value for name, value in fields.items() if value is not None}
    return Call("POST", f"{_session_path(session_id)}/fork", _model("Session"), json=body)


def compact_session(session_id: str) -> Call[CompactionAccepted]:
    path = f"{_session_path(session_id)}/compact"
    return Call("POST", path, _model("CompactionAccepted"))


def decide_tool_call(
    session_id: str, tool_call_id: str, approved: bool, reason: str | None
) -> Call[ApprovalAccepted]:
    body: dict[str, Any] = {"approved": approved}
    if reason is not None:
        body["reason"] = reason
    path = f"{_session_path(session_id)}/tool-calls/{_segment(tool_call_id)}/approval"
    return Call("POST", path, _model("ApprovalAccepted"), json=body)


class Unset:
    """The default of a field `update_assistant` leaves as it is (None clears it)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET = Unset()


def _page(limit: int, page_token: str | None) -> dict[str, Any]:
    """The query of one page of a list."""
    return {"limit": limit, **({"pageToken": page_token} if page_token else {})}


def _assistant_path(assistant_id: str) -> str:
    return f"/api/assistants/{_segment(assistant_id)}"


def create_assistant(
    name: str,
    *,
    model: str,
    description: str | None,
    instructions: str | None,
    model_settings: dict[str, Any] | None,
    tools: list[str] | None,
    approval_required: list[str] | None,
    metadata: dict[str, Any] | None,
) -> Call[Assistant]:
    fields = {
        "name": name,
        "model": model,
        "description": description,
        "instructions": instructions,
        "modelSettings": model_settings,
        "tools": tools,
        "approvalRequired": approval_required,
        "metadata": metadata,
    }
    body = {key: value for key, value in fields.items() if value is not None}
    return Call("POST", "/api/assistants", _model("Assistant"), json=body)


def list_assistants(
    name: str | None, metadata: dict[str, Any] | None, limit: int, page_token: str | None
) -> Call[AssistantPage]:
    params: dict[str, Any] = {"limit": limit}
    if name:
        params["name"] = name
    if metadata is not None:
        params["metadata"] = json.dumps(metadata)
    if page_token:
        params["pageToken"] = page_token
    return Call("GET", "/api/assistants", _model("AssistantPage"), params=params)


def get_assistant(assistant_id: str) -> Call[Assistant]:
    return Call("GET", _assistant_path(assistant_id), _model("Assistant"))


def update_assistant(assistant_id: str, changes: dict[str, Any]) -> Call[Assistant]:
    """`changes` by wire name; an UNSET value is left out, None clears the field."""
    body = {key: value for key, value in changes.items() if not isinstance(value, Unset)}
    return Call("PATCH", _assistant_path(assistant_id), _model("Assistant"), json=body)


def assistant_versions(
    assistant_id: str, limit: int, page_token: str | None
) -> Call[AssistantVersions]:
    path = f"{_assistant_path(assistant_id)}/versions"
    return Call("GET", path, _model("AssistantVersions"), params=_page(limit, page_token))


def delete_assistant(assistant_id: str) -> Call[None]:
    return Call("DELETE", _assistant_path(assistant_id), _nothing)


def wire_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments (`model_settings`) as the API's fields (`modelSettings`), UNSET ones
    left out."""
    wire = {}
    for name, value in fields.items():
        if not isinstance(value, Unset):
            first, *rest = name.split("_")
            wire[first + "".join(part.title() for part in rest)] = value
    return wire


def _schedule_path(schedule_id: str) -> str:
    return f"/api/schedules/{_segment(schedule_id)}"


def create_schedule(cron: str, prompt: str, fields: dict[str, Any]) -> Call[Schedule]:
    """`fields` by keyword name: the schedule's own and the session's (None: left out)."""
    given = {key: value for key, value in wire_fields(fields).items() if value is not None}
    body = {"cron": cron, "prompt": prompt, **given}
    return Call("POST", "/api/schedules", _model("Schedule"), json=body)


def list_schedules(limit: int, page_token: str | None) -> Call[SchedulePage]:
    return Call("GET", "/api/schedules", _model("SchedulePage"), params=_page(limit, page_token))


def get_schedule(schedule_id: str) -> Call[Schedule]:
    return Call("GET", _schedule_path(schedule_id), _model("Schedule"))


def update_schedule(schedule_id: str, changes: dict[str, Any]) -> Call[Schedule]:
    """`changes` by keyword name; None clears a session field or the title."""
    body = wire_fields(changes)
    return Call("PATCH", _schedule_path(schedule_id), _model("Schedule"), json=body)


def delete_schedule(schedule_id: str) -> Call[None]:
    return Call("DELETE", _schedule_path(schedule_id), _nothing)


def _webhook_path(webhook_id: str) -> str:
    return f"/api/webhooks/{_segment(webhook_id)}"


def create_webhook(url: str, events: list[str]) -> Call[Webhook]:
    body = {"url": url, "events": events}
    return Call("POST", "/api/webhooks", _model("Webhook"), json=body)


def rotate_run_webhook_secret() -> Call[RunWebhookSecret]:
    return Call("POST", "/api/webhooks/run-secret", _model("RunWebhookSecret"))


def list_webhooks() -> Call[WebhookList]:
    return Call("GET", "/api/webhooks", _model("WebhookList"))


def get_webhook(webhook_id: str) -> Call[Webhook]:
    return Call("GET", _webhook_path(webhook_id), _model("Webhook"))


def update_webhook(webhook_id: str, url: str | None, events: list[str] | None) -> Call[Webhook]:
    fields = {"url": url, "events": events}
    body = {key: value for key, value in fields.items() if value is not None}
    return Call("PATCH", _webhook_path(webhook_id), _model("Webhook"), json=body)


def delete_webhook(webhook_id: str) -> Call[None]:
    return Call("DELETE", _webhook_path(webhook_id), _nothing)


def webhook_deliveries(
    webhook_id: str, limit: int, page_token: str | None
) -> Call[WebhookDeliveryPage]:
    path = f"{_webhook_path(webhook_id)}/deliveries"
    return Call("GET", path, _model("WebhookDeliveryPage"), params=_page(limit, page_token))


def list_tools() -> Call[ToolCatalog]:
    return Call("GET", "/api/tools", _model("ToolCatalog"))


def transcript(session_id: str, after: int, limit: int) -> Call[Transcript]:
    path = f"{_session_path(session_id)}/transcript"
    return Call("GET", path, _model("Transcript"), params={"after": after, "limit": limit})


def _segment(value: str) -> str:
    """`value` as one path segment, whatever it holds (a `/` or `..` must not move the path)."""
    segment = quote(value, safe="")
    return segment.replace(".", "%2E") if segment in (".", "..") else segment


# --- streams ----------------------------------------------------------------------------------


class Backoff:
    """Delays doubling from `first` up to `cap`, each jittered to 50-100 % of itself so that
    clients cut off together do not all come back together."""

    def __init__(self, first: float, cap: float) -> None:
        self.first = first
        self.cap = cap
        self.delay = first

    def reset(self) -> None:
        self.delay = self.first

    def next(self) -> float:
        delay = self.delay * (0.5 + random.random() / 2)
        self.delay = min(self.delay * 2, self.cap)
        return delay


# Raised into a stream's loop: all of them mean "connect again" (unless `Stream.failed` says no).
STREAM_ERRORS = (httpx.TransportError, FerrymanConnectionError, ApiError)


@dataclass
class Stream:
    """One logical stream over as many connections as it takes. It keeps the cursor (the last
    durable id), decides which failures end it and how long to wait before the next
    connection; the clients only move the bytes.

    `on_resync`: "end" stops after yielding `resync_required`; "snapshot" asks the client for a
    fresh list snapshot and goes on from its cursor. `follow=False` ends after `caught_up`. A
    session stream ends on a 404 once it has been open (the session was deleted)."""

    path: str
    cursor: str | None
    backoff: Backoff
    timeout: httpx.Timeout
    on_resync: Literal["end", "snapshot"] = "end"
    follow: bool = True
    ends_on_404: bool = False
    # Told True when a connection opens, False when it is lost.
    on_connection: Callable[[bool], None] | None = None
    ended: bool = field(default=False, init=False)
    needs_snapshot: bool = field(default=False, init=False)
    opened_once: bool = field(default=False, init=False)

    def request_options(self) -> dict[str, Any]:
        headers = {"Last-Event-ID": self.cursor} if self.cursor is not None else {}
        params = {} if self.follow else {"follow": "false"}
        return {"headers": headers, "params": params, "timeout": self.timeout}

    def opened(self, response: httpx.Response) -> None:
        """Check the answer (its body read if it is an error)."""
        if response.status_code >= 400:
            raise api_error(response)
        self.opened_once = True
        self.backoff.reset()
        self._tell(True)

    def receive(self, sse: ServerSentEvent) -> StreamEvent | None:
        if not sse.data:
            return None  # the `retry:` block
        try:
            envelope = json.loads(sse.data)
        except ValueError as exc:
            raise httpx.RemoteProtocolError(f"a frame that is not JSON: {exc}") from exc
        if not isinstance(envelope, dict):
            raise httpx.RemoteProtocolError("a frame that is not a JSON object")
        # Its own `id:` when it names the frame's envelope (a durable event) or its chunk (a
        # token delta's `<seq>.<chunk>`): like EventSource, httpx-sse repeats the last id on
        # control frames.
        chunk = envelope.get("chunk")
        own = bool(sse.id) and (
            envelope.get("id") == sse.id
            or (isinstance(chunk, int) and sse.id.endswith(f".{chunk}"))
        )
        event = StreamEvent.of(sse.event, sse.id if own else None, envelope)
        if event.id is not None:
            self.cursor = event.id
        if event.type == "resync_required":
            self.needs_snapshot = self.on_resync == "snapshot"
            self.ended = self.on_resync == "end"
        if event.type == "caught_up" and not self.follow:
            self.ended = True
        return event

    @property
    def interrupted(self) -> bool:
        """Whether to stop reading this connection."""
        return self.ended or self.needs_snapshot

    def closed(self) -> None:
        """The connection ended without an error."""
        if not self.ended:
            self._tell(False)

    def failed(self, error: Exception) -> None:
        """A failure that means "connect again" returns; any other is raised."""
        self._tell(False)
        if isinstance(error, ApiError):
            if error.status == 404 and self.ends_on_404 and self.opened_once:
                self.ended = True
            elif not error.retryable:
                raise error

    def delay(self) -> float:
        return 0.0 if self.needs_snapshot else self.backoff.next()

    def snapshot(self, cursor: str) -> None:
        self.cursor = cursor
        self.needs_snapshot = False

    def _tell(self, connected: bool) -> None:
        if self.on_connection is not None:
            self.on_connection(connected)


class ClientBase:
    """Settings and the making of streams, for both clients."""

    settings: Settings

    @property
    def base_url(self) -> str:
        return self.settings.base_url

    def _backoff(self) -> Backoff:
        return Backoff(self.settings.reconnect_delay, self.settings.max_reconnect_delay)

    def _session_stream(self, session_id: str, after: int | str | None, follow: bool) -> Stream:
        return Stream(
            f"{_session_path(session_id)}/events",
            str(after) if after is not None else None,
            self._backoff(),
            self.settings.stream_timeout,
            follow=follow,
            ends_on_404=True,
        )

    def _owner_stream(
        self,
        cursor: str | None,
        on_resync: Literal["end", "snapshot"] = "snapshot",
        on_connection: Callable[[bool], None] | None = None,
    ) -> Stream:
        return Stream(
            OWNER_EVENTS,
            cursor,
            self._backoff(),
            self.settings.stream_timeout,
            on_resync=on_resync,
            on_connection=on_connection,
        )
