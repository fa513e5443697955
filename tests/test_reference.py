"""docs/reference.md is what `python -m app.reference` makes of the code, and making it fails
when a setting, a named limit or a problem code has no meaning written down. Pure: no
PostgreSQL."""

from __future__ import annotations

import subprocess
import sys

import pytest

from app import reference
from app.config import Settings
from app.errors import ProblemCode


def test_the_committed_reference_is_the_generated_one() -> None:
    assert reference.COMMITTED.read_text() == reference.render(), (
        "docs/reference.md is stale: run `python -m app.reference --write`"
    )


def test_every_setting_limit_and_code_is_in_it() -> None:
    text = reference.COMMITTED.read_text()
    for name in Settings.model_fields:
        assert f"_{name.upper()}`" in text or f"`{name.upper()}`" in text, name
    assert "`FERRYMAN_EMBEDDED_CHECK_INTERVAL`" in text
    for name in reference.named_limits()[1]:
        assert f"| `{name}` |" in text, name
    for code in ProblemCode:
        assert f"| `{code}` |" in text, code


@pytest.mark.parametrize(
    ("table", "name"),
    [
        (reference.SETTINGS, "embedded_check_interval"),
        (reference.NAMED_LIMITS, "MAX_TOOLS"),
        (reference.PROBLEM_CODES, ProblemCode.TOO_MANY_STREAMS),
    ],
)
def test_a_name_without_a_meaning_fails_naming_it(
    monkeypatch: pytest.MonkeyPatch, table: dict[object, object], name: object
) -> None:
    monkeypatch.delitem(table, name)
    with pytest.raises(reference.MissingReference, match=f"{name} has no meaning"):
        reference.render()


def test_a_meaning_for_a_name_that_is_gone_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(reference.SETTINGS, "retired_setting", "Once meant something.")
    with pytest.raises(reference.MissingReference, match="retired_setting is in app/reference"):
        reference.render()


def test_a_status_that_disagrees_with_the_code_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(reference.PROBLEM_CODES, ProblemCode.SESSION_NOT_FOUND, (410, "Gone."))
    with pytest.raises(reference.MissingReference, match="SessionNotFound answers 404"):
        reference.render()


def test_the_command_prints_it() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "app.reference"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == reference.COMMITTED.read_text()
