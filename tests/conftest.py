from __future__ import annotations

import contextlib
import itertools
import os
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import yaml
from hypothesis import settings

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from proxy.app import build_app
from proxy.config import load_config
from proxy.reader import ArchiveReader
from tests.postgres_server import PostgresNotInstalled, PostgresServer
from tests.servers import FakeUpstream, ServerThread

# No per-example deadline: timing lives in bench/, and a first example that loads a tokenizer (~0.3 s)
# failed one depending on which tests ran before it in the process (seen with the suite split across
# processes). pytest-timeout still ends a test that hangs.
settings.register_profile("ctxproxy", deadline=None)
settings.load_profile("ctxproxy")


@pytest.fixture(scope="session")
def upstream_server() -> Iterator[tuple[FakeUpstream, ServerThread]]:
    fake = FakeUpstream()
    with ServerThread(fake.app) as server:
        yield fake, server


@pytest.fixture
def fake_upstream(upstream_server) -> FakeUpstream:
    fake, _ = upstream_server
    fake.reset()
    return fake


BACKENDS = ("sqlite", "postgresql")
# A test whose proxies run once on each archive backend; the PostgreSQL case starts (once a run) a real
# server and gives each test a fresh database. Chosen for what they store: see each marked test.
BOTH_BACKENDS = pytest.mark.backends(*BACKENDS)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "backends(*names): run the test's proxy (make_proxy, proxy) on each archive backend "
        "named, \"sqlite\" and/or \"postgresql\" (default: sqlite alone); the closest marker wins, so a "
        "module's `pytestmark` can name both and one test narrow it again")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test's proxies run on the backends its `backends` marker names; CTXPROXY_TEST_BACKENDS (say
    `postgresql`, or `sqlite,postgresql`) runs every test that starts a proxy on those instead."""
    if "proxy_backend" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("backends")
    chosen = os.environ.get("CTXPROXY_TEST_BACKENDS", "").strip()
    names = tuple(name.strip() for name in chosen.split(",")) if chosen else marker.args if marker else None
    if names is None:
        return
    if not names or set(names) - set(BACKENDS):
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: backends {names}: name some of {BACKENDS}")
    metafunc.parametrize("proxy_backend", list(names), indirect=True)


@pytest.fixture
def proxy_backend(request: pytest.FixtureRequest) -> str:
    """The archive backend of this test's proxies: "sqlite" unless the test is marked `backends(...)`."""
    return getattr(request, "param", "sqlite")


@dataclass
class RunningProxy:
    url: str
    server: ServerThread
    config_path: Path
    data_dir: Path
    policies_dir: Path
    archive_url: str | None = None  # PostgreSQL: the database this proxy archives to; None: SQLite
    _reader: Any = field(default=None, repr=False)

    @property
    def backend(self) -> str:
        return "postgresql" if self.archive_url else "sqlite"

    @property
    def state(self):
        return self.server.server.config.app.state.proxy

    def flush(self) -> None:
        assert self.state.archive.flush(), "archive writer did not flush"

    def reader(self):
        """A read side of the archive of the test's own (ArchiveReader or PostgresReader), closed with
        the proxy; the same object on every call."""
        if self._reader is None:
            if self.archive_url:
                from proxy.store.postgres_reader import PostgresReader

                self._reader = PostgresReader(self.archive_url)
            else:
                self._reader = ArchiveReader(self.data_dir / "archive.db")
        return self._reader

    def query(self, sql: str, params: tuple = ()) -> Iterator[dict]:
        """Rows of the archive read through a connection of the test's own, in the SQL both databases
        share (`?` placeholders). SQLite: the writer's connection is its thread's alone (a statement left
        open on it, a generator half read, is a transaction its next BEGIN IMMEDIATE would refuse).
        PostgreSQL: the test's PostgresReader (rows as the dashboard and the report read them)."""
        if self.archive_url:
            return iter(self.reader().rows(sql, params))
        with contextlib.closing(sqlite3.connect(self.data_dir / "archive.db")) as db:
            db.row_factory = sqlite3.Row
            return iter([dict(row) for row in db.execute(sql, params)])

    def close_readers(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def client(self, api_key: str = "sk-test-key", **kwargs) -> openai.OpenAI:
        kwargs.setdefault("base_url", f"{self.url}/v1")
        return openai.OpenAI(api_key=api_key, max_retries=0, timeout=30, **kwargs)

    def anthropic(self, api_key: str = "sk-ant-test-key", policy: str | None = None,
                  **kwargs) -> anthropic.Anthropic:
        """The official Anthropic SDK as Claude Code is configured: ANTHROPIC_BASE_URL = the proxy."""
        base = f"{self.url}/p/{policy}" if policy else self.url
        return anthropic.Anthropic(api_key=api_key, base_url=base, max_retries=0, timeout=30, **kwargs)


def write_config(tmp_path: Path, upstream_url: str, extra: dict | None = None) -> Path:
    policies = tmp_path / "policies"
    policies.mkdir(exist_ok=True)
    (policies / "passthrough.yaml").write_text(yaml.safe_dump({
        section: {"enabled": False}
        for section in ("tool_results", "budget", "window", "summary", "working_memory", "folded")}))
    config: dict = {"upstream": {"base_url": f"{upstream_url}/v1", "anthropic_base_url": upstream_url,
                                 "timeout_s": 30},
                    "data_dir": "data", "policies_dir": "policies"}
    for key, value in (extra or {}).items():
        config[key] = config.get(key, {}) | value if isinstance(value, dict) else value
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def make_proxy(tmp_path, upstream_server, proxy_backend, request):
    """start(extra) -> a running proxy on the test's archive backend (proxy_backend: SQLite in
    tmp_path/data, or a fresh PostgreSQL database that every proxy of the test shares, as replicas or a
    restart would)."""
    started: list[RunningProxy] = []
    _, upstream = upstream_server
    archive_url = request.getfixturevalue("postgres_url") if proxy_backend == "postgresql" else None

    def start(extra: dict | None = None) -> RunningProxy:
        extra = dict(extra or {})
        if archive_url:
            extra["archive"] = {"url": archive_url, **extra.get("archive", {})}
        config_path = write_config(tmp_path, upstream.url, extra)
        config = load_config(config_path)
        server = ServerThread(build_app(config)).__enter__()
        running = RunningProxy(server.url, server, config_path, config.data_dir, config.policies_dir,
                               config.archive.url)
        started.append(running)
        return running

    yield start
    for running in started:
        running.close_readers()
        running.server.__exit__()


@pytest.fixture
def proxy(make_proxy, fake_upstream) -> RunningProxy:
    return make_proxy()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One throwaway PostgreSQL server for the whole run (tests.postgres_server), on its unix socket and
    on 127.0.0.1:<free port> (`url(name, tcp=True)`) for other processes. Missing PostgreSQL skips the
    tests that use it, except in CI (CI=true), where it fails them, as tests/ui does for Chromium."""
    try:
        server = PostgresServer.start(tcp=True)
    except PostgresNotInstalled as missing:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"PostgreSQL tests need a server: {missing}")
        pytest.skip(str(missing))
    try:
        yield server
    finally:
        server.stop()


_database_numbers = itertools.count(1)


@pytest.fixture
def postgres_url(postgres_server: PostgresServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """A new, empty database of the session's server for this test alone; its URL over the unix socket.
    Dropped afterwards (with the connections left open on it)."""
    test = re.sub(r"[^a-z0-9_]+", "_", request.node.name.lower())[:40]
    name = f"t{next(_database_numbers)}_{test}"
    url = postgres_server.create_database(name)
    yield url
    with contextlib.suppress(Exception):
        postgres_server.drop_database(name)


@pytest.fixture(params=["sqlite", "postgresql"])
def archive_backend(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    """Runs a test once per archive backend: ("sqlite", None), then ("postgresql", url of a fresh
    database). The server starts only when a postgresql case runs; without PostgreSQL that case is
    skipped (failed in CI) and the sqlite one still runs."""
    if request.param == "sqlite":
        return "sqlite", None
    return "postgresql", request.getfixturevalue("postgres_url")
