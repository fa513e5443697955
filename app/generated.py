"""The command of a file generated from the code and committed: print it, or `--write` it over
the committed copy (whose test fails while the two differ)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def main(
    committed: Path, description: str, generate: Callable[[], str], argv: list[str] | None
) -> None:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--write", action="store_true", help=f"update {committed}")
    args = parser.parse_args(argv)
    text = generate()
    if args.write:
        committed.write_text(text)
        print(f"wrote {committed}", file=sys.stderr)
    else:
        sys.stdout.write(text)
