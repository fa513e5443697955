"""Clients generated from docs/openapi.json work, typed, against a running server.

- Python: openapi-python-client (from PyPI, at the version pinned below, in a virtualenv of its
  own: its pins, typer's among them, need not fit the project's) generates `ferryman_client`;
  tests/clients/python_client_check.py is type-checked against it with mypy --strict, then
  run against a server.
- TypeScript: openapi-typescript and openapi-fetch (from the npm registry, at the versions
  tests/clients/ts/package-lock.json pins, installed by `npm ci`); openapi-typescript writes
  schema.d.ts, `tsc` compiles tests/clients/ts/check.ts under "strict", and node runs it.

Each check runs the session lifecycle (create, list, get, rename, cancel twice, post a message,
read the transcript, delete) and reads problems' `code`s (404, 409, 422, and 401 in keys mode),
once with an API key on a server in keys mode and once with no credentials on one in local mode.

Without node and npm, or when a generator cannot be installed, these tests skip, except under
CI=true, where they fail.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from tests.npm import installed_as_locked
from tests.support import REPO, ServerProcess, missing, running

# A first run installs the generators; CI runs this on one PostgreSQL (`once`).
pytestmark = [pytest.mark.timeout(420), pytest.mark.once]

ROOT = Path(REPO)
DOCUMENT = ROOT / "docs" / "openapi.json"
CLIENTS = ROOT / "tests" / "clients"
TS = CLIENTS / "ts"
# Pinned, as package-lock.json pins the TypeScript tools: a new release changes the generated
# code, so it comes in by a change here, with the checks run on it.
OPENAPI_PYTHON_CLIENT = "openapi-python-client==0.29.1"
MIN_NODE = (20, 0)  # global fetch and crypto.randomUUID, unflagged
TIMEOUT = 300


def unavailable(reason: str) -> NoReturn:
    missing(reason, "the generated clients' tests")


def run(
    args: list[str | Path], cwd: Path, env: dict[str, str] | None = None, timeout: float = TIMEOUT
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def output(result: subprocess.CompletedProcess[str]) -> str:
    return f"{result.stdout[-6000:]}\n{result.stderr[-6000:]}".strip()


def ok(result: subprocess.CompletedProcess[str], what: str) -> str:
    assert result.returncode == 0, f"{what} exited {result.returncode}:\n{output(result)}"
    return result.stdout


# What each check prints as it goes (`ok N - <step>`), in order; then `all N steps passed`.
STEPS = [
    "create ",
    "list",
    "get",
    "rename, and a 422 naming `title`",
    "cancel, and a second cancel's 409 SESSION_ALREADY_TERMINAL",
    "post a message",
    "transcript (",
    "delete, and a 404 SESSION_NOT_FOUND",
]
KEYS_STEP = "keys mode: no key is a 401 AUTH_REQUIRED"


def assert_steps(out: str, keys_mode: bool) -> None:
    """The check ran every step, in order (and the 401 one in keys mode only)."""
    done = re.findall(r"^ok \d+ - (.*)$", out, re.MULTILINE)
    expected = [KEYS_STEP, *STEPS] if keys_mode else STEPS
    assert len(done) == len(expected), out
    for name, step in zip(expected, done, strict=True):
        assert step.startswith(name), out
    assert f"all {len(expected)} steps passed" in out, out


def client_env(server: ServerProcess, key: str | None) -> dict[str, str]:
    """The environment of a check: the server's URL, and the API key when there is one."""
    env = {k: v for k, v in os.environ.items() if k not in ("FERRYMAN_API_KEY", "PYTHONPATH")}
    env["FERRYMAN_URL"] = server.url
    if key is not None:
        env["FERRYMAN_API_KEY"] = key
    return env


# --- servers ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keys_server(database_url: str) -> Iterator[ServerProcess]:
    with running(ServerProcess(database_url, env={"FERRYMAN_AUTH": "keys"})) as proc:
        yield proc


@pytest.fixture(scope="module")
def local_server(database_url: str) -> Iterator[ServerProcess]:
    with running(ServerProcess(database_url, env={"FERRYMAN_AUTH": "local"})) as proc:
        yield proc


# --- Python: openapi-python-client ------------------------------------------------------------


def tools_home() -> Path:
    """Where the generator's virtualenv and mypy's cache are kept between runs: beside the test
    run's own virtualenv (in the temporary directory when the tests run outside one)."""
    if sys.prefix != sys.base_prefix:
        return Path(sys.prefix) / "generators"
    return Path(tempfile.gettempdir()) / "ferryman-generators"


def generator_venv() -> Path:
    """A virtualenv with openapi-python-client, made once."""
    home = tools_home()
    venv = home / OPENAPI_PYTHON_CLIENT.replace("==", "-")
    done = venv / "ferryman-installed.txt"  # written last: a venv without it is half made
    if done.exists() and done.read_text() == OPENAPI_PYTHON_CLIENT:
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    ok(run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=home), "python -m venv")
    # The test run's pip installs into it (no copy of pip of its own to set up).
    pip = [sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q"]
    installed = run([*pip, "--disable-pip-version-check", OPENAPI_PYTHON_CLIENT], cwd=home)
    if installed.returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)
        unavailable(f"pip could not install {OPENAPI_PYTHON_CLIENT}:\n{output(installed)}")
    done.write_text(OPENAPI_PYTHON_CLIENT)
    return venv


@pytest.fixture(scope="module")
def python_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generated package's parent directory (for PYTHONPATH), the check script type-checked
    against it."""
    venv = generator_venv()
    out = tmp_path_factory.mktemp("python-client")
    config = out / "config.yaml"
    config.write_text(
        "project_name_override: ferryman-client\npackage_name_override: ferryman_client\n"
    )
    # The generator formats its output with ruff, which it installed in its virtualenv.
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    generated = run(
        [
            venv / "bin" / "openapi-python-client",
            "generate",
            "--path",
            DOCUMENT,
            "--config",
            config,
            "--meta",
            "none",
            "--output-path",
            out / "ferryman_client",
            "--fail-on-warning",
        ],
        cwd=out,
        env=env,
    )
    ok(generated, "openapi-python-client generate")
    assert (out / "ferryman_client" / "api" / "sessions" / "get_session.py").exists()
    # Typed code: the check must type-check against the generated package under --strict, as
    # must the package's modules made from the document (client.py is the generator's fixed
    # template, which mypy --strict faults on *args forwarding; the document has no part in it).
    mypy_config = out / "mypy.ini"
    mypy_config.write_text(
        "[mypy]\nstrict = True\npython_version = 3.11\n"
        "[mypy-ferryman_client.client]\nignore_errors = True\n"
    )
    mypy = run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            mypy_config,
            # Kept between runs: mypy knows the generated modules again by their hashes.
            "--cache-dir",
            tools_home() / "mypy-cache",
            CLIENTS / "python_client_check.py",
        ],
        cwd=out,
        env={**os.environ, "MYPYPATH": str(out)},
    )
    ok(mypy, "mypy --strict on python_client_check.py and the generated package")
    return out


def run_python_check(package_dir: Path, server: ServerProcess, key: str | None) -> str:
    env = client_env(server, key)
    env["PYTHONPATH"] = str(package_dir)
    # The generated package needs httpx and attrs, which the test run's interpreter has.
    result = run([sys.executable, CLIENTS / "python_client_check.py"], cwd=package_dir, env=env)
    return ok(result, "python_client_check.py")


def test_python_client_with_an_api_key(
    python_client: Path, keys_server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    assert_steps(run_python_check(python_client, keys_server, owner_key[1]), keys_mode=True)


def test_python_client_in_local_mode_without_a_key(
    python_client: Path, local_server: ServerProcess
) -> None:
    assert_steps(run_python_check(python_client, local_server, None), keys_mode=False)


# --- TypeScript: openapi-typescript + openapi-fetch -------------------------------------------


@pytest.fixture(scope="module")
def ts_client() -> Path:
    """tests/clients/ts built: tools installed by `npm ci` (skipped when node_modules is already
    what the lock file pins), schema.d.ts generated from the document, check.ts compiled by tsc
    under the project's strict config. The compiled check's path."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        unavailable("node and npm are needed to test the TypeScript client (apt-get install npm)")
    version = run([node, "--version"], cwd=TS).stdout.strip()
    found = re.match(r"v(\d+)\.(\d+)\.", version)
    if found is None or (int(found[1]), int(found[2])) < MIN_NODE:
        wanted = ".".join(map(str, MIN_NODE))
        unavailable(f"the TypeScript client check needs node >= {wanted}, not {version!r}")
    if not installed_as_locked(TS):
        installed = run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=TS)
        if installed.returncode != 0:
            unavailable(f"npm ci in tests/clients/ts failed:\n{output(installed)}")
    bin_ = TS / "node_modules" / ".bin"
    schema = TS / "schema.d.ts"
    schema.unlink(missing_ok=True)
    generated = run([bin_ / "openapi-typescript", DOCUMENT, "--output", schema], cwd=TS)
    ok(generated, "openapi-typescript")
    assert schema.exists(), output(generated)
    # Incremental (dist/.tsbuildinfo): an unchanged document compiles in a second or two.
    ok(run([bin_ / "tsc", "--project", TS / "tsconfig.json", "--strict"], cwd=TS), "tsc --strict")
    compiled = TS / "dist" / "check.js"
    assert compiled.exists()
    return compiled


def run_ts_check(compiled: Path, server: ServerProcess, key: str | None) -> str:
    node = shutil.which("node")
    assert node is not None
    return ok(run([node, compiled], cwd=TS, env=client_env(server, key)), "node dist/check.js")


def test_typescript_client_with_an_api_key(
    ts_client: Path, keys_server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    assert_steps(run_ts_check(ts_client, keys_server, owner_key[1]), keys_mode=True)


def test_typescript_client_in_local_mode_without_a_key(
    ts_client: Path, local_server: ServerProcess
) -> None:
    assert_steps(run_ts_check(ts_client, local_server, None), keys_mode=False)
