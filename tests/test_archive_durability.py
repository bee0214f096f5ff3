"""The archive never drops an exchange: wrong-shaped answers, lone surrogates, a locked database, a full
queue, kill -9, and a second process on the same data dir (issue 8). Real files, real SQLite."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from proxy import archive_params, archive_rows
from proxy.archive import (
    ArchiveWriter,
    ExchangeRecord,
    TableRow,
    encode_item,
    frame,
    open_database,
    request_params,
    utc_now,
)
from proxy.cli import main as cli_main
from proxy.errors import ConfigError
from proxy.reader import ArchiveReader
from proxy.store.postgres import NUL_MARK, PostgresTarget
from proxy.store.postgres_reader import PostgresReader
from tests.conftest import BOTH_BACKENDS, write_config
from tests.servers import Step, sse

ROOT = Path(__file__).resolve().parent.parent
GOOD = b'{"id":"r1","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},' \
       b'"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}'


def record(n: int | str, *, body: bytes | None = GOOD, chunks: list[bytes] | None = None, status: int = 200,
           session: str = "s", tenant: str = "t", model: str | None = "gpt-4o",
           messages: list | None = None, route: str = "chat/completions") -> ExchangeRecord:
    return ExchangeRecord(
        id=f"ex-{n}", created_at=utc_now(), session_id=session, session_source="header", tenant=tenant,
        policy="default", route=route, model=model, stream=chunks is not None,
        request_messages=messages or [{"role": "user", "content": f"question {n}"}], params={"n": 1},
        status=status, response_body=None if chunks is not None else body, response_chunks=chunks or [])


def exchange(db_path: Path, exchange_id: str) -> dict:
    conn = sqlite3.connect(db_path)
    conn.row_factory = sqlite3.Row
    try:
        row = conn.execute("select * from exchanges where id = ?", [exchange_id]).fetchone()
        return dict(row) if row else {}
    finally:
        conn.close()


def count(db_path: Path, sql: str, params: tuple = ()) -> int:
    conn = sqlite3.connect(db_path)
    try:
        return conn.execute(sql, params).fetchone()[0]
    finally:
        conn.close()


@pytest.fixture
def archive_path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "archive.db"


@dataclass
class Archive:
    """The writer and the read side of one archive on the test's backend (conftest.archive_backend)."""

    path: Path  # the SQLite archive, or where the PostgreSQL writer keeps its spool
    url: str | None  # PostgreSQL: the database

    def writer(self) -> ArchiveWriter:
        url = self.url
        return ArchiveWriter(self.path, target=(lambda: PostgresTarget(url)) if url else None)

    def reader(self) -> ArchiveReader | PostgresReader:
        return PostgresReader(self.url) if self.url else ArchiveReader(self.path)

    def exchange(self, exchange_id: str) -> dict:
        if self.url is None:
            return exchange(self.path, exchange_id)
        reader = PostgresReader(self.url)
        try:
            rows = reader.rows("select * from exchanges where id = ?", [exchange_id])
        finally:
            reader.close()
        return rows[0] if rows else {}


@pytest.fixture
def archive(archive_path: Path, archive_backend: tuple[str, str | None]) -> Archive:
    return Archive(archive_path, archive_backend[1])


class Blocker:
    """Another connection holding the archive's write lock (BEGIN IMMEDIATE) until released."""

    def __init__(self, path: Path) -> None:
        self.conn: sqlite3.Connection | None = sqlite3.connect(path, isolation_level=None, timeout=30)
        self.conn.execute("BEGIN IMMEDIATE")

    def release(self) -> None:
        if self.conn is not None:
            self.conn.execute("ROLLBACK")
            self.conn.close()
            self.conn = None


# ------------------------------------------------------------------------------ wrong-shaped answers

WRONG_BODIES = {
    "not json": b"<html>502 Bad Gateway</html>",
    "empty": b"",
    "not utf-8": b"\xff\xfe\x00garbage",
    "array": b"[1,2,3]",
    "string": b'"hello"',
    "null": b"null",
    "choices not a list": b'{"choices":"nope"}',
    "choices empty": b'{"choices":[]}',
    "choices [null]": b'{"choices":[null]}',
    "choice not an object": b'{"choices":[7]}',
    "message not an object": b'{"choices":[{"message":"hi","finish_reason":3}]}',
    "message null": b'{"choices":[{"message":null}]}',
    "usage not an object": b'{"choices":[{"message":{"role":"assistant","content":"ok"}}],"usage":"lots"}',
    "usage fields not ints": b'{"id":5,"choices":[{"message":{"role":"assistant","content":"ok"}}],'
                             b'"usage":{"prompt_tokens":"11","completion_tokens":1.5,'
                             b'"prompt_tokens_details":[]}}',
}

WRONG_STREAMS = {
    "array event": [b"data: [1,2,3]\n\n", b"data: [DONE]\n\n"],
    "choices [null]": [b'data: {"choices":[null]}\n\n', b"data: [DONE]\n\n"],
    "not json": [b"data: {not json\n\n", b"data: [DONE]\n\n"],
    "garbage bytes": [b"\x00\x01\xff garbage without events"],
    "empty": [b""],
    "mixed": [sse({"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "par"}}]}),
              b'data: {"choices":{"0":1}}\n\n', b'data: {"choices":[{"delta":"x"}]}\n\n',
              b'data: {"choices":[{"delta":{"tool_calls":[null,{"index":"0","function":7}]}}]}\n\n',
              sse({"choices": [{"index": 0, "delta": {"content": "tial"}, "finish_reason": "stop"}],
                   "usage": {"prompt_tokens": "x"}}),
              b"data: [DONE]\n\n"],
}


def test_any_upstream_body_is_archived_raw_with_the_problem_named(archive):
    writer = archive.writer()
    cases = {f"body {name}": record(f"b{i}", body=body)
             for i, (name, body) in enumerate(WRONG_BODIES.items())}
    cases |= {f"stream {name}": record(f"s{i}", chunks=chunks)
              for i, (name, chunks) in enumerate(WRONG_STREAMS.items())}
    for item in cases.values():
        writer.submit(item)
    writer.submit(record("good"))
    huge = b'{"choices":[{"message":{"role":"assistant","content":"ok","n":' + b"9" * 40 + b"}}]}"
    writer.submit(record("huge-int", body=huge))  # valid JSON that orjson refuses
    writer.close()
    for name, item in cases.items():
        row = archive.exchange(item.id)
        assert row, f"{name}: exchange not archived"
        assert row["status"] == 200 and row["request_leaf"], name
        assert row["parse_error"], f"{name}: the problem is not named"
        raw = b"".join(item.response_chunks) if item.stream else item.response_body
        assert row["response_raw"] == raw, f"{name}: raw response not kept"
    good = archive.exchange("ex-good")
    assert good["parse_error"] is None and good["response_raw"] is None
    assert good["prompt_tokens"] == 3 and good["response_message_id"]
    # What could be read is still used: the message next to a bad usage, the deltas around bad events.
    assert archive.exchange("ex-b12")["response_message_id"]
    assert archive.exchange("ex-b13")["prompt_tokens"] is None
    reader = archive.reader()
    big = archive.exchange("ex-huge-int")
    assert big["parse_error"] is None
    assert reader.chain(big["response_message_id"])[-1]["n"] == int("9" * 40)
    mixed = archive.exchange(f"ex-s{list(WRONG_STREAMS).index('mixed')}")
    assert reader.chain(mixed["response_message_id"])[-1]["content"] == "partial"
    reader.close()


def named_event(obj: dict) -> bytes:
    return b"event: " + str(obj.get("type")).encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


# The Messages and Responses routes' answers of the wrong shape (each once made the writer raise, or could:
# a message_start whose message is not an object set its record aside, out of the archive)
WRONG_NATIVE = {
    "messages: message_start's message a list": ("messages", [named_event(
        {"type": "message_start", "message": [None]})]),
    "messages: message_start's message a string": ("messages", [named_event(
        {"type": "message_start", "message": "m"}), named_event({"type": "message_stop"})]),
    "messages: a text block whose text is a number": ("messages", [
        named_event({"type": "message_start", "message": {"id": "m1", "usage": {"input_tokens": 1}}}),
        named_event({"type": "content_block_start", "index": 0,
                     "content_block": {"type": "text", "text": 5}}),
        named_event({"type": "content_block_delta", "index": 0,
                     "delta": {"type": "text_delta", "text": "hi"}}),
        named_event({"type": "content_block_delta", "index": 0, "delta": "not an object"}),
        named_event({"type": "message_stop"})]),
    "messages: an error event and no start": ("messages", [named_event(
        {"type": "error", "error": {"type": "overloaded_error"}})]),
    "responses: completed with a list for a response": ("responses", [named_event(
        {"type": "response.completed", "response": [1]})]),
    "responses: output not a list": ("responses", [named_event(
        {"type": "response.completed", "response": {"id": "r", "output": {"a": 1}}})]),
}


def test_native_answers_of_the_wrong_shape_are_archived_raw_with_the_problem_named(archive):
    writer = archive.writer()
    cases = {name: record(f"n{i}", chunks=chunks, route=route)
             for i, (name, (route, chunks)) in enumerate(WRONG_NATIVE.items())}
    for item in cases.values():
        writer.submit(item)
    writer.close()
    for name, item in cases.items():
        row = archive.exchange(item.id)
        assert row and row["request_leaf"], f"{name}: exchange not archived"
        assert row["parse_error"], f"{name}: the problem is not named"
        assert "could not be read (" not in row["parse_error"], f"{name}: its reader raised"
        assert row["response_raw"] == b"".join(item.response_chunks), f"{name}: raw response not kept"
    reader = archive.reader()
    numbered = archive.exchange(cases["messages: a text block whose text is a number"].id)
    assert reader.chain(numbered["response_message_id"])[-1]["content"] == "hi"  # what could be read
    reader.close()


def test_an_answer_its_reader_fails_on_is_archived_raw(archive, monkeypatch, caplog):
    """A bug in an answer's reader keeps neither that exchange nor its batch out of the archive."""
    def broken(item: ExchangeRecord) -> None:
        if item.id == "ex-broken":
            raise KeyError("a reader's bug")
        return real(item)

    real = archive_rows.parse_response
    monkeypatch.setattr(archive_rows, "parse_response", broken)
    writer = archive.writer()
    for name in ("before", "broken", "after"):
        writer.submit(record(name))
    with caplog.at_level(logging.ERROR, logger="ctxproxy.archive"):
        writer.close()
    row = archive.exchange("ex-broken")
    assert row["parse_error"] == "the answer could not be read (KeyError)" and row["response_raw"] == GOOD
    assert row["response_message_id"] is None and row["request_leaf"]
    assert all(archive.exchange(f"ex-{name}")["response_message_id"] for name in ("before", "after"))
    assert "ex-broken: its answer could not be read" in caplog.text


def test_error_answers_keep_their_text_and_huge_ones_their_bytes(archive):
    writer = archive.writer()
    huge = b'{"error":{"message":"' + b"x" * 100_000 + b'"}}'
    writer.submit(record("e1", status=503, body=b'{"error":"overloaded"}'))
    writer.submit(record("e2", status=500, body=huge))
    writer.close()
    assert "overloaded" in archive.exchange("ex-e1")["error"]
    assert archive.exchange("ex-e2")["response_raw"] == huge


def test_lone_surrogates_are_stored_and_read_back_exactly(archive):
    messages = [{"role": "user", "content": "half an emoji \ud83d and \udc00 alone"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c\ud800", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]
    body = b'{"id":"r\\ud800","choices":[{"message":{"role":"assistant","content":"cut \\ud83d"}}]}'
    item = record("sur", model="\ud800", session="sess\udfff", tenant="ten\ud800", messages=messages,
                  body=body)
    item.params = {"metadata": {"note": "\ud800"}}
    writer = archive.writer()
    writer.submit(item)
    writer.submit(TableRow("tool_results", {
        "tenant": "t", "session_id": "s", "handle": "h1", "call_id": "h1", "content_hash": "x",
        "tool_name": "sh", "content": "out \ud800", "replacement": "r", "kind": "summary",
        "created_at": utc_now()}))
    writer.close()
    row = archive.exchange("ex-sur")
    assert row["model"] == "\\ud800" and row["response_id"] == "r\\ud800"
    assert row["parse_error"] is None
    reader = archive.reader()
    assert reader.chain(row["request_leaf"]) == messages  # exact, surrogates included
    assert reader.chain(row["response_message_id"])[-1]["content"] == "cut \ud83d"
    assert reader.params(row) == {"metadata": {"note": "\ud800"}}
    assert reader.tool_result_rows("t", "s")[0]["content"] == "out \\ud800"
    hits = reader.search("emoji", tenant="ten\ud800")
    assert len(hits) == 1 and "[emoji]" in hits[0]["snippet"]
    reader.close()


def test_nul_is_stored_and_read_back_exactly(archive):
    """PostgreSQL text holds no NUL (SQLite's does): every row holding one is still written, never set
    aside as rejected, and reads back as it was; so does a text that merely looks like an encoded one."""
    looks_encoded = NUL_MARK + '"x"'
    messages = [{"role": "user", "content": "run \x00 it"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c\x00", "type": "function", "function": {"name": "f\x00", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c\x00", "content": "out\x00put"}]
    item = record("nul", session="s", tenant="t", messages=messages, status=500, body=b"boom\x00 at 0x00")
    writer = archive.writer()
    writer.submit(item)
    now = utc_now()
    writer.submit(TableRow("tool_results", {
        "tenant": "t", "session_id": "s", "handle": "h1", "call_id": "h1", "content_hash": "x",
        "tool_name": "sh\x00", "content": "a\x00b\x00", "replacement": looks_encoded, "kind": "summary",
        "created_at": now}))
    writer.submit(TableRow("session_windows", {
        "tenant": "t", "session_id": "s", "cut": 3, "last_evicted": "m", "headlines": "[\"h\\u0000\"]",
        "block": "evicted \x00 here", "updated_at": now}))
    writer.submit(TableRow("session_memory", {"tenant": "t", "session_id": "s", "kind": "working",
                                              "data": looks_encoded + "\x00", "updated_at": now}))
    writer.close()
    assert not list((archive.path.parent / "spool").glob("rejected-*")), "a row was set aside"
    row = archive.exchange("ex-nul")
    assert row["error"] == "boom\x00 at 0x00"
    reader = archive.reader()
    try:
        assert reader.chain(row["request_leaf"]) == messages
        [result] = reader.tool_result_rows("t", "s")
        assert (result["tool_name"], result["content"], result["replacement"]) == \
            ("sh\x00", "a\x00b\x00", looks_encoded)
        assert reader.tool_result_by_handle("t", "h1")["content"] == "a\x00b\x00"
        assert reader.session_window("t", "s")["block"] == "evicted \x00 here"
        assert reader.session_memory("t", "s", "working")["data"] == looks_encoded + "\x00"
        assert reader.rows("select content from tool_results where tool_name = ?", ["sh\x00"]) == \
            [{"content": "a\x00b\x00"}]
        assert [hit["role"] for hit in reader.search("run", tenant="t")] == ["user"]  # searchable too
    finally:
        reader.close()


def test_request_params_drop_secrets_at_any_depth_without_touching_the_body():
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5,
            "max_completion_tokens": 9, "api_key": "sk-1", "X-Api-Key": "sk-2",
            "metadata": {"api_key": "sk-3", "user": "u", "nested": [{"password": "p", "ok": 1}]},
            "extra_headers": {"Authorization": "Bearer sk-4", "Cookie": "c=1", "x-trace": "t"},
            "extra_body": {"clientSecret": "s", "accessToken": "a", "refresh_token": "r", "token": "t",
                           "prompt_cache_key": "keep", "tokens": 3}}
    before = orjson.dumps(body)
    params = request_params(body)
    assert orjson.dumps(body) == before  # not mutated
    assert params == {"model": "m", "max_tokens": 5, "max_completion_tokens": 9,
                      "metadata": {"user": "u", "nested": [{"ok": 1}]},
                      "extra_headers": {"x-trace": "t"},
                      "extra_body": {"prompt_cache_key": "keep", "tokens": 3}}
    assert b"sk-" not in orjson.dumps(params)
    # A tool's parameter named password is a schema, not a credential; a header in a tool config is one.
    login = {"type": "function", "function": {"name": "login", "parameters": {
        "type": "object", "properties": {"password": {"type": "string"}, "token": {"type": "string"}},
        "required": ["password"]}}}
    mcp = {"type": "mcp", "server_url": "https://mcp.example", "headers": {"Authorization": "Bearer sk-5"}}
    for _ in range(2):  # the second time from the cache
        tools = request_params({"tools": [login, mcp]})["tools"]
        assert tools == [login, {"type": "mcp", "server_url": "https://mcp.example", "headers": {}}]
        assert mcp["headers"] == {"Authorization": "Bearer sk-5"}  # not mutated


def test_the_very_same_large_params_value_is_cleaned_once(monkeypatch):
    """A resent body's tools are the earlier parse's very objects: what they cleaned to is taken again
    without serializing them; an equal copy is cleaned anew."""
    mcp = {"type": "mcp", "server_url": "https://mcp.example", "headers": {"Authorization": "Bearer sk-6"}}
    tools = [*({"name": f"Tool{n}", "description": "d" * 400} for n in range(20)), mcp]
    first = request_params({"tools": tools})["tools"]
    assert b"sk-6" not in orjson.dumps(first) and len(first) == 21

    def refuse(value, *args, **kwargs):
        raise AssertionError("serialized again")

    monkeypatch.setattr(archive_params.orjson, "dumps", refuse)
    assert request_params({"tools": tools})["tools"] is first
    with pytest.raises(AssertionError, match="serialized again"):
        request_params({"tools": [*tools]})


def test_what_is_remembered_by_identity_stays_within_its_byte_budget():
    remembered = archive_params._ByIdentity(100)
    values = [[n] for n in range(4)]
    for value in values[:3]:
        remembered.put(value, ("cleaned", value), 40)
    remembered.put(values[2], ("cleaned", values[2]), 40)  # (again: counted once)
    assert remembered.size == 80 and remembered.get(values[0]) is None  # the oldest left
    assert remembered.get(values[1]) == ("cleaned", values[1]) and remembered.get([1]) is None  # (identity)
    remembered.put(values[3], "big", 90)
    assert remembered.size == 90 and remembered.get(values[2]) is None and remembered.get(values[3]) == "big"


def test_a_sessions_very_same_params_are_neither_serialized_nor_hashed_again(monkeypatch):
    conn = sqlite3.connect(":memory:")
    conn.execute("create table request_params (id text primary key, tenant text, body text, created_at text)")
    writer = archive_rows.RowWriter(conn)
    tools = [{"name": f"tool{n}"} for n in range(5)]
    first = record(0)
    first.params = {"tools": tools, "max_tokens": 1024}
    node = writer._params_id(first)
    serialized = []
    monkeypatch.setattr(archive_rows, "dumps", lambda value: serialized.append(value) or orjson.dumps(value))
    again = record(1)
    again.params = {"tools": tools, "max_tokens": 1024}  # (a new dict, the same objects)
    assert writer._params_id(again) == node and serialized == []
    other = record(2)
    other.params = {"tools": [dict(t) for t in tools], "max_tokens": 1024}  # (equal, other objects)
    assert writer._params_id(other) == node and len(serialized) == 1
    assert conn.execute("select count(*) from request_params").fetchone()[0] == 1


@BOTH_BACKENDS
def test_wrong_shaped_answers_through_the_server_are_archived(proxy, fake_upstream):
    bodies = [b"not json at all", b"[1,2,3]", b'{"choices":[null]}', b'{"choices":[{"message":7}]}',
              b'{"choices":[{"message":{"role":"assistant","content":"ok"}}],"usage":[1]}']
    for body in bodies:
        fake_upstream.then(Step(kind="raw", body=body, headers={"content-type": "application/json"}))
    fake_upstream.then(Step(kind="stream", chunks=[b"data: [1,2,3]\n\n", b'data: {"choices":[null]}\n\n',
                                                   b"data: [DONE]\n\n"]))
    for n, body in enumerate(bodies):
        response = httpx.post(f"{proxy.url}/v1/chat/completions", headers={"x-ctxproxy-session": f"raw-{n}"},
                              json={"model": "gpt-4o", "messages": [{"role": "user", "content": f"q{n}"}]})
        assert response.status_code == 200 and response.content == body  # relayed untouched
    with httpx.stream("POST", f"{proxy.url}/v1/chat/completions", headers={"x-ctxproxy-session": "raw-s"},
                      json={"model": "gpt-4o", "stream": True,
                            "messages": [{"role": "user", "content": "qs"}]}) as response:
        response.read()
    proxy.flush()
    for session in [f"raw-{n}" for n in range(len(bodies))] + ["raw-s"]:
        [row] = proxy.query("select count(*) as n from exchanges where session_id = ? and parse_error is not "
                            "null and response_raw is not null", (session,))
        assert row["n"] == 1, session


@BOTH_BACKENDS
def test_lone_surrogates_through_the_server(proxy, fake_upstream):
    # The model's answer carries a lone surrogate (a cut emoji): relayed as sent, archived safely.
    answer = (b'{"id":"r1","model":"\\ud800","choices":[{"index":0,"message":{"role":"assistant",'
              b'"content":"cut \\ud83d"},"finish_reason":"stop"}]}')
    fake_upstream.then(Step(kind="raw", body=answer, headers={"content-type": "application/json"}))
    response = httpx.post(f"{proxy.url}/v1/chat/completions", headers={"x-ctxproxy-session": "sur-1"},
                          json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 200 and response.content == answer
    # A lone surrogate in the request's model name (the openai SDK cannot send one).
    raw = b'{"model":"\\ud800","messages":[{"role":"user","content":"hi \\udc00"}]}'
    fake_upstream.then(Step(content="fine"))
    second = httpx.post(f"{proxy.url}/v1/chat/completions", content=raw,
                        headers={"content-type": "application/json", "x-ctxproxy-session": "sur-2"})
    assert second.status_code in (200, 400), second.text  # accepted, or refused naming the field
    proxy.flush()
    reader = proxy.reader()
    [row] = reader.exchanges("sur-1")
    assert row["parse_error"] is None
    assert reader.chain(row["response_message_id"])[-1]["content"] == "cut \ud83d"
    if second.status_code == 200:
        [row] = reader.exchanges("sur-2")
        assert row["model"] == "\\ud800"
        assert reader.chain(row["request_leaf"]) == [{"role": "user", "content": "hi \udc00"}]
    # The writer is still fine afterwards.
    proxy.client().chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "after"}],
                                           extra_headers={"x-ctxproxy-session": "sur-3"})
    proxy.flush()
    assert len(reader.exchanges("sur-3")) == 1


# ------------------------------------------------------------------------ busy database, back-pressure

def test_a_locked_database_delays_records_but_loses_none(archive_path, caplog):
    open_database(archive_path).close()
    blocker = Blocker(archive_path)
    writer = ArchiveWriter(archive_path, busy_timeout=0.05)  # fail fast inside SQLite: our retries wait
    try:
        with caplog.at_level(logging.WARNING, logger="ctxproxy.archive"):
            for n in range(40):
                writer.submit(record(n, session=f"s{n % 3}"))
                writer.submit(TableRow("session_memory", {"tenant": "t", "session_id": f"s{n}", "kind": "w",
                                                          "data": "{}", "updated_at": utc_now()}))
            assert not writer.flush(timeout=0.5)  # nothing can be committed while the lock is held
            blocker.release()
            assert writer.flush(timeout=60)
        assert any("database unavailable" in r.message for r in caplog.records)
    finally:
        blocker.release()
        writer.close()
    assert count(archive_path, "select count(*) from exchanges") == 40
    assert count(archive_path, "select count(*) from session_memory") == 40
    assert not list((archive_path.parent / "spool").glob("*.log"))  # all committed: the spool is empty


def test_submit_blocks_while_the_queue_is_over_its_byte_budget(archive_path):
    open_database(archive_path).close()
    blocker = Blocker(archive_path)
    writer = ArchiveWriter(archive_path, max_queued_bytes=1)  # anything beyond one queued item waits
    submitted = threading.Event()
    try:
        writer.submit(record(1))  # an empty queue takes any item
        assert writer.queued_bytes > 0

        def second() -> None:
            writer.submit(record(2))
            submitted.set()

        thread = threading.Thread(target=second, daemon=True)
        thread.start()
        assert not submitted.wait(0.5)  # blocked: the writer cannot commit the first item
        assert count(archive_path, "select count(*) from exchanges") == 0
        blocker.release()
        assert submitted.wait(60)
        assert writer.flush(60)
    finally:
        blocker.release()
        writer.close()
    assert count(archive_path, "select count(*) from exchanges") == 2


def test_a_record_that_cannot_be_written_stays_in_the_spool_and_is_retried_at_start(archive_path):
    writer = ArchiveWriter(archive_path)
    writer.submit(record(1))
    writer.submit(TableRow("no_such_table", {"a": 1}))  # a bug: this can never be written
    writer.submit(record(2))
    assert writer.flush(30)
    writer.close()
    assert count(archive_path, "select count(*) from exchanges") == 2  # the rest of the batch is written
    rejected = list((archive_path.parent / "spool").glob("rejected-*.log"))
    assert len(rejected) == 1 and b"no_such_table" in rejected[0].read_bytes()
    # Once the cause is fixed, the next start writes it.
    conn = sqlite3.connect(archive_path)
    conn.execute("create table no_such_table (a int)")
    conn.commit()
    conn.close()
    ArchiveWriter(archive_path).close()
    assert count(archive_path, "select count(*) from no_such_table") == 1
    assert not list((archive_path.parent / "spool").glob("*.log"))


# ---------------------------------------------------------------------------------- spool and replay

def test_a_start_that_cannot_replay_its_spool_fails_and_keeps_it(archive_path):
    writer = ArchiveWriter(archive_path)
    spool = archive_path.parent / "spool" / "000000000050.log"
    payload = encode_item(record("left"))
    spool.write_bytes(frame(payload) + payload)  # as a crashed run would have left it
    writer.close()
    blocker = Blocker(archive_path)
    try:
        with pytest.raises(ConfigError, match=r"stayed unavailable .* the spool .* is kept"):
            ArchiveWriter(archive_path, busy_timeout=0.05, retry_for=0.3)
    finally:
        blocker.release()
    assert spool.exists()
    ArchiveWriter(archive_path).close()  # the lock was released; this start replays it
    assert exchange(archive_path, "ex-left") and not spool.exists()


def test_set_aside_records_never_overwrite_newer_rows(archive_path):
    def window(block: str) -> TableRow:
        return TableRow("session_windows", {"tenant": "t", "session_id": "s", "cut": 1, "last_evicted": "{}",
                                            "headlines": "[]", "block": block, "updated_at": utc_now()})

    writer = ArchiveWriter(archive_path)
    writer.submit(window("newer"))
    writer.close()
    rejected = archive_path.parent / "spool" / "rejected-1.log"
    older = [encode_item(window("older")), encode_item(record("gap"))]
    rejected.write_bytes(b"".join(frame(p) + p for p in older))
    ArchiveWriter(archive_path).close()
    conn = sqlite3.connect(archive_path)
    assert conn.execute("select block from session_windows").fetchall() == [("newer",)]
    conn.close()
    assert exchange(archive_path, "ex-gap")  # what was missing is filled in
    assert not rejected.exists()


def test_replaying_committed_records_changes_nothing(archive_path):
    items: list = [record(n, messages=[{"role": "user", "content": f"needle {k}"} for k in range(n + 1)])
                   for n in range(5)]
    items.append(TableRow("tool_results", {"tenant": "t", "session_id": "s", "handle": "h", "call_id": "h",
                                           "content_hash": "x", "tool_name": None, "content": "needle",
                                           "replacement": "r", "kind": "summary", "created_at": utc_now()}))
    writer = ArchiveWriter(archive_path)
    writer.submit_many(items)
    writer.close()
    tables = ("exchanges", "messages", "message_chunks_fts", "tool_results")
    before = {t: count(archive_path, f"select count(*) from {t}") for t in tables}
    # As if the process died after committing but before trimming its spool: the same records again.
    spool = archive_path.parent / "spool" / "000000000099.log"
    with open(spool, "wb") as f:
        for item in items:
            payload = encode_item(item)
            f.write(frame(payload) + payload)
        f.write(frame(b"x" * 100)[:10])  # a frame cut short at the end: never acknowledged, ignored
    ArchiveWriter(archive_path).close()
    assert {t: count(archive_path, f"select count(*) from {t}") for t in tables} == before
    assert not spool.exists()


CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from proxy.archive import ArchiveWriter, ExchangeRecord, TableRow, utc_now

    writer = ArchiveWriter(Path(sys.argv[1]), busy_timeout=0.05)
    for n in range(30):
        writer.submit(ExchangeRecord(
            id=f"kill-{n}", created_at=utc_now(), session_id=f"s{n % 4}", session_source="header",
            tenant="t", policy="default", route="chat/completions", model="m", stream=False,
            request_messages=[{"role": "user", "content": f"spooled {n}"}], params={}, status=200,
            response_body=b'{"choices":[{"message":{"role":"assistant","content":"ok"}}]}'))
    writer.submit_many([
        TableRow("tool_results", {"tenant": "t", "session_id": "s0", "handle": "h", "call_id": "h",
                                  "content_hash": "x", "tool_name": "sh", "content": "original",
                                  "replacement": "summary", "kind": "summary", "created_at": utc_now()}),
        TableRow("session_windows", {"tenant": "t", "session_id": "s0", "cut": 3, "last_evicted": "{}",
                                     "headlines": "[]", "block": "b", "updated_at": utc_now()}),
        TableRow("session_memory", {"tenant": "t", "session_id": "s0", "kind": "working", "data": "{}",
                                    "updated_at": utc_now()}),
        TableRow("tickets", {"id": "tk1", "created_at": utc_now(), "tenant": "t", "session_id": "s0",
                             "kind": "decompose-required", "severity": "error", "checkpoint_id": "c",
                             "estimated_tokens": 1, "max_input_tokens": 1, "message": "m"})])
    print("submitted", flush=True)
    sys.stdin.read()  # wait to be killed
""")


def test_kill_9_keeps_every_submitted_item_in_the_spool(archive_path):
    open_database(archive_path).close()
    blocker = Blocker(archive_path)  # the child cannot commit anything: all it has is its spool
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(archive_path)], cwd=ROOT, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == "submitted", child.stderr.read()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    assert count(archive_path, "select count(*) from exchanges") == 0
    assert sum(p.stat().st_size for p in (archive_path.parent / "spool").glob("*.log")) > 0
    blocker.release()
    ArchiveWriter(archive_path).close()  # the start replays the spool
    assert count(archive_path, "select count(*) from exchanges") == 30
    for table in ("tool_results", "session_windows", "session_memory", "tickets"):
        assert count(archive_path, f"select count(*) from {table}") == 1, table
    assert not list((archive_path.parent / "spool").glob("*.log"))
    reader = ArchiveReader(archive_path)
    assert len(reader.search("spooled", tenant="t")) == 10
    reader.close()


# --------------------------------------------------------------------------------------- one process

def test_one_writer_per_data_dir(archive_path):
    first = ArchiveWriter(archive_path)
    with pytest.raises(ConfigError) as refused:
        ArchiveWriter(archive_path)
    message = refused.value.message
    assert f"another ctxproxy process is using {archive_path.parent} (pid {os.getpid()})" in message
    assert "archive.url: postgresql://" in message  # several processes: replicas on PostgreSQL
    reader = ArchiveReader(archive_path)  # readers (the CLI) are welcome meanwhile
    assert reader.sessions() == []
    first.close()
    ArchiveWriter(archive_path).close()  # released by close()
    reader.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(config: Path, port: int, log: Path | None = None) -> subprocess.Popen:
    """The server in its own process; its output to `log` (a pipe nobody reads would fill up with a
    line an exchange and stall it), or to pipes for a test that reads them."""
    env = os.environ | {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    output = log.open("ab") if log is not None else subprocess.PIPE
    return subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port",
                             str(port)], cwd=ROOT, env=env, stdout=output, stderr=output)


def wait_healthy(process: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # readiness poll only
        if process.poll() is not None:
            output = process.stderr.read().decode() if process.stderr else "(see its log file)"
            raise AssertionError(f"server exited: {output[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError("server did not become healthy")


def test_a_second_server_on_the_same_data_dir_refuses_to_start(proxy, capsys):
    port = free_port()
    second = serve(proxy.config_path, port)
    try:
        _, stderr = second.communicate(timeout=90)
    finally:
        if second.poll() is None:
            second.kill()
    assert second.returncode != 0
    # One clean line (the ConfigError's message), before the server starts: no traceback, no server log.
    lines = stderr.decode().strip().splitlines()
    assert len(lines) == 1, stderr.decode()
    assert lines[0].startswith(f"ctxproxy: another ctxproxy process is using {proxy.data_dir}")
    assert "Traceback" not in stderr.decode()
    # The running proxy is untouched, and the CLI's read commands work beside it.
    assert httpx.get(f"{proxy.url}/healthz").status_code == 200
    question = [{"role": "user", "content": "cli check"}]
    proxy.client().chat.completions.create(model="gpt-4o", messages=question)
    proxy.flush()
    assert cli_main(["sessions", "--config", str(proxy.config_path), "--json"]) == 0
    assert len(orjson.loads(capsys.readouterr().out)) == 1
    assert cli_main(["search", "cli check", "--config", str(proxy.config_path)]) == 0
    assert "[cli]" in capsys.readouterr().out


@pytest.mark.parametrize("writer_behind", [False, True], ids=["writer-keeping-up", "database-locked"])
def test_kill_9_loses_no_answered_exchange(tmp_path, upstream_server, fake_upstream, writer_behind):
    _, upstream = upstream_server
    config = write_config(tmp_path, upstream.url)
    db = tmp_path / "data" / "archive.db"
    port = free_port()
    server = serve(config, port, tmp_path / "server.log")
    blocker = None
    try:
        wait_healthy(server, port)
        if writer_behind:  # nothing gets committed: every answered exchange lives only in the spool
            blocker = Blocker(db)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test", max_retries=0,
                               timeout=60)

        def ask(n: int) -> int:
            client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": f"q {n}"}],
                                           extra_headers={"x-ctxproxy-session": f"kill-{n}"})
            return n

        with ThreadPoolExecutor(4) as pool:
            answered = list(pool.map(ask, range(200)))
        server.send_signal(signal.SIGKILL)  # right after the last answer
        server.wait(30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(30)
    if writer_behind:
        assert count(db, "select count(*) from exchanges") == 0
        blocker.release()
    restarted = serve(config, port, tmp_path / "server.log")
    try:
        wait_healthy(restarted, port)  # the spool was replayed before it started serving
    finally:
        restarted.send_signal(signal.SIGTERM)
        restarted.wait(60)
    conn = sqlite3.connect(db)
    per_session = dict(conn.execute("select session_id, count(*) from exchanges group by session_id"))
    conn.close()
    assert len(answered) == 200
    missing = [n for n in answered if per_session.get(f"kill-{n}") != 1]
    assert not missing, f"answered but not archived exactly once: {missing[:10]}"
    assert sum(per_session.values()) == 200
    assert not list((db.parent / "spool").glob("*.log"))


@pytest.mark.parametrize("remembered", [True, False], ids=["remembered", "nothing-remembered"])
def test_a_sessions_request_params_are_stored_once_per_tenant_and_read_back_with_each_exchange(
        archive, monkeypatch, remembered):
    """Agents resend the same tools every turn (Claude Code ~15 KB): one `request_params` row per distinct
    params and tenant, each exchange naming it, whether the writer remembers a session's last params (the
    very objects, or the same bytes) or its budget for them holds nothing; an exchange archived before
    that table still reads."""
    if not remembered:
        monkeypatch.setattr(archive_rows, "PARAMS_BYTES", 0)
    tools = [{"name": f"tool{n}", "input_schema": {"type": "object", "properties": {"x": {"type": "string"}}}}
             for n in range(20)]
    items = [record(n) for n in range(4)] + [record(4, tenant="other"), record(5)]
    for item in items:
        item.params = {"tools": tools, "max_tokens": 1024}
    items[-1].params = {"tools": tools, "max_tokens": 2048}
    writer = archive.writer()
    for item in items:
        writer.submit(item)
    writer.close()
    reader = archive.reader()
    try:
        rows = [archive.exchange(item.id) for item in items]
        assert [reader.params(row) for row in rows] == [item.params for item in items]
        assert len({row["params_id"] for row in rows[:4]}) == 1  # one session's turns: one row
        assert len({row["params_id"] for row in rows}) == 3  # another tenant's, other params: their own
        stored = reader.rows("select id, tenant from request_params")
        assert sorted(row["tenant"] for row in stored) == ["other", "t", "t"]
        assert all(row["params"] is None for row in rows)
        legacy = {**rows[0], "params_id": None, "params": '{"temperature": 0.5}'}
        assert reader.params(legacy) == {"temperature": 0.5}
    finally:
        reader.close()
