"""`ferryman --show-completion` and `--install-completion`: click's shell completion (bash, zsh,
fish) for the shell $SHELL names. Imported only by those two options.

Completion itself needs no Ferryman code: click answers it when `_FERRYMAN_COMPLETE` is set
(`eval "$(_FERRYMAN_COMPLETE=bash_source ferryman)"` does what the installed script does).
"""

from __future__ import annotations

import os
from pathlib import Path

import click
from click.shell_completion import get_completion_class

from ferryman.cli.common import Exit


def _script(ctx: click.Context) -> tuple[str, str, str]:
    """The shell's name, the program's name and its completion script."""
    root = ctx.find_root()
    prog_name = root.info_name or "ferryman"
    shell = Path(os.environ.get("SHELL", "")).name
    completion = get_completion_class(shell)
    if completion is None:
        click.echo(f"Shell {shell or '(unknown: $SHELL is not set)'} is not supported.", err=True)
        raise Exit(1)
    complete_var = "_{}_COMPLETE".format(prog_name.replace("-", "_").upper())
    return shell, prog_name, completion(root.command, {}, prog_name, complete_var).source()


def show(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    click.echo(_script(ctx)[2])
    raise Exit(0)


def install(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    shell, prog_name, script = _script(ctx)
    home = Path.home()
    if shell == "bash":
        path = home / ".bash_completions" / f"{prog_name}.sh"
        _add_line(home / ".bashrc", f"source '{path}'")
    elif shell == "zsh":
        path = home / ".zfunc" / f"_{prog_name}"
        _add_line(home / ".zshrc", "fpath+=~/.zfunc; autoload -Uz compinit; compinit")
    else:
        path = home / ".config" / "fish" / "completions" / f"{prog_name}.fish"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{script}\n")
    click.secho(f"{shell} completion installed in {path}", fg="green")
    click.echo("Completion will take effect once you restart the terminal")
    raise Exit(0)


def _add_line(rc: Path, line: str) -> None:
    text = rc.read_text() if rc.is_file() else ""
    if line not in text.splitlines():
        rc.write_text(f"{text.rstrip()}\n{line}\n" if text.strip() else f"{line}\n")
