"""Search stays bounded (issue 8): a multi-megabyte tool result is indexed in chunks, recall gives one hit
per message with a chunk-sized snippet, every search runs under a deadline, and lookups on other threads
never wait behind a running search. Real files, real SQLite."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import orjson
import pytest
from sqlite_utils import Database

from proxy import migrations
from proxy.archive import ArchiveWriter, ExchangeRecord, TableRow, scope_of, utc_now
from proxy.cli import main
from proxy.internal_tools import format_hits
from proxy.reader import ArchiveReader
from tests.conftest import write_config

LOG_LINES = 110_000  # ~8.5 MB; the query word is on every line
OK = b'{"choices":[{"message":{"role":"assistant","content":"done"}}]}'


def log_text(lines: int = LOG_LINES) -> str:
    return "\n".join(f"2026-11-21T10:{n // 60 % 60:02d}:{n % 60:02d} worker-{n % 7} request {n} failed: "
                     f"upstream timeout after 30s (attempt {n % 3})" for n in range(lines))


def exchange(n: int, tenant: str, session: str, messages: list[dict]) -> ExchangeRecord:
    return ExchangeRecord(id=f"{tenant}-{session}-{n}", created_at=utc_now(), session_id=session,
                          session_source="header", tenant=tenant, policy="default", route="chat/completions",
                          model="gpt-4o", stream=False, request_messages=messages, params={}, status=200,
                          response_body=OK)


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bounds")
    write_config(folder, "http://127.0.0.1:9")
    path = folder / "data" / "archive.db"
    writer = ArchiveWriter(path)
    call = {"id": "call_big", "type": "function", "function": {"name": "sh", "arguments": '{"cmd":"logs"}'}}
    writer.submit(exchange(1, "acme", "big", [
        {"role": "user", "content": "why does the job fail?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_big", "content": log_text()}]))
    for n in range(3):
        writer.submit(exchange(n, "acme", "other", [{"role": "user", "content": f"a timeout in step {n}"}]))
    writer.submit(exchange(1, "globex", "g1", [{"role": "user", "content": "globex timeout secret"}]))
    writer.submit(TableRow("tool_results", {
        "tenant": "acme", "session_id": "big", "handle": "call_big", "call_id": "call_big",
        "content_hash": "x", "tool_name": "sh", "content": "original", "replacement": "summary",
        "kind": "summary", "created_at": utc_now()}))
    writer.close()
    return path


def test_recall_over_a_huge_document_gives_one_hit_per_message(archive):
    reader = ArchiveReader(archive)  # the default time limit
    hits = reader.recall("acme", "big", "default", "timeout", 8)
    assert hits.complete and not hits.truncated
    ids = [hit["id"] for hit in hits]
    assert len(ids) == len(set(ids)) == 4  # the log once, plus the project's three other messages
    big = hits[0]
    assert big["session_id"] == "big" and big["role"] == "tool"  # this session first
    assert "[timeout]" in big["snippet"] and len(big["snippet"]) < 1000  # one chunk's snippet
    assert set(big) == {"id", "session_id", "role", "created_at", "body", "snippet", "rank", "lines",
                        "line_count", "handle"}
    # The lines holding the term, numbered as read_tool_result numbers the original's lines.
    original = log_text().split("\n")
    assert big["handle"] == "call_big" and 1 <= len(big["lines"]) <= 3
    assert all(original[number - 1] == text for number, text in big["lines"])
    # The 8 MB body is not carried around: a stand-in names the call to read it with.
    assert len(big["body"]) < 1000 and orjson.loads(big["body"])["tool_call_id"] == "call_big"
    assert 'call_id="call_big"' in format_hits("timeout", hits, "big", 10_000)
    assert {hit["session_id"] for hit in hits[1:]} == {"other"}
    reader.close()


def test_other_tenants_see_nothing(archive):
    reader = ArchiveReader(archive)
    globex = reader.recall("globex", "g1", "default", "timeout", 8)
    assert [hit["session_id"] for hit in globex] == ["g1"]
    assert reader.recall("initech", "big", "default", "timeout", 8) == []  # same session name, other key
    hits = reader.recall("acme", "other", "default", "timeout secret")
    assert hits and all(hit["session_id"] != "g1" for hit in hits)
    reader.close()


def test_a_search_past_its_deadline_returns_what_it_has_marked_truncated(archive):
    reader = ArchiveReader(archive, search_timeout=0.0)  # the deadline has passed before the first step
    hits = reader.recall("acme", "big", "default", "timeout", 8)
    assert hits.truncated and list(hits) == []
    assert "stopped at its time limit" in format_hits("timeout", hits, "big", 10_000)
    # The connection is usable afterwards, and a later search with time to spare completes.
    assert reader.search("timeout", tenant="acme", limit=2, deadline=None).truncated
    reader.search_timeout = 30.0
    assert reader.recall("acme", "big", "default", "timeout", 8).complete
    reader.close()


def test_lookups_never_wait_behind_a_running_search(archive):
    searching, looked_up = threading.Event(), threading.Event()
    waited: list[bool] = []

    def inside_the_search() -> None:  # runs on the searching thread, between SQLite steps
        if not searching.is_set():
            searching.set()
            waited.append(looked_up.wait(20))  # holds the search until the lookups are done

    reader = ArchiveReader(archive, search_timeout=60.0, on_progress=inside_the_search)
    found: list = []

    def lookups() -> None:
        assert searching.wait(20)
        found.append(reader.tool_result_rows("acme", "big"))
        found.append(reader.session_window("acme", "big"))
        found.append(reader.sessions())
        looked_up.set()

    thread = threading.Thread(target=lookups, daemon=True)
    thread.start()
    hits = reader.recall("acme", "big", "default", "timeout", 8)
    thread.join(20)
    assert waited == [True], "a lookup waited behind the search"
    assert found[0][0]["handle"] == "call_big" and found[1] is None and len(found[2]) == 3
    assert hits.complete and len(hits) == 4
    reader.close()


def test_cli_search_prints_a_snippet_per_message(archive, capsys):
    config = archive.parent.parent / "config.yaml"
    assert main(["search", "timeout", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert out.count("[timeout]") == 5 and len(out) < 10_000
    assert main(["search", "timeout", "--config", str(config), "--json", "--session", "big"]) == 0
    [hit] = orjson.loads(capsys.readouterr().out)
    assert hit["session_id"] == "big" and len(hit["body"]) < 1000


def test_migration_moves_an_old_full_text_index_into_chunks(tmp_path):
    path = tmp_path / "archive.db"
    db = Database(sqlite3.connect(path))
    migrations.migrations.apply(db, stop_before="m007_chunked_search_and_raw_responses")
    assert db["messages_fts"].exists()
    big = {"role": "tool", "tool_call_id": "c9", "content": log_text(5000)}
    rows = [("m1", {"role": "user", "content": "the deploy failed with ERR_QUOTA_42"}), ("m2", big)]
    for node, message in rows:  # as the old writer stored them: the text in messages.text
        db["messages"].insert({"id": node, "parent_id": "tenant:t", "tenant": "t", "session_id": "s",
                               "policy": "default", "scope": scope_of("t", "s", "default"),
                               "role": message["role"], "text": message["content"],
                               "body": orjson.dumps(message).decode(), "created_at": utc_now()})
    db.conn.commit()
    migrations.apply(db)
    assert not db["messages_fts"].exists()
    assert not [t for t in db.triggers if "messages_fts" in t.sql]
    assert db.execute("select count(*) from message_chunks_fts").fetchone()[0] > 10
    assert db.execute("select count(*) from messages where text is not null").fetchone()[0] == 0
    assert "response_raw" in db["exchanges"].columns_dict and "parse_error" in db["exchanges"].columns_dict
    db.close()
    reader = ArchiveReader(path)
    [hit] = reader.recall("t", "s", "default", "ERR_QUOTA_42")
    assert hit["id"] == "m1" and "[ERR_QUOTA_42]" in hit["snippet"]
    [hit] = reader.recall("t", "s", "default", "timeout")
    assert hit["id"] == "m2" and orjson.loads(hit["body"])["tool_call_id"] == "c9"
    reader.close()
