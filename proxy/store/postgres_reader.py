"""Read side of the archive on PostgreSQL: what ArchiveReader answers for SQLite, with the same methods,
shapes and meaning (proxy/store/storage.py: ArchiveQueries), for the CLI, the dashboard and the tools.

Connections come from a pool opened on first use (a reader may be built before the writer created the
schema), all autocommit and read-only. A search runs in one transaction under a deadline: the server
cancels a statement past it (statement_timeout, set to the time left) and the search returns what it
has, marked `truncated`, as SQLite's progress handler does. Ranking and headlines: postgres_recall.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.abc import Buffer
from psycopg.adapt import Loader
from psycopg.errors import QueryCanceled
from psycopg_pool import ConnectionPool, PoolTimeout

from proxy.archive_codec import loads, safe_text
from proxy.archive_read_back import archived_result
from proxy.reader import BODY_INLINE, SEARCH_TIMEOUT, SearchHits, _hit
from proxy.store import postgres_recall
from proxy.store.postgres import CONNECT_TIMEOUT, decode_text, encode_text, pg_text, redacted
from proxy.store.shared_queries import SharedQueries
from proxy.store.sql import QmarkConnection

POOL_SIZE = 8  # connections at most: a lookup never waits behind a running search
_SELECT_LIST = re.compile(r"^\s*select\b(.*?)\bfrom\b", re.I | re.S)
_ROWID = re.compile(r"\browid\b", re.I)


class _Number(Loader):
    """numeric as SQLite gives it: sums of integers as int, the rest (averages) as float, never Decimal
    (orjson, the report's rounding and the dashboard take int and float)."""

    def load(self, data: Buffer) -> int | float:
        text = bytes(data).decode()
        try:
            return int(text)
        except ValueError:
            return float(text)


def _configure(conn: psycopg.Connection[Any]) -> None:
    conn.adapters.register_loader("numeric", _Number)


def _cells(conn: psycopg.Connection[Any]) -> QmarkConnection:
    """`?` queries whose text cells are as the writer stored them (postgres.encode_text), read back as
    they were written (decode_text)."""
    return QmarkConnection(conn, encode=encode_text, decode=decode_text)


class PostgresReader(SharedQueries):
    """Read-side queries on a PostgreSQL archive (see ArchiveReader for what each one means)."""

    def __init__(self, url: str, *, search_timeout: float = SEARCH_TIMEOUT,
                 on_progress: Callable[[], None] | None = None, pool_size: int = POOL_SIZE) -> None:
        self.url, self.name = url, redacted(url)
        self.search_timeout = search_timeout
        self._on_progress = on_progress  # test seam: called between the statements of a running search
        self._pool_size = max(2, pool_size)
        self._pool: ConnectionPool[Any] | None = None
        self._config: str | None = None  # the text search config of the chunk index
        self._lock = threading.Lock()  # guards opening and closing the pool only
        self._closed = False

    # ------------------------------------------------------------------------------ connections

    def _connections(self) -> ConnectionPool[Any]:
        pool = self._pool
        if pool is not None:
            return pool
        with self._lock:
            if self._closed:
                raise RuntimeError("the archive reader is closed")
            if self._pool is None:
                # Read-only like SQLite's mode=ro; notices (a query of stop words only) are not news.
                # Checked when lent: after a database restart a lookup gets a live connection.
                options = "-c default_transaction_read_only=on -c client_min_messages=warning"
                self._pool = ConnectionPool(
                    self.url, min_size=1, max_size=self._pool_size, open=True, configure=_configure,
                    check=ConnectionPool.check_connection, name="ctxproxy-reader", timeout=CONNECT_TIMEOUT,
                    kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT,
                            "application_name": "ctxproxy-reader", "options": options})
            return self._pool

    @contextmanager
    def _connection(self, timeout: float | None = None) -> Iterator[psycopg.Connection[Any]]:
        with self._connections().connection(timeout=timeout) as conn:
            yield conn

    def _query(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        # Stored text had lone surrogates escaped (archive.safe_text) and a NUL encoded (encode_text,
        # as the writer stores it): a value is asked as stored, and every value read is decoded.
        values = [safe_text(p) if isinstance(p, str) else p for p in params]
        with self._connection() as conn:
            rows = _cells(conn).rows(sql, values)
        listed = _SELECT_LIST.match(sql)
        if rows and "rowid" in rows[0] and listed and not _ROWID.search(listed.group(1)):
            for row in rows:  # `select *`: SQLite's rowid is hidden, this one a column
                del row["rowid"]
        return rows

    def rows(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        """A read-only query's rows, written in the SQL both databases share (`?` placeholders)."""
        return self._query(sql, params)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    # ----------------------------------------------------------------------------------- queries

    def chain(self, leaf: str | None) -> list[dict[str, Any]]:
        """Messages from the root to `leaf`, each as it was received (one round trip, not one a
        message)."""
        if not leaf or leaf.startswith("tenant:"):
            return []
        with self._connection() as conn:
            rows = conn.execute(
                "with recursive up (parent_id, body, depth) as ("
                " select parent_id, body, 0 from messages where id = %s"
                " union all select m.parent_id, m.body, up.depth + 1 from up join messages m"
                " on m.id = up.parent_id where not starts_with(up.parent_id, 'tenant:'))"
                " select body from up order by depth desc", [leaf]).fetchall()
        return [loads(body) for (body,) in rows]

    # ------------------------------------------------------------------------------------ search

    def search(self, query: str, *, tenant: str | None = None, session_id: str | None = None,
               policy: str | None = None, exclude_session: str | None = None, limit: int = 10,
               deadline: float | None = None) -> SearchHits:
        """Ranked hits, at most one per message (its best chunk), each with the lines of that chunk
        holding query terms and the handle that reads the message back; never the proxy's own traffic.
        Every filter is optional. Stops at `deadline` (time.monotonic(); default: now + search_timeout)
        and returns what it has, with `truncated` set."""
        terms = postgres_recall.words(query)
        if not terms or limit <= 0:
            return SearchHits()
        if deadline is None:
            deadline = time.monotonic() + self.search_timeout
        wanted = {"tenant": tenant, "session_id": session_id, "policy": policy}
        stored = {k: pg_text(safe_text(v)) if v is not None else None
                  for k, v in [*wanted.items(), ("exclude_session", exclude_session)]}
        scope = postgres_recall.Scope(**stored)

        def in_scope(row: dict[str, Any]) -> bool:  # the same check as SQLite's, on the message row
            return all(v is None or row[k] == pg_text(safe_text(v)) for k, v in wanted.items()) and (
                exclude_session is None or row["session_id"] != pg_text(safe_text(exclude_session)))

        asking = session_id if session_id is not None else exclude_session
        found: list[dict[str, Any]] = []
        truncated = False
        try:
            left = deadline - time.monotonic()
            if left <= 0:
                raise postgres_recall.Expired()
            with self._connection(timeout=left) as conn:
                config = self._index_config(conn)
                try:
                    with conn.transaction():
                        timed = postgres_recall.Timed(conn, deadline, self._on_progress)
                        postgres_recall.ranked(timed, config, terms, scope, limit, in_scope, tenant,
                                               asking, found, BODY_INLINE)
                except QueryCanceled:
                    truncated = True
        except (postgres_recall.Expired, PoolTimeout):
            truncated = True
        return SearchHits([_hit(row) for row in found], truncated)

    def _index_config(self, conn: psycopg.Connection[Any]) -> str:
        if self._config is None:
            found = postgres_recall.index_config(conn)
            if found is None:  # no schema yet: nothing to find, and look again next time
                return postgres_recall.DEFAULT_CONFIG
            self._config = found
        return self._config

    # ------------------------------------------------------------------------------ state lookups

    def archived_result(self, tenant: str, session_id: str | None, handle: str) -> dict[str, Any] | None:
        """A message the model saw, by call id, `id#n` or `msg-...`, from the archive (this session, or
        with None the tenant's newest session holding it). See proxy.archive_read_back."""
        with self._connection() as conn:
            return archived_result(_cells(conn), tenant, session_id, handle,
                                   by_message=postgres_recall.message_by_handle)

