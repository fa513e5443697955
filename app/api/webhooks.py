"""The webhooks API of SPEC section 12: an owner's subscriptions and their deliveries
(docs/webhooks.md). The subscription's signing secret is answered once, by the create."""

from __future__ import annotations

import base64
import secrets
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Path, Query, Response, status
from pydantic import BaseModel, Field, field_validator, model_validator

from app.api.deps import DatabaseDep, Owner, ServicesDep
from app.api.openapi import problems
from app.api.schemas import DateTime, Request, Uuid
from app.api.sessions import ANY_ERRORS, BODY_ERRORS, decode_page_token, encode_page_token
from app.domain import MAX_WEBHOOK_URL_CHARS, WebhookEventType, rfc3339
from app.errors import WebhookNotFound
from app.store import webhooks as webhook_store
from app.webhooks.targets import allowed_hosts, check_url

router = APIRouter(prefix="/api/webhooks", tags=["webhooks"])

# A webhook's operations: 404 for an id that names none of the caller's webhooks.
WEBHOOK_ERRORS = (*ANY_ERRORS, 404)
# The bytes of a signing secret (Standard Webhooks asks for 24 to 64).
SECRET_BYTES = 32

WebhookId = Annotated[
    str, Path(description="The webhook's id.", json_schema_extra={"format": "uuid"})
]
WebhookUrl = Annotated[str, Field(min_length=1, max_length=MAX_WEBHOOK_URL_CHARS)]
Events = Annotated[
    list[WebhookEventType],
    Field(min_length=1, max_length=len(WebhookEventType), description="The events to deliver."),
]


def _distinct(events: list[WebhookEventType] | None) -> list[WebhookEventType] | None:
    if events is not None and len(set(events)) != len(events):
        raise ValueError("must not name an event twice")
    return events


class CreateWebhook(Request):
    url: WebhookUrl = Field(description="Where to POST: http(s), a public host (see allow list).")
    events: Events

    _events_distinct = field_validator("events")(_distinct)


class UpdateWebhook(Request):
    """The fields to change."""

    url: WebhookUrl | None = None
    events: Events | None = None

    _events_distinct = field_validator("events")(_distinct)

    @model_validator(mode="after")
    def _changes_something(self) -> UpdateWebhook:
        if self.url is None and self.events is None:
            raise ValueError("give url or events to change")
        return self


class Webhook(BaseModel):
    id: Uuid
    url: str
    events: list[WebhookEventType]
    createdAt: DateTime
    updatedAt: DateTime


class CreatedWebhook(Webhook):
    secret: str = Field(
        description="The signing secret, `whsec_` and base64: shown only in this answer."
    )


class RunWebhookSecret(BaseModel):
    secret: str = Field(
        description="The secret the owner's run webhooks (an Agent Protocol run create's"
        " `webhook`) are signed with from now on, `whsec_` and base64: shown only here."
    )
    createdAt: DateTime


class WebhookList(BaseModel):
    webhooks: list[Webhook]


class WebhookDelivery(BaseModel):
    id: Uuid = Field(description="Also the `webhook-id` header of every attempt.")
    sessionId: Uuid
    type: WebhookEventType
    createdAt: DateTime
    status: str = Field(description="pending, delivered or abandoned (retried for too long).")
    attempts: int
    lastStatusCode: int | None = Field(description="The receiver's last answer; null: none.")
    lastError: str | None = Field(description="An excerpt of the last failure.")
    lastAttemptAt: DateTime | None
    nextAttemptAt: DateTime | None
    deliveredAt: DateTime | None


class WebhookDeliveryList(BaseModel):
    deliveries: list[WebhookDelivery]
    nextPageToken: str | None


def webhook_view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": str(row["id"]),
        "url": row["url"],
        "events": row["events"],
        "createdAt": rfc3339(row["created_at"]),
        "updatedAt": rfc3339(row["updated_at"]),
    }


def delivery_view(row: dict[str, Any]) -> dict[str, Any]:
    pending = row["delivered_at"] is None and row["abandoned_at"] is None
    state = "pending" if pending else "delivered" if row["delivered_at"] else "abandoned"
    return {
        "id": str(row["id"]),
        "sessionId": str(row["session_id"]),
        "type": row["type"],
        "createdAt": rfc3339(row["created_at"]),
        "status": state,
        "attempts": row["attempts"],
        "lastStatusCode": row["last_status"],
        "lastError": row["last_error"],
        "lastAttemptAt": rfc3339(row["last_attempt_at"]),
        "nextAttemptAt": rfc3339(row["next_attempt_at"]) if pending else None,
        "deliveredAt": rfc3339(row["delivered_at"]),
    }


def new_secret() -> str:
    """A Standard Webhooks secret: `whsec_` and the base64 of random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def _webhook_id(raw: str) -> UUID:
    try:
        return UUID(raw)
    except ValueError:
        raise WebhookNotFound() from None


@router.post(
    "",
    operation_id="createWebhook",
    status_code=status.HTTP_201_CREATED,
    response_model=CreatedWebhook,
    # WEBHOOK_TARGET_REFUSED (422), WEBHOOK_LIMIT_REACHED (409)
    responses=problems(*ANY_ERRORS, *BODY_ERRORS, 409),
)
async def create_webhook(
    body: CreateWebhook, owner: Owner, services: ServicesDep, response: Response
) -> dict[str, Any]:
    """Subscribe a URL to events of the owner's sessions. The answer's `secret` signs every
    delivery and is never shown again."""
    check_url(body.url, allowed_hosts(services.settings.webhook_allow_hosts))
    secret = new_secret()
    async with services.db.transaction() as conn:
        row = await webhook_store.create(conn, owner, body.url, list(body.events), secret)
    response.headers["Location"] = f"/api/webhooks/{row['id']}"
    return {**webhook_view(row), "secret": secret}


@router.post(
    "/run-secret",
    operation_id="rotateRunWebhookSecret",
    status_code=status.HTTP_201_CREATED,
    response_model=RunWebhookSecret,
    responses=problems(*ANY_ERRORS),
)
async def rotate_run_secret(owner: Owner, db: DatabaseDep) -> dict[str, Any]:
    """A new signing secret for the owner's run webhooks (docs/webhooks.md#run-webhooks):
    those of runs created from now on are signed with it; those made before keep theirs."""
    async with db.transaction() as conn:
        row = await webhook_store.rotate_run_secret(conn, owner, new_secret())
    return {"secret": row["secret"], "createdAt": rfc3339(row["created_at"])}


@router.get(
    "",
    operation_id="listWebhooks",
    response_model=WebhookList,
    responses=problems(*ANY_ERRORS),
)
async def list_webhooks(owner: Owner, db: DatabaseDep) -> dict[str, Any]:
    """The owner's webhooks, newest first (at most MAX_WEBHOOKS_PER_OWNER)."""
    async with db.connection() as conn:
        rows = await webhook_store.list_all(conn, owner)
    return {"webhooks": [webhook_view(row) for row in rows]}


@router.get(
    "/{webhook_id}",
    operation_id="getWebhook",
    response_model=Webhook,
    responses=problems(*WEBHOOK_ERRORS),
)
async def get_webhook(webhook_id: WebhookId, owner: Owner, db: DatabaseDep) -> dict[str, Any]:
    async with db.connection() as conn:
        row = await webhook_store.get(conn, owner, _webhook_id(webhook_id))
    return webhook_view(row)


@router.patch(
    "/{webhook_id}",
    operation_id="updateWebhook",
    response_model=Webhook,
    responses=problems(*WEBHOOK_ERRORS, *BODY_ERRORS),  # WEBHOOK_TARGET_REFUSED (422)
)
async def update_webhook(
    webhook_id: WebhookId, body: UpdateWebhook, owner: Owner, services: ServicesDep
) -> dict[str, Any]:
    """Change the URL or the events; deliveries not yet sent go to the new URL."""
    if body.url is not None:
        check_url(body.url, allowed_hosts(services.settings.webhook_allow_hosts))
    async with services.db.transaction() as conn:
        row = await webhook_store.update(
            conn,
            owner,
            _webhook_id(webhook_id),
            url=body.url,
            events=list(body.events) if body.events is not None else None,
        )
    return webhook_view(row)


@router.delete(
    "/{webhook_id}",
    operation_id="deleteWebhook",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=problems(*WEBHOOK_ERRORS),
)
async def delete_webhook(webhook_id: WebhookId, owner: Owner, db: DatabaseDep) -> Response:
    """Deletes the webhook and its deliveries: those not yet sent are not sent."""
    async with db.transaction() as conn:
        await webhook_store.delete(conn, owner, _webhook_id(webhook_id))
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get(
    "/{webhook_id}/deliveries",
    operation_id="listWebhookDeliveries",
    response_model=WebhookDeliveryList,
    responses=problems(*WEBHOOK_ERRORS, 400, 422),  # INVALID_PAGE_TOKEN, a bad limit
)
async def list_deliveries(
    webhook_id: WebhookId,
    owner: Owner,
    db: DatabaseDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    page_token: Annotated[str | None, Query(alias="pageToken", max_length=512)] = None,
) -> dict[str, Any]:
    """The webhook's deliveries, newest first: attempts, the last status code and error."""
    after = decode_page_token(page_token) if page_token else None
    async with db.connection() as conn:
        rows, next_key = await webhook_store.deliveries(
            conn, owner, _webhook_id(webhook_id), limit=limit, after=after
        )
    return {
        "deliveries": [delivery_view(row) for row in rows],
        "nextPageToken": encode_page_token(next_key) if next_key else None,
    }
