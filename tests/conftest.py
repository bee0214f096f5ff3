from __future__ import annotations

import contextlib
import itertools
import os
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import openai
import pytest
import yaml

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from proxy.app import build_app
from proxy.config import load_config
from tests.postgres_server import PostgresNotInstalled, PostgresServer
from tests.servers import FakeUpstream, ServerThread


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


@dataclass
class RunningProxy:
    url: str
    server: ServerThread
    config_path: Path
    data_dir: Path
    policies_dir: Path

    @property
    def state(self):
        return self.server.server.config.app.state.proxy

    def flush(self) -> None:
        assert self.state.archive.flush(), "archive writer did not flush"

    def query(self, sql: str, params: tuple = ()) -> Iterator[dict]:
        """Rows of the archive read through a connection of the test's own. The writer's connection is
        its thread's alone: a statement left open on it (a generator half read) is a transaction its
        next BEGIN IMMEDIATE would refuse."""
        with contextlib.closing(sqlite3.connect(self.data_dir / "archive.db")) as db:
            db.row_factory = sqlite3.Row
            return iter([dict(row) for row in db.execute(sql, params)])

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
def make_proxy(tmp_path, upstream_server):
    started: list[ServerThread] = []
    _, upstream = upstream_server

    def start(extra: dict | None = None) -> RunningProxy:
        config_path = write_config(tmp_path, upstream.url, extra)
        config = load_config(config_path)
        server = ServerThread(build_app(config)).__enter__()
        started.append(server)
        return RunningProxy(server.url, server, config_path, config.data_dir, config.policies_dir)

    yield start
    for server in started:
        server.__exit__()


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
