"""The web UI's route (``GET /`` and ``/ui/...``): its files, the Content-Security-Policy
they are served under, that they are public while every API route stays behind the key,
``--no-ui``, Ollama's probe of ``/`` untouched, and that every file the page loads is shipped in the package."""

from __future__ import annotations

import gzip
import re
import tomllib
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from podium.server.app import create_app
from podium.settings import Settings

UI = Path(__file__).parents[2] / "podium" / "ui"
ROOT = Path(__file__).parents[2]


HTML = {"accept": "text/html,application/xhtml+xml,*/*;q=0.8"}     # as a browser asks


@pytest.fixture
def ui_client(scripted, tmp_path):
    def build(**settings) -> TestClient:
        settings.setdefault("store_url", f"sqlite:///{tmp_path / 'ui.db'}")
        return TestClient(create_app(Settings(**settings), scripted(["Hi."])),
                          raise_server_exceptions=False)
    return build


def policy(response) -> dict[str, str]:
    header = response.headers["content-security-policy"]
    return {d.split()[0]: d.partition(" ")[2] for d in header.split("; ")}


def test_the_page_and_its_files_under_a_strict_policy(ui_client):
    client = ui_client()
    page = client.get("/", headers=HTML)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = policy(page)
    assert csp["script-src"] == "'self'" and csp["default-src"] == "'none'"
    assert csp["connect-src"] == "'self'" and csp["frame-ancestors"] == "'none'"
    assert "unsafe" not in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"
    # no inline script, no inline handlers: everything the page runs is a file of its own
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", page.text)
    assert not re.search(r"\son[a-z]+\s*=", page.text, re.I)
    script = client.get("/ui/js/main.js", headers={"accept-encoding": "gzip"})
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert script.headers["content-encoding"] == "gzip" and "content-security-policy" in \
        script.headers
    assert client.head("/", headers=HTML).headers["content-type"].startswith("text/html")
    # Ollama's clients probe / for its text, as before
    assert client.get("/").text == "Ollama is running"
    assert client.get("/", headers={"accept": "*/*"}).text == "Ollama is running"
    assert client.get("/ui/js/missing.js").status_code == 404
    assert client.get("/ui/../settings.py").status_code == 404
    assert client.get("/ui/%2e%2e/settings.py").status_code == 404


def test_every_file_the_page_loads_is_served(ui_client):
    """The page's stylesheets and scripts, and every module they import, resolve."""
    client = ui_client()
    pending = [p for p in re.findall(r'(?:src|href)="(/ui/[^"]+)"', client.get("/", headers=HTML).text)]
    pending += ["/ui/vendor/katex/katex.min.js", "/ui/vendor/katex/katex.min.css"]  # lazy
    seen: set[str] = set()
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        response = client.get(path)
        assert response.status_code == 200, path
        if path.endswith(".js"):
            for spec in re.findall(r'(?:^|[;\n])\s*import\s[^"\']*["\'](\.{1,2}/[^"\']+)["\']',
                                   response.text):
                pending.append(str(Path(path).parent / spec).replace("\\", "/"))
                pending[-1] = "/" + str(Path(pending[-1]).resolve().relative_to("/"))
        if path.endswith(".css"):
            for url in re.findall(r"url\(([^)]+\.woff2)\)", response.text):
                pending.append(str(Path(path).parent / url))
    assert "/ui/vendor/dompurify/purify.es.js" in seen and "/ui/js/chat.js" in seen
    assert any(p.endswith(".woff2") for p in seen)


def test_public_page_while_the_api_keeps_its_key(ui_client):
    client = ui_client(api_key=["k"])
    assert client.get("/", headers=HTML).status_code == 200
    assert client.get("/ui/app.css").status_code == 200
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/conversations").status_code == 401
    assert client.get("/v1/models", headers={"authorization": "Bearer k"}).status_code == 200
    # only GET and HEAD of the page's paths; anything else is the app's as before
    assert client.post("/", json={}, headers=HTML).status_code == 401
    assert client.get("/index.html", headers=HTML).status_code == 401
    assert client.get("/").status_code == 401      # Ollama's probe: behind the key as before


def test_no_ui(ui_client):
    client = ui_client(ui=False)
    assert client.get("/", headers=HTML).text == "Ollama is running"
    assert client.get("/ui/app.css").status_code == 404
    assert Settings.from_sources(["--no-ui"], {}).ui is False
    assert Settings.from_sources([], {"PODIUM_UI": "false"}).ui is False
    assert Settings.from_sources([], {}).ui is True


def test_health_tells_the_memory_budget(ui_client):
    assert ui_client(memory_budget="1G").get("/health").json()["memory_budget"] == 2**30
    assert ui_client(memory_budget="0").get("/health").json()["memory_budget"] is None


def test_every_ui_file_is_package_data():
    """A wheel ships what pyproject's package-data names: every file under podium/ui."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["podium"]
    shipped = {p for pattern in patterns for p in (ROOT / "podium").glob(pattern)}
    files = {p for p in UI.rglob("*") if p.is_file()}
    assert files and files <= shipped, sorted(str(p) for p in files - shipped)
