"""Fixtures of the dashboard tests: one seeded archive behind a running proxy for the whole run, per
archive backend (the dashboard is read-only, so tests can share it), and one headless Chromium per test
module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ui.browser import ARGS, require_chromium
from tests.ui.seed import Seeded, seed, start_proxy


def seeded_proxy(root: Path, upstream_server, extra: dict[str, Any] | None = None) -> Iterator[Seeded]:
    fake, upstream = upstream_server
    proxy = start_proxy(root, upstream.url, extra)
    try:
        yield seed(proxy, fake)
    finally:
        fake.reset()
        proxy.close_readers()
        proxy.server.__exit__()


@pytest.fixture(scope="session")
def seeded_sqlite(upstream_server, tmp_path_factory) -> Iterator[Seeded]:
    yield from seeded_proxy(tmp_path_factory.mktemp("ui"), upstream_server)


@pytest.fixture(scope="session")
def seeded_postgresql(upstream_server, tmp_path_factory, postgres_server) -> Iterator[Seeded]:
    url = postgres_server.create_database("ui_seed")
    yield from seeded_proxy(tmp_path_factory.mktemp("ui-pg"), upstream_server, {"archive": {"url": url}})


@pytest.fixture
def seeded(proxy_backend: str, request: pytest.FixtureRequest) -> Seeded:
    """One archive seeded for the whole run on the test's backend (SQLite unless the test is marked
    `backends(...)`, see tests/conftest.py): the dashboard is read-only, so tests can share it."""
    return request.getfixturevalue(f"seeded_{proxy_backend}")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=ARGS)
        yield launched
        launched.close()


class Console(list):
    """Errors the page reported: script errors, failed loads, Content-Security-Policy refusals."""


@pytest.fixture
def page(browser) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    opened = context.new_page()
    errors = Console()
    opened.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    opened.on("pageerror", lambda error: errors.append(str(error)))
    opened.errors = errors
    yield opened
    context.close()
