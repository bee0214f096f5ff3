from __future__ import annotations

import contextlib
import os
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
