"""What both archive readers (SQLite and PostgreSQL) answer with the same SQL: sessions and exchanges,
recall's two steps and the state lookups the session store rebuilds from. A reader provides `_query`,
`chain` and `search`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from proxy.archive_codec import loads

if TYPE_CHECKING:
    from proxy.reader import SearchHits

SETTLE_SHARE = 0.25  # of a search's time limit, at most, spent waiting for the archive writer


class SharedQueries:
    search_timeout: float
    settle: Callable[[float], object] | None = None  # the archive writer's flush (see wait_for_writer)

    def _query(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        raise NotImplementedError

    def chain(self, leaf: str | None) -> list[dict[str, Any]]:
        raise NotImplementedError

    def sessions(self, limit: int = 50) -> list[dict[str, Any]]:
        return self._query(
            """select session_id, min(session_source) as source, count(*) as turns,
                      sum(tokens_before) as tokens_before, sum(tokens_after) as tokens_after,
                      max(created_at) as last_activity, group_concat(distinct policy) as policies
               from exchanges group by session_id order by last_activity desc limit ?""", [limit])

    def exchanges(self, session_id: str) -> list[dict[str, Any]]:
        return self._query("select * from exchanges where session_id = ? order by created_at, rowid",
                           [session_id])

    def params(self, exchange: dict[str, Any]) -> dict[str, Any]:
        """What an exchange's request held besides its messages (credentials left out): its
        `request_params` row, or the `params` column of an exchange archived before that table."""
        if exchange.get("params_id"):
            rows = self._query("select body from request_params where id = ?", [exchange["params_id"]])
            return loads(rows[0]["body"]) if rows else {}
        return loads(exchange["params"]) if exchange.get("params") else {}

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
               policy: str | None = None, exclude_session: str | None = None, limit: int = 10,
               deadline: float | None = None) -> SearchHits:
        raise NotImplementedError

    def wait_for_writer(self, limit_s: float | None = None) -> None:
        """Wait until the exchanges submitted so far are committed, a quarter of `limit_s` (a search's
        time limit; default: search_timeout) at most: the writer lingers for company before it commits."""
        if self.settle is not None:
            self.settle((self.search_timeout if limit_s is None else limit_s) * SETTLE_SHARE)

    def recall(self, tenant: str, session_id: str, policy: str, query: str,
               limit: int = 8, *, timeout: float | None = None) -> SearchHits:
        """This session's hits first, then the rest of the project (same tenant and policy), within one
        time limit for both; `truncated` says it ran out of time."""
        from proxy.reader import SearchHits

        limit_s = self.search_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit_s
        self.wait_for_writer(limit_s)
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
