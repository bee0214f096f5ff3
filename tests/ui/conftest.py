"""Fixtures of the dashboard tests: one seeded archive behind a running proxy for the whole run (the
dashboard is read-only, so tests can share it), and one headless Chromium per test module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.ui.browser import ARGS, require_chromium
from tests.ui.seed import Seeded, seed, start_proxy


@pytest.fixture(scope="session")
def seeded(upstream_server, tmp_path_factory) -> Iterator[Seeded]:
    fake, upstream = upstream_server
    proxy = start_proxy(tmp_path_factory.mktemp("ui"), upstream.url)
    try:
        yield seed(proxy, fake)
    finally:
        fake.reset()
        proxy.server.__exit__()


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
