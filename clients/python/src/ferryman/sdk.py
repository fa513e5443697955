"""`Ferryman` (sync) and `AsyncFerryman` (async): the same methods over httpx.Client and
httpx.AsyncClient. Requests and parsers come from `_core`, so each class only moves bytes.

Streams survive disconnects: each reconnect resumes from the last durable event id
(`Last-Event-ID`), after a jittered backoff, so the caller sees every event once."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, TypeVar, cast

import httpx
from httpx_sse import aconnect_sse, connect_sse

from ferryman import _core
from ferryman._core import (
    MAX_LIST_LIMIT,
    MAX_TRANSCRIPT_LIMIT,
    STREAM_ERRORS,
    UNSET,
    Call,
    ClientBase,
    Settings,
    Stream,
    Unset,
)
from ferryman.errors import connection_error
from ferryman.events import StreamEvent

if TYPE_CHECKING:
    # Imported by the first answer parsed into a model: `Ferryman.raw` and the streams never
    # import pydantic (a CLI command starts faster without it).
    from ferryman.models import (
        ApprovalAccepted,
        Assistant,
        AssistantPage,
        AssistantVersions,
        CancelAccepted,
        CompactionAccepted,
        Event,
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

T = TypeVar("T")


class Ferryman(ClientBase):
    """The Ferryman API, synchronously.

    `base_url` defaults to $FERRYMAN_URL, else http://127.0.0.1:8000; `api_key` to
    $FERRYMAN_API_KEY (none: no Authorization header, as local mode wants)."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        reconnect_delay: float = 0.5,
        max_reconnect_delay: float = 10.0,
        stream_idle_timeout: float | None = 60.0,
    ) -> None:
        self.settings = Settings.resolve(
            base_url, api_key, timeout, reconnect_delay, max_reconnect_delay, stream_idle_timeout
        )
        self._http = httpx.Client(**self.settings.http_options())
        self.raw = RawFerryman(self)

    def __enter__(self) -> Ferryman:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, call: Call[T]) -> T:
        try:
            response = self._http.request(call.method, call.path, **call.request_options())
        except httpx.TransportError as exc:
            raise connection_error(self.base_url, exc) from exc
        return call.result(response)

    # --- sessions ----------------------------------------------------------------------------

    def create_session(
        self,
        prompt: str | None = None,
        *,
        title: str | None = None,
        model: str | None = None,
        instructions: str | None = None,
        model_settings: dict[str, Any] | None = None,
        tools: list[str] | None = None,
        approval_required: list[str] | None = None,
        script: list[dict[str, Any]] | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        assistant_id: str | None = None,
        assistant_version: int | None = None,
        delegates: list[str] | None = None,
        priority: int | None = None,
    ) -> Session:
        """Create a queued session, or without `prompt` an idle one that runs at its first
        `send_message`. With `assistant_id`, the session runs that assistant's definition (at
        `assistant_version`, default its latest), overridden by the fields given here.
        `model_settings` and `script` are sent as they are (wire names: `maxTokens`,
        `toolCalls`, ...). The same `idempotency_key` and body give back the same session.
        `delegates`: ids of assistants the session may hand work to (docs/delegation.md).
        `priority`: -100..100, higher claimed first (unset: the key's, else 0)."""
        return self._call(
            _core.create_session(
                prompt,
                title=title,
                model=model,
                instructions=instructions,
                model_settings=model_settings,
                tools=tools,
                approval_required=approval_required,
                script=script,
                metadata=metadata,
                idempotency_key=idempotency_key,
                assistant_id=assistant_id,
                assistant_version=assistant_version,
                delegates=delegates,
                priority=priority,
            )
        )

    def list_sessions(
        self,
        *,
        status: list[str] | str | None = None,
        limit: int = 50,
        page_token: str | None = None,
    ) -> SessionPage:
        """One page, newest first; its `cursor` is where to start `owner_events`."""
        return self._call(_core.list_sessions(status, limit, page_token))

    def iter_sessions(self, *, status: list[str] | str | None = None) -> Iterator[Session]:
        """Every session (of these statuses), newest first, page after page."""
        token: str | None = None
        while True:
            page = self.list_sessions(status=status, limit=MAX_LIST_LIMIT, page_token=token)
            yield from page.sessions
            if page.next_page_token is None:
                return
            token = page.next_page_token

    def get_session(self, session_id: str) -> Session:
        return self._call(_core.get_session(session_id))

    def rename_session(self, session_id: str, title: str) -> Session:
        return self._call(_core.rename_session(session_id, title))

    def delete_session(self, session_id: str) -> None:
        """Soft delete (cancels it first if it is not terminal)."""
        self._call(_core.delete_session(session_id))

    def cancel_session(self, session_id: str, *, wait: bool = False) -> Session | CancelAccepted:
        """Request cancellation. With `wait`, the server holds the answer until the session is
        terminal (at most 30 s) and answers the Session; otherwise `CancelAccepted`."""
        return self._call(_core.cancel_session(session_id, wait))

    def send_message(self, session_id: str, text: str) -> MessageAccepted:
        """A follow-up: steers a running session, queues an idle, waiting or terminal one."""
        return self._call(_core.send_message(session_id, text))

    def fork_session(
        self,
        session_id: str,
        at_seq: int,
        *,
        message: str | None = None,
        title: str | None = None,
    ) -> Session:
        """A new session whose history is this one's log through `at_seq`; with `message`,
        the user message at `at_seq` replaced by it (edit and regenerate). Queued when
        something is left to answer, else idle; the session forked from is left as it is."""
        return self._call(_core.fork_session(session_id, at_seq, message, title))

    def compact_session(self, session_id: str) -> CompactionAccepted:
        """Ask for a compaction (docs/compaction.md): at a running session's next model call;
        a waiting or succeeded one is queued for it and settles as it was."""
        return self._call(_core.compact_session(session_id))

    def decide_tool_call(
        self, session_id: str, tool_call_id: str, approved: bool, *, reason: str | None = None
    ) -> ApprovalAccepted:
        """Approve or deny a tool call that waits for approval (`tool_approval_requested`)."""
        return self._call(_core.decide_tool_call(session_id, tool_call_id, approved, reason))

    def list_tools(self) -> ToolCatalog:
        """The tools the live workers offer, each with how many of them offer it."""
        return self._call(_core.list_tools())

    def transcript(self, session_id: str, *, after: int = 0, limit: int = 200) -> Transcript:
        """The session's events after seq `after`, one page."""
        return self._call(_core.transcript(session_id, after, limit))

    def iter_transcript(self, session_id: str, *, after: int = 0) -> Iterator[Event]:
        """Every event after seq `after` that exists now, page after page."""
        while True:
            page = self.transcript(session_id, after=after, limit=MAX_TRANSCRIPT_LIMIT)
            yield from page.events
            if page.next_after is None:
                return
            after = page.next_after

    # --- assistants --------------------------------------------------------------------------

    def create_assistant(
        self,
        name: str,
        *,
        model: str,
        description: str | None = None,
        instructions: str | None = None,
        model_settings: dict[str, Any] | None = None,
        tools: list[str] | None = None,
        approval_required: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Assistant:
        """Store an agent definition, at version 1; sessions run it with `assistant_id`."""
        return self._call(
            _core.create_assistant(
                name,
                model=model,
                description=description,
                instructions=instructions,
                model_settings=model_settings,
                tools=tools,
                approval_required=approval_required,
                metadata=metadata,
            )
        )

    def list_assistants(
        self,
        *,
        name: str | None = None,
        metadata: dict[str, Any] | None = None,
        limit: int = 50,
        page_token: str | None = None,
    ) -> AssistantPage:
        """One page, newest first: `name` in the name (any case), `metadata` contained in
        theirs."""
        return self._call(_core.list_assistants(name, metadata, limit, page_token))

    def get_assistant(self, assistant_id: str) -> Assistant:
        return self._call(_core.get_assistant(assistant_id))

    def update_assistant(
        self,
        assistant_id: str,
        *,
        name: str | Unset = UNSET,
        description: str | Unset | None = UNSET,
        model: str | Unset = UNSET,
        instructions: str | Unset | None = UNSET,
        model_settings: dict[str, Any] | Unset | None = UNSET,
        tools: list[str] | Unset | None = UNSET,
        approval_required: list[str] | Unset | None = UNSET,
        metadata: dict[str, Any] | Unset | None = UNSET,
    ) -> Assistant:
        """Write the next version with the fields given changed (None clears one; `name` and
        `model` cannot be cleared). Sessions created from earlier versions keep theirs."""
        return self._call(
            _core.update_assistant(
                assistant_id,
                {
                    "name": name,
                    "description": description,
                    "model": model,
                    "instructions": instructions,
                    "modelSettings": model_settings,
                    "tools": tools,
                    "approvalRequired": approval_required,
                    "metadata": metadata,
                },
            )
        )

    def assistant_versions(
        self, assistant_id: str, *, limit: int = 50, page_token: str | None = None
    ) -> AssistantVersions:
        """The assistant as each of its versions has it, newest first, one page."""
        return self._call(_core.assistant_versions(assistant_id, limit, page_token))

    def delete_assistant(self, assistant_id: str) -> None:
        """Sessions created from it go on with the version they pinned."""
        self._call(_core.delete_assistant(assistant_id))

    # --- schedules ---------------------------------------------------------------------------

    def create_schedule(
        self,
        cron: str,
        prompt: str,
        *,
        timezone: str = "UTC",
        overlap: str = "skip",
        enabled: bool = True,
        title: str | None = None,
        **session: Any,
    ) -> Schedule:
        """A timetable whose every tick creates a session with `prompt`: `cron` (five fields,
        or six with seconds first) read in `timezone`; `overlap` (skip, queue or allow) says
        what a tick does while the last session runs. `session`: a create's fields by keyword
        (`assistant_id`, `model`, `instructions`, `model_settings`, `tools`, ...)."""
        fields = {"timezone": timezone, "overlap": overlap, "enabled": enabled, "title": title}
        return self._call(_core.create_schedule(cron, prompt, {**fields, **session}))

    def list_schedules(self, *, limit: int = 50, page_token: str | None = None) -> SchedulePage:
        """One page of the owner's schedules, newest first."""
        return self._call(_core.list_schedules(limit, page_token))

    def get_schedule(self, schedule_id: str) -> Schedule:
        return self._call(_core.get_schedule(schedule_id))

    def update_schedule(self, schedule_id: str, **changes: Any) -> Schedule:
        """Change the fields given by keyword (`cron`, `enabled`, `tools`, ...); None clears a
        session field or the title."""
        return self._call(_core.update_schedule(schedule_id, changes))

    def pause_schedule(self, schedule_id: str) -> Schedule:
        """No tick fires until it is resumed (the ticks in between never do)."""
        return self._call(_core.update_schedule(schedule_id, {"enabled": False}))

    def resume_schedule(self, schedule_id: str) -> Schedule:
        """Fire again, from the first tick after now."""
        return self._call(_core.update_schedule(schedule_id, {"enabled": True}))

    def delete_schedule(self, schedule_id: str) -> None:
        """It fires no more; the sessions it fired stay."""
        self._call(_core.delete_schedule(schedule_id))

    # --- webhooks ----------------------------------------------------------------------------

    def create_webhook(self, url: str, events: list[str]) -> Webhook:
        """Subscribe `url` to `events`; the answer's `secret` is shown this once."""
        return self._call(_core.create_webhook(url, events))

    def list_webhooks(self) -> WebhookList:
        return self._call(_core.list_webhooks())

    def rotate_run_webhook_secret(self) -> RunWebhookSecret:
        """A new secret for the owner's Agent Protocol run webhooks: shown only here."""
        return self._call(_core.rotate_run_webhook_secret())

    def get_webhook(self, webhook_id: str) -> Webhook:
        return self._call(_core.get_webhook(webhook_id))

    def update_webhook(
        self, webhook_id: str, *, url: str | None = None, events: list[str] | None = None
    ) -> Webhook:
        return self._call(_core.update_webhook(webhook_id, url, events))

    def delete_webhook(self, webhook_id: str) -> None:
        self._call(_core.delete_webhook(webhook_id))

    def webhook_deliveries(
        self, webhook_id: str, *, limit: int = 50, page_token: str | None = None
    ) -> WebhookDeliveryPage:
        """The webhook's deliveries, newest first, one page."""
        return self._call(_core.webhook_deliveries(webhook_id, limit, page_token))

    # --- streams -----------------------------------------------------------------------------

    def session_events(
        self, session_id: str, *, after: int | str | None = None, follow: bool = True
    ) -> Iterator[StreamEvent]:
        """The session's log after seq `after` (None: from seq 1; a token delta's id
        `<seq>.<chunk>`: after that chunk of the turn streaming then), then live. Ends when a
        `follow=False` stream has caught up, when the session is deleted, or after a
        `resync_required` (the cursor is ahead of the log)."""
        return self._events(self._session_stream(session_id, after, follow))

    def owner_events(self, *, cursor: str | None = None) -> Iterator[StreamEvent]:
        """The owner's lifecycle feed after `cursor` (a list's `cursor`; None: live from now),
        forever. On `resync_required` it yields that event, then goes on from a fresh list
        snapshot's cursor: the caller should reload its own state then."""
        return self._events(self._owner_stream(cursor))

    def _events(self, stream: Stream) -> Iterator[StreamEvent]:
        while True:
            try:
                if stream.needs_snapshot:
                    stream.snapshot(self.raw.list_sessions(limit=1)["cursor"])
                with connect_sse(self._http, "GET", stream.path, **stream.request_options()) as sse:
                    if sse.response.status_code >= 400:
                        sse.response.read()
                    stream.opened(sse.response)
                    for frame in sse.iter_sse():
                        event = stream.receive(frame)
                        if event is not None:
                            yield event
                        if stream.interrupted:
                            break
                stream.closed()
            except STREAM_ERRORS as error:
                stream.failed(error)
            if stream.ended:
                return
            time.sleep(stream.delay())


class RawFerryman:
    """`Ferryman`'s calls, answering the API's JSON as it came (dicts with camelCase keys)
    instead of models: `ferryman.raw.get_session(id)["lastSeq"]`. What to print or forward
    as it is; it never imports pydantic."""

    def __init__(self, client: Ferryman) -> None:
        self._client = client

    def _call(self, call: Call[Any]) -> dict[str, Any]:
        # Every answer of these calls with a body is a JSON object.
        return cast(dict[str, Any], self._client._call(call.raw()))

    def create_session(
        self,
        prompt: str | None = None,
        *,
        title: str | None = None,
        model: str | None = None,
        instructions: str | None = None,
        model_settings: dict[str, Any] | None = None,
        tools: list[str] | None = None,
        approval_required: list[str] | None = None,
        script: list[dict[str, Any]] | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        assistant_id: str | None = None,
        assistant_version: int | None = None,
        delegates: list[str] | None = None,
        priority: int | None = None,
    ) -> dict[str, Any]:
        return self._call(
            _core.create_session(
                prompt,
                title=title,
                model=model,
                instructions=instructions,
                model_settings=model_settings,
                tools=tools,
                approval_required=approval_required,
                script=script,
                metadata=metadata,
                idempotency_key=idempotency_key,
                assistant_id=assistant_id,
                assistant_version=assistant_version,
                delegates=delegates,
                priority=priority,
            )
        )

    def list_sessions(
        self,
        *,
        status: list[str] | str | None = None,
        limit: int = 50,
        page_token: str | None = None,
    ) -> dict[str, Any]:
        return self._call(_core.list_sessions(status, limit, page_token))

    def get_session(self, session_id: str) -> dict[str, Any]:
        return self._call(_core.get_session(session_id))

    def rename_session(self, session_id: str, title: str) -> dict[str, Any]:
        return self._call(_core.rename_session(session_id, title))

    def delete_session(self, session_id: str) -> None:
        self._client._call(_core.delete_session(session_id))

    def cancel_session(self, session_id: str, *, wait: bool = False) -> dict[str, Any]:
        """The session (with `wait`, once terminal) or `{id, cancelRequested, status}`."""
        return self._call(_core.cancel_session(session_id, wait))

    def send_message(self, session_id: str, text: str) -> dict[str, Any]:
        return self._call(_core.send_message(session_id, text))

    def fork_session(
        self,
        session_id: str,
        at_seq: int,
        *,
        message: str | None = None,
        title: str | None = None,
    ) -> dict[str, Any]:
        return self._call(_core.fork_session(session_id, at_seq, message, title))

    def compact_session(self, session_id: str) -> dict[str, Any]:
        return self._call(_core.compact_session(session_id))

    def decide_tool_call(
        self, session_id: str, tool_call_id: str, approved: bool, *, reason: str | None = None
    ) -> dict[str, Any]:
        call = _core.decide_tool_call(session_id, tool_call_id, approved, reason)
        return self._call(call)

    def list_tools(self) -> dict[str, Any]:
        """`{tools: [...], workers}`, as the API answers it."""
        return self._call(_core.list_tools())

    def transcript(self, session_id: str, *, after: int = 0, limit: int = 200) -> dict[str, Any]:
        return self._call(_core.transcript(session_id, after, limit))

    # --- assistants --------------------------------------------------------------------------

    def create_assistant(
        self,
        name: str,
        *,
        model: str,
        description: str | None = None,
        instructions: str | None = None,
        model_settings: dict[str, Any] | None = None,
        tools: list[str] | None = None,
        approval_required: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return self._call(
            _core.create_assistant(
                name,
                model=model,
                description=description,
                instructions=instructions,
                model_settings=model_settings,
                tools=tools,
                approval_required=approval_required,
                metadata=metadata,
            )
        )

    def list_assistants(
        self,
        *,
        name: str | None = None,
        metadata: dict[str, Any] | None = None,
        limit: int = 50,
        page_token: str | None = None,
    ) -> dict[str, Any]:
        return self._call(_core.list_assistants(name, metadata, limit, page_token))

    def get_assistant(self, assistant_id: str) -> dict[str, Any]:
        return self._call(_core.get_assistant(assistant_id))

    def update_assistant(
        self,
        assistant_id: str,
        *,
        name: str | Unset = UNSET,
        description: str | Unset | None = UNSET,
        model: str | Unset = UNSET,
        instructions: str | Unset | None = UNSET,
        model_settings: dict[str, Any] | Unset | None = UNSET,
        tools: list[str] | Unset | None = UNSET,
        approval_required: list[str] | Unset | None = UNSET,
        metadata: dict[str, Any] | Unset | None = UNSET,
    ) -> dict[str, Any]:
        return self._call(
            _core.update_assistant(
                assistant_id,
                {
                    "name": name,
                    "description": description,
                    "model": model,
                    "instructions": instructions,
                    "modelSettings": model_settings,
                    "tools": tools,
                    "approvalRequired": approval_required,
                    "metadata": metadata,
                },
            )
        )

    def assistant_versions(
        self, assistant_id: str, *, limit: int = 50, page_token: str | None = None
    ) -> dict[str, Any]:
        return self._call(_core.assistant_versions(assistant_id, limit, page_token))

    def delete_assistant(self, assistant_id: str) -> None:
        self._client._call(_core.delete_assistant(assistant_id))

    # --- schedules ---------------------------------------------------------------------------

    def create_schedule(
        self,
        cron: str,
        prompt: str,
        *,
        timezone: str = "UTC",
        overlap: str = "skip",
        enabled: bool = True,
        title: str | None = None,
        **session: Any,
    ) -> dict[str, Any]:
        """A timetable whose every tick creates a session with `prompt`: `cron` (five fields,
        or six with seconds first) read in `timezone`; `overlap` (skip, queue or allow) says
        what a tick does while the last session runs. `session`: a create's fields by keyword
        (`assistant_id`, `model`, `instructions`, `model_settings`, `tools`, ...)."""
        fields = {"timezone": timezone, "overlap": overlap, "enabled": enabled, "title": title}
        return self._call(_core.create_schedule(cron, prompt, {**fields, **session}))

    def list_schedules(self, *, limit: int = 50, page_token: str | None = None) -> dict[str, Any]:
        """One page of the owner's schedules, newest first."""
        return self._call(_core.list_schedules(limit, page_token))

    def get_schedule(self, schedule_id: str) -> dict[str, Any]:
        return self._call(_core.get_schedule(schedule_id))

    def update_schedule(self, schedule_id: str, **changes: Any) -> dict[str, Any]:
        """Change the fields given by keyword (`cron`, `enabled`, `tools`, ...); None clears a
        session field or the title."""
        return self._call(_core.update_schedule(schedule_id, changes))

    def pause_schedule(self, schedule_id: str) -> dict[str, Any]:
        """No tick fires until it is resumed (the ticks in between never do)."""
        return self._call(_core.update_schedule(schedule_id, {"enabled": False}))

    def resume_schedule(self, schedule_id: str) -> dict[str, Any]:
        """Fire again, from the first tick after now."""
        return self._call(_core.update_schedule(schedule_id, {"enabled": True}))

    def delete_schedule(self, schedule_id: str) -> None:
        """It fires no more; the sessions it fired stay."""
        self._client._call(_core.delete_schedule(schedule_id))


class AsyncFerryman(ClientBase):
    """The Ferryman API, with asyncio: the methods of `Ferryman`, awaitable, and async
    iterators for the iterators."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        reconnect_delay: float = 0.5,
        max_reconnect_delay: float = 10.0,
        stream_idle_timeout: float | None = 60.0,
    ) -> None:
        self.settings = Settings.resolve(
            base_url, api_key, timeout, reconnect_delay, max_reconnect_delay, stream_idle_timeout
        )
        self._http = httpx.AsyncClient(**self.settings.http_options())

    async def __aenter__(self) -> AsyncFerryman:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _call(self, call: Call[T]) -> T:
        try:
            response = await self._http.request(call.method, call.path, **call.request_options())
        except httpx.TransportError as exc:
            raise connection_error(self.base_url, exc) from exc
        return call.result(response)

    # --- sessions ----------------------------------------------------------------------------

    async def create_session(
        self,
        prompt: str | None = None,
        *,
        title: str | None = None,
        model: str | None = None,
        instructions: str | None = None,
        model_settings: dict[str, Any] | None = None,
        tools: list[str] | None = None,
        approval_required: list[str] | None = None,
        script: list[dict[str, Any]] | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        assistant_id: str | None = None,
        assistant_version: int | None = None,
        delegates: list[str] | None = None,
        priority: int | None = None,
    ) -> Session:
        """See `Ferryman.create_session`."""
        return await self._call(
            _core.create_session(
                prompt,
                title=title,
                model=model,
                instructions=instructions,
                model_settings=model_settings,
                tools=tools,
                approval_required=approval_required,
                script=script,
                metadata=metadata,
                idempotency_key=idempotency_key,
                assistant_id=assistant_id,
                assistant_version=assistant_version,
                delegates=delegates,
                priority=priority,
            )
        )

    async def list_sessions(
        self,
        *,
        status: list[str] | str | None = None,
        limit: int = 50,
        page_token: str | None = None,
    ) -> SessionPage:
        return await self._call(_core.list_sessions(status, limit, page_token))

    async def iter_sessions(
        self, *, status: list[str] | str | None = None
    ) -> AsyncIterator[Session]:
        token: str | None = None
        while True:
            page = await self.list_sessions(status=status, limit=MAX_LIST_LIMIT, page_token=token)
            for session in page.sessions:
                yield session
            if page.next_page_token is None:
                return
            token = page.next_page_token

    async def get_session(self, session_id: str) -> Session:
        return await self._call(_core.get_session(session_id))

    async def rename_session(self, session_id: str, title: str) -> Session:
        return await self._call(_core.rename_session(session_id, title))

    async def delete_session(self, session_id: str) -> None:
        await self._call(_core.delete_session(session_id))

    async def cancel_session(
        self, session_id: str, *, wait: bool = False
    ) -> Session | CancelAccepted:
        return await self._call(_core.cancel_session(session_id, wait))

    async def send_message(self, session_id: str, text: str) -> MessageAccepted:
        return await self._call(_core.send_message(session_id, text))

    async def fork_session(
        self,
        session_id: str,
        at_seq: int,
        *,
        message: str | None = None,
        title: str | None = None,
    ) -> Session:
        return await self._call(_core.fork_session(session_id, at_seq, message, title))

    async def compact_session(self, session_id: str) -> CompactionAccepted:
        return await self._call(_core.compact_session(session_id))

    async def decide_tool_call(
        self, session_id: str, tool_call_id: str, approved: bool, *, reason: str | None = None
    ) -> ApprovalAccepted:
        return await self._call(_core.decide_tool_call(session_id, tool_call_id, approved, reason))

    async def list_tools(self) -> ToolCatalog:
        return await self._call(_core.list_tools())

    async def transcript(self, session_id: str, *, after: int = 0, limit: int = 200) -> Transcript:
        return await self._call(_core.transcript(session_id, after, limit))

    async def iter_transcript(self, session_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        while True:
            page = await self.transcript(session_id, after=after, limit=MAX_TRANSCRIPT_LIMIT)
            for event in page.events:
                yield event
            if page.next_after is None:
                return
            after = page.next_after

    # --- assistants --------------------------------------------------------------------------

    async def create_assistant(
        self,
        name: str,
        *,
        model: str,
        description: str | None = None,
        instructions: str | None = None,
        model_settings: dict[str, Any] | None = None,
        tools: list[str] | None = None,
        approval_required: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Assistant:
        return await self._call(
            _core.create_assistant(
                name,
                model=model,
                description=description,
                instructions=instructions,
                model_settings=model_settings,
                tools=tools,
                approval_required=approval_required,
                metadata=metadata,
            )
        )

    async def list_assistants(
        self,
        *,
        name: str | None = None,
        metadata: dict[str, Any] | None = None,
        limit: int = 50,
        page_token: str | None = None,
    ) -> AssistantPage:
        return await self._call(_core.list_assistants(name, metadata, limit, page_token))

    async def get_assistant(self, assistant_id: str) -> Assistant:
        return await self._call(_core.get_assistant(assistant_id))

    async def update_assistant(
        self,
        assistant_id: str,
        *,
        name: str | Unset = UNSET,
        description: str | Unset | None = UNSET,
        model: str | Unset = UNSET,
        instructions: str | Unset | None = UNSET,
        model_settings: dict[str, Any] | Unset | None = UNSET,
        tools: list[str] | Unset | None = UNSET,
        approval_required: list[str] | Unset | None = UNSET,
        metadata: dict[str, Any] | Unset | None = UNSET,
    ) -> Assistant:
        return await self._call(
            _core.update_assistant(
                assistant_id,
                {
                    "name": name,
                    "description": description,
                    "model": model,
                    "instructions": instructions,
                    "modelSettings": model_settings,
                    "tools": tools,
                    "approvalRequired": approval_required,
                    "metadata": metadata,
                },
            )
        )

    async def assistant_versions(
        self, assistant_id: str, *, limit: int = 50, page_token: str | None = None
    ) -> AssistantVersions:
        return await self._call(_core.assistant_versions(assistant_id, limit, page_token))

    async def delete_assistant(self, assistant_id: str) -> None:
        await self._call(_core.delete_assistant(assistant_id))

    # --- schedules ---------------------------------------------------------------------------

    async def create_schedule(
        self,
        cron: str,
        prompt: str,
        *,
        timezone: str = "UTC",
        overlap: str = "skip",
        enabled: bool = True,
        title: str | None = None,
        **session: Any,
    ) -> Schedule:
        """A timetable whose every tick creates a session with `prompt`: `cron` (five fields,
        or six with seconds first) read in `timezone`; `overlap` (skip, queue or allow) says
        what a tick does while the last session runs. `session`: a create's fields by keyword
        (`assistant_id`, `model`, `instructions`, `model_settings`, `tools`, ...)."""
        fields = {"timezone": timezone, "overlap": overlap, "enabled": enabled, "title": title}
        return await self._call(_core.create_schedule(cron, prompt, {**fields, **session}))

    async def list_schedules(
        self, *, limit: int = 50, page_token: str | None = None
    ) -> SchedulePage:
        """One page of the owner's schedules, newest first."""
        return await self._call(_core.list_schedules(limit, page_token))

    async def get_schedule(self, schedule_id: str) -> Schedule:
        return await self._call(_core.get_schedule(schedule_id))

    async def update_schedule(self, schedule_id: str, **changes: Any) -> Schedule:
        """Change the fields given by keyword (`cron`, `enabled`, `tools`, ...); None clears a
        session field or the title."""
        return await self._call(_core.update_schedule(schedule_id, changes))

    async def pause_schedule(self, schedule_id: str) -> Schedule:
        """No tick fires until it is resumed (the ticks in between never do)."""
        return await self._call(_core.update_schedule(schedule_id, {"enabled": False}))

    async def resume_schedule(self, schedule_id: str) -> Schedule:
        """Fire again, from the first tick after now."""
        return await self._call(_core.update_schedule(schedule_id, {"enabled": True}))

    async def delete_schedule(self, schedule_id: str) -> None:
        """It fires no more; the sessions it fired stay."""
        await self._call(_core.delete_schedule(schedule_id))

    # --- webhooks ----------------------------------------------------------------------------

    async def create_webhook(self, url: str, events: list[str]) -> Webhook:
        """Subscribe `url` to `events`; the answer's `secret` is shown this once."""
        return await self._call(_core.create_webhook(url, events))

    async def list_webhooks(self) -> WebhookList:
        return await self._call(_core.list_webhooks())

    async def rotate_run_webhook_secret(self) -> RunWebhookSecret:
        """A new secret for the owner's Agent Protocol run webhooks: shown only here."""
        return await self._call(_core.rotate_run_webhook_secret())

    async def get_webhook(self, webhook_id: str) -> Webhook:
        return await self._call(_core.get_webhook(webhook_id))

    async def update_webhook(
        self, webhook_id: str, *, url: str | None = None, events: list[str] | None = None
    ) -> Webhook:
        return await self._call(_core.update_webhook(webhook_id, url, events))

    async def delete_webhook(self, webhook_id: str) -> None:
        await self._call(_core.delete_webhook(webhook_id))

    async def webhook_deliveries(
        self, webhook_id: str, *, limit: int = 50, page_token: str | None = None
    ) -> WebhookDeliveryPage:
        """The webhook's deliveries, newest first, one page."""
        return await self._call(_core.webhook_deliveries(webhook_id, limit, page_token))

    # --- streams -----------------------------------------------------------------------------

    def session_events(
        self, session_id: str, *, after: int | str | None = None, follow: bool = True
    ) -> AsyncIterator[StreamEvent]:
        """See `Ferryman.session_events`."""
        return self._events(self._session_stream(session_id, after, follow))

    def owner_events(self, *, cursor: str | None = None) -> AsyncIterator[StreamEvent]:
        """See `Ferryman.owner_events`."""
        return self._events(self._owner_stream(cursor))

    async def _events(self, stream: Stream) -> AsyncGenerator[StreamEvent, None]:
        while True:
            try:
                if stream.needs_snapshot:
                    stream.snapshot((await self.list_sessions(limit=1)).cursor)
                async with aconnect_sse(
                    self._http, "GET", stream.path, **stream.request_options()
                ) as sse:
                    if sse.response.status_code >= 400:
                        await sse.response.aread()
                    stream.opened(sse.response)
                    async with contextlib.aclosing(sse.aiter_sse()) as frames:
                        async for frame in frames:
                            event = stream.receive(frame)
                            if event is not None:
                                yield event
                            if stream.interrupted:
                                break
                stream.closed()
            except STREAM_ERRORS as error:
                stream.failed(error)
            if stream.ended:
                return
            await _sleep(stream.delay())


async def _sleep(seconds: float) -> None:
    # asyncio is imported by the async client's first wait, not by every `ferryman` command.
    import asyncio

    await asyncio.sleep(seconds)
