"""Pinned knowledge: the policy's files plus runtime pins per project, under one hard token budget.

Runtime pins come from two places. The CLI and the admin API pin for the whole project (tenant "*"):
curated by the operator. `/pin` and `/remember` in a chat pin for the API key that sent them (its
tenant), either within the project or, under `commands.pins: session`, within that one session; these
are labelled in the pinned block as what they are, text an end user typed into a conversation.

A pin that would exceed the budget fails with both sizes and changes nothing. Pins are few and rare,
so they are written directly (SQLite serializes writers) instead of through the archive's queue.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.archive import open_database, utc_now
from proxy.errors import BadRequest, ConfigError, NotFound
from proxy.policy import LoadedPolicy
from proxy.tokens import TokenCounter

EVERY_TENANT = "*"
# Where a pin came from, which decides how the pinned block labels it.
CURATED, CHAT_PROJECT, CHAT_SESSION = "curated", "chat-project", "chat-session"
LABELS = {
    CURATED: "[ctxproxy pinned knowledge: curated by the user; always applies]",
    CHAT_PROJECT: "[ctxproxy pinned knowledge: pinned by /pin in a conversation with this API key]",
    CHAT_SESSION: "[ctxproxy pinned knowledge: pinned in this conversation by /pin]",
}
READ_ENTRIES = 4096  # (policy, tenant, session) reads kept for recheck_s; past that, all are dropped
PIN_ID = re.compile(r"^pin-[0-9a-f]{8,32}$")
COUNT_MODEL = "gpt-4o"  # budgets are model-independent: counted with one tokenizer


class PinBudgetExceeded(BadRequest):
    code = "pin_budget_exceeded"


@dataclass(frozen=True)
class Pin:
    id: str
    name: str
    content: str
    tokens: int
    origin: str = CURATED  # curated (files, CLI, admin API) | chat-project | chat-session (/pin)


def _origin(tenant: str, session_id: str | None) -> str:
    if tenant == EVERY_TENANT:
        return CURATED
    return CHAT_SESSION if session_id is not None else CHAT_PROJECT


_file_cache: dict[Path, tuple[int, str]] = {}


def file_pins(policy: LoadedPolicy, tokens: TokenCounter) -> list[Pin]:
    """The policy's pinned files, in the policy's order, read relative to the policy file.

    Files are re-read only when their mtime changes (one stat per file per request).
    """
    pins = []
    for relative in policy.policy.pinned.files:
        path = (policy.folder or Path(".")) / relative
        try:
            mtime = path.stat().st_mtime_ns
            cached = _file_cache.get(path)
            if cached is None or cached[0] != mtime:
                cached = _file_cache[path] = (mtime, path.read_text(encoding="utf-8"))
            text = cached[1]
        except OSError as exc:
            raise ConfigError(f"{policy.path}: pinned.files: cannot read {relative!r}: {exc.strerror}") \
                from None
        pins.append(Pin(f"file:{relative}", relative, text, tokens.text(text, COUNT_MODEL)))
    return pins


def _query_pins(conn: Any, policy: str, tenant: str | None, session_id: str | None) -> list[Pin]:
    query = "select * from pins where policy = ?"
    params: list[str] = [policy]
    if tenant is not None:
        query += " and tenant in (?, ?)"
        params += [tenant, EVERY_TENANT]
        if session_id is None:
            query += " and session_id is null"
        else:
            query += " and (session_id is null or session_id = ?)"
            params.append(session_id)
    rows = conn.execute(query + " order by created_at, id", params).fetchall()
    return [Pin(r["id"], r["name"], r["content"], r["tokens"], _origin(r["tenant"], r["session_id"]))
            for r in rows]


class PinStore:
    """Runtime pins in the archive database: SQLite at `db_path`, or PostgreSQL at `url` (replicas share
    them; a pin's budget check and insert are one transaction under a per-project lock). What `list` read
    is reused for `recheck_s` seconds (pins changed by another process show within that; this store's own
    changes at once)."""

    def __init__(self, db_path: Path | None, tokens: TokenCounter, *, url: str | None = None,
                 recheck_s: float = 0.0) -> None:
        self.db_path, self.tokens, self.url, self.recheck_s = db_path, tokens, url, recheck_s
        self._read: dict[tuple[str, str | None, str | None], tuple[float, list[Pin]]] = {}
        self._changes = 0  # pins added or removed here: a read that raced one is not kept
        self._conn: Any
        if url is not None:
            from psycopg.rows import dict_row

            from proxy.store.postgres import decode_text, encode_text, first_connection
            from proxy.store.sql import QmarkConnection

            conn = first_connection(url)
            conn.row_factory = dict_row
            # A pin's text may hold NUL, which PostgreSQL text cannot: stored encoded, read back exactly.
            self._conn = QmarkConnection(conn, encode=encode_text, decode=decode_text)
        else:
            assert db_path is not None
            open_database(db_path).close()  # create (0600) and migrate if needed
            self._conn = sqlite3.connect(db_path, timeout=10, check_same_thread=False,
                                         isolation_level=None)  # autocommit: each write its own transaction
            self._conn.row_factory = sqlite3.Row
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _connect(self) -> Iterator[Any]:
        with self._lock:
            yield self._conn

    @contextlib.contextmanager
    def _transaction(self, policy: str) -> Iterator[Any]:
        """One transaction that no other writer of this project's pins interleaves with (a replica's
        budget check and insert against another's)."""
        with self._connect() as conn:
            if self.url is not None:
                with conn.conn.transaction():
                    conn.execute("select pg_advisory_xact_lock(hashtext(?))", ["ctxproxy-pins:" + policy])
                    yield conn
                return
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            (self._conn.conn if self.url is not None else self._conn).close()

    def list(self, policy: str, tenant: str | None = None, session_id: str | None = None) -> list[Pin]:
        """Pins of a project, oldest first.

        tenant None: all of them (operators). Else those visible to the tenant: the project-wide ones
        (tenant "*"), the tenant's own project pins, and, given a session, the tenant's pins of that session.
        """
        key, now, changes = (policy, tenant, session_id), time.monotonic(), self._changes
        read = self._read.get(key)
        if read is not None and now - read[0] < self.recheck_s:
            return read[1]
        with self._connect() as conn:
            pins = _query_pins(conn, policy, tenant, session_id)
        if self.recheck_s and changes == self._changes:
            if len(self._read) >= READ_ENTRIES:
                self._read.clear()
            self._read[key] = (now, pins)
        return pins

    def add(self, policy: LoadedPolicy, content: str, *, name: str, tenant: str = EVERY_TENANT,
            session_id: str | None = None) -> Pin:
        """Pin for the project (tenant "*": the CLI and admin API), a tenant in it, or a tenant's session."""
        if not content.strip():
            raise BadRequest("a pin needs some text", code="empty_pin")
        if tenant == EVERY_TENANT and session_id is not None:
            raise ValueError("project-wide pins have no session")
        tokens = self.tokens.text(content, COUNT_MODEL)
        files = sum(p.tokens for p in file_pins(policy, self.tokens))
        pin = Pin(f"pin-{uuid.uuid4().hex[:12]}", name, content, tokens, _origin(tenant, session_id))
        with self._transaction(policy.name) as conn:
            used = files + sum(p.tokens for p in _query_pins(conn, policy.name, tenant, session_id))
            limit = policy.policy.pinned.max_tokens
            if used + tokens > limit:
                raise PinBudgetExceeded(f"pinning {tokens} tokens would make {used + tokens} pinned "
                                        f"tokens, over pinned.max_tokens ({limit}) of policy "
                                        f"{policy.name!r}; nothing changed")
            conn.execute("insert into pins (id, tenant, policy, name, content, tokens, created_at, "
                         "session_id) values (?, ?, ?, ?, ?, ?, ?, ?)",
                         (pin.id, tenant, policy.name, name, content, tokens, utc_now(), session_id))
        self._changed()
        return pin

    def remove(self, policy: str, pin_id: str, tenant: str | None = None,
               session_id: str | None = None) -> None:
        """Remove a pin. tenant None: any pin of the project (operators). Else only the tenant's own pins
        (never a project-wide one), and given a session only the pins of that session."""
        if not PIN_ID.match(pin_id):
            raise BadRequest(f"invalid pin id {pin_id!r}", code="invalid_pin_id")
        query, params = "delete from pins where id = ? and policy = ?", [pin_id, policy]
        if tenant is not None:
            query += " and tenant = ?"
            params.append(tenant)
        if session_id is not None:
            query += " and session_id = ?"
            params.append(session_id)
        with self._connect() as conn:
            removed = conn.execute(query, params).rowcount
        self._changed()
        if not removed:
            scope = "" if tenant is None else " that this conversation may remove"
            raise NotFound(f"no pin {pin_id!r}{scope} in policy {policy!r}", code="unknown_pin")

    def _changed(self) -> None:
        self._changes += 1
        self._read.clear()


def render(pins: list[Pin]) -> str:
    """The pinned block: stable order, so it changes only when a pin or a file changes.

    Curated pins (files, CLI, admin API) come first under their own label; pins typed into a chat with
    /pin follow under labels that say so, project ones before this session's.
    """
    if not pins:
        return ""
    parts = []
    for origin in (CURATED, CHAT_PROJECT, CHAT_SESSION):
        group = [pin for pin in pins if pin.origin == origin]
        if group:
            parts.append(LABELS[origin])
            parts += [f"## {pin.name} ({pin.id})\n{pin.content.rstrip()}" for pin in group]
    return "\n\n".join(parts)
