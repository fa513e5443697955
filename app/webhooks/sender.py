"""Sends the outbox's due deliveries: every API and worker process runs a `Sender`, and the
claim (`store/webhooks.py`, FOR UPDATE SKIP LOCKED) gives each delivery to one of them at a
time. At least once: a delivery is marked sent only after its receiver answered 2xx, and one
whose sender died is claimed again once its hold has passed, with the same `webhook-id`.

Each attempt is signed afresh with the Standard Webhooks library (`webhook-timestamp` is the
attempt's: receivers refuse old ones), connects only to an address the SSRF guard accepted
(the URL's host pinned to it, SNI and Host kept), follows no redirect, is bounded by the
connect and read timeouts as a whole, and keeps at most an excerpt of the answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx2
from standardwebhooks.webhooks import Webhook

from app.backoff import Outage
from app.config import Settings
from app.db.pool import UNAVAILABLE_ERRORS, Connection, Database
from app.domain import rfc3339, session_view
from app.errors import WebhookTargetRefused
from app.protocols.agent_protocol.service import run_webhook_body
from app.store import webhooks as webhook_store
from app.webhooks.targets import IPAddress, allowed_hosts, parse_target, resolve

log = logging.getLogger(__name__)

# Of a receiver's answer, the delivery keeps this much text (its status code, and the body's
# start when it failed).
MAX_ERROR_CHARS = 500
# A delivery claimed is held this long past its attempt's own bound (connect + read timeouts)
# before another process may take it again: time for the attempt's outcome to be recorded.
HOLD_MARGIN = 5.0
# Prune sent and abandoned deliveries at most this often, in seconds.
PRUNE_INTERVAL = 3_600.0


def retry_delay(attempt: int, first: float, cap: float) -> float:
    """The wait after the `attempt`-th failed attempt: `first`, doubling, at most `cap`."""
    return min(cap, first * 2.0 ** min(max(attempt - 1, 0), 64))


def payload(delivery: dict[str, Any], session: dict[str, Any] | None) -> str:
    """The body: `{type, timestamp, data}`, `data` the event and its session as it is now
    (null once deleted and purged)."""
    event = dict(delivery["event"])
    event["createdAt"] = rfc3339(datetime.fromisoformat(event["createdAt"]))
    body = {
        "type": delivery["type"],
        "timestamp": rfc3339(delivery["created_at"]),
        "data": {
            "sessionId": str(delivery["session_id"]),
            "event": event,
            "session": session_view(session) if session is not None else None,
        },
    }
    return json.dumps(body, separators=(",", ":"))


def pinned_url(url: str, address: IPAddress) -> str:
    """`url` with its host replaced by `address`, so the connection goes where the guard
    looked, whatever the name resolves to a moment later."""
    parts = urlsplit(url)
    host = f"[{address}]" if address.version == 6 else str(address)
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))


class Sender:
    def __init__(self, settings: Settings, db: Database) -> None:
        self.settings = settings
        self.db = db
        self.allow = allowed_hosts(settings.webhook_allow_hosts)
        self.bound = settings.webhook_connect_timeout + settings.webhook_read_timeout
        self.outage = Outage(log, "webhook deliveries (the database)")
        self.pruned_at = 0.0

    async def run(self) -> None:
        timeout = httpx2.Timeout(
            self.settings.webhook_read_timeout, connect=self.settings.webhook_connect_timeout
        )
        # No redirects (a 3xx is a failed attempt), no proxies from the environment, and no
        # connection kept: one is made to a pinned address with one host's SNI, and must not
        # serve another host that resolves to the same address.
        async with httpx2.AsyncClient(
            timeout=timeout,
            follow_redirects=False,
            trust_env=False,
            limits=httpx2.Limits(max_keepalive_connections=0),
        ) as http:
            while True:
                sent = 0
                try:
                    sent = await self.round(http)
                    self.outage.recovered()
                    await self._maybe_prune()
                except UNAVAILABLE_ERRORS as exc:
                    self.outage.failed(exc)
                except Exception:  # a bug here must not stop this process's sending for good
                    log.exception("webhook deliveries: a round failed")
                if sent < self.settings.webhook_batch:
                    await asyncio.sleep(self.settings.webhook_poll_interval)

    async def round(self, http: httpx2.AsyncClient) -> int:
        """Claims a batch of due deliveries and sends them at once; how many it claimed."""
        async with self.db.transaction() as conn:
            claimed = await webhook_store.claim(
                conn, limit=self.settings.webhook_batch, hold=self.bound + HOLD_MARGIN
            )
        if not claimed:
            return 0
        async with self.db.connection() as conn:
            sessions = await webhook_store.sessions(conn, [d["session_id"] for d in claimed])
            bodies = [await _body(conn, d, sessions.get(d["session_id"])) for d in claimed]
        await asyncio.gather(
            *(self._deliver(http, d, body) for d, body in zip(claimed, bodies, strict=True))
        )
        return len(claimed)

    async def _deliver(self, http: httpx2.AsyncClient, delivery: dict[str, Any], body: str) -> None:
        status, error = await self._attempt(http, delivery, body)
        ok = status is not None and 200 <= status < 300
        settings = self.settings
        delay = retry_delay(
            delivery["attempts"],
            settings.webhook_retry_initial_delay,
            settings.webhook_retry_max_delay,
        )
        async with self.db.transaction() as conn:
            await webhook_store.record(
                conn,
                delivery["id"],
                delivery["attempts"],
                status=status,
                error=None if ok else error,
                ok=ok,
                delay=delay,
                max_age=settings.webhook_max_age,
            )
        if not ok:
            log.info(
                "webhook delivery %s attempt %d failed: %s",
                delivery["id"],
                delivery["attempts"],
                error,
            )

    async def _attempt(
        self, http: httpx2.AsyncClient, delivery: dict[str, Any], body: str
    ) -> tuple[int | None, str | None]:
        """One POST: the receiver's status code (None when there was no answer) and what
        went wrong, briefly."""
        target = parse_target(delivery["url"])
        try:
            async with asyncio.timeout(self.bound):
                addresses = await resolve(target, self.allow)
                return await self._post(http, delivery, body, target.host, addresses[0])
        except WebhookTargetRefused as exc:
            return None, f"refused: {exc.detail}"[:MAX_ERROR_CHARS]
        except TimeoutError:
            return None, f"no answer within {self.bound:g} s"
        except (OSError, httpx2.HTTPError) as exc:
            return None, f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]

    async def _post(
        self,
        http: httpx2.AsyncClient,
        delivery: dict[str, Any],
        body: str,
        host: str,
        address: IPAddress,
    ) -> tuple[int, str | None]:
        message_id = str(delivery["id"])
        now = datetime.now(UTC)
        signature = Webhook(delivery["secret"]).sign(message_id, now, body)
        parts = urlsplit(delivery["url"])
        headers = {
            "content-type": "application/json",
            "host": parts.netloc.rpartition("@")[2],
            "user-agent": "Ferryman-Webhooks",
            "webhook-id": message_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": signature,
        }
        request = http.build_request(
            "POST",
            pinned_url(delivery["url"], address),
            content=body.encode(),
            headers=headers,
            extensions={"sni_hostname": host},
        )
        response = await http.send(request, stream=True)
        try:
            if 200 <= response.status_code < 300:
                return response.status_code, None
            return response.status_code, await _excerpt(response)
        finally:
            await response.aclose()

    async def _maybe_prune(self) -> None:
        now = asyncio.get_running_loop().time()
        if now - self.pruned_at < PRUNE_INTERVAL:
            return
        self.pruned_at = now
        async with self.db.transaction() as conn:
            older_than = self.settings.webhook_delivery_retention_days * 86_400
            pruned = await webhook_store.prune(conn, older_than)
        if pruned:
            log.info("pruned %d webhook deliveries", pruned)


async def _body(conn: Connection, delivery: dict[str, Any], session: dict[str, Any] | None) -> str:
    """The delivery's body: a subscription's `{type, timestamp, data}`, or for a run's
    one-off webhook what LangGraph's servers send (the Agent Protocol's run)."""
    if delivery["run_start_seq"] is None:
        return payload(delivery, session)
    body = await run_webhook_body(
        conn, session, delivery["session_id"], delivery["run_start_seq"], delivery["event"]
    )
    return json.dumps(body, separators=(",", ":"))


async def _excerpt(response: httpx2.Response) -> str:
    """The status line and the start of the body, at most MAX_ERROR_CHARS: a receiver's
    answer is never read whole."""
    head = bytearray()
    with contextlib.suppress(httpx2.HTTPError):
        async for chunk in response.aiter_bytes():
            head.extend(chunk)
            if len(head) >= MAX_ERROR_CHARS:
                break
    text = head[:MAX_ERROR_CHARS].decode("utf-8", errors="replace")
    return f"HTTP {response.status_code}: {text}"[:MAX_ERROR_CHARS]
