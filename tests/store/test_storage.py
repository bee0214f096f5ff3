"""The storage interface on both backends: config, pins, the session ledger, health."""

from __future__ import annotations

import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest

from proxy.archive import TableRow
from proxy.config import Config, load_config
from proxy.errors import ConfigError
from proxy.pins import PinBudgetExceeded
from proxy.policy import load_policy_file
from proxy.state import StateStore
from proxy.store.ledger import PostgresLedger
from proxy.store.postgres import redacted
from proxy.store.storage import open_storage
from proxy.tokens import TokenCounter


def config_for(tmp_path: Path, backend: tuple[str, str | None]) -> Config:
    archive = {"url": backend[1], "pool_size": 4} if backend[1] else {}
    return Config.model_validate({"data_dir": str(tmp_path / "data"), "archive": archive})


def test_a_password_in_the_url_is_refused_and_never_echoed(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("archive:\n  url: postgresql://app:s3cret@db:5432/ctx\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "PGPASSWORD" in caught.value.message and "s3cret" not in caught.value.message
    path.write_text("archive:\n  url: mysql://db/ctx\n")
    with pytest.raises(ConfigError, match="expected postgresql://"):
        load_config(path)
    assert redacted("postgresql://app:s3cret@db:5432/ctx") == "postgresql://app:***@db:5432/ctx"


def test_pins_share_one_budget_across_processes_writing_at_once(tmp_path, archive_backend):
    """Two stores (two replicas) pinning at once never exceed the budget together."""
    (tmp_path / "p.yaml").write_text("pinned:\n  max_tokens: 60\n")
    policy = load_policy_file(tmp_path / "p.yaml")
    config = config_for(tmp_path, archive_backend)
    tokens = TokenCounter()
    first = open_storage(config, tokens)
    second_pins = open_storage(config.model_copy(update={"data_dir": tmp_path / "other"}), tokens).pins \
        if archive_backend[0] == "postgresql" else first.pins
    barrier = threading.Barrier(8)

    def pin(n: int) -> bool:
        barrier.wait()
        try:
            (first.pins if n % 2 else second_pins).add(policy, "word " * 12, name=f"n{n}")
        except PinBudgetExceeded:
            return False
        return True

    try:
        with ThreadPoolExecutor(8) as pool:
            made = sum(pool.map(pin, range(8)))
        listed = first.pins.list("p")
        assert made == len(listed) and sum(p.tokens for p in listed) <= 60 and made >= 1
    finally:
        first.close()
        if second_pins is not first.pins:
            second_pins.close()


def test_the_ledger_serializes_a_session_across_stores_and_carries_its_state(tmp_path, postgres_url):
    """Two state stores (two replicas): what one decided is what the other starts from."""
    one, two = PostgresLedger(postgres_url, 4), PostgresLedger(postgres_url, 4)
    rows: list[TableRow] = []
    a, b = StateStore(persist=rows.append, ledger=one), StateStore(persist=rows.append, ledger=two)
    try:
        with a.session("t", "s") as state:
            state.history_len, state.window.first_seen = 7, [1.0, 1.0, 2.0]
            a.record(state, "call_1", "original text", "ls", "[summary]", "summary")
        assert rows == []  # committed by the ledger, not queued for the writer
        with psycopg.connect(postgres_url) as conn:
            assert conn.execute("select replacement from tool_results").fetchall() == [("[summary]",)]

        class Reader:  # the archive as the other replica reads it
            def __init__(self) -> None:
                self.conn = psycopg.connect(postgres_url, autocommit=True)

            def tool_result_rows(self, tenant, session_id):
                cursor = self.conn.execute("select * from tool_results where tenant = %s and session_id = %s",
                                           [tenant, session_id])
                names = [d.name for d in cursor.description]
                return [dict(zip(names, row, strict=True)) for row in cursor]

            def session_window(self, *args):
                return None

            def session_memory(self, *args):
                return None

        b._lookup = Reader()  # type: ignore[assignment]
        with b.session("t", "s") as state:
            assert state.history_len == 7 and state.window.first_seen == [1.0, 1.0, 2.0]
            assert state.by_handle["call_1"].replacement == "[summary]"
            state.history_len = 9
        with a.session("t", "s") as state:  # a's cached copy is behind: it catches up
            assert state.history_len == 9
    finally:
        one.close()
        two.close()


def test_healthz_says_the_database_is_gone(tmp_path, postgres_server, postgres_url):
    from proxy.app import build_app
    from tests.servers import ServerThread

    config = config_for(tmp_path, ("postgresql", postgres_url))
    with ServerThread(build_app(config)) as server:
        assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok", "database": "postgresql"}
        name = urlsplit(postgres_url).path.lstrip("/")
        with psycopg.connect(postgres_server.url("postgres"), autocommit=True) as admin:
            # (refused first, then cut: the pool reconnecting in between would find the database up)
            admin.execute(f'alter database "{name}" with allow_connections false')
            admin.execute("select pg_terminate_backend(pid) from pg_stat_activity where datname = %s", [name])
        answer = httpx.get(f"{server.url}/healthz", timeout=30)
        assert answer.status_code == 503 and answer.json()["database"] == "postgresql"
        with psycopg.connect(postgres_server.url("postgres"), autocommit=True) as admin:
            admin.execute(f'alter database "{name}" with allow_connections true')
        assert httpx.get(f"{server.url}/healthz", timeout=30).status_code == 200


def test_a_request_that_fails_after_deciding_keeps_its_decisions(tmp_path, postgres_url):
    """A refusal raises after the pipeline recorded results and a ticket: as in one process, they stay."""
    ledger = PostgresLedger(postgres_url, 2)
    store = StateStore(persist=lambda row: None, ledger=ledger)
    try:
        with pytest.raises(ValueError, match="refused"), store.session("t", "s") as state:
            store.record(state, "call_9", "original", "ls", "[summary]", "summary")
            store.persist(TableRow("tickets", {"id": "ckpt-1", "tenant": "t", "session_id": "s"}))
            raise ValueError("refused")
        with psycopg.connect(postgres_url) as conn:
            assert conn.execute("select handle from tool_results").fetchall() == [("call_9",)]
            assert conn.execute("select id from tickets").fetchall() == [("ckpt-1",)]
            assert conn.execute("select version from session_state").fetchall() == [(1,)]
    finally:
        ledger.close()


def test_messages_are_not_indexed_by_parent(tmp_path, archive_backend):
    """Nothing looks a message up by its parent (chains are walked up by id): the archive keeps no index
    on it, which cost every new message a write; walking up still goes through the primary key."""
    config = config_for(tmp_path, archive_backend)
    open_storage(config, TokenCounter()).close()  # (the schema is made as it opens)
    if archive_backend[0] == "postgresql":
        with psycopg.connect(archive_backend[1]) as conn:
            definitions = [row[0] for row in conn.execute(
                "SELECT indexdef FROM pg_indexes WHERE tablename = 'messages'")]
            plan = " ".join(row[0] for row in conn.execute(
                "EXPLAIN SELECT parent_id, body FROM messages WHERE id = 'x'"))
        assert definitions and not any("(parent_id)" in definition for definition in definitions)
        assert "messages_pkey" in plan
        return
    with sqlite3.connect(config.data_dir / "archive.db") as conn:
        indexed = [row[2] for name, in conn.execute("SELECT name FROM pragma_index_list('messages')")
                   for row in conn.execute("SELECT * FROM pragma_index_info(?)", [name])]
        plan = " ".join(str(row[3]) for row in conn.execute(
            "EXPLAIN QUERY PLAN SELECT parent_id, body FROM messages WHERE id = 'x'"))
    assert indexed and "parent_id" not in indexed
    assert "sqlite_autoindex_messages_1" in plan


def test_recall_finds_an_exchange_answered_a_moment_ago(tmp_path, archive_backend):
    """The writer lingers for company before it commits; recall first waits for what was submitted, so
    an answer given just before a /recall or a recall tool call is already searchable."""
    from tests.test_read_back import TENANT, record

    storage = open_storage(config_for(tmp_path, archive_backend), TokenCounter())
    try:
        storage.writer.linger_s = 600  # only a flush ends this linger: recall must have asked for one
        storage.writer.submit(record(1, [{"role": "user", "content": "the canary word is quuxzeta"}]))
        hits = storage.reader.recall(TENANT, "s1", "default", "quuxzeta", timeout=30)
        assert len(hits) == 1 and not hits.truncated
        storage.reader.settle = None  # (without the wait, the next exchange is not in the archive yet)
        storage.writer.submit(record(2, [{"role": "user", "content": "the next one is plughzorp"}]))
        assert len(storage.reader.recall(TENANT, "s1", "default", "plughzorp", timeout=30)) == 0
    finally:
        storage.close()
