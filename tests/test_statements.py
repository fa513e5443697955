"""Every statement store/ puts together from parts is committed as SQL
(app/store/statements.sql), so a change of SQL reads as SQL in a review: the rendered statements
must equal the copy. After changing one, rewrite it: `python -m app.store.statements --write`."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from app.store import statements


def test_the_committed_copy_is_what_store_renders() -> None:
    assert statements.COPY.read_text() == statements.rendered(), (
        "app/store/statements.sql differs from the statements store/ renders:"
        " run `python -m app.store.statements` to see how, `--write` to rewrite it"
    )


def test_the_command_checks_the_copy() -> None:
    """Without --write it prints the difference and fails only when there is one."""
    checked = subprocess.run(
        [sys.executable, "-m", "app.store.statements"], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout == ""


def test_a_statement_name_is_registered_once() -> None:
    name = next(iter(statements.registered()))
    try:
        statements.statement(name, "SELECT 1")
    except ValueError as exc:
        assert name in str(exc)
    else:
        raise AssertionError("a second statement took a name already registered")


def test_no_sql_runs_outside_store_and_db() -> None:
    """Statements run in app/store/ (data) and app/db/ (the pool's, the migrations' and the
    embedded server's own plumbing), nowhere else: any other module calls a store function."""
    app = Path(statements.__file__).parents[1]
    running = [
        f"{path.relative_to(app.parent)}:{node.lineno}"
        for path in sorted(app.rglob("*.py"))
        if path.relative_to(app).parts[0] not in ("store", "db")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("execute", "executemany")
        and node.args
    ]
    assert running == []
