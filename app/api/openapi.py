"""The OpenAPI document, a first-class artifact: committed as docs/openapi.json (a test fails
when the app drifts from it), and shaped for the code generators people use.

FastAPI builds it from the routes; this module adds what FastAPI cannot know: the `Problem`
schema on every error answer, security that lets local mode go without a key, and the streams'
frames as schemas. `python -m app.api.openapi` prints it; `--write` updates the committed copy.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import TypeAdapter

from app import generated
from app.api.event_schemas import stream_components
from app.api.problems import PROBLEM_JSON
from app.api.schemas import KeyPolicy, Problem, SessionError, component

REF_TEMPLATE = "#/components/schemas/{model}"
COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"

SECURITY_SCHEME = "apiKey"
_SECURITY_SCHEMES = {
    SECURITY_SCHEME: {
        "type": "http",
        "scheme": "bearer",
        "description": (
            "An API key from `ferryman keys create`, as `Authorization: Bearer <key>`. Required "
            "when the server runs with FERRYMAN_AUTH=keys; with FERRYMAN_AUTH=jwt, a token of "
            "the identity provider instead. A server in local mode (the default, loopback only) "
            "needs none, and every operation also allows no credentials."
        ),
    }
}
# Either a key or nothing: the server decides by its mode. Declared once, for the document,
# so generators offer a client without a key.
_SECURITY: list[dict[str, list[str]]] = [{SECURITY_SCHEME: []}, {}]
_PUBLIC_PATHS = ("/healthz", "/readyz")

# Free-form objects the server keeps as JSON, named so generators make one type of each.
_NAMED_FIELDS = {
    ("Session", "metadata"): component("Metadata"),
    ("CreateSession", "metadata"): component("Metadata"),
    ("Session", "modelSettings"): component("ModelSettings"),
}

_STREAM_FRAMES = {
    "streamSessionEvents": ["SessionEvent", "MessageDelta", "CaughtUp", "ResyncRequired"],
    "streamOwnerEvents": ["OwnerEvent", "CaughtUp", "ResyncRequired"],
}


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses` entries: problem+json answers with these statuses."""
    return {
        status: {
            "description": HTTPStatus(status).phrase,
            "content": {PROBLEM_JSON: {"schema": component("Problem")}},
        }
        for status in statuses
    }


def build(app: FastAPI) -> dict[str, Any]:
    document = get_openapi(
        title=app.title,
        version=app.version,
        summary=app.summary,
        description=app.description,
        routes=app.routes,
        tags=app.openapi_tags,
    )
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in _extra_components().items():
        schemas.setdefault(name, schema)
    document["components"]["securitySchemes"] = _SECURITY_SCHEMES
    document["security"] = _SECURITY
    for (name, field), schema in _NAMED_FIELDS.items():
        schemas[name]["properties"][field] = schema
    _drop_titles(document["components"])
    for schema in schemas.values():
        if schema.get("additionalProperties") is False:
            _optional_not_null(schema)
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)  # FastAPI's 422 body, which this server never sends
    for path, item in document["paths"].items():
        for operation in item.values():
            if "422" in operation["responses"]:
                operation["responses"]["422"] = problems(422)[422]
            operation.pop("security", None)
            _drop_titles(operation.get("parameters", []), 3)
            for parameter in operation.get("parameters", []):
                if not parameter.get("required"):
                    _drop_null(parameter["schema"])
            if path in _PUBLIC_PATHS:
                operation["security"] = []
            frames = _STREAM_FRAMES.get(operation.get("operationId", ""))
            if frames is not None:
                operation["responses"]["200"]["content"] = {"text/event-stream": _sse(frames)}
    return document


def _drop_titles(node: Any, depth: int = 0) -> None:
    """Drop the titles pydantic gives every property ("Modelsettings"): generators name classes
    after them. A schema's own name (a component's title) stays."""
    if isinstance(node, dict):
        if depth > 2 and isinstance(node.get("title"), str):
            del node["title"]
        for value in node.values():
            _drop_titles(value, depth + 1)
    elif isinstance(node, list):
        for value in node:
            _drop_titles(value, depth + 1)


def _optional_not_null(schema: dict[str, Any]) -> None:
    """A request's optional field takes null as absent; document it as only optional, so
    generated clients get `Unset | T`, not `None | T` with a made-up class name for T."""
    required = set(schema.get("required", []))
    for name, field in schema.get("properties", {}).items():
        if name not in required:
            _drop_null(field)


def _drop_null(schema: dict[str, Any]) -> None:
    branches = schema.get("anyOf", [])
    if {"type": "null"} not in branches:
        return
    rest = [branch for branch in branches if branch != {"type": "null"}]
    del schema["anyOf"]
    if schema.get("default", ...) is None:
        del schema["default"]
    if len(rest) == 1:
        schema.update(rest[0])
    else:
        schema["anyOf"] = rest


def _extra_components() -> dict[str, dict[str, Any]]:
    """Schemas the routes only point to: they are documented, never validated by FastAPI."""
    _, definitions = TypeAdapter.json_schemas(
        [(m.__name__, "serialization", TypeAdapter(m)) for m in (Problem, SessionError, KeyPolicy)],
        ref_template=REF_TEMPLATE,
    )
    metadata = {
        "type": "object",
        "additionalProperties": True,
        "description": "Yours to keep with a session: any JSON object, up to 16 KiB.",
    }
    return {**definitions.get("$defs", {}), "Metadata": metadata, **stream_components(REF_TEMPLATE)}


def _sse(frames: list[str]) -> dict[str, Any]:
    """A `text/event-stream` media type whose items are SSE events (OpenAPI 3.2's `itemSchema`,
    as FastAPI writes it), each `data:` one JSON value of `frames`."""
    return {
        "schema": {"type": "string"},
        "itemSchema": {
            "type": "object",
            "required": ["data"],
            "properties": {
                "id": {"type": "string", "description": "Durable events only: the cursor."},
                "event": {"type": "string", "description": "The `type` of `data`."},
                "retry": {"type": "integer", "minimum": 0},
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": {"oneOf": [component(name) for name in frames]},
                },
            },
        },
    }


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def render(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> None:
    from app.main import create_app

    generated.main(COMMITTED, __doc__.splitlines()[0], lambda: render(create_app().openapi()), argv)


if __name__ == "__main__":
    main()
