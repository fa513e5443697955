"""What a key may use (docs/tenants.md, "What a key may use"): the `tools`, `models` and
`approverFor` fields of its policy (`api_keys.policy`), checked when a key is made and matched
against an agent definition when a session is asked for. Pure: no I/O."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from app.agent.tools.mcp import SEPARATOR, SERVER_NAME_PATTERN
from app.domain import MODEL_NAME_PATTERN, OWNER_ID_PATTERN, TOOL_NAME_PATTERN
from app.errors import ModelNotAllowed, ToolNotAllowed

# Entries of one field of a policy, at most.
MAX_SCOPE_ENTRIES = 200
# `mcp:<server>`: every tool of that MCP server (named `<server>__<tool>`, docs/mcp.md).
MCP_PREFIX = "mcp:"
SCRIPTED = "scripted"
# A provider prefix (`openai:`) allows every model of that provider.
_PROVIDER_PREFIX = re.compile(r"^(openai|anthropic):$")
_MODEL = re.compile(MODEL_NAME_PATTERN)
_TOOL = re.compile(TOOL_NAME_PATTERN)
_SERVER = re.compile(SERVER_NAME_PATTERN)
# The policy fields this module owns, by their name in the policy.
SCOPE_FIELDS = ("tools", "models", "approverFor")


@dataclass(frozen=True)
class Scopes:
    """A key's scopes. `tools`/`models` None: every one; `approver_for`: the owners whose
    pending approvals the key may list and decide."""

    tools: frozenset[str] | None = None
    models: frozenset[str] | None = None
    approver_for: frozenset[str] = frozenset()


def _entries(policy: Mapping[str, Any], name: str, valid: Any, rule: str) -> list[str] | None:
    value = policy.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{name} must be a list of strings")
    if len(value) > MAX_SCOPE_ENTRIES:
        raise ValueError(f"{name} takes at most {MAX_SCOPE_ENTRIES} entries")
    bad = [v for v in value if not valid(v)]
    if bad:
        raise ValueError(f"{name}: {', '.join(map(repr, bad))} {rule}")
    return list(dict.fromkeys(value))


def _tool_entry(entry: str) -> bool:
    if entry.startswith(MCP_PREFIX):
        return _SERVER.fullmatch(entry[len(MCP_PREFIX) :]) is not None
    return _TOOL.fullmatch(entry) is not None and len(entry) <= 200


def _model_entry(entry: str) -> bool:
    return _MODEL.fullmatch(entry) is not None or _PROVIDER_PREFIX.fullmatch(entry) is not None


def _owner_entry(entry: str) -> bool:
    return OWNER_ID_PATTERN.fullmatch(entry) is not None


def check_scopes(policy: Mapping[str, Any]) -> dict[str, Any]:
    """The scope fields of `policy`, checked and without repeats (absent fields left out);
    ValueError saying what is wrong otherwise."""
    checked = {
        "tools": _entries(policy, "tools", _tool_entry, "must be tool names or `mcp:<server>`"),
        "models": _entries(
            policy,
            "models",
            _model_entry,
            "must be model names (`openai:gpt-4o`, `scripted`) or provider prefixes (`openai:`)",
        ),
        "approverFor": _entries(policy, "approverFor", _owner_entry, "must be owner ids"),
    }
    return {k: v for k, v in checked.items() if v is not None}


def parse_scopes(policy: Mapping[str, Any]) -> Scopes:
    """A stored policy's scopes (checked as a key is made; checked again here, so a hand-edited
    row that is wrong fails closed: ValueError)."""
    checked = check_scopes(policy)
    tools, models = checked.get("tools"), checked.get("models")
    return Scopes(
        tools=None if tools is None else frozenset(tools),
        models=None if models is None else frozenset(models),
        approver_for=frozenset(checked.get("approverFor", ())),
    )


def tool_allowed(scopes: Scopes, name: str) -> bool:
    """Whether the key may use the tool `name`: listed by name, or of a listed MCP server."""
    if scopes.tools is None or name in scopes.tools:
        return True
    return any(
        entry.startswith(MCP_PREFIX)
        and name.startswith(entry[len(MCP_PREFIX) :] + SEPARATOR)
        and len(name) > len(entry) - len(MCP_PREFIX) + len(SEPARATOR)
        for entry in scopes.tools
    )


def model_allowed(scopes: Scopes, model: str) -> bool:
    """Whether the key may use `model`: listed by name, or of a listed provider prefix."""
    if scopes.models is None or model in scopes.models:
        return True
    provider, colon, rest = model.partition(":")
    return bool(colon and rest) and f"{provider}:" in scopes.models


def refused_tools(scopes: Scopes, tools: Iterable[str]) -> list[str]:
    return [name for name in dict.fromkeys(tools) if not tool_allowed(scopes, name)]


def check_definition(
    scopes: Scopes, tools: list[str] | None, model: str, scripted_allowed: bool
) -> None:
    """Refuse (403) an agent definition the key may not use: ToolNotAllowed naming the tools
    (a definition that leaves `tools` unset means every tool, so a key limited in tools must
    name them), ModelNotAllowed naming the model (`scripted` too when `scripted_allowed` is
    false: keys mode without FERRYMAN_SCRIPTED_MODEL)."""
    if model == SCRIPTED and not scripted_allowed:
        raise ModelNotAllowed(
            "the scripted model is off in keys mode (FERRYMAN_SCRIPTED_MODEL=true turns it on):"
            " name a provider's model",
            model,
        )
    if not model_allowed(scopes, model):
        raise ModelNotAllowed(f"this key may not use the model {model!r}", model)
    if tools is None and scopes.tools is not None:
        raise ToolNotAllowed(
            "this key may use only some tools: name them in `tools` (unset means every tool)",
            [],
        )
    refused = refused_tools(scopes, tools or ())
    if refused:
        raise ToolNotAllowed(
            f"this key may not use {'the tool' if len(refused) == 1 else 'the tools'} "
            + ", ".join(refused),
            refused,
        )


def child_scope_problem(
    policy: Mapping[str, Any], tools: list[str] | None, model: str
) -> str | None:
    """Why a delegated child (of a session a key made, docs/delegation.md) may not be made
    with `tools` and `model` under that key's `policy`, or None when it may. The scripted
    model's setting is the server's business, checked as the delegate's assistant was written."""
    try:
        check_definition(parse_scopes(policy), tools, model, scripted_allowed=True)
    except (ToolNotAllowed, ModelNotAllowed) as exc:
        return f"the key that made this session may not delegate to this assistant: {exc.detail}"
    except ValueError as exc:
        return f"the key that made this session has a policy that does not read: {exc}"
    return None
