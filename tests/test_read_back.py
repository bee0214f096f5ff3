"""read_tool_result reads back any tool result the model was sent, from the archive when the state store
recorded nothing for it (issue 9: an evicted result that was never summarized answered "no stored tool
result"). Real archives, written by the real writer, on each backend (SQLite, and a PostgreSQL database
through PostgresReader); one API key never reads another's."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from proxy.archive import ArchiveWriter, ExchangeRecord, TableRow, utc_now
from proxy.internal_tools import ToolContext, execute
from proxy.reader import ArchiveReader
from proxy.state import StateStore
from proxy.store.postgres import PostgresTarget
from proxy.store.postgres_reader import PostgresReader

# Exact bytes: non-ASCII, a CRLF, trailing spaces and no final newline must all come back as sent.
LOG = "\n".join(f"step {i}: built módulo_{i} in {i * 3} ms  " for i in range(1, 40)) + "\r\nexit 0"
TENANT = "acme"


def call(call_id: str, name: str = "bash", arguments: str = '{"cmd": "make"}') -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def answer(message: dict) -> bytes:
    return orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion",
                         "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})


def record(n: int, messages: list[dict], *, tenant: str = TENANT, session: str = "s1",
           forwarded: list[dict] | None = None, response: dict | None = None) -> ExchangeRecord:
    return ExchangeRecord(id=f"{tenant}-{session}-{n}", created_at=utc_now(), session_id=session,
                          session_source="header", tenant=tenant, policy="default", route="chat/completions",
                          model="gpt-4o", stream=False, request_messages=messages, params={}, status=200,
                          forwarded_messages=forwarded,
                          response_body=answer(response or {"role": "assistant", "content": "ok"}))


def write(path: Path, *records: ExchangeRecord | TableRow, url: str | None = None) -> None:
    """The records through the real writer: into the SQLite archive at `path`, or (url) into PostgreSQL
    with `path`'s folder holding the writer's spool."""
    writer = ArchiveWriter(path, target=(lambda: PostgresTarget(url)) if url else None)
    for item in records:
        writer.submit(item)
    writer.close()


def context(store: StateStore, tenant: str = TENANT, session: str = "s1",
            page_chars: int = 24_000) -> ToolContext:
    return ToolContext(store, tenant, session, page_chars)


def read(store: StateStore, handle: str, tenant: str = TENANT, session: str = "s1", **lines: int) -> str:
    arguments = orjson.dumps({"call_id": handle, **lines}).decode()
    return execute({"function": {"name": "read_tool_result", "arguments": arguments}},
                   context(store, tenant, session))


def open_reader(path: Path, url: str | None = None) -> ArchiveReader | PostgresReader:
    return PostgresReader(url) if url else ArchiveReader(path)


@pytest.fixture
def url(archive_backend: tuple[str, str | None]) -> str | None:
    """None (SQLite), or the URL of this test's PostgreSQL database: each test runs on both."""
    return archive_backend[1]


@pytest.fixture
def archive(tmp_path: Path, url: str | None) -> Path:
    path = tmp_path / "data" / "archive.db"
    turn = [{"role": "system", "content": "You are a build agent."},
            {"role": "user", "content": "Build it."},
            {"role": "assistant", "content": None, "tool_calls": [call("call_make")]},
            {"role": "tool", "tool_call_id": "call_make", "content": LOG}]
    later = [*turn, {"role": "assistant", "content": "Built."}, {"role": "user", "content": "Now test."}]
    write(path, record(1, turn), record(2, later), url=url)
    return path


@pytest.fixture
def store(archive: Path, url: str | None):
    reader = open_reader(archive, url)
    yield StateStore(lookup=reader)
    reader.close()


def test_a_result_never_summarized_reads_back_byte_for_byte_by_its_call_id(store):
    assert store.get(TENANT, "s1").by_handle == {}  # nothing recorded: only the archive holds it
    assert read(store, "call_make") == LOG
    found = store.find(TENANT, "s1", "call_make")
    assert found is not None and found.content == LOG and found.kind == "archived"
    # Paged as usual, with the original's line numbers.
    page = read(store, "call_make", start_line=3, end_line=4)
    assert page.splitlines()[1:] == LOG.split("\n")[2:4]
    assert page.startswith("[lines 3-4 of 40 of call_id=call_make")


def test_another_api_key_never_reads_it(store):
    for handle in ("call_make", "call_make#1"):
        assert "no stored tool result" in read(store, handle, tenant="globex")
        assert "no stored tool result" in read(store, handle, tenant="globex", session="s1")
    assert store.find("globex", "s1", "call_make") is None


def test_the_same_key_reads_it_from_another_session(store):
    assert read(store, "call_make", session="s2") == LOG


def test_reused_call_ids_are_numbered_like_new_handle(tmp_path, url):
    path = tmp_path / "archive.db"
    first = [{"role": "user", "content": "go"},
             {"role": "assistant", "content": None, "tool_calls": [call("call_0")]},
             {"role": "tool", "tool_call_id": "call_0", "content": "first output"}]
    second = [*first, {"role": "assistant", "content": None, "tool_calls": [call("call_0")]},
              {"role": "tool", "tool_call_id": "call_0", "content": "second output"}]
    # The forwarded copy of a rewritten request: the first result as a summary, under a block. Neither is
    # a result of call_0; the exact copies of the others count once.
    forwarded = [{"role": "system", "content": "[ctxproxy pinned knowledge: curated]\nrules"},
                 first[0], first[1],
                 {"role": "tool", "tool_call_id": "call_0",
                  "content": "[ctxproxy summary of tool result call_id=call_0: ...]\nfirst"}, *second[3:]]
    write(path, record(1, first), record(2, second, forwarded=forwarded), record(3, [*second, *second[3:]]),
          url=url)
    reader = open_reader(path, url)
    store = StateStore(lookup=reader)
    assert read(store, "call_0") == "first output"
    assert read(store, "call_0#2") == "second output"
    assert "no stored tool result" in read(store, "call_0#3")
    reader.close()


def test_recorded_results_come_first(archive, url):
    write(archive, TableRow("tool_results", {
        "tenant": TENANT, "session_id": "s1", "handle": "obs-0123456789ab", "call_id": "obs-0123456789ab",
        "content_hash": "x", "tool_name": None, "content": "an observation", "replacement": "",
        "kind": "evicted", "created_at": utc_now()}), url=url)
    reader = open_reader(archive, url)
    store = StateStore(lookup=reader)
    assert read(store, "obs-0123456789ab") == "an observation"
    assert "no stored tool result" in read(store, "obs-0123456789ab", tenant="globex")
    reader.close()


def test_the_proxys_own_results_are_not_read_back(tmp_path, url):
    path = tmp_path / "archive.db"
    history = [{"role": "user", "content": "what was the key?"}]
    internal = {"role": "assistant", "content": None,
                "tool_calls": [call("int_1", "recall", '{"query": "key"}')]}
    rounds = [*history, internal, {"role": "tool", "tool_call_id": "int_1", "content": "recall 'key': ..."}]
    write(path, record(1, history, response=internal), record(2, history, forwarded=rounds), url=url)
    reader = open_reader(path, url)
    store = StateStore(lookup=reader)
    assert "no stored tool result" in read(store, "int_1")
    reader.close()
