"""Screenshots of the dashboard over a seeded archive (tests/ui/seed.py) for the README:
docs/screenshots/{overview,session,request}.png.

    .venv/bin/python -m bench.screenshots [OUT_DIR]
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from playwright.sync_api import sync_playwright

from tests.servers import FakeUpstream, ServerThread
from tests.ui.browser import ARGS, CHROMIUM
from tests.ui.seed import SESSION, seed, start_proxy

ROOT = Path(__file__).resolve().parent.parent
WIDTH = 1360


def spread_over_days(archive: Path, days: int = 6) -> None:
    """Back-date the seeded calls across the last `days` days, in their order, so the charts per day
    have something to show (the figures are unchanged: only when each call happened moves)."""
    now = datetime.now(UTC)
    with contextlib.closing(sqlite3.connect(archive)) as db, db:
        ids = [row[0] for row in db.execute("select id from exchanges order by rowid")]
        for index, ident in enumerate(ids):
            when = now - timedelta(days=days) + timedelta(days=days) * index / max(1, len(ids) - 1)
            db.execute("update exchanges set created_at = ? where id = ?", [when.isoformat(), ident])


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    fake = FakeUpstream()
    with ServerThread(fake.app) as upstream, tempfile.TemporaryDirectory() as tmp:
        proxy = start_proxy(Path(tmp), upstream.url)
        try:
            seeded = seed(proxy, fake)
            spread_over_days(proxy.data_dir / "archive.db")
            ui = f"{proxy.url}/ctxproxy/ui"
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                page = browser.new_page(viewport={"width": WIDTH, "height": 900})
                # (name, page, height of the shot: the top of a long page is what the README shows)
                for name, path, height in (("overview", "", 1150), ("session", f"/sessions/{SESSION}", 1250),
                                           ("request", f"/exchanges/{seeded.evicting}", 1500)):
                    page.goto(ui + path)
                    size = page.evaluate("document.documentElement.scrollHeight")
                    page.screenshot(path=str(out / f"{name}.png"), full_page=True,
                                    clip={"x": 0, "y": 0, "width": WIDTH, "height": min(height, size)})
                    print(out / f"{name}.png")
                browser.close()
        finally:
            proxy.server.__exit__()


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "screenshots")
