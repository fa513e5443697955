"""The workbench's files: plain HTML, CSS and JavaScript modules served by the app, in the
wheel, with nothing from the internet and no way to put a string into the page as HTML.
(tests/test_workbench.py drives the page itself in a browser.)"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import httpx

from app import web
from tests.support import REPO, ServerProcess

WEB = Path(REPO) / "app" / "web"
ASSETS = sorted(p for p in WEB.iterdir() if p.is_file() and p.suffix != ".py")
# Every way a string becomes markup: none of them may appear in the page's code.
HTML_SINKS = re.compile(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|srcdoc|\beval\(")


def test_no_asset_parses_a_string_as_html() -> None:
    assert {p.name for p in ASSETS} >= {"index.html", "app.js", "style.css", "favicon.svg"}
    for path in ASSETS:
        found = HTML_SINKS.findall(path.read_text())
        assert not found, f"{path.name} uses {found}: insert text with textContent / h()"


def test_nothing_comes_from_the_internet() -> None:
    for path in ASSETS:
        text = path.read_text().replace('xmlns="http://www.w3.org/2000/svg"', "")
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", text, re.I), path.name
        assert "@import" not in text, path.name
    page = (WEB / "index.html").read_text()
    # Scripts are modules from this origin; no inline script or style (the CSP forbids both).
    assert re.findall(r"<script[^>]*>", page) == ['<script type="module" src="/assets/app.js">']
    assert "<style" not in page and " style=" not in page


def test_every_imported_module_exists() -> None:
    for path in WEB.glob("*.js"):
        for name in re.findall(r"from '\./([a-z-]+\.js)'", path.read_text()):
            assert (WEB / name).is_file(), f"{path.name} imports {name}"


def test_the_wheel_takes_every_asset() -> None:
    config = tomllib.loads((Path(REPO) / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["app"]
    for path in ASSETS:
        relative = f"web/{path.name}"
        assert any(fnmatch.fnmatch(relative, p) for p in patterns), f"{relative} not packaged"
    assert set(web.assets()) == {p.name for p in ASSETS}


def test_the_app_serves_the_page_its_assets_and_a_favicon(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.url) as http:
        page = http.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        policy = page.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "require-trusted-types-for 'script'" in policy
        assert page.headers["x-content-type-options"] == "nosniff"
        types = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
        for path in ASSETS:
            if path.suffix in types:
                response = http.get(f"/assets/{path.name}")
                assert response.status_code == 200, path.name
                assert response.headers["content-type"].startswith(types[path.suffix])
                assert response.content == path.read_bytes()
        icon = http.get("/favicon.ico")
        assert icon.status_code == 200
        assert icon.headers["content-type"].startswith("image/svg+xml")
        for missing in ("/assets/nope.js", "/assets/__init__.py", "/assets/..%2Fmain.py"):
            response = http.get(missing)
            assert response.status_code == 404, missing
            assert response.headers["content-type"].startswith("application/problem+json")


def test_the_docs_show_screenshots_that_exist() -> None:
    def shown(page: str) -> list[str]:
        text = (Path(REPO) / page).read_text()
        return re.findall(r"\((?:docs/)?screenshots/([a-z-]+\.png)\)", text)

    assert len(shown("README.md")) == 1
    assert len(shown("docs/workbench.md")) >= 5
    for name in shown("README.md") + shown("docs/workbench.md"):
        assert (Path(REPO) / "docs" / "screenshots" / name).is_file(), name
