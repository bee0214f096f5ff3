"""Headless Chromium for the dashboard tests: Debian's /usr/bin/chromium driven by Playwright (never a
browser Playwright downloads). Missing in CI is a failure, so a machine set up without it is caught."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("CTXPROXY_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def require_chromium() -> str:
    """The browser's path; else fail in CI (CI=true) and skip elsewhere, saying how to install it."""
    missing = None
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing = "the playwright package is not installed (pip install -e '.[test]')"
    if missing is None and not Path(CHROMIUM).exists():
        missing = (f"no Chromium at {CHROMIUM}: run ./scripts/test as root (it installs Debian's chromium) "
                   "or `apt-get install -y chromium`")
    if missing is not None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"dashboard tests need a browser: {missing}")
        pytest.skip(missing)
    return CHROMIUM
