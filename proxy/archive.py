"""The archive: every exchange recorded in SQLite by one background writer, off the request path.

This module holds the writer thread (ArchiveWriter). Its parts live in their own modules, re-exported
here for callers: archive_items (ExchangeRecord, TableRow and their byte form for the queue and the
spool), archive_codec (JSON and text), archive_params (request params minus credentials), archive_db
(schema, content-addressed messages, search index), archive_parse (reading upstream answers),
archive_rows (items as rows), archive_retry, spool (the spool files), data_dir_lock.

Nothing acknowledged is lost. `submit` serializes the item and appends it to a spool file in the data
dir before it returns (what reached the page cache survives kill -9); the writer commits in IMMEDIATE
transactions and waits out a busy database instead of dropping; a start replays whatever an earlier
run left in the spool (idempotently: exchange ids are keys, messages are content-addressed). Any
upstream body is archived: what cannot be parsed is kept raw, with the problem named. One process
per data dir, enforced with a lock file.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

from proxy import malloc
from proxy.accounting import Pricing
from proxy.archive_codec import dumps, loads, safe_text, serialize
from proxy.archive_db import (
    CHUNK_CHARS,
    chunk_text,
    insert_message,
    message_call_id,
    message_id,
    open_database,
    project_token,
    scope_of,
    scope_token,
    searchable_text,
)
from proxy.archive_items import ExchangeRecord, TableRow, decode_item, encode_item, utc_now
from proxy.archive_params import SECRET_FIELDS, is_secret_key, request_params
from proxy.archive_parse import ParsedResponse, parse_response
from proxy.archive_retry import StillUnavailable, WriteFailed
from proxy.archive_rows import CHAIN_CACHE_BYTES, ERROR_CHARS, ChainCache
from proxy.data_dir_lock import DataDirLock
from proxy.errors import ConfigError
from proxy.spool import (
    SEGMENT_BYTES,
    CorruptSpool,
    Spool,
    append_framed,
    frame,
    read_frames,
    replay_file,
    spool_files,
)
from proxy.spool_delta import Bases, Expander
from proxy.store.target import SqliteTarget, WriteTarget

__all__ = [
    "BATCH_BYTES", "BATCH_MAX", "CHAIN_CACHE_BYTES", "CHUNK_CHARS", "ERROR_CHARS", "QUEUE_BYTES", "RETRY_FOR",
    "SECRET_FIELDS", "SEGMENT_BYTES", "ArchiveWriter", "ChainCache", "CorruptSpool", "DataDirLock",
    "ExchangeRecord", "ParsedResponse", "Spool", "TableRow", "chunk_text", "decode_item", "dumps",
    "encode_item", "frame", "insert_message", "is_secret_key", "loads", "message_call_id", "message_id",
    "open_database", "parse_response", "project_token", "read_frames", "request_params", "safe_text",
    "scope_of", "scope_token", "searchable_text", "serialize", "spool_files", "utc_now",
]

log = logging.getLogger("ctxproxy.archive")

BATCH_MAX = 256  # items per transaction
BATCH_BYTES = 32 * 1024 * 1024  # serialized bytes per transaction (one bigger item still goes alone)
QUEUE_BYTES = 64 * 1024 * 1024  # `submit` blocks while more than this waits to be committed
TRIM_AFTER_BYTES = 8 * 1024 * 1024  # after committing a batch this large, return free heap to the OS
# A short batch waits this long for company: one transaction for several exchanges instead of one each
# (every record is durable in the spool already; a commit costs about what writing three messages does,
# and its pages dirtied at random places in the id indexes are written once for the whole batch); a
# flush (recall waits for one), a close, a full batch or a full queue cut it short. 0.25 s / 128 against
# 0.1 s / 64: the long run's CPU 0.957-0.962 (batches of ~70 exchanges instead of ~28).
LINGER_S = 0.25
LINGER_ITEMS = 128
RETRY_FOR = 300.0  # seconds of an unavailable database before warnings turn into errors (or a start fails)


# ------------------------------------------------------------------------------------------ writer

class _Queued(NamedTuple):
    seq: int
    segment: int | None
    payload: bytes
    # The exchange as submitted, so the writer need not decode its payload again (a record is not
    # changed once submitted); None for rows, whose JSON round trip normalizes their values.
    item: ExchangeRecord | None = None


class ArchiveWriter:
    """Single writer thread. `submit` serializes the item, appends it to the spool and queues the bytes;
    it blocks while more than `max_queued_bytes` wait (call it off the event loop). `flush` waits for
    what was submitted so far; `close` writes everything and releases the data dir.

    Holds `<data_dir>/ctxproxy.lock` from start to close: a second writer on the same data dir (another
    process, or this one before close) gets a ConfigError. Readers (ArchiveReader, the CLI) need no lock.
    """

    def __init__(self, path: Path, *, max_queued_bytes: int = QUEUE_BYTES, retry_for: float = RETRY_FOR,
                 busy_timeout: float = 30.0, chain_cache_bytes: int = CHAIN_CACHE_BYTES,
                 pricing: Pricing | None = None,
                 on_exchange: Callable[[list[dict[str, Any]]], None] | None = None,
                 target: Callable[[], WriteTarget] | None = None, linger_s: float = LINGER_S) -> None:
        """`path`: the SQLite archive, whose folder is the data dir (spool, lock); `target`: opens
        another database to commit to instead (PostgreSQL), `path` then only places the data dir."""
        self.path = path
        self.linger_s = linger_s
        self.data_dir = path.parent
        self.max_queued_bytes = max_queued_bytes
        self.retry_for = retry_for
        self._lock_file = DataDirLock(self.data_dir)
        try:
            self._target = target() if target is not None else SqliteTarget(path, busy_timeout)
            self._rows = self._target.row_writer(chain_cache_bytes, pricing)
            self._on_exchange = on_exchange  # the exchange rows of each commit (logs, metrics): no content
            self._cond = threading.Condition()
            self._queue: deque[_Queued] = deque()
            self._queued_bytes = 0
            self._submitted = 0  # sequence number of the last item queued
            self._done = 0  # every item up to this sequence number is committed (or set aside)
            self._wanted = 0  # a flush waits for every item up to this one: no lingering
            self._stopping = False
            self._closed = False
            self._starting = True  # replaying the spool: an unavailable database fails the start
            self.spool = Spool(self.data_dir / "spool")
            self._bases = Bases()
            self._replay(self.spool.leftovers)
            self._starting = False
        except BaseException:
            if getattr(self, "spool", None) is not None:
                self.spool.close()
            if getattr(self, "_target", None) is not None:
                self._target.close()
            self._lock_file.release()
            raise
        self._thread = threading.Thread(target=self._run, name="ctxproxy-archive", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------------------- submitting

    def submit(self, item: ExchangeRecord | TableRow) -> None:
        """Durable (spooled) when this returns; may block while the writer is behind."""
        self.submit_many([item])

    def submit_many(self, items: Iterable[ExchangeRecord | TableRow]) -> int:
        """Durable when this returns; the bytes spooled. An exchange is spooled relative to its session's
        previous one (spool_delta.py), so it is encoded under the lock, right before its append."""
        spooled = 0
        for item in items:
            if isinstance(item, ExchangeRecord):
                spooled += self._enqueue(None, item)
            else:
                spooled += self._enqueue(encode_item(item))
        return spooled

    def submit_small(self, record: ExchangeRecord, limit: int) -> int | None:
        """`submit_many([record])` when that is sure to be quick (the event loop may make it): the record
        is spooled relative to its session's previous one, writing messages of about `limit` bytes at
        most, and the writer is far from full. Else None, having done nothing."""
        with self._cond:  # (a Condition's lock is re-entrant: _enqueue takes it again)
            if self._closed or self._queued_bytes + 2 * limit > self.max_queued_bytes // 2:
                return None
            payload = self._bases.encode(record, self.spool, small_only=limit)
            return None if payload is None else self._enqueue(payload, record)

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    @property
    def has_room(self) -> bool:
        """Far from full: a small submit now will not wait for the writer (the event loop may make it)."""
        return self._queued_bytes < self.max_queued_bytes // 2

    def _enqueue(self, payload: bytes | None, item: ExchangeRecord | None = None) -> int:
        """Spool and queue an item (`payload` None: an exchange, encoded here); its spooled size."""
        with self._cond:
            while (not self._closed and self._queued_bytes
                   and self._queued_bytes + (len(payload) if payload else 1) > self.max_queued_bytes):
                self._cond.wait()
            if self._closed:
                self._late(encode_item(item) if item is not None else payload or b"")
                return 0
            if payload is None:
                assert item is not None
                payload = self._bases.encode(item, self.spool)
                assert payload is not None  # (None only with small_only)
            try:
                segment: int | None = self.spool.append(payload)
            except OSError as exc:
                log.error("archive: cannot append to the spool (%s); this record is only in memory until "
                          "it is committed", exc)
                segment = None
                if item is not None:
                    # not a base: the next record of its session goes whole
                    self._bases.unspooled(item, self.spool)
            self._submitted += 1
            self._queue.append(_Queued(self._submitted, segment, payload, item))
            self._queued_bytes += len(payload)
            if len(self._queue) == 1 or len(self._queue) >= LINGER_ITEMS or not self.has_room:
                # the writer waits for a first item, or for enough company to stop lingering (woken
                # on every item, it would take the GIL from the event loop that many times more)
                self._cond.notify_all()
            return len(payload)

    def _late(self, payload: bytes) -> None:
        """Submitted after close: kept in its own spool file, written at the next start."""
        path = self.spool.folder / f"late-{time.time_ns()}-{os.getpid()}.log"
        log.error("archive: a record arrived after the writer closed; kept in %s for the next start", path)
        append_framed(path, payload)

    def flush(self, timeout: float = 30.0) -> bool:
        """Block until everything submitted so far is committed (for shutdown, the CLI and tests)."""
        with self._cond:
            target = self._wanted = self._submitted
            self._cond.notify_all()
            return self._cond.wait_for(lambda: self._done >= target, timeout)

    def close(self, timeout: float = 120.0) -> None:
        """Write everything queued, stop the thread, release the data dir. Whatever is still not written
        after `timeout` (a database locked for that long) stays in the spool for the next start."""
        with self._cond:
            if self._stopping:
                return
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            if self._thread.is_alive():
                log.error("archive: writer still busy after %.0f s; %d records stay in the spool and are "
                          "written at the next start", timeout, len(self._queue))
            else:
                self.spool.close()
                self._target.close()
        self._lock_file.release()

    # ------------------------------------------------------------------------------- writing

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                self._linger()
                if not self._queue:
                    self._closed = True  # later submits go to their own spool file
                    self._cond.notify_all()
                    return
                batch: list[_Queued] = []
                size = 0
                while self._queue and len(batch) < BATCH_MAX and (
                        not batch or size + len(self._queue[0].payload) <= BATCH_BYTES):
                    entry = self._queue.popleft()
                    batch.append(entry)
                    size += len(entry.payload)
            kept = False
            try:
                self._commit([entry.payload for entry in batch], [entry.item for entry in batch])
            except Exception:  # a bug in the writer itself: leave the items in the spool
                log.exception("archive: writer failed on a batch of %d; it stays in the spool", len(batch))
                kept = True
            if size >= TRIM_AFTER_BYTES:  # a huge exchange went through: give its memory back
                malloc.trim()
            with self._cond:
                self._done = batch[-1].seq
                self._queued_bytes -= size
                if not kept:
                    try:
                        self.spool.committed(entry.segment for entry in batch)
                    except OSError as exc:
                        log.warning("archive: could not trim the spool: %s", exc)
                self._cond.notify_all()

    def _linger(self) -> None:
        """(Holding the lock.) Give a short queue `linger_s` to grow before it is committed."""
        deadline = time.monotonic() + self.linger_s
        while (self._queue and len(self._queue) < LINGER_ITEMS and not self._stopping and self.has_room
               and self._wanted <= self._done and (left := deadline - time.monotonic()) > 0):
            self._cond.wait(left)

    def _replay(self, files: list[Path]) -> None:
        """Write what an earlier run left in the spool (idempotent, in order), before any new work.
        Set-aside (rejected) records are older than what was committed after them: they only fill
        gaps (insert or ignore), never replace a row."""
        total = 0
        for path in files:
            self._rows.stale = path.name.startswith("rejected-")
            try:
                total += replay_file(path, self._commit, batch_items=BATCH_MAX, batch_bytes=BATCH_BYTES,
                                     prepare=Expander())
            finally:
                self._rows.stale = False
        if total:
            log.warning("archive: wrote %d records an earlier run left in the spool", total)

    def _commit(self, payloads: list[bytes], known: list[ExchangeRecord | None] | None = None) -> None:
        """Write items in one transaction; on a permanent error, one by one: an item that cannot be
        written is set aside in a `rejected-*.log` spool file (retried at the next start). A busy or
        locked database is waited out, in order, however long it takes (see _transaction)."""
        items: list[tuple[bytes, ExchangeRecord | TableRow]] = []
        for payload, submitted in zip(payloads, known or [None] * len(payloads), strict=True):
            if submitted is not None:
                items.append((payload, submitted))
                continue
            try:
                items.append((payload, decode_item(payload)))
            except Exception as exc:
                self._reject(payload, f"cannot decode: {type(exc).__name__}: {exc}")
        if not items:
            return
        try:
            self._transaction(items)
            return
        except WriteFailed:
            pass
        for payload, item in items:
            try:
                self._transaction([(payload, item)])
            except WriteFailed as failed:  # (set aside whole: a spooled record may be relative)
                self._reject(encode_item(item) if isinstance(item, ExchangeRecord) else payload, str(failed))

    def _transaction(self, items: list[tuple[bytes, ExchangeRecord | TableRow]]) -> None:
        """One IMMEDIATE transaction. A busy, locked, full or failing database is retried with backoff,
        never given up on while running (records stay in order, safe in the spool; `submit` blocks once
        the queue is full); warnings become errors after `retry_for`. During the start-up replay, an
        outage longer than `retry_for` fails the start instead (the spool is kept)."""
        def write() -> None:
            self._rows.begin([item for _, item in items])
            for payload, item in items:
                self._write_item(item, len(payload))

        try:  # nodes remembered as written are forgotten when rolled back
            self._target.transaction(write, records=len(items), retry_for=self.retry_for,
                                     give_up=self._starting, on_rollback=self._rows.forget)
            self._announce()
        except StillUnavailable as exc:
            raise ConfigError(
                f"the archive {self._target.name} stayed unavailable for {exc.waited:.0f} s while "
                f"replaying the spool ({exc.cause}); nothing was lost: the spool in {self.spool.folder} "
                "is kept and replayed at the next start", code="archive_unavailable") from exc.cause

    def _announce(self) -> None:
        written, self._rows.written = self._rows.written, []
        if self._on_exchange is None or self._starting or not written:
            return  # the spool replayed at start: an earlier run's exchanges, written but not announced
        try:
            self._on_exchange(written)
        except Exception:  # a logging or metrics problem never stops the archive
            log.exception("archive: the exchange hook failed")

    def _reject(self, payload: bytes, reason: str) -> None:
        log.error("archive: could not write a record (%s); it is kept in %s and retried at the next start",
                  reason, self.spool.folder)
        try:
            self.spool.set_aside(payload)
        except OSError as exc:
            log.error("archive: could not keep the rejected record: %s", exc)

    def _write_item(self, item: ExchangeRecord | TableRow, size: int) -> None:
        if isinstance(item, TableRow):
            self._rows.table_row(item)
        else:
            self._rows.exchange(item, size)

    @property
    def chains(self) -> ChainCache:
        """The last message chain stored per session (prefix reuse), bounded by `chain_cache_bytes`."""
        return self._rows.chains
