"""The archive: every exchange recorded in SQLite by one background writer, off the request path.

Messages are content-addressed and parent-linked (id = hash of parent id + message bytes), so each
distinct message is stored once however often a growing conversation is resent.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import sqlite3
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from sqlite_utils import Database

from proxy import migrations
from proxy.sse import assemble

log = logging.getLogger("ctxproxy.archive")

BATCH_MAX = 256
_SEEN_LIMIT = 500_000
_SESSION_CHAINS = 2000


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass
class ExchangeRecord:
    """Everything known about one upstream call, handed to the writer as-is (cheap to build)."""

    id: str
    created_at: str
    session_id: str
    session_source: str
    tenant: str
    policy: str
    route: str
    model: str | None
    stream: bool
    request_messages: list[Any]
    params: dict[str, Any]
    forwarded_messages: list[Any] | None = None  # None: forwarded unchanged
    status: int = 0
    latency_ms: float = 0.0
    upstream_ms: float = 0.0
    tokens_before: int | None = None
    tokens_after: int | None = None
    gate: str = "pass"
    response_body: bytes | None = None
    response_chunks: list[bytes] = field(default_factory=list)
    error: str | None = None


@dataclass
class TableRow:
    """A row for a side table (tool results, tickets), written by the same background writer."""

    table: str
    row: dict[str, Any]
    replace: bool = True


SECRET_FIELDS = frozenset({"api_key", "apikey", "authorization", "api-key", "x-api-key"})


def request_params(body: dict[str, Any]) -> dict[str, Any]:
    """Everything of a request but its messages, minus any field that could carry an API key."""
    return {k: v for k, v in body.items() if k != "messages" and k.lower() not in SECRET_FIELDS}


def open_database(path: Path) -> Database:
    """Open (creating 0600 if needed) the archive with WAL and the current schema."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    os.close(fd)
    os.chmod(path, 0o600)
    conn = sqlite3.connect(str(path), check_same_thread=False, timeout=30)
    db = Database(conn)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    migrations.apply(db)
    return db


def message_id(parent_id: str, body: bytes) -> str:
    return hashlib.sha256(parent_id.encode() + b"\0" + body).hexdigest()[:32]


def scope_token(kind: str, value: str) -> str:
    """One alphanumeric token per tenant / session / policy, indexed next to the text."""
    return kind + hashlib.sha1(value.encode()).hexdigest()[:16]


def scope_of(tenant: str, session_id: str, policy: str) -> str:
    # Project = tenant + policy as one token: intersecting two large doclists would cost more.
    return " ".join((scope_token("tn", tenant), scope_token("ss", session_id), project_token(tenant, policy)))


def project_token(tenant: str, policy: str) -> str:
    return scope_token("tp", tenant + "\0" + policy)


def searchable_text(message: Any) -> str:
    if not isinstance(message, dict):
        return str(message)
    parts: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        parts.extend(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    for call in message.get("tool_calls") or ():
        function = (call.get("function") or {}) if isinstance(call, dict) else {}
        parts.append(f"{function.get('name', '')}({function.get('arguments', '')})")
    return "\n".join(parts)


class ArchiveWriter:
    """Single writer thread; `submit` never blocks the caller, `close` flushes everything queued."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._seen: set[str] = set()
        self._last_chain: dict[tuple[str, str, str], tuple[list[Any], list[str]]] = {}
        self._db = open_database(path)
        self._thread = threading.Thread(target=self._run, name="ctxproxy-archive", daemon=True)
        self._thread.start()

    def submit(self, item: ExchangeRecord | TableRow) -> None:
        self._queue.put(item)

    def flush(self, timeout: float = 30.0) -> bool:
        """Block until everything submitted so far is committed (for shutdown, the CLI and tests)."""
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=60)
        self._db.close()

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < BATCH_MAX:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            records = [item for item in batch if isinstance(item, ExchangeRecord | TableRow)]
            if records:
                try:
                    with self._db.atomic():
                        for record in records:
                            self._write_item(record)
                except Exception:
                    # One bad item must not lose the batch: retry them one by one. Nodes remembered
                    # as written were rolled back, so forget them.
                    self._seen.clear()
                    self._last_chain.clear()
                    for record in records:
                        try:
                            with self._db.atomic():
                                self._write_item(record)
                        except Exception:
                            log.exception("archive: could not write %s", type(record).__name__)
            for item in batch:
                if isinstance(item, threading.Event):
                    item.set()
            if any(item is None for item in batch):
                return

    def _write_item(self, item: ExchangeRecord | TableRow) -> None:
        if isinstance(item, TableRow):
            self._db[item.table].insert(item.row, replace=item.replace)
        else:
            self._write(item)

    def _store_chain(self, messages: list[Any], record: ExchangeRecord, kind: str = "request") -> str:
        # Agents resend the whole history every turn: reuse the ids of the prefix this session sent
        # last time (a dict comparison is far cheaper than serializing and hashing it again).
        key = (record.tenant, record.session_id, kind)
        previous, previous_ids = self._last_chain.get(key, ([], []))
        shared = 0
        for old, new in zip(previous, messages, strict=False):
            if old != new:
                break
            shared += 1
        ids = previous_ids[:shared]
        parent = ids[-1] if ids else f"tenant:{record.tenant}"
        rows = []
        for message in messages[shared:]:
            body = orjson.dumps(message)
            node = message_id(parent, body)
            if node not in self._seen:
                rows.append(_message_row(node, parent, message, body, record))
                self._remember(node)
            parent = node
            ids.append(node)
        if rows:
            self._db["messages"].insert_all(rows, ignore=True)
        if len(self._last_chain) >= _SESSION_CHAINS:
            self._last_chain.clear()
        self._last_chain[key] = (messages, ids)
        return parent

    def _remember(self, node: str) -> None:
        if len(self._seen) >= _SEEN_LIMIT:
            self._seen.clear()
        self._seen.add(node)

    def _write(self, record: ExchangeRecord) -> None:
        request_leaf = self._store_chain(record.request_messages, record)
        forwarded_leaf = request_leaf
        if record.forwarded_messages is not None:
            forwarded_leaf = self._store_chain(record.forwarded_messages, record, "forwarded")
        row: dict[str, Any] = {
            "id": record.id, "created_at": record.created_at, "session_id": record.session_id,
            "session_source": record.session_source, "tenant": record.tenant, "policy": record.policy,
            "route": record.route, "model": record.model, "stream": int(record.stream),
            "status": record.status, "latency_ms": round(record.latency_ms, 3),
            "upstream_ms": round(record.upstream_ms, 3), "tokens_before": record.tokens_before,
            "tokens_after": record.tokens_after, "gate": record.gate, "request_leaf": request_leaf,
            "forwarded_leaf": forwarded_leaf, "params": orjson.dumps(record.params).decode(),
            "error": record.error,
        }
        if 200 <= record.status < 300:
            row.update(self._response_fields(record, request_leaf))
        elif record.response_body and not record.error:
            row["error"] = record.response_body.decode("utf-8", "replace")[:65536]
        self._db["exchanges"].insert(row, replace=True)

    def _response_fields(self, record: ExchangeRecord, request_leaf: str) -> dict[str, Any]:
        message, usage, response_id, finish = _parse_response(record)
        fields: dict[str, Any] = {"response_id": response_id, "finish_reason": finish}
        if message is not None:
            fields["response_message_id"] = self._store_chain_from(request_leaf, message, record)
        if usage:
            details = usage.get("prompt_tokens_details") or {}
            fields.update(prompt_tokens=usage.get("prompt_tokens"),
                          completion_tokens=usage.get("completion_tokens"),
                          cached_tokens=details.get("cached_tokens"))
        return fields

    def _store_chain_from(self, parent: str, message: dict[str, Any], record: ExchangeRecord) -> str:
        body = orjson.dumps(message)
        node = message_id(parent, body)
        # The proxy's own answers (slash commands) would make recall find its earlier results.
        row = _message_row(node, parent, message, body, record, searchable=record.gate != "command")
        self._db["messages"].insert(row, ignore=True)
        return node


def _message_row(node: str, parent: str, message: Any, body: bytes, record: ExchangeRecord,
                 searchable: bool = True) -> dict[str, Any]:
    return {
        "id": node, "parent_id": parent, "tenant": record.tenant, "session_id": record.session_id,
        "policy": record.policy, "scope": scope_of(record.tenant, record.session_id, record.policy),
        "role": message.get("role") if isinstance(message, dict) else None,
        "text": searchable_text(message) if searchable else "", "body": body.decode(),
        "created_at": record.created_at,
    }


def _parse_response(record: ExchangeRecord) -> tuple[dict | None, dict | None, str | None, str | None]:
    if record.stream:
        folded = assemble(record.response_chunks)
        return folded.message(), folded.usage, folded.response_id, folded.finish_reason
    try:
        body = orjson.loads(record.response_body or b"")
    except orjson.JSONDecodeError:
        return None, None, None, None
    if not isinstance(body, dict):
        return None, None, None, None
    choices = body.get("choices") or [{}]
    first = choices[0] if isinstance(choices[0], dict) else {}
    return first.get("message"), body.get("usage"), body.get("id"), first.get("finish_reason")
