"""A provider's error text as a tenant may read it: with what names the operator's account at
that provider taken out. Every provider's failure reaches the session (`model_retry.message`,
the session's `error.message`) through `ModelFault`, which cleans its message here; the words
that say what went wrong (the status, "rate limit", "invalid api key") stay.

Taken out: API keys (`sk-...`, `sk-ant-...`, `sk-proj-...`, Google's `AIza...`), bearer tokens
and `key=`/`api_key: ...` values, credentials in a URL, organization, project and user ids
(`org-...`, `proj_...`, `user-...`), request ids (`req_...`: the provider ties them to the
account), UUIDs (Anthropic names an organization by one) and email addresses.
Pure: no I/O."""

from __future__ import annotations

import re

# Each pattern and what stands in for what it matches (a group 1, when there, is kept).
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Credentials in a URL: scheme://user:password@host.
    (re.compile(r"(\b[a-z][a-z0-9+.-]*://)[^/\s:@]+(?::[^/\s@]*)?@", re.I), r"\1[redacted]@"),
    # Emails (before ids: an address may hold one).
    (re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"), "[email]"),
    # Bearer tokens, and named keys or tokens: `api_key=...`, `"x-api-key": "..."`, `?key=...`.
    (re.compile(r"(\bbearer\s+)[^\s\"',;]+", re.I), r"\1[redacted]"),
    (
        re.compile(
            r"((?:\b(?:x-)?api[_-]?key|\baccess[_-]?token|\bsecret|\bpassword|[?&]key)"
            r"[\"']?\s*[:=]\s*[\"']?)[^\s\"',;&]+",
            re.I,
        ),
        r"\1[redacted]",
    ),
    # Keys by their form: OpenAI and Anthropic (`sk-`, masked or not), Google (`AIza`).
    (re.compile(r"\bsk-[A-Za-z0-9_*.-]{3,}"), "sk-[redacted]"),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{10,}"), "[redacted key]"),
    # Account ids: organizations, projects, users, request ids.
    (re.compile(r"\borg-[A-Za-z0-9]{4,}"), "org-[redacted]"),
    (re.compile(r"\bproj_[A-Za-z0-9]{4,}"), "proj_[redacted]"),
    (re.compile(r"\buser-[A-Za-z0-9]{4,}"), "user-[redacted]"),
    (re.compile(r"\breq_[A-Za-z0-9]{4,}"), "req_[redacted]"),
    (
        re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I),
        "[redacted id]",
    ),
)


def redact_provider_text(text: str) -> str:
    """`text` with the operator's keys, account ids, request ids and emails replaced."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text
