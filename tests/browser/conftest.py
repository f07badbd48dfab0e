"""The dashboard in a real browser: Debian's headless Chromium (scripts/chromium.sh install),
driven by Playwright for Python, against `smlt dashboard` over a local console (`smlt local up`,
in its own process, as a user runs it). Skipped, with the reason, only where Chromium or
Playwright is missing. SMLT_SCREENSHOTS=DIR saves the main views' screenshots there
(docs/screenshots/ is refreshed with `SMLT_SCREENSHOTS=docs/screenshots pytest tests/browser`)."""

from __future__ import annotations

import os
import shutil
import socket
import threading
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("SMLT_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# No network, no first-run or background work: the page must load everything from the dashboard.
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def require_browser() -> None:
    """Skip (with the reason) where the browser tests cannot run; the test modules call it."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: run scripts/chromium.sh install (Debian's chromium)")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def console_info(tmp_path_factory):
    require_browser()  # before the console starts
    from smlt import console

    state = tmp_path_factory.mktemp("browser-console")
    info = console.up(state, port=free_port())
    yield info
    console.down(state)


@pytest.fixture(scope="session")
def source(console_info):
    from smlt.dashboard.data import Source

    with pytest.MonkeyPatch.context() as mp:
        for k, v in console_info.environment().items():
            if k != "AWS_ENDPOINT_URL":  # this process's other tests keep their own endpoint
                mp.setenv(k, v)
        yield Source.open(console_info.stack, endpoint_url=console_info.endpoint_url, region=console_info.region)


@pytest.fixture(scope="session")
def dashboard_url(source):
    from smlt.dashboard.app import make_app, serve

    server = serve(make_app(source, interval_s=0.5), port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def browser():
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(30_000)
    yield page
    context.close()


@pytest.fixture
def screenshot(tmp_path):
    """screenshot(page, name): into $SMLT_SCREENSHOTS (committed views) or the test's tmp folder."""
    folder = Path(os.environ.get("SMLT_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)

    def take(page, name: str) -> Path:
        path = folder / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take
