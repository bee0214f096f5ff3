"""Where the archive writer commits: one database behind a transaction with retries. The writer thread
(proxy/archive.py) owns the queue, the spool and the batching; a target owns the connection, the schema
and what a transaction means on its database (SQLite's BEGIN IMMEDIATE with a busy timeout, or a
PostgreSQL transaction that survives a lost connection)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from proxy.accounting import Pricing
from proxy.archive_rows import RowWriter


class WriteTarget(Protocol):
    name: str  # for messages: a path, or a URL without credentials

    def row_writer(self, chain_cache_bytes: int, pricing: Pricing | None) -> RowWriter: ...

    def transaction(self, write: Callable[[], None], *, records: int, retry_for: float, give_up: bool,
                    on_rollback: Callable[[], None]) -> None:
        """Run `write` in one transaction; retried while the database is unavailable (StillUnavailable
        past `retry_for` when `give_up`), WriteFailed on a permanent error (see archive_retry)."""
        ...

    def close(self) -> None: ...


class SqliteTarget:
    """The embedded archive: `<data_dir>/archive.db`, WAL, written by this process only."""

    def __init__(self, path: Path, busy_timeout: float = 30.0) -> None:
        from proxy.archive_db import open_database

        self.path, self.name = path, str(path)
        self._db = open_database(path, busy_timeout)
        self._conn = self._db.conn
        self._conn.isolation_level = None  # transactions are explicit: BEGIN IMMEDIATE ... COMMIT

    def row_writer(self, chain_cache_bytes: int, pricing: Pricing | None) -> RowWriter:
        return RowWriter(self._conn, chain_cache_bytes, pricing)

    def transaction(self, write: Callable[[], None], *, records: int, retry_for: float, give_up: bool,
                    on_rollback: Callable[[], None]) -> None:
        from proxy.archive_retry import immediate_transaction

        immediate_transaction(self._conn, write, records=records, retry_for=retry_for, give_up=give_up,
                              on_rollback=on_rollback)

    def close(self) -> None:
        self._db.close()
