"""Token counts kept across restarts, so a session continued after the proxy restarts is not counted again.

A first sight of a long history counts every message (~0.2 s for 2 MB, issue 14); after a restart every
session the proxy held is a first sight. At shutdown the counts of the sessions in memory are written to
`<data_dir>/cache/token_counts.db` (SQLite, 0600 in the 0700 cache folder, as the tokenizer's ranks beside
it); a later first sight looks its messages up there before it counts. A key is a SHA-256 of exactly what
a message's count reads (its role, content, name, tool calls and call id), beside the tokenizer and its
version: no text is stored, and two messages share a key only when they count the same. A cache: anything
wrong with the file only costs the counting it would have saved (it is logged and set aside), and a proxy
killed without its shutdown keeps what the last clean one wrote.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from time import monotonic
from typing import TYPE_CHECKING, Any

import orjson

from proxy.encoders import encoding_name_for, tokenizer_version

if TYPE_CHECKING:
    from proxy.state import StateStore

log = logging.getLogger("ctxproxy")

FILE_NAME = "token_counts.db"
RECIPE = "1"  # bump when encoders._count_message changes what a message counts
MAX_ROWS = 500_000  # ~40 MB: the newest counts of ~400 sessions of 2 MB
SAVE_SECONDS = 3.0  # at most about this long at shutdown (the sessions used last first)
_CHUNK = 500  # keys per lookup query (well under SQLite's variable limit)
PROBE = 16  # messages looked up first
_SAVE_CHUNK = 10_000  # rows per transaction at shutdown (~0.1 s each: the deadline is checked between)


def message_digest(message: dict[str, Any]) -> bytes | None:
    """A stable key for a message's count (Python's own string hashes change from process to process):
    the fields encoders._count_message reads, serialized. None for what cannot be serialized (a lone
    surrogate in a text, which JSON cannot carry): such a message is counted, never kept."""
    try:
        fields = orjson.dumps([message.get("role"), message.get("content"), message.get("name"),
                               message.get("tool_calls"), message.get("tool_call_id")])
    except orjson.JSONEncodeError:
        return None
    return hashlib.sha256(fields).digest()[:16]


class KeptCounts:
    """The counts file, opened at its first use; thread-safe (lookups come from worker threads)."""

    def __init__(self, path: Path, on_restored: Callable[[int], object] | None = None) -> None:
        self.path = path
        self._on_restored = on_restored
        self._connection: sqlite3.Connection | None = None
        self._broken = False
        self._lock = threading.Lock()

    def restore(self, family: str, messages: list[dict[str, Any]]) -> list[int | None]:
        """The kept count of each message, None where there is none. A few of the newest (but the last
        two, new in a continued session) are looked up first: a history none of them was kept for is
        not looked up further (a new one: ~11 ms saved at 2 MB)."""
        probe = messages[-PROBE - 2:-2] if len(messages) > PROBE + 2 else []
        if probe and all(count is None for count in self._lookup(family, probe)):
            return [None] * len(messages)
        counts = self._lookup(family, messages)
        if self._on_restored is not None:
            self._on_restored(sum(count is not None for count in counts))
        return counts

    def _lookup(self, family: str, messages: list[dict[str, Any]]) -> list[int | None]:
        digests = [message_digest(message) for message in messages]
        wanted = [digest for digest in digests if digest is not None]
        found: dict[bytes, int] = {}
        with self._lock:
            connection = self._open(create=False)
            if connection is None or not wanted:
                return [None] * len(messages)
            try:
                for start in range(0, len(wanted), _CHUNK):
                    chunk = wanted[start:start + _CHUNK]
                    found.update(connection.execute(
                        f"select digest, tokens from counts where family = ? and digest in "
                        f"({','.join('?' * len(chunk))})", [_family(family), *chunk]).fetchall())
            except sqlite3.Error as exc:
                self._set_aside(exc)
                return [None] * len(messages)
        return [None if digest is None else found.get(digest) for digest in digests]

    def save(self, counted: Iterable[tuple[str, dict[str, Any], int]], deadline: float | None = None) -> int:
        """Keep these (model, message, count) triples, in that order, till `deadline` (a time.monotonic()
        value) passes; the newest MAX_ROWS stay. Returns how many were written."""
        rows: dict[tuple[str, bytes], int] = {}
        for model, message, count in counted:
            if deadline is not None and monotonic() > deadline:
                break
            digest = message_digest(message)
            if digest is not None:
                rows[(_family(encoding_name_for(model)), digest)] = count
        items = list(rows.items())
        written = 0
        with self._lock:
            connection = self._open(create=True) if items else None
            if connection is None:
                return 0
            try:
                generation = connection.execute("select coalesce(max(generation), 0) + 1 from counts"
                                                ).fetchone()[0]
                for start in range(0, len(items), _SAVE_CHUNK):
                    if written and deadline is not None and monotonic() > deadline:
                        break
                    chunk = sorted(items[start:start + _SAVE_CHUNK])  # (in key order: B-tree appends)
                    with connection:
                        connection.executemany(
                            "insert into counts (family, digest, tokens, generation) values (?, ?, ?, ?) "
                            "on conflict (family, digest) do update set tokens = excluded.tokens, "
                            "generation = excluded.generation",
                            [(family, digest, count, generation) for (family, digest), count in chunk])
                    written += len(chunk)
                with connection:  # whole generations go, the oldest, till at most MAX_ROWS stay
                    connection.execute("delete from counts where generation <= (select generation from "
                                       "counts order by generation desc limit 1 offset ?)", [MAX_ROWS])
            except sqlite3.Error as exc:
                self._set_aside(exc)
        return written

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def _open(self, *, create: bool) -> sqlite3.Connection | None:
        """The connection (under the lock); None when there is no file yet and `create` is False, or the
        file could not be opened or made."""
        if self._connection is not None:
            return self._connection
        if not create and (self._broken or not self.path.exists()):
            return None
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.path.touch(mode=0o600)  # (sqlite would create it with the umask's mode)
            self.path.chmod(0o600)
            connection = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            connection.execute("create table if not exists counts (family text not null, digest blob not "
                               "null, tokens integer not null, generation integer not null, primary key "
                               "(family, digest)) without rowid")
            connection.execute("create index if not exists counts_generation on counts (generation)")
            connection.isolation_level = "DEFERRED"  # (transactions from here: `with connection` commits)
        except (OSError, sqlite3.Error) as exc:
            self._set_aside(exc)
            return None
        self._connection = connection
        return connection

    def _set_aside(self, exc: Exception) -> None:
        """A file that does not work is renamed away once and lookups stop (the proxy counts as it would
        without them); the shutdown's save starts a new file."""
        log.warning("token counts file %s not usable (%s): set aside, counting instead", self.path, exc)
        if self._connection is not None:
            with contextlib.suppress(sqlite3.Error):
                self._connection.close()
            self._connection = None
        if not self._broken:
            with contextlib.suppress(OSError):
                self.path.replace(self.path.with_name(self.path.name + ".broken"))
        self._broken = True


def _family(family: str) -> str:
    """The family as kept: with our counting recipe and the tokenizer's version (an upgrade starts anew)."""
    return f"{family}/{RECIPE}/{tokenizer_version(family)}"


def keep_at_shutdown(kept: KeptCounts | None, store: StateStore) -> None:
    """Write the counts the sessions in memory carry (state.counted), the one used last first."""
    if kept is None:
        return
    written = kept.save(counted_in(store), deadline=monotonic() + SAVE_SECONDS)
    kept.close()
    if written:
        log.info("kept %d token counts in %s", written, kept.path)


def counted_in(store: StateStore) -> Iterator[tuple[str, dict[str, Any], int]]:
    for state in reversed(store.states()):  # (the one used last first)
        for model, by_id in list(state.counted.items()):
            for message, count in list(by_id.values()):  # (copies: made in C, whole)
                yield model, message, count
