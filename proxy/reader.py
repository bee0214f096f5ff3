"""Read side of the archive: sessions, conversations, full-text search and recall, for the CLI and the
internal tools. WAL lets it run beside the writer; one connection, guarded by a lock."""

from __future__ import annotations

import re
import sqlite3
import threading
from pathlib import Path
from typing import Any

import orjson
from sqlite_utils import Database

from proxy.archive import project_token, scope_token

_WORD = re.compile(r"\w+", re.UNICODE)


def fts_query(text: str, *, any_term: bool = True) -> str:
    """Quote every word so user text can never be FTS syntax; OR them for recall-style ranking."""
    words = _WORD.findall(text)
    return (" OR " if any_term else " ").join(f'"{w}"' for w in words)


class ArchiveReader:
    """Read-side queries for the CLI and the internal tools (WAL lets it run beside the writer)."""

    def __init__(self, path: Path) -> None:
        if not path.exists():
            raise FileNotFoundError(f"no archive at {path}")
        self.db = Database(sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False))
        self._lock = threading.Lock()  # one connection, used from the event loop and worker threads

    def sessions(self, limit: int = 50) -> list[dict[str, Any]]:
        return list(self.db.query(
            """select session_id, min(session_source) as source, count(*) as turns,
                      sum(tokens_before) as tokens_before, sum(tokens_after) as tokens_after,
                      max(created_at) as last_activity, group_concat(distinct policy) as policies
               from exchanges group by session_id order by last_activity desc limit ?""", [limit]))

    def chain(self, leaf: str | None) -> list[dict[str, Any]]:
        """Messages from the root to `leaf`, each as it was received."""
        found: list[dict[str, Any]] = []
        node = leaf
        while node and not node.startswith("tenant:"):
            row = next(self.db.query("select parent_id, body from messages where id = ?", [node]), None)
            if row is None:
                break
            found.append(orjson.loads(row["body"]))
            node = row["parent_id"]
        found.reverse()
        return found

    def exchanges(self, session_id: str) -> list[dict[str, Any]]:
        return list(self.db.query(
            "select * from exchanges where session_id = ? order by created_at, rowid", [session_id]))

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

    def search(self, query: str, *, tenant: str | None = None, session_id: str | None = None,
               policy: str | None = None, exclude_session: str | None = None,
               limit: int = 10) -> list[dict[str, Any]]:
        """BM25-ranked full-text hits with snippets; every filter is optional."""
        words = fts_query(query)
        if not words:
            return []
        # The scope filters go into the MATCH too, so FTS5 ranks only this scope's documents.
        if session_id is not None:
            scope = [f'scope:"{scope_token("ss", session_id)}"']
        elif tenant is not None and policy is not None:
            scope = [f'scope:"{project_token(tenant, policy)}"']
        else:
            scope = [f'scope:"{scope_token("tn", tenant)}"'] if tenant is not None else []
        match = " AND ".join([*scope, f"text:({words})"])
        if exclude_session is not None:
            match += f' NOT scope:"{scope_token("ss", exclude_session)}"'
        where, params = ["messages_fts match ?"], [match]
        for clause, value in (("messages.tenant = ?", tenant), ("messages.session_id = ?", session_id),
                              ("messages.policy = ?", policy), ("messages.session_id != ?", exclude_session)):
            if value is not None:
                where.append(clause)
                params.append(value)
        params.append(limit)
        with self._lock:
            return list(self.db.query(
                f"""select messages.id, messages.session_id, messages.role, messages.created_at,
                           messages.body, snippet(messages_fts, 0, '[', ']', ' … ', 16) as snippet,
                           bm25(messages_fts) as rank
                    from messages_fts join messages on messages.rowid = messages_fts.rowid
                    where {' and '.join(where)} order by rank limit ?""", params))

    def recall(self, tenant: str, session_id: str, policy: str, query: str,
               limit: int = 8) -> list[dict[str, Any]]:
        """This session's hits first, then the rest of the project (same tenant and policy)."""
        hits = self.search(query, tenant=tenant, session_id=session_id, limit=limit)
        if len(hits) < limit:
            hits += self.search(query, tenant=tenant, policy=policy, exclude_session=session_id,
                                limit=limit - len(hits))
        return hits

    def session_window(self, tenant: str, session_id: str) -> dict[str, Any] | None:
        with self._lock:
            return next(self.db.query("select * from session_windows where tenant = ? and session_id = ?",
                                      [tenant, session_id]), None)

    def tool_result_rows(self, tenant: str, session_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.db.query("select * from tool_results where tenant = ? and session_id = ? "
                                      "order by created_at, rowid", [tenant, session_id]))

    def tool_result_by_handle(self, tenant: str, handle: str) -> dict[str, Any] | None:
        with self._lock:
            return next(self.db.query("select * from tool_results where tenant = ? and handle = ? "
                                      "order by created_at desc limit 1", [tenant, handle]), None)

    def session_memory(self, tenant: str, session_id: str, kind: str) -> dict[str, Any] | None:
        with self._lock:
            return next(self.db.query("select * from session_memory where tenant = ? and session_id = ? "
                                      "and kind = ?", [tenant, session_id, kind]), None)

    def close(self) -> None:
        self.db.close()

