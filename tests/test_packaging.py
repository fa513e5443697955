"""Packaging: the migrations live in the top-level alembic/, which never shadows the Alembic
library, and ship in the wheel, so `pip install ./clients/python .` then `ferryman migrate` works
without a checkout (and `pip install -e .` finds them in the checkout). The client
(clients/python, `ferryman-client`) is a wheel of its own that installs alone, from the package
index, and works from a project with its own `app/` package."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import alembic
import psycopg
import pytest

from app.db import migrate
from tests import support
from tests.support import ServerProcess

REPO = Path(support.REPO)
# What the Dockerfile copies before `pip install .`: a wheel built from these alone must work.
SOURCES = ("pyproject.toml", "README.md", "app", "alembic")
CLIENT = REPO / "clients" / "python"
CLIENT_PACKAGE = CLIENT / "src" / "ferryman"
# What the server's wheel brings that a client must not: the server and its heavy dependencies.
SERVER_ONLY = ("app", "fastapi", "uvicorn", "psycopg", "psycopg_pool", "sqlalchemy", "alembic")
TIMEOUT = 300
pytestmark = pytest.mark.once  # builds and installs a wheel: CI runs it on one PostgreSQL
# The Alembic library, as this process imported it (its own test below checks it is no folder of
# the checkout).
LIBRARY = Path(alembic.__file__ or "").parent


def run(args: list[str | Path], cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env if env is not None else clean_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, f"{args} exited {result.returncode}:\n{result.stderr[-4000:]}"
    return result.stdout


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without anything that would put the checkout on the import path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["FERRYMAN_LOG_FORMAT"] = "console"
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the files a build reads, so building leaves nothing (build/, stale files)
    in the checkout."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(
                REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
        else:
            shutil.copy2(REPO / name, src / name)
    return src


@pytest.fixture(scope="module")
def wheel(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(source, "ferryman-*.whl", tmp_path_factory)


@pytest.fixture(scope="module")
def client_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The client's wheel, built from a copy of clients/python (an editable install leaves its
    egg-info there)."""
    source = tmp_path_factory.mktemp("client-src") / "python"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    shutil.copytree(CLIENT, source, ignore=ignore)
    return build_wheel(source, "ferryman_client-*.whl", tmp_path_factory)


def build_wheel(source: Path, pattern: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, source], cwd=dist)
    (built,) = dist.glob(pattern)
    return built


def new_venv(where: Path, install: list[str | Path]) -> Path:
    """A fresh virtualenv with Ferryman installed by `pip install --no-deps *install`. Its
    dependencies come from the test run's own site-packages, appended after its own by a .pth
    file: that directory is not a site directory, so the .pth files in it (an editable install
    of the checkout among them) are not run, and `app` can only come from the new install."""
    venv = where / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=where)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q"]
    run([*pip, *install], cwd=where)
    purelib = run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], where)
    ours = dict.fromkeys(sysconfig.get_path(k) for k in ("purelib", "platlib"))
    (Path(purelib.strip()) / "ferryman_test_deps.pth").write_text("\n".join(ours) + "\n")
    return venv


def where_things_are(venv: Path, cwd: Path) -> dict[str, Path]:
    code = (
        "import alembic, app\n"
        "from app.db import migrate\n"
        "print(app.__file__, alembic.__file__, migrate.migrations_dir(), sep='\\n')\n"
    )
    out = run([venv / "bin" / "python", "-c", code], cwd).split()
    return dict(zip(("app", "alembic", "migrations"), map(Path, out), strict=True))


def migrates(venv: Path, cwd: Path) -> None:
    """`ferryman migrate`, run from `cwd`, takes an empty database to the head revision."""
    head = migrate.head_revision()
    assert head
    with support.empty_database("ferryman_pkg") as url:
        out = run([venv / "bin" / "ferryman", "migrate"], cwd, clean_env(DATABASE_URL=url))
        assert f"revision {head}" in out
        with psycopg.connect(url) as conn:
            versions = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    assert versions == [(head,)]


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """An empty working directory outside the checkout."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return cwd


def test_the_wheel_carries_every_file_of_app_and_the_migrations(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())

    def files(top: str) -> set[str]:
        return {
            p.relative_to(REPO / top).as_posix()
            for p in (REPO / top).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }

    # pyproject.toml lists the packages one by one: a new one left out would be missing here.
    assert {f"app/{f}" for f in files("app")} - names == set()
    assert {f"app/migrations/{f}" for f in files("alembic")} - names == set()
    assert "app/migrations/versions/0001_foundation.py" in names
    # Nothing lands beside the Alembic library in site-packages.
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"app"}


def test_pip_install_then_ferryman_migrate_works_without_a_checkout(
    wheel: Path, client_wheel: Path, tmp_path: Path, elsewhere: Path
) -> None:
    # The client's wheel owns the `ferryman` script; the server's adds its commands to it.
    venv = new_venv(tmp_path, [client_wheel, wheel])
    found = where_things_are(venv, elsewhere)
    assert found["app"].is_relative_to(venv)
    assert found["migrations"].is_relative_to(venv)
    assert found["migrations"] == found["app"].parent / "migrations"
    assert found["alembic"] == LIBRARY / "__init__.py"
    migrates(venv, elsewhere)


def test_an_editable_install_migrates_from_the_checkout(
    source: Path, client_wheel: Path, tmp_path: Path, elsewhere: Path
) -> None:
    venv = new_venv(tmp_path, [client_wheel, "-e", source])
    found = where_things_are(venv, elsewhere)
    assert found["app"] == source / "app" / "__init__.py"
    assert found["migrations"] == source / "alembic"
    assert found["alembic"] == LIBRARY / "__init__.py"
    migrates(venv, elsewhere)


def test_the_alembic_folder_never_shadows_the_alembic_library() -> None:
    assert (REPO / "alembic" / "env.py").is_file()
    assert list((REPO / "alembic").rglob("__init__.py")) == []
    # This process has the checkout on sys.path (pytest's rootdir), and so does a Python
    # started in the checkout: both import the library.
    assert LIBRARY != REPO / "alembic"
    assert (LIBRARY / "command.py").is_file()
    code = "import alembic.command; print(alembic.__file__)"
    out = run([sys.executable, "-c", code], cwd=REPO)
    assert Path(out.strip()).parent == LIBRARY
    # `python -m alembic` from the checkout is the library too, and alembic.ini finds the scripts.
    heads = run([sys.executable, "-m", "alembic", "heads"], cwd=REPO)
    assert f"{migrate.head_revision()} (head)" in heads


# --- the client alone ---------------------------------------------------------------------------


def test_the_client_wheel_carries_ferryman_alone(client_wheel: Path) -> None:
    with zipfile.ZipFile(client_wheel) as whl:
        names = set(whl.namelist())
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = re.findall(r"^Requires-Dist: (.+)$", whl.read(metadata).decode(), re.M)
        (scripts,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entry_points = whl.read(scripts).decode()
    package = {
        f"ferryman/{p.relative_to(CLIENT_PACKAGE).as_posix()}"
        for p in CLIENT_PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert package - names == set()
    assert "ferryman/py.typed" in names and "ferryman/cli/commands.py" in names
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"ferryman"}
    # What a client needs, and the command line's two as the `cli` extra.
    plain = sorted(r.split(">")[0] for r in requires if "extra ==" not in r)
    extra = sorted(r.split(">")[0] for r in requires if 'extra == "cli"' in r)
    assert (plain, extra) == (["httpx", "httpx-sse", "pydantic"], ["click", "rich"]), requires
    assert re.search(r"^\[console_scripts\]\nferryman = ferryman.cli:main$", entry_points, re.M)


@pytest.fixture(scope="module")
def client_venv(client_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the client's wheel and its `cli` extra installed, their
    dependencies from the package index pip is configured with: nothing of the server."""
    where = tmp_path_factory.mktemp("client-venv")
    venv = where / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=where)
    pip = [sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q"]
    run([*pip, f"{client_wheel}[cli]"], cwd=where)
    return venv


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project folder with its own `app` package, as most FastAPI projects have."""
    folder = tmp_path / "project"
    (folder / "app").mkdir(parents=True)
    (folder / "app" / "__init__.py").write_text('NAME = "the project\'s own app"\n')
    return folder


def sdk_example() -> str:
    """The README's SDK example: the first python block after `### The Python SDK`."""
    readme = (REPO / "README.md").read_text()
    after = readme[readme.index("### The Python SDK") :]
    match = re.search(r"```python\n(.*?)```", after, re.S)
    assert match, "no python block after ### The Python SDK"
    return match.group(1)


def test_the_client_alone_has_nothing_of_the_server(client_venv: Path, tmp_path: Path) -> None:
    code = (
        "import importlib.metadata as metadata, importlib.util, json\n"
        f"found = [name for name in {SERVER_ONLY!r} if importlib.util.find_spec(name)]\n"
        "dists = sorted(d.metadata['Name'].lower() for d in metadata.distributions())\n"
        "print(json.dumps({'found': found, 'dists': dists}))\n"
    )
    # -I: not even the working directory on the path, only what the venv installed.
    report = json.loads(run([client_venv / "bin" / "python", "-I", "-c", code], tmp_path))
    assert report["found"] == [], report
    assert "ferryman-client" in report["dists"]
    assert not {"ferryman", "fastapi", "psycopg", "psycopg-binary", "uvicorn"} & set(
        report["dists"]
    ), report


def test_the_client_alone_runs_the_readme_example_and_the_cli_beside_an_app_package(
    client_venv: Path, project: Path, isolated_db: str
) -> None:
    python, ferryman = client_venv / "bin" / "python", client_venv / "bin" / "ferryman"
    # The project's `app` and the SDK side by side.
    where = "import app, ferryman; print(app.NAME); print(ferryman.__file__)"
    name, sdk = run([python, "-c", where], project).splitlines()
    assert name == "the project's own app"
    assert Path(sdk).is_relative_to(client_venv)

    (project / "example.py").write_text(sdk_example())
    (project / "script.json").write_text(json.dumps([{"text": "Hello from the client alone."}]))
    with support.running(ServerProcess(isolated_db, worker=True)) as served:
        env = clean_env(FERRYMAN_URL=served.url)
        # (1) The README's SDK example, from the project's folder.
        lines = run([python, "example.py"], project, env).splitlines()
        assert lines[0].startswith("user_message") and lines[-1] == "SESSION_NOT_FOUND", lines
        assert any(line.startswith("session_end") for line in lines), lines

        # (2) The command line's client commands, from the client's venv alone.
        ran = run([ferryman, "run", "hello", "--script", "script.json"], project, env)
        assert ran.splitlines()[1:] == ["Hello from the client alone.", "· session succeeded"]
        listed = run([ferryman, "sessions", "list"], project, env).splitlines()
        assert listed[0].split() == ["ID", "TITLE", "STATUS", "RESUMES", "UPDATED"], listed
        assert len(listed) == 3, listed  # newest first: this run's, then the example's
        assert listed[1].split()[1:4] == ["hello", "succeeded", "0"], listed
        assert " take a note " in listed[2] and listed[2].split()[-3] == "succeeded", listed
        queued = run([ferryman, "run", "later", "--no-follow"], project, env).strip()
        assert re.fullmatch(r"[0-9a-f-]{36}", queued), queued

    # The server's commands are not there, and the command says where they come from.
    version = run([ferryman, "--version"], project)
    assert version == "ferryman-client 0.1.0\n", version
    serve = subprocess.run(
        [ferryman, "serve"], cwd=project, env=clean_env(), capture_output=True, text=True
    )
    assert serve.returncode == 2, serve
    assert "`ferryman serve` is a server command" in serve.stderr, serve.stderr
