"""The statements of store/ that are put together from parts, each by name, and their committed
copy, `app/store/statements.sql`, so that a change of SQL reads as SQL in a review.

A statement built from named parts (the fence, the owner-event CTEs, the session columns, event
type names) is a module constant rendered once, at import, and registered here by `statement`;
one written whole where it runs is its own copy and is not registered. A statement with a
bounded set of forms registers each form under a name of its own. tests/test_statements.py
fails while the copy differs from what the modules render; rewrite the copy with

    python -m app.store.statements --write
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import pkgutil
import sys
import textwrap
from pathlib import Path

COPY = Path(__file__).with_name("statements.sql")

_STATEMENTS: dict[str, str] = {}


def statement(name: str, text: str) -> str:
    """Register the statement `text` as `name`; returns it, to be run as it is."""
    if name in _STATEMENTS:
        raise ValueError(f"two statements named {name!r}")
    _STATEMENTS[name] = text
    return text


def registered() -> dict[str, str]:
    """Every statement every module of store/ registers, by name."""
    package = __name__.rpartition(".")[0]
    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
        importlib.import_module(f"{package}.{module.name}")
    return dict(sorted(_STATEMENTS.items()))


def rendered() -> str:
    """The registered statements as the copy holds them."""
    return "".join(f"-- name: {name}\n{_tidy(text)};\n\n" for name, text in registered().items())


def _tidy(text: str) -> str:
    """`text` as the copy shows it: indented from the margin, no trailing blanks."""
    lines = textwrap.dedent(text).strip().splitlines()
    return "\n".join(line.rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {COPY.name}")
    args = parser.parse_args(argv)
    text = rendered()
    if args.write:
        COPY.write_text(text)
        return 0
    committed = COPY.read_text() if COPY.exists() else ""
    diff = difflib.unified_diff(
        committed.splitlines(keepends=True),
        text.splitlines(keepends=True),
        str(COPY.name),
        "rendered",
    )
    sys.stdout.writelines(diff)
    return 0 if text == committed else 1


if __name__ == "__main__":
    # Run as the module the others register into, not as a second copy named __main__.
    from app.store.statements import main as canonical_main

    sys.exit(canonical_main())
