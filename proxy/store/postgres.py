"""PostgreSQL as the archive database, shared by several replicas: connections (credentials only from
the environment: PGPASSWORD, ~/.pgpass, or the URL's own user), the writer's target and its rows.

Rows are the SQLite archive's rows (archive_rows.RowWriter decides them); what differs is how they are
written: ON CONFLICT clauses for INSERT OR IGNORE / OR REPLACE, and a message's searchable text as
numbered chunks that carry their message's tenant, session and policy (postgres_schema)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from proxy.accounting import Pricing
from proxy.archive_codec import cell, dumps, loads, safe_text
from proxy.archive_db import chunk_text, message_call_id
from proxy.archive_retry import WARN_EVERY, StillUnavailable, WriteFailed
from proxy.archive_rows import CHAIN_CACHE_BYTES, RowWriter, quote
from proxy.archive_traffic import is_proxy_message, message_text
from proxy.errors import ConfigError
from proxy.store import postgres_schema

if TYPE_CHECKING:
    import psycopg

from proxy.archive_items import ExchangeRecord, TableRow

log = logging.getLogger("ctxproxy.archive")

SCHEMES = ("postgresql", "postgres")
CONNECT_TIMEOUT = 10  # seconds for one connection attempt
START_WAIT = 60.0  # seconds a start waits for the database to accept connections


def is_postgres_url(url: str | None) -> bool:
    return bool(url) and urlsplit(str(url)).scheme in SCHEMES


def check_url(url: str) -> str:
    """The URL if usable; a ConfigError for another scheme or a password written into it (credentials
    come from the environment: PGPASSWORD or ~/.pgpass, which libpq reads itself)."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ConfigError(f"archive.url: expected postgresql://..., got {redacted(url)!r}")
    if parts.password is not None:
        raise ConfigError("archive.url: holds a password; put it in the PGPASSWORD environment variable "
                          "(or ~/.pgpass) and leave it out of the config")
    return url


def redacted(url: str) -> str:
    """The URL without a password (for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    user = f"{parts.username}:***@" if parts.username else ":***@"
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit((parts.scheme, user + host + port, parts.path, parts.query, parts.fragment))


def connect(url: str, **options: Any) -> psycopg.Connection[Any]:
    import psycopg

    return psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT,
                           application_name="ctxproxy", **options)


def transient(exc: BaseException) -> bool:
    """Worth retrying: the server went away or restarted, a deadlock or serialization failure between
    replicas, too many connections. A bad row or a bug is not."""
    import psycopg

    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)


def first_connection(url: str, wait: float = START_WAIT) -> psycopg.Connection[Any]:
    """A connection with the schema migrated, waiting up to `wait` seconds for the server (a replica may
    start before its database); then a ConfigError that names the URL without its password."""
    started, delay = time.monotonic(), 0.2
    while True:
        try:
            conn = connect(url)
            postgres_schema.apply(conn)
            return conn
        except Exception as exc:
            if not transient(exc) or time.monotonic() - started >= wait:
                raise ConfigError(f"archive.url {redacted(url)}: cannot use the database: "
                                  f"{type(exc).__name__}: {str(exc).strip()}",
                                  code="archive_unavailable") from None
            log.warning("archive: waiting for PostgreSQL at %s (%s)", redacted(url), str(exc).strip())
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


class PostgresTarget:
    """The writer's database when `archive.url` is PostgreSQL: one connection, reopened when lost."""

    def __init__(self, url: str, *, wait: float = START_WAIT) -> None:
        self.url, self.name = url, redacted(url)
        self.conn: psycopg.Connection[Any] | None = first_connection(url, wait)

    def row_writer(self, chain_cache_bytes: int = CHAIN_CACHE_BYTES,
                   pricing: Pricing | None = None) -> PostgresRowWriter:
        return PostgresRowWriter(self, chain_cache_bytes, pricing)

    def connection(self) -> psycopg.Connection[Any]:
        if self.conn is None or self.conn.closed or self.conn.broken:
            if self.conn is not None:
                self.conn.close()
            self.conn = None
            self.conn = connect(self.url)
        return self.conn

    def transaction(self, write: Callable[[], None], *, records: int, retry_for: float, give_up: bool,
                    on_rollback: Callable[[], None]) -> None:
        """One transaction; a lost connection, a restarting server, a deadlock with another replica
        are retried with backoff (what waits is safe in the spool), never given up on while running
        (unless `give_up`: StillUnavailable past `retry_for`); anything else is WriteFailed."""
        started = time.monotonic()
        delay, warned, failed = 0.05, 0.0, False
        while True:
            try:
                conn = self.connection()
                try:
                    with conn.transaction():
                        write()
                except BaseException:
                    on_rollback()
                    raise
            except Exception as exc:
                if not transient(exc):
                    raise WriteFailed(exc) from exc
                now = time.monotonic()
                waited = now - started
                if give_up and waited >= retry_for:
                    raise StillUnavailable(waited, exc) from exc  # type: ignore[arg-type]
                if not failed or now - warned >= WARN_EVERY:
                    (log.error if waited >= retry_for else log.warning)(
                        "archive: PostgreSQL unavailable for %.0f s (%s); retrying, %d records wait (safe "
                        "in the spool)", waited, str(exc).strip(), records)
                    warned, failed = now, True
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            if failed:
                log.warning("archive: PostgreSQL writable again after %.1f s; %d records committed",
                            time.monotonic() - started, records)
            return

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def upsert(table: str, columns: Sequence[str], replace: bool) -> str:
    """INSERT OR REPLACE (replace) / OR IGNORE as PostgreSQL says it."""
    keys = postgres_schema.PRIMARY_KEYS[table]
    names = ", ".join(quote(c) for c in columns)
    values = ", ".join(["%s"] * len(columns))
    updates = [c for c in columns if c not in keys]
    if replace and updates:
        action = "DO UPDATE SET " + ", ".join(f"{quote(c)} = EXCLUDED.{quote(c)}" for c in updates)
    else:
        action = "DO NOTHING"
    return (f"INSERT INTO {quote(table)} ({names}) VALUES ({values}) "
            f"ON CONFLICT ({', '.join(quote(k) for k in keys)}) {action}")


_MESSAGE_INSERT = ("INSERT INTO messages (id, parent_id, tenant, session_id, policy, role, body, created_at, "
                   "call_id, size, proxy) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
                   "ON CONFLICT (id) DO NOTHING RETURNING 1")
_CHUNK_INSERT = ("INSERT INTO message_chunks (message_id, seq, first_line, tenant, session_id, policy, text) "
                 "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (message_id, seq) DO NOTHING")


NUL_MARK = "\ue000nul:"  # a private-use character and a word: how an encoded text cell begins


def encode_text(value: Any) -> Any:
    """A text cell PostgreSQL can hold, whatever it holds: PostgreSQL text cannot hold NUL, so a string
    with one (or one that begins like an encoded cell) is stored as NUL_MARK + its JSON string. Every
    other value is itself. `decode_text` is the inverse; equal strings encode equal (lookups by a value
    encode it too)."""
    if isinstance(value, str) and ("\x00" in value or value.startswith(NUL_MARK)):
        return NUL_MARK + dumps(value).decode()
    return value


def decode_text(value: Any) -> Any:
    """A value read from a text cell, as it was before `encode_text`."""
    if isinstance(value, str) and value.startswith(NUL_MARK):
        return loads(value[len(NUL_MARK):])
    return value


def pg_cell(value: Any) -> Any:
    """A value for a column of a side-table row (archive_codec.cell), as PostgreSQL stores it."""
    return encode_text(cell(value))


def pg_text(value: Any) -> Any:
    """PostgreSQL text cannot hold NUL: searchable copies get a space instead."""
    return value.replace("\x00", " ") if isinstance(value, str) and "\x00" in value else value


class PostgresRowWriter(RowWriter):
    """RowWriter's rows, written on the target's current connection."""

    def __init__(self, target: PostgresTarget, chain_budget_bytes: int = CHAIN_CACHE_BYTES,
                 pricing: Pricing | None = None) -> None:
        super().__init__(None, chain_budget_bytes, pricing)  # type: ignore[arg-type]
        self._target = target

    def begin(self, items: list[ExchangeRecord | TableRow]) -> None:
        """Replicas' writers insert the same messages (a session's history, resent through both): each
        batch first locks the tenants it writes, in one order, so two batches wait for each other
        instead of deadlocking (message ids are rooted per tenant: no conflict crosses tenants)."""
        from proxy.store.ledger import lock_key

        tenants = sorted({str(item.tenant if isinstance(item, ExchangeRecord) else item.row.get("tenant"))
                          for item in items})
        conn = self._target.connection()
        for tenant in tenants:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", [lock_key("archive-writer", tenant)])

    def _row(self, verb: str, table: str, row: dict[str, Any]) -> None:
        key = (verb, table, tuple(row))
        statement = self._statements.get(key)
        if statement is None:
            statement = self._statements[key] = upsert(table, list(row), verb == "INSERT OR REPLACE")
        self._target.connection().execute(statement, [pg_cell(v) for v in row.values()])

    def _insert(self, node: str, parent: str, message: Any, body: bytes, record: ExchangeRecord,
                searchable: bool = True) -> None:
        conn = self._target.connection()
        role = message.get("role") if isinstance(message, dict) else None
        proxy = not searchable or is_proxy_message(message)
        # Text cells as every row has them (encode_text); the body is JSON text, which never holds a NUL.
        tenant, session_id, policy = (encode_text(safe_text(value)) for value in
                                      (record.tenant, record.session_id, record.policy))
        inserted = conn.execute(_MESSAGE_INSERT, (
            node, encode_text(safe_text(parent)), tenant, session_id, policy, encode_text(safe_text(role)),
            body.decode("utf-8"), record.created_at, encode_text(message_call_id(message)), len(body),
            int(proxy))).fetchone()
        if inserted is None or proxy:
            return
        rows, line = [], 1
        for seq, chunk in enumerate(chunk_text(safe_text(message_text(message)) or "")):
            rows.append((node, seq, line, tenant, session_id, policy, pg_text(chunk)))
            line += chunk.count("\n")
        if rows:
            with conn.cursor() as cursor:
                cursor.executemany(_CHUNK_INSERT, rows)
