"""Session state that several replicas agree on (PostgreSQL): one request of a session at a time across
processes, each starting from what the one before committed.

A request of a session opens a transaction and takes a per-session advisory lock in it; it reads the
session's version and snapshot (the sticky state that is not a row: how much history the provider has
seen, injected tokens, when each message first arrived); the state store rebuilds its cached state when
another replica moved the version on. Every decision row the request makes (tool results and their
replacements, the window, memory blocks, tickets) is written in that same transaction, with the next
version and snapshot; the commit releases the lock. Rows reach the database before the answer reaches
the client, so the next request, wherever it lands, sees them."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from proxy.archive_items import TableRow, utc_now

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool


@dataclass
class LedgerEntry:
    """One request's view of its session in the ledger."""

    version: int  # 0: the session has no committed state yet
    snapshot: dict[str, Any] | None
    # How often each kind of decision row was written (tool_results, window, working, folded, splices):
    # a replica catching up reloads only the kinds that moved.
    kinds: dict[str, int] = field(default_factory=dict)
    rows: list[TableRow] = field(default_factory=list)  # written at commit, in order


def row_kind(row: TableRow) -> str | None:
    """Which part of a session's state a decision row belongs to (None: not part of it)."""
    if row.table == "session_memory":
        return str(row.row.get("kind"))
    return {"tool_results": "tool_results", "session_windows": "window"}.get(row.table)


class SessionLedger(Protocol):
    def open(self, tenant: str, session_id: str) -> contextlib.AbstractContextManager[LedgerEntry]:
        """Lock the session (waiting for a request of it on another replica), read its version; on exit
        write the entry's rows and its new snapshot (`finish` sets it) and unlock."""
        ...

    def unavailable(self, exc: BaseException) -> bool:
        """`exc` says the database could not be reached or used (not a bug, not a client error)."""
        ...

    def close(self) -> None: ...


def lock_key(tenant: str, session_id: str) -> int:
    """The session's advisory lock: a signed 64-bit key from its tenant and id."""
    digest = hashlib.sha256(f"{tenant}\0{session_id}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


_READ = "SELECT version, data FROM session_state WHERE tenant = %s AND session_id = %s"
_WRITE = ("INSERT INTO session_state (tenant, session_id, version, data, updated_at) "
          "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (tenant, session_id) DO UPDATE SET "
          "version = EXCLUDED.version, data = EXCLUDED.data, updated_at = EXCLUDED.updated_at")


class PostgresLedger:
    def __init__(self, url: str, pool_size: int = 20) -> None:
        from psycopg_pool import ConnectionPool

        from proxy.store.postgres import CONNECT_TIMEOUT, first_connection

        first_connection(url).close()  # migrated (and reachable) before the first request
        self._pool: ConnectionPool[Any] = ConnectionPool(
            url, min_size=1, max_size=pool_size, open=True, timeout=60,
            check=ConnectionPool.check_connection,  # a connection broken by a database restart is replaced
            kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT, "application_name": "ctxproxy"})

    @contextlib.contextmanager
    def open(self, tenant: str, session_id: str) -> Iterator[LedgerEntry]:
        from proxy.store.postgres import pg_cell, upsert

        failed: Exception | None = None
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", [lock_key(tenant, session_id)])
            row = conn.execute(_READ, [tenant, session_id]).fetchone()
            data = orjson.loads(row[1]) if row and row[1] else {}
            entry = LedgerEntry(row[0] if row else 0, data.get("snapshot"), dict(data.get("kinds") or {}))
            before = entry.snapshot
            try:
                yield entry
            except Exception as exc:  # a refused request keeps what it decided, as one process would:
                failed = exc          # committed, then raised outside the transaction
            finally:
                for item in entry.rows:
                    statement = upsert(item.table, list(item.row), item.replace)
                    conn.execute(statement, [pg_cell(v) for v in item.row.values()])
                    kind = row_kind(item)
                    if kind is not None:
                        entry.kinds[kind] = entry.kinds.get(kind, 0) + 1
                if entry.rows or entry.snapshot != before:
                    data = {"snapshot": entry.snapshot, "kinds": entry.kinds}
                    conn.execute(_WRITE, [tenant, session_id, entry.version + 1, orjson.dumps(data).decode(),
                                          utc_now()])
                    entry.version += 1
        if failed is not None:
            raise failed

    def unavailable(self, exc: BaseException) -> bool:
        from psycopg_pool import PoolTimeout

        from proxy.store.postgres import transient

        return transient(exc) or isinstance(exc, PoolTimeout)

    def close(self) -> None:
        self._pool.close()
