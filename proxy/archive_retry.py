"""Archive transactions that wait out an unavailable database instead of dropping what they write: one
BEGIN IMMEDIATE ... COMMIT, retried with backoff while SQLite is busy, locked, read-only, full or
failing; a permanent error (a bug, a record that cannot be stored) is raised as WriteFailed."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable

log = logging.getLogger("ctxproxy.archive")

WARN_EVERY = 10.0  # seconds between warnings while the database stays unavailable

_TRANSIENT_CODES = frozenset({5, 6, 8, 10, 13, 14, 15})  # BUSY LOCKED READONLY IOERR FULL CANTOPEN PROTOCOL
_TRANSIENT_WORDS = ("locked", "busy", "disk i/o", "disk is full", "unable to open", "readonly", "read-only")


class WriteFailed(Exception):
    """A permanent error (a bug or a record that cannot be stored)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")


class StillUnavailable(Exception):
    """The database stayed unavailable past the time limit of a transaction that may give up."""

    def __init__(self, waited: float, cause: sqlite3.OperationalError) -> None:
        super().__init__(f"unavailable for {waited:.0f} s: {cause}")
        self.waited = waited
        self.cause = cause


def transient(exc: BaseException) -> bool:
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in _TRANSIENT_CODES:
        return True
    return any(word in str(exc).lower() for word in _TRANSIENT_WORDS)


def immediate_transaction(conn: sqlite3.Connection, write: Callable[[], None], *, records: int,
                          retry_for: float, give_up: bool, on_rollback: Callable[[], None]) -> None:
    """Run `write` in one IMMEDIATE transaction on `conn` (isolation_level None). Retried with backoff
    while the database is unavailable, never given up on (warnings become errors after `retry_for`)
    unless `give_up`: then StillUnavailable past `retry_for`. `on_rollback` runs before each rollback."""
    started = time.monotonic()
    delay, warned, failed, escalated = 0.05, 0.0, False, False
    while True:
        try:
            conn.execute("BEGIN IMMEDIATE")  # takes the write lock now: the busy timeout applies
            try:
                write()
                conn.execute("COMMIT")
            except BaseException:
                on_rollback()
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as exc:
            if not transient(exc):
                raise WriteFailed(exc) from exc
            now = time.monotonic()
            waited = now - started
            if give_up and waited >= retry_for:
                raise StillUnavailable(waited, exc) from exc
            late = waited >= retry_for
            if not failed or (late and not escalated) or now - warned >= (retry_for if late else WARN_EVERY):
                (log.error if late else log.warning)(
                    "archive: database unavailable for %.0f s (%s); retrying, %d records wait (safe in "
                    "the spool)", waited, exc, records)
                warned, failed, escalated = now, True, late
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
            continue
        except Exception as exc:
            raise WriteFailed(exc) from exc
        if failed:
            log.warning("archive: database writable again after %.1f s; %d records committed",
                        time.monotonic() - started, records)
        return
