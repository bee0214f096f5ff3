"""Read side of the archive: sessions, conversations, full-text search and recall, for the CLI and the
internal tools. WAL lets it run beside the writer.

Every thread gets its own read-only connection, so a state lookup never waits behind a search, and
every search runs under a deadline (a progress handler interrupts it): it returns what it found, marked
`truncated`, rather than holding a thread for as long as a pathological query takes. Text is indexed
in ~4 KB chunks (see migration m007), so ranking and a hit's matching lines cost a chunk's work per hit.
Recall leaves out the proxy's own traffic and names a handle per hit (archive_recall); read-back of
results the state store never recorded comes from the archived messages (archive_read_back).
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

from proxy import archive_recall
from proxy.archive_codec import loads, safe_text
from proxy.archive_db import project_token, scope_token
from proxy.archive_read_back import archived_result
from proxy.archive_traffic import message_text
from proxy.sqlite_lib import Database
from proxy.store.shared_queries import SharedQueries

_WORD = re.compile(r"\w+", re.UNICODE)
SEARCH_TIMEOUT = 2.0  # seconds per search / recall
BODY_INLINE = 65536  # a hit carries its message's body up to this size; above, a small stand-in
_PROGRESS_STEPS = 2000  # SQLite VM instructions between deadline checks
_MMAP_BYTES = 256 * 1024 * 1024
Row = dict[str, Any]


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


class ArchiveReader(SharedQueries):
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
        self._starts = archive_recall.ChunkStarts()

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

    def rows(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        """A read-only query's rows (reports and the dashboard compose theirs in proxy/report.py)."""
        return self._query(sql, params)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            connections, self._connections = list(self._connections.values()), {}
        for conn in connections:
            conn.close()
        self._local = threading.local()

    # ----------------------------------------------------------------------------------- queries

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
        """BM25-ranked hits, at most one per message (its best chunk), each with the lines of that chunk
        holding query terms and the handle that reads the message back; never the proxy's own traffic.
        Every filter is optional. Stops at `deadline` (time.monotonic(); default: now + search_timeout)
        and returns what it has, with `truncated` set."""
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

        def in_scope(row: dict[str, Any]) -> bool:
            # Checked again on the message itself: scope tokens are hashes.
            return all(v is None or row[k] == safe_text(v) for k, v in wanted.items()) and (
                exclude_session is None or row["session_id"] != safe_text(exclude_session))

        asking = session_id if session_id is not None else exclude_session
        hits = SearchHits()
        with self._deadline(deadline) as conn:
            try:
                for row in self._ranked(conn, match, limit, in_scope, tenant, asking):
                    hits.append(_hit(row))
            except sqlite3.OperationalError as exc:
                if "interrupted" not in str(exc):
                    raise
                hits.truncated = True
        return hits

    def _ranked(self, conn: sqlite3.Connection, match: str, limit: int, in_scope: Callable[[Row], bool],
                tenant: str | None, asking: str | None) -> list[Row]:
        """The best chunk of each of the `limit` best messages that are the conversation, with its
        matching lines, handle and message row."""
        # FTS5 ranks with its own sorter; spare rows absorb messages with several good chunks and rows
        # the guard drops (the proxy's traffic, indexed before it was told apart; copies of a message).
        spare = limit * 4
        rows = conn.execute("select message_id, rowid, rank from message_chunks_fts where message_chunks_fts "
                            "match ? order by rank limit ?", [match, spare]).fetchall()
        best: dict[str, tuple[int, float]] = {}
        for message, chunk, rank in rows:
            best.setdefault(message, (chunk, rank))
        seen: dict[str, Row] = {}
        found = self._accepted(conn, best, limit, in_scope, seen)
        if len(found) < limit and len(rows) == spare:  # one long document crowds the top: group per message
            rows = conn.execute("select message_id, rowid, min(rank) as rank from message_chunks_fts "
                                "where message_chunks_fts match ? group by message_id order by rank limit ?",
                                [match, spare]).fetchall()
            found = self._accepted(conn, {m: (c, r) for m, c, r in rows}, limit, in_scope, seen)
        if not found:
            return []
        chunks = [row["chunk"] for row in found]
        mark, end = archive_recall.MARK, archive_recall.END
        marked = dict(conn.execute(
            f"select rowid, highlight(message_chunks_fts, 2, '{mark}', '{end}') "
            f"from message_chunks_fts where message_chunks_fts match ? "
            f"and rowid in ({', '.join('?' * len(chunks))})", [match, *chunks]))
        out = []
        for row in found:
            message = row.pop("message")
            first = archive_recall.chunk_start_line(conn, row["id"], row["chunk"], row["size"], self._starts)
            edges = archive_recall.cut_edges(conn, row["id"], row["chunk"], row["size"])
            if archive_recall.fill_hit(conn, row, message, marked.get(row.pop("chunk")) or "", first, edges,
                                       tenant, asking):
                out.append(row)
        return out

    def _accepted(self, conn: sqlite3.Connection, best: dict[str, tuple[int, float]], limit: int,
                  in_scope: Callable[[Row], bool], seen: dict[str, Row]) -> list[Row]:
        """Candidates in rank order that pass the scope check and the guard, one per distinct message
        (a message forwarded under another parent was archived again), at most `limit`."""
        wanted = [m for m in best if m not in seen]
        for start in range(0, len(wanted), 500):
            part = wanted[start:start + 500]
            cursor = conn.execute(
                "select id, parent_id, session_id, role, created_at, tenant, policy, call_id, size, proxy, "
                f"case when size is null or size <= {BODY_INLINE} then body end as body from messages "
                f"where id in ({', '.join('?' * len(part))})", part)
            columns = [d[0] for d in cursor.description]
            for values in cursor:
                fetched = dict(zip(columns, values, strict=True))
                fetched["message"] = loads(fetched["body"]) if fetched["body"] is not None else None
                seen[fetched["id"]] = fetched
        found: list[Row] = []
        copies: set[tuple[Any, ...]] = set()
        for node, (chunk, rank) in best.items():
            row = seen.get(node)
            if row is None or not in_scope(row) or not archive_recall.keep(conn, row, row["message"]):
                continue
            text = message_text(row["message"]) if row["message"] is not None else None
            copy = (row["session_id"], row["role"], row["call_id"], text if text is not None else row["size"])
            if text != "" and copy in copies:  # (a body without text cannot tell copies apart)
                continue
            copies.add(copy)
            found.append(row | {"chunk": chunk, "rank": rank})
            if len(found) == limit:
                break
        return found

    # ------------------------------------------------------------------------------ state lookups

    def archived_result(self, tenant: str, session_id: str | None, handle: str) -> dict[str, Any] | None:
        """A message the model saw, by call id, `id#n` or `msg-...`, from the archive (this session, or
        with None the tenant's newest session holding it). See proxy.archive_read_back."""
        return archived_result(self.db.conn, tenant, session_id, handle)


def _hit(row: Row) -> Row:
    """The keys callers use; a huge message's body is replaced by a stand-in naming its call id."""
    call_id, size = row.pop("call_id"), row.pop("size")
    for key in ("tenant", "policy", "parent_id", "proxy"):
        del row[key]
    if row["body"] is None:
        stand_in: dict[str, Any] = {"role": row["role"], "content": f"[{size} bytes, not included]"}
        if call_id and row["role"] == "tool":
            stand_in["tool_call_id"] = call_id
        elif call_id:
            stand_in["tool_calls"] = [{"id": call_id}]
        row["body"] = orjson.dumps(stand_in).decode()
    return row
