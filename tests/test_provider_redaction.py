"""Provider error text as a tenant reads it: nothing naming the operator's account (keys, bearer
tokens, organization, project and request ids, emails). The cleaning by property; then a real
worker calling the OpenAI adapter against a real local HTTP server (tests/fake_provider.py) that
answers 429 and 401 bodies as OpenAI's, naming an organization, a key and a request id."""

from __future__ import annotations

import string

from hypothesis import assume, given
from hypothesis import strategies as st

from app.agent.models import ModelFault
from app.agent.models.faults import fault_for_status
from app.agent.models.redact import redact_provider_text
from tests.fake_provider import FakeProvider, Reply
from tests.support import (
    ServerProcess,
    StartWorker,
    client,
    new_session,
    of_type,
    ready,
    transcript,
    wait_for_status,
)

ALNUM = string.ascii_letters + string.digits
token = st.text(alphabet=ALNUM, min_size=8, max_size=40)
secrets = st.one_of(
    token.map(lambda t: f"sk-{t}"),
    token.map(lambda t: f"sk-proj-{t}"),
    token.map(lambda t: f"sk-ant-api03-{t}"),
    token.map(lambda t: f"org-{t}"),
    token.map(lambda t: f"proj_{t}"),
    token.map(lambda t: f"req_{t}"),
    token.map(lambda t: f"user-{t}"),
    st.uuids().map(str),
    st.tuples(token, token).map(lambda p: f"{p[0]}@{p[1].lower()}.com"),
)
# Text around a secret: words and punctuation, as providers write.
words = st.text(alphabet=string.ascii_lowercase + " .,:()0123456789", max_size=60)


@given(words, secrets, words)
def test_a_secret_never_survives(before: str, secret: str, after: str) -> None:
    assume(secret not in before and secret not in after)
    cleaned = redact_provider_text(f"{before} {secret} {after}")
    assert secret not in cleaned


@given(token, words)
def test_bearer_tokens_and_named_keys_are_cut(value: str, around: str) -> None:
    assume(value not in around)
    for text in (
        f"{around} Authorization: Bearer {value} {around}",
        f'{around} {{"api_key": "{value}"}}',
        f"{around} https://host/v1?key={value}&x=1",
        f"{around} https://me:{value}@host/v1",
    ):
        assert value not in redact_provider_text(text)


@given(words)
def test_plain_words_pass_unchanged(text: str) -> None:
    assert redact_provider_text(text) == text


@given(st.text(max_size=200))
def test_cleaning_is_idempotent(text: str) -> None:
    once = redact_provider_text(text)
    assert redact_provider_text(once) == once


def test_what_went_wrong_stays() -> None:
    openai_429 = (
        "Rate limit reached for gpt-4o in organization org-AbC123xyz789 on tokens per min"
        " (TPM): Limit 30000, Used 29000, Requested 2000. Please try again in 2s."
    )
    cleaned = redact_provider_text(openai_429)
    assert "org-AbC123xyz789" not in cleaned
    assert cleaned.startswith("Rate limit reached for gpt-4o in organization org-[redacted]")
    assert "Limit 30000" in cleaned
    masked = "Incorrect API key provided: sk-proj-****************************abcd."
    assert redact_provider_text(masked) == "Incorrect API key provided: sk-[redacted]"


def test_every_fault_is_cleaned() -> None:
    fault = fault_for_status(401, "bad key sk-ant-api03-SECRETSECRET for jo@example.com")
    assert "SECRET" not in fault.message and "jo@example.com" not in fault.message
    assert "SECRET" not in str(fault)
    assert "SECRET" not in ModelFault("connection_error", "Bearer SECRETSECRET").message


ORG = "org-Z9yX8wV7uT6sR5qP"
KEY = "sk-proj-Ab12Cd34Ef56Gh78Ij90Kl"
REQUEST = "req_5f1c2e9a8b7d4c3e2f1a0b9c8d7e6f5a"
EMAIL = "billing@operator.example"


def openai_error(status: int, message: str, type_: str, code: str, **headers: str) -> Reply:
    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return Reply(status=status, body=body, headers={"x-request-id": REQUEST, **headers})


async def test_a_tenant_reads_no_account_of_the_operator(
    api: ServerProcess, key: str, start_worker: StartWorker, fake: FakeProvider
) -> None:
    env = {
        "FERRYMAN_MODEL_RETRY_INITIAL_DELAY": "0.05",
        "FERRYMAN_MODEL_RETRY_MAX_DELAY": "1",
        "FERRYMAN_MODEL_MAX_RETRIES": "3",
        "FERRYMAN_OPENAI_BASE_URL": fake.openai_url,
    }
    await ready(start_worker(env))
    limited = (
        f"Rate limit reached for gpt-4o in organization {ORG} on requests per min (RPM):"
        f" Limit 3, Used 3, Requested 1. Request id {REQUEST}. Contact {EMAIL}."
    )
    refused = f"Incorrect API key provided: {KEY}. You can find your API key at platform."
    fake.answer(
        openai_error(429, limited, "requests", "rate_limit_exceeded", **{"retry-after": "0.1"}),
        openai_error(401, refused, "invalid_request_error", "invalid_api_key"),
    )
    async with client(api.url, key) as http:
        sid = await new_session(http, model="openai:fake-model")
        session = await wait_for_status(http, sid, {"failed"}, timeout=30)
        events = await transcript(http, sid)
    retries = of_type(events, "model_retry")
    assert [r["data"]["reason"] for r in retries] == ["rate_limited"]
    shown = f"{retries[0]['data']['message']} | {session['error']['message']}"
    assert session["error"]["code"] == "MODEL_AUTH_FAILED"
    for secret in (ORG, KEY, REQUEST, EMAIL, KEY[-6:]):
        assert secret not in shown
    assert "Rate limit reached" in shown and "Incorrect API key provided" in shown
    assert "429" in shown and "401" in shown
    # Nothing else the tenant can read names them either.
    for event in events:
        assert ORG not in str(event) and KEY not in str(event)
