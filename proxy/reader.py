"""Read side of the archive: sessions, conversations, full-text search and recall, for the CLI and the
internal tools. WAL lets it run beside the writer.

Every thread gets its own read-only connection, so a state lookup never waits behind a search, and
every search runs under a deadline (a progress handler interrupts it): it returns what it found, marked
`truncated`, rather than holding a thread for as long as a pathological query takes. Text is indexed
in ~4 KB chunks (see migration m007), so ranking and snippets cost a chunk's work per hit.
"""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
from sqlite_utils import Database

from proxy.archive_codec import loads, safe_text
from proxy.archive_db import project_token, scope_token

_WORD = re.compile(r"\w+", re.UNICODE)
SEARCH_TIMEOUT = 2.0  # seconds per search / recall
BODY_INLINE = 65536  # a hit carries its message's body up to this size; above, a small stand-in
_PROGRESS_STEPS = 2000  # SQLite VM instructions between deadline checks
_MMAP_BYTES = 256 * 1024 * 1024


def fts_query(text: str, *, any_term: bool = True) -> str:
    """Quote every word so user text can never be FTS syntax; OR them for recall-style ranking."""
    words = _WORD.findall(text)
    return (" OR " if any_term else " ").join(f'"{w}"' for w in words)


class SearchHits(list):
    """Hits, best first. `truncated`: the search hit its time limit, so there may be more (or better)."""

    def __init__(self, hits: Iterable[dict[str, Any]] = (), truncated: bool = False) -> None:
        super().__init__(hits)
        self.truncated = truncated

    @property
    def complete(self) -> bool:
        return not self.truncated


class ArchiveReader:
    """Read-side queries for the CLI and the internal tools (WAL lets it run beside the writer)."""

    def __init__(self, path: Path, *, search_timeout: float = SEARCH_TIMEOUT,
                 on_progress: Callable[[], None] | None = None) -> None:
        if not path.exists():
            raise FileNotFoundError(f"no archive at {path}")
        self.path = path
        self.search_timeout = search_timeout
        self._on_progress = on_progress  # test seam: called from inside a running search
        self._uri = f"{path.resolve().as_uri()}?mode=ro"
        self._local = threading.local()
        self._connections: dict[threading.Thread, sqlite3.Connection] = {}
        self._lock = threading.Lock()  # guards _connections only; queries never hold it
        self._closed = False

    # ------------------------------------------------------------------------------ connections

    @property
    def db(self) -> Database:
        """This thread's read-only connection (opened on first use)."""
        db = getattr(self._local, "db", None)
        if db is None:
            if self._closed:
                raise RuntimeError("the archive reader is closed")
            conn = sqlite3.connect(self._uri, uri=True, check_same_thread=False, timeout=5)
            conn.execute(f"PRAGMA mmap_size={_MMAP_BYTES}")  # walking a huge row's overflow pages is cheap
            db = Database(conn)
            self._local.db = db
            with self._lock:
                for thread in [t for t in self._connections if not t.is_alive()]:
                    self._connections.pop(thread).close()
                self._connections[threading.current_thread()] = conn
        return db

    def _query(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        # Stored text had lone surrogates escaped (archive.safe_text): look it up the same way.
        return list(self.db.query(sql, [safe_text(p) if isinstance(p, str) else p for p in params]))

    def close(self) -> None:
        self._closed = True
        with self._lock:
            connections, self._connections = list(self._connections.values()), {}
        for conn in connections:
            conn.close()
        self._local = threading.local()

    # ----------------------------------------------------------------------------------- queries

    def sessions(self, limit: int = 50) -> list[dict[str, Any]]:
        return self._query(
            """select session_id, min(session_source) as source, count(*) as turns,
                      sum(tokens_before) as tokens_before, sum(tokens_after) as tokens_after,
                      max(created_at) as last_activity, group_concat(distinct policy) as policies
               from exchanges group by session_id order by last_activity desc limit ?""", [limit])

    def chain(self, leaf: str | None) -> list[dict[str, Any]]:
        """Messages from the root to `leaf`, each as it was received."""
        found: list[dict[str, Any]] = []
        node = leaf
        conn = self.db.conn
        while node and not node.startswith("tenant:"):
            row = conn.execute("select parent_id, body from messages where id = ?", [node]).fetchone()
            if row is None:
                break
            found.append(loads(row[1]))
            node = row[0]
        found.reverse()
        return found

    def exchanges(self, session_id: str) -> list[dict[str, Any]]:
        return self._query("select * from exchanges where session_id = ? order by created_at, rowid",
                           [session_id])

    def conversation(self, session_id: str) -> list[dict[str, Any]]:
        """The latest request of the session as the client sent it, plus the answer it got."""
        rows = self.exchanges(session_id)
        if not rows:
            return []
        last = rows[-1]
        messages = self.chain(last["request_leaf"])
        if last["response_message_id"]:
            messages += self.chain(last["response_message_id"])[-1:]
        return messages

    # ------------------------------------------------------------------------------------ search

    @contextmanager
    def _deadline(self, deadline: float) -> Iterator[sqlite3.Connection]:
        conn = self.db.conn
        hook = self._on_progress

        def check() -> int:
            if hook is not None:
                hook()
            return 1 if time.monotonic() >= deadline else 0

        conn.set_progress_handler(check, _PROGRESS_STEPS)
        try:
            yield conn
        finally:
            conn.set_progress_handler(None, 0)

    def search(self, query: str, *, tenant: str | None = None, session_id: str | None = None,
               policy: str | None = None, exclude_session: str | None = None, limit: int = 10,
               deadline: float | None = None) -> SearchHits:
        """BM25-ranked hits with snippets, at most one per message (its best chunk); every filter is
        optional. Stops at `deadline` (time.monotonic(); default: now + search_timeout) and returns
        what it has, with `truncated` set."""
        words = fts_query(query)
        if not words or limit <= 0:
            return SearchHits()
        # The scope filters go into the MATCH too, so FTS5 ranks only this scope's chunks.
        if session_id is not None:
            scope = [f'scope:"{scope_token("ss", session_id)}"']
        elif tenant is not None and policy is not None:
            scope = [f'scope:"{project_token(tenant, policy)}"']
        else:
            scope = [f'scope:"{scope_token("tn", tenant)}"'] if tenant is not None else []
        match = " AND ".join([*scope, f"text:({words})"])
        if exclude_session is not None:
            match += f' NOT scope:"{scope_token("ss", exclude_session)}"'
        if deadline is None:
            deadline = time.monotonic() + self.search_timeout
        wanted = {"tenant": tenant, "session_id": session_id, "policy": policy}
        hits = SearchHits()
        with self._deadline(deadline) as conn:
            try:
                for row in self._ranked(conn, match, limit):
                    # Checked again on the message itself: scope tokens are hashes.
                    if all(v is None or row[k] == safe_text(v) for k, v in wanted.items()) and (
                            exclude_session is None or row["session_id"] != safe_text(exclude_session)):
                        hits.append(_hit(row))
            except sqlite3.OperationalError as exc:
                if "interrupted" not in str(exc):
                    raise
                hits.truncated = True
        return hits

    def _ranked(self, conn: sqlite3.Connection, match: str, limit: int) -> list[dict[str, Any]]:
        """The best chunk of each of the `limit` best messages, with its snippet and its message's row."""
        # FTS5 ranks with its own sorter; a few spare rows absorb messages with several good chunks.
        spare = limit * 4
        rows = conn.execute("select message_id, rowid, rank from message_chunks_fts where message_chunks_fts "
                            "match ? order by rank limit ?", [match, spare]).fetchall()
        best: dict[str, tuple[int, float]] = {}
        for message, chunk, rank in rows:
            best.setdefault(message, (chunk, rank))
        if len(best) < limit and len(rows) == spare:  # one long document crowds the top: group per message
            rows = conn.execute("select message_id, rowid, min(rank) as rank from message_chunks_fts "
                                "where message_chunks_fts match ? group by message_id order by rank limit ?",
                                [match, limit]).fetchall()
            best = {message: (chunk, rank) for message, chunk, rank in rows}
        best = dict(list(best.items())[:limit])
        if not best:
            return []
        chunks = [chunk for chunk, _ in best.values()]
        snippets = dict(conn.execute(
            "select rowid, snippet(message_chunks_fts, 2, '[', ']', ' … ', 16) from message_chunks_fts "
            f"where message_chunks_fts match ? and rowid in ({', '.join('?' * len(chunks))})",
            [match, *chunks]))
        cursor = conn.execute(
            "select id, session_id, role, created_at, tenant, policy, call_id, size, "
            f"case when size is null or size <= {BODY_INLINE} then body end as body from messages "
            f"where id in ({', '.join('?' * len(best))})", list(best))
        columns = [d[0] for d in cursor.description]
        messages = {row[0]: dict(zip(columns, row, strict=True)) for row in cursor}
        found = []
        for message, (chunk, rank) in best.items():
            if message in messages:
                found.append(messages[message] | {"snippet": snippets.get(chunk), "rank": rank})
        return found

    def recall(self, tenant: str, session_id: str, policy: str, query: str,
               limit: int = 8, *, timeout: float | None = None) -> SearchHits:
        """This session's hits first, then the rest of the project (same tenant and policy), within one
        time limit for both; `truncated` says it ran out of time."""
        deadline = time.monotonic() + (self.search_timeout if timeout is None else timeout)
        hits = self.search(query, tenant=tenant, session_id=session_id, limit=limit, deadline=deadline)
        if len(hits) < limit and not hits.truncated:
            more = self.search(query, tenant=tenant, policy=policy, exclude_session=session_id,
                               limit=limit - len(hits), deadline=deadline)
            hits = SearchHits([*hits, *more], more.truncated)
        return hits

    # ------------------------------------------------------------------------------ state lookups

    def _one(self, sql: str, params: list[Any]) -> dict[str, Any] | None:
        rows = self._query(sql, params)
        return rows[0] if rows else None

    def session_window(self, tenant: str, session_id: str) -> dict[str, Any] | None:
        return self._one("select * from session_windows where tenant = ? and session_id = ?",
                         [tenant, session_id])

    def tool_result_rows(self, tenant: str, session_id: str) -> list[dict[str, Any]]:
        return self._query("select * from tool_results where tenant = ? and session_id = ? "
                           "order by created_at, rowid", [tenant, session_id])

    def tool_result_by_handle(self, tenant: str, handle: str) -> dict[str, Any] | None:
        return self._one("select * from tool_results where tenant = ? and handle = ? "
                         "order by created_at desc limit 1", [tenant, handle])

    def session_memory(self, tenant: str, session_id: str, kind: str) -> dict[str, Any] | None:
        return self._one("select * from session_memory where tenant = ? and session_id = ? and kind = ?",
                         [tenant, session_id, kind])


def _hit(row: dict[str, Any]) -> dict[str, Any]:
    """The keys callers use; a huge message's body is replaced by a stand-in naming its call id."""
    call_id, size = row.pop("call_id"), row.pop("size")
    del row["tenant"], row["policy"]
    if row["body"] is None:
        stand_in: dict[str, Any] = {"role": row["role"], "content": f"[{size} bytes, not included]"}
        if call_id and row["role"] == "tool":
            stand_in["tool_call_id"] = call_id
        elif call_id:
            stand_in["tool_calls"] = [{"id": call_id}]
        row["body"] = orjson.dumps(stand_in).decode()
    return row
