"""The per-owner and per-key limits a request meets (docs/tenants.md "Limits"): each check is
one statement, and none when its limit is unset, so the default path costs nothing.

- creates a minute per key (FERRYMAN_KEY_CREATES_PER_MINUTE, a key's `createsPerMinute`): a
  native create, an Agent Protocol thread or stateless run;
- messages a minute per key (FERRYMAN_KEY_MESSAGES_PER_MINUTE, `messagesPerMinute`): a native
  message, an Agent Protocol run on a thread, an AG-UI run;
- queued sessions per owner (FERRYMAN_OWNER_MAX_QUEUED): a create or run that queues one more.

A caller without a key (local mode, jwt) is counted by its owner."""

from __future__ import annotations

from typing import Literal

from fastapi import Depends

from app.api.deps import Caller, CallerDep, ProtocolCaller, ServicesDep
from app.errors import OwnerQueueFull, RateLimited
from app.services import Services
from app.store import limits as limit_store

Action = Literal["creates", "messages"]
# The key's policy field that overrides each action's setting.
POLICY_FIELDS: dict[Action, str] = {
    "creates": "createsPerMinute",
    "messages": "messagesPerMinute",
}


def rate_limit(services: Services, caller: Caller, action: Action) -> int | None:
    """The caller's limit of `action` a minute: its key's own, else the setting's; None: none."""
    own = caller.policy.get(POLICY_FIELDS[action])
    if own is not None:
        return int(own)
    settings = services.settings
    return (
        settings.key_creates_per_minute if action == "creates" else settings.key_messages_per_minute
    )


async def check_rate(services: Services, caller: Caller, action: Action) -> None:
    """Count the request in its key's minute; RateLimited (429) past the limit."""
    limit = rate_limit(services, caller, action)
    if limit is None:
        return
    subject = f"key:{caller.key_id}" if caller.key_id is not None else f"owner:{caller.owner}"
    async with services.db.connection() as conn:
        count, retry_after = await limit_store.count_rate(conn, subject, action)
    if count > limit:
        raise RateLimited(action, limit, retry_after)


async def check_queue(services: Services, owner: str) -> None:
    """OwnerQueueFull (429) when the owner has FERRYMAN_OWNER_MAX_QUEUED sessions queued."""
    limit = services.settings.owner_max_queued
    if limit is None:
        return
    async with services.db.connection() as conn:
        full = await limit_store.queued_at_least(conn, owner, limit)
    if full:
        raise OwnerQueueFull(limit)


async def _creates(services: ServicesDep, caller: CallerDep) -> None:
    await check_rate(services, caller, "creates")


async def _messages(services: ServicesDep, caller: CallerDep) -> None:
    await check_rate(services, caller, "messages")


async def _protocol_creates(services: ServicesDep, caller: ProtocolCaller) -> None:
    await check_rate(services, caller, "creates")
    await check_queue(services, caller.owner)


async def _protocol_thread(services: ServicesDep, caller: ProtocolCaller) -> None:
    await check_rate(services, caller, "creates")


async def _protocol_messages(services: ServicesDep, caller: ProtocolCaller) -> None:
    await check_rate(services, caller, "messages")
    await check_queue(services, caller.owner)


async def _queued_messages(services: ServicesDep, caller: CallerDep) -> None:
    await check_rate(services, caller, "messages")
    await check_queue(services, caller.owner)


# As a route's `dependencies`.
COUNTS_CREATE = Depends(_creates)
COUNTS_MESSAGE = Depends(_messages)
# A run of a protocol: it queues a session (or will), so the owner's queue limit too.
COUNTS_PROTOCOL_CREATE = Depends(_protocol_creates)
COUNTS_PROTOCOL_RUN = Depends(_protocol_messages)
COUNTS_AG_UI_RUN = Depends(_queued_messages)
# An Agent Protocol thread is created idle: only the rate counts.
COUNTS_PROTOCOL_THREAD = Depends(_protocol_thread)
