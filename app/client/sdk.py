"""An async client for the Ferryman API whose streams survive disconnects: each reconnect
resumes from the last durable event id, so the caller sees every event exactly once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import aconnect_sse


class ApiError(Exception):
    """A problem+json answer: `status`, `code` and the whole `problem`."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        super().__init__(f"{status} {problem.get('code')}: {problem.get('detail')}")
        self.status = status
        self.code = str(problem.get("code", ""))
        self.problem = problem


def _api_error(response: httpx.Response) -> ApiError:
    """The error for a 4xx/5xx answer, whose body is problem+json (or, from a proxy, not)."""
    try:
        problem = response.json()
    except ValueError:
        problem = {"detail": response.text}
    return ApiError(response.status_code, problem)


@dataclass(frozen=True)
class StreamEvent:
    """One frame of a stream: durable events have an `id`; control and ephemeral ones do not."""

    type: str
    id: str | None
    envelope: dict[str, Any]

    @property
    def data(self) -> dict[str, Any]:
        data: dict[str, Any] = self.envelope.get("data", self.envelope)
        return data


class FerrymanClient:
    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        reconnect_delay: float = 0.5,
        max_reconnect_delay: float = 10.0,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout)
        self.reconnect_delay = reconnect_delay
        self.max_reconnect_delay = max_reconnect_delay

    async def __aenter__(self) -> FerrymanClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        response = await self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise _api_error(response)
        return response.json() if response.content else None

    # --- sessions ----------------------------------------------------------------------------

    async def create_session(
        self, prompt: str, *, idempotency_key: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        session: dict[str, Any] = await self._request(
            "POST", "/api/agent", json={"prompt": prompt, **fields}, headers=headers
        )
        return session

    async def list_sessions(
        self, *, status: list[str] | None = None, limit: int = 50, page_token: str | None = None
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = status
        if page_token:
            params["pageToken"] = page_token
        page: dict[str, Any] = await self._request("GET", "/api/agent", params=params)
        return page

    async def get_session(self, session_id: str) -> dict[str, Any]:
        session: dict[str, Any] = await self._request("GET", f"/api/agent/{session_id}")
        return session

    async def rename_session(self, session_id: str, title: str) -> dict[str, Any]:
        session: dict[str, Any] = await self._request(
            "PATCH", f"/api/agent/{session_id}", json={"title": title}
        )
        return session

    async def delete_session(self, session_id: str) -> None:
        await self._request("DELETE", f"/api/agent/{session_id}")

    async def cancel_session(self, session_id: str, *, wait: bool = False) -> dict[str, Any]:
        answer: dict[str, Any] = await self._request(
            "POST", f"/api/agent/{session_id}/cancel", params={"wait": str(wait).lower()}
        )
        return answer

    async def send_message(self, session_id: str, text: str) -> dict[str, Any]:
        answer: dict[str, Any] = await self._request(
            "POST", f"/api/agent/{session_id}/messages", json={"text": text}
        )
        return answer

    async def decide_tool_call(
        self, session_id: str, tool_call_id: str, approved: bool, *, reason: str | None = None
    ) -> dict[str, Any]:
        """Approve or deny a tool call that waits for approval (`tool_approval_requested`)."""
        body: dict[str, Any] = {"approved": approved}
        if reason is not None:
            body["reason"] = reason
        answer: dict[str, Any] = await self._request(
            "POST", f"/api/agent/{session_id}/tool-calls/{tool_call_id}/approval", json=body
        )
        return answer

    async def list_tools(self) -> list[dict[str, Any]]:
        """Every tool a session may use, with its schema, idempotency and approval policy."""
        answer: dict[str, Any] = await self._request("GET", "/api/tools")
        tools: list[dict[str, Any]] = answer["tools"]
        return tools

    async def transcript(
        self, session_id: str, *, after: int = 0, limit: int = 200
    ) -> dict[str, Any]:
        page: dict[str, Any] = await self._request(
            "GET",
            f"/api/agent/{session_id}/transcript",
            params={"after": after, "limit": limit},
        )
        return page

    # --- streams -----------------------------------------------------------------------------

    async def owner_events(self, *, cursor: str | None = None) -> AsyncIterator[StreamEvent]:
        """The owner feed from `cursor` (a list's `cursor`; None: live from now), forever.

        On `resync_required` it takes a fresh list snapshot and continues from its cursor,
        yielding the `resync_required` event first so the caller can reload its own state.
        """
        while True:
            async for event in self._stream("/api/agent/owner-events", cursor):
                if event.id is not None:
                    cursor = event.id
                yield event
            # The stream only ends after `resync_required`: go on from a fresh snapshot.
            cursor = (await self.list_sessions(limit=1))["cursor"]

    async def session_events(
        self, session_id: str, *, after: str | None = None
    ) -> AsyncIterator[StreamEvent]:
        """A session's log from seq 1 (or after `after`), then live, forever."""
        async for event in self._stream(f"/api/agent/{session_id}/events", after):
            yield event

    async def _stream(self, path: str, cursor: str | None) -> AsyncIterator[StreamEvent]:
        """One logical stream over as many connections as it takes; ends on resync."""
        delay = self.reconnect_delay
        while True:
            headers = {"Last-Event-ID": cursor} if cursor is not None else {}
            try:
                async with aconnect_sse(
                    self._http, "GET", path, headers=headers, timeout=httpx.Timeout(None)
                ) as source:
                    if source.response.status_code >= 400:
                        await source.response.aread()
                        raise _api_error(source.response)
                    delay = self.reconnect_delay
                    async for sse in source.aiter_sse():
                        if not sse.data:
                            continue  # the `retry:` block
                        envelope = json.loads(sse.data)
                        # Durable iff the frame has an `id:` naming its own envelope: like
                        # EventSource, httpx-sse repeats the last id on control frames.
                        durable = bool(sse.id) and envelope.get("id") == sse.id
                        event = StreamEvent(sse.event, sse.id if durable else None, envelope)
                        if event.id is not None:
                            cursor = event.id
                        yield event
                        if event.type == "resync_required":
                            return
            except (httpx.TransportError, httpx.RemoteProtocolError):
                pass
            except ApiError as error:
                # 429: the owner's stream slots are taken for now; wait like for a 5xx.
                if error.status < 500 and error.status != 429:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_reconnect_delay)
