"""Read-back from the archive: any message the model has seen, by the handle the prompt or recall names.

read_tool_result asks the state store first (summarized, masked and evicted results recorded there);
this answers the rest from the messages every exchange archived: a tool result by its call id (`id#n`:
the n-th distinct result with that id in the session, in archive order, as SessionState.new_handle
numbers reused ids), or any message by `msg-<first 16 characters of its archive id>`. Always within one
tenant; the proxy's own traffic (archive_traffic) is never returned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.archive_codec import loads, safe_text
from proxy.archive_traffic import (
    HANDLE,
    MESSAGE_HANDLE,
    MESSAGE_HANDLE_CHARS,
    answers_internal_call,
    is_proxy_message,
    message_text,
)


class Queryable(Protocol):
    """What these helpers query through: a sqlite3 connection, or PostgreSQL behind
    proxy.store.sql.QmarkConnection (the same `?` SQL, tuple rows)."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Any: ...


INLINE = 65536  # bodies up to this size are read to tell results apart; larger ones by size, then bytes
_WALK = 64  # parents to walk up from a tool result to the turn that called it


@dataclass
class Result:
    """One distinct tool result with a call id in a session, in archive order."""

    rowid: int
    ids: list[str]  # the archive's message ids holding it (one per chain it was sent in)
    size: int
    message: dict[str, Any] | None  # None while not read (a large body)


def distinct_results(conn: Queryable, tenant: str, session_id: str, call_id: str) -> list[Result]:
    """The distinct results answering `call_id` in the session, first sent first: what `id#n` numbers."""
    rows = conn.execute(
        "select rowid, id, parent_id, size, proxy, case when size is null or size <= ? then body end "
        "from messages where tenant = ? and call_id = ? and session_id = ? and role = 'tool' "
        "order by created_at, rowid", [INLINE, safe_text(tenant), safe_text(call_id), safe_text(session_id)])
    found: list[Result] = []
    by_text: dict[str, Result] = {}
    for rowid, node, parent, size, proxy, body in rows.fetchall():
        if proxy == 1:
            continue
        if body is None:  # large: never a proxy text; the same bytes as an earlier large one is the same
            same = next((r for r in found if r.message is None and r.size == size
                         and _same_body(conn, r.rowid, rowid)), None)
            if same is not None:
                same.ids.append(node)
            else:
                found.append(Result(rowid, [node], size, None))
            continue
        message = loads(body)
        if proxy is None and (is_proxy_message(message) or answers_internal(conn, parent, call_id)):
            continue  # written before rows were classified: a summary forwarded in its place, or ours
        text = message_text(message)
        if text in by_text:
            by_text[text].ids.append(node)
            continue
        by_text[text] = Result(rowid, [node], size or 0, message)
        found.append(by_text[text])
    return found


def _same_body(conn: Queryable, first: int, second: int) -> bool:
    row = conn.execute("select (select body from messages where rowid = ?) = "
                       "(select body from messages where rowid = ?)", [first, second]).fetchone()
    return bool(row and row[0])


def answers_internal(conn: Queryable, parent: str | None, call_id: str) -> bool:
    """Whether the turn this tool result follows called `call_id` as an internal tool."""
    node = parent
    for _ in range(_WALK):
        if not node or node.startswith("tenant:"):
            return False
        row = conn.execute("select parent_id, role, case when role = 'assistant' then body end "
                           "from messages where id = ?", [node]).fetchone()
        if row is None:
            return False
        if row[1] == "assistant":
            return answers_internal_call(loads(row[2]), call_id) if row[2] else False
        if row[1] != "tool":
            return False
        node = row[0]
    return False


def split_handle(handle: str) -> tuple[str, int] | None:
    """(call id, n) of `id` or `id#n`; None for a malformed handle."""
    if not HANDLE.match(handle):
        return None
    base, _, number = handle.partition("#")
    n = int(number) if number else 1
    return (base, n) if n >= 1 else None


def message_by_handle(conn: Queryable, tenant: str, handle: str) -> dict[str, Any] | None:
    """A `msg-` handle's message row (tenant-scoped), or None."""
    prefix = handle[len(MESSAGE_HANDLE):]
    if not handle.startswith(MESSAGE_HANDLE) or "#" in prefix or len(prefix) < MESSAGE_HANDLE_CHARS:
        return None
    row = conn.execute(f"select {HANDLE_COLUMNS} from messages where id >= ? and id <= ? and tenant = ? "
                       "limit 1", [prefix, prefix + "\U0010ffff", safe_text(tenant)]).fetchone()
    return handle_result(conn, handle, row)


HANDLE_COLUMNS = "id, session_id, role, call_id, proxy, parent_id, body"


def handle_result(conn: Queryable, handle: str, row: Any) -> dict[str, Any] | None:
    """What a `msg-` handle reads back, from its message row (HANDLE_COLUMNS): nothing for the proxy's
    own traffic."""
    if row is None or row[4] == 1:
        return None
    message = loads(row[6])
    if row[4] is None and (is_proxy_message(message) or (
            row[2] == "tool" and row[3] and answers_internal(conn, row[5], row[3]))):
        return None
    return {"handle": handle, "call_id": row[3] or handle, "content": message_text(message),
            "tool_name": None}


def archived_result(conn: Queryable, tenant: str, session_id: str | None, handle: str, *,
                    by_message: Callable[[Queryable, str, str], dict[str, Any] | None] = message_by_handle,
                    ) -> dict[str, Any] | None:
    """The text a handle names, from this session (`session_id`), or else (None) from the tenant's
    session that most recently had a result with that call id. Keys: handle, call_id, content,
    tool_name. `by_message`: how a `msg-` handle is looked up (PostgreSQL has its own)."""
    found = by_message(conn, tenant, handle)
    if found is not None:
        return found
    parsed = split_handle(handle)
    if parsed is None:
        return None
    call_id, n = parsed
    if session_id is None:
        row = conn.execute("select session_id from messages where tenant = ? and call_id = ? "
                           "and role = 'tool' and (proxy is null or proxy = 0) "
                           "order by created_at desc, rowid desc limit 1",
                           [safe_text(tenant), safe_text(call_id)]).fetchone()
        if row is None:
            return None
        session_id = row[0]
    results = distinct_results(conn, tenant, session_id, call_id)
    if n > len(results):
        return None
    result = results[n - 1]
    message = result.message
    if message is None:
        body = conn.execute("select body from messages where rowid = ?", [result.rowid]).fetchone()[0]
        message = loads(body)
    return {"handle": handle, "call_id": call_id, "content": message_text(message), "tool_name": None}
