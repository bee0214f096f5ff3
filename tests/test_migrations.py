"""The archive's schema after every migration: each message lookup the proxy makes is answered by an index
(a scan would read every message of every tenant), and no index is kept that no lookup uses (each costs
every new message a write at a random place)."""

from __future__ import annotations

import sqlite3

from proxy import migrations
from proxy.sqlite_lib import Database

# Every WHERE the proxy puts on messages (archive_read_back, archive_recall, reader): id, a call's rows.
LOOKUPS = [
    "select parent_id, body from messages where id = ?",
    "select session_id from messages where tenant = ? and call_id = ? and role = 'tool' "
    "and (proxy is null or proxy = 0) order by created_at desc, rowid desc limit 1",
    "select id from messages where tenant = ? and call_id = ? and session_id = ? and role = 'tool'",
]


def _migrated(tmp_path, stop_before: str | None = None) -> Database:
    db = Database(sqlite3.connect(tmp_path / "archive.db"))
    if stop_before:
        migrations.migrations.apply(db, stop_before=stop_before)
    else:
        migrations.apply(db)
    return db


def _plan(db: Database, query: str) -> str:
    arguments = ["x"] * query.count("?")
    return " ".join(row[-1] for row in db.conn.execute("explain query plan " + query, arguments))


def test_every_message_lookup_uses_an_index(tmp_path):
    db = _migrated(tmp_path)
    for query in LOOKUPS:
        plan = _plan(db, query)
        assert "USING" in plan and "INDEX" in plan and "SCAN messages" not in plan, (query, plan)


def test_an_archive_from_before_loses_the_session_index_and_keeps_its_lookups(tmp_path):
    db = _migrated(tmp_path, stop_before="m015_no_session_index")
    indexes = {row[1] for row in db.conn.execute("pragma index_list(messages)")}
    assert "idx_messages_tenant_session_id" in indexes
    migrations.apply(db)
    indexes = {row[1] for row in db.conn.execute("pragma index_list(messages)")}
    assert "idx_messages_tenant_session_id" not in indexes
    assert "idx_messages_tenant_call_id_session_id_role_proxy" in indexes
    for query in LOOKUPS:
        assert "SCAN messages" not in _plan(db, query)
