"""Recall hits a model can act on: which indexed rows count (never the proxy's own traffic), the lines of
each hit that hold the query's terms (with their line numbers), and the handle that reads the whole
message back with read_tool_result."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import threading
from collections import OrderedDict
from typing import Any

from proxy.archive_codec import loads, safe_text
from proxy.archive_db import CHUNK_CHARS
from proxy.archive_read_back import Queryable, answers_internal, distinct_results
from proxy.archive_traffic import (
    HANDLE,
    MESSAGE_HANDLE,
    MESSAGE_HANDLE_CHARS,
    has_internal_call,
    is_internal_call_line,
    is_proxy_message,
    message_text,
)

MARK, END = "\ue000", "\ue001"  # highlight() marks around matched terms (private-use characters)
LINES_PER_HIT = 3
LINE_CHARS = 240  # a longer line is shown as this much around its first match
CUT = "[…]"  # where a shown line was clipped
_MARKED = re.compile(f"{MARK}(.*?){END}")
_WALK_CHUNKS = 64


def keep(conn: Queryable, row: dict[str, Any], message: dict[str, Any] | None) -> bool:
    """Whether a candidate row is the conversation. Rows written since migration m010 were classified
    then (proxy 0/1); older ones are judged by content and by the call they answer."""
    if row["proxy"] is not None or message is None:  # large bodies are never texts the proxy wrote
        return row["proxy"] != 1
    if is_proxy_message(message):
        return False
    return not (row["role"] == "tool" and row["call_id"]
                and answers_internal(conn, row["parent_id"], row["call_id"]))


class ChunkStarts:
    """Chunk start lines of messages indexed before message_chunk_lines existed, worked out once (by
    reading the message's chunks) and kept for the next hits: least recently used dropped first."""

    def __init__(self, max_messages: int = 256) -> None:
        self.max_messages = max_messages
        self._known: OrderedDict[str, tuple[int, list[int]]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, message_id: str) -> tuple[int, list[int]] | None:
        with self._lock:
            found = self._known.get(message_id)
            if found is not None:
                self._known.move_to_end(message_id)
            return found

    def put(self, message_id: str, first: int, starts: list[int]) -> None:
        with self._lock:
            self._known[message_id] = (first, starts)
            while len(self._known) > self.max_messages:
                self._known.popitem(last=False)


def chunk_start_line(conn: sqlite3.Connection, message_id: str, chunk: int, size: int | None,
                     known: ChunkStarts) -> int:
    """The line of its message a chunk starts on."""
    if size is not None and size <= CHUNK_CHARS:
        return 1  # one chunk: its body (the text, escaped, and more) is no longer than a chunk
    found = known.get(message_id)
    if found is None:
        row = conn.execute("select first_chunk, starts from message_chunk_lines where message_id = ?",
                           [message_id]).fetchone()
        found = (row[0], json.loads(row[1])) if row is not None else _read_starts(conn, message_id, chunk)
        if row is None:
            known.put(message_id, *found)
    first, starts = found
    return int(starts[chunk - first]) if 0 <= chunk - first < len(starts) else 1


def _read_starts(conn: sqlite3.Connection, message_id: str, chunk: int) -> tuple[int, list[int]]:
    """Chunk starts of an old message: its chunks have consecutive rowids around `chunk`."""
    counts: dict[int, int] = {}
    for step in (-1, 1):  # back to its first chunk, then on to its last
        edge = chunk if step < 0 else chunk + 1
        while True:
            low, high = (max(edge - _WALK_CHUNKS, 1), edge) if step < 0 else (edge, edge + _WALK_CHUNKS)
            rows = conn.execute(
                "select rowid, message_id, length(text) - length(replace(text, char(10), '')) "
                "from message_chunks_fts where rowid >= ? and rowid < ?", [low, high]).fetchall()
            mine = {rowid: lines for rowid, owner, lines in rows if owner == message_id}
            counts.update(mine)
            if len(mine) < high - low:
                break
            edge = low if step < 0 else high
            if edge <= 1:
                break
    first = min(counts, default=chunk)
    starts, line = [], 1
    for rowid in range(first, max(counts, default=chunk) + 1):
        starts.append(line)
        line += counts.get(rowid, 0)
    return first, starts


def cut_edges(conn: sqlite3.Connection, message_id: str, chunk: int, size: int | None) -> tuple[bool, bool]:
    """Whether the chunk starts, and ends, inside a line (a line longer than a chunk was cut at a space)."""
    if size is not None and size <= CHUNK_CHARS:
        return False, False
    rows = dict(conn.execute("select rowid, message_id = ? and substr(text, -1) != char(10) "
                             "from message_chunks_fts where rowid in (?, ?)", [message_id, chunk - 1, chunk]))
    following = conn.execute("select message_id = ? from message_chunks_fts where rowid = ?",
                             [message_id, chunk + 1]).fetchone()
    return bool(rows.get(chunk - 1)), bool(rows.get(chunk)) and bool(following and following[0])


def matching_lines(highlighted: str, first_line: int, *, skip_internal_calls: bool = False,
                   edges: tuple[bool, bool] = (False, False)) -> list[tuple[int, str]]:
    """Up to LINES_PER_HIT lines of a highlighted chunk that hold query terms (those with the most
    distinct terms), in order, numbered from `first_line`, each clipped around its first match (and
    marked as cut where the chunk cut it: `edges`). The matched terms stay marked (MARK ... END):
    `plain` or `bracketed` make them text."""
    lines = highlighted.split("\n")
    scored = []
    for index, line in enumerate(lines):
        if MARK not in line or (skip_internal_calls and is_internal_call_line(plain(line))):
            continue
        terms = {term.lower() for term in _MARKED.findall(line)}
        scored.append((-len(terms), index, line))
    chosen = sorted(sorted(scored)[:LINES_PER_HIT], key=lambda item: item[1])
    shown = []
    for _, index, line in chosen:
        text = _clip(line.rstrip("\r"))
        if index == 0 and edges[0] and not text.startswith(CUT):
            text = CUT + text
        if index == len(lines) - 1 and edges[1] and not text.endswith(CUT):
            text += CUT
        shown.append((first_line + index, text))
    return shown


def _clip(line: str) -> str:
    if len(line) <= LINE_CHARS:
        return line
    start = max(0, line.index(MARK) - LINE_CHARS // 3)
    end = min(len(line), start + LINE_CHARS)
    start = max(0, end - LINE_CHARS)
    return (CUT if start else "") + line[start:end] + (CUT if end < len(line) else "")


def plain(line: str) -> str:
    return line.replace(MARK, "").replace(END, "")


def bracketed(line: str) -> str:
    return line.replace(MARK, "[").replace(END, "]")


def message_handle(message_id: str) -> str:
    return MESSAGE_HANDLE + message_id[:MESSAGE_HANDLE_CHARS]


def hit_handle(conn: Queryable, row: dict[str, Any], message: dict[str, Any] | None,
               tenant: str | None, session_id: str | None) -> str:
    """What read_tool_result accepts for this hit, as StateStore.find resolves it: the handle its text
    was recorded under (summary, eviction, observation), else its call id (`id#n` for the n-th distinct
    result with a reused id), else `msg-...`. Hits from other sessions get `msg-...`: call ids repeat
    across sessions, and find looks in the asking session first."""
    fallback = message_handle(row["id"])
    if tenant is None or session_id is None or row["session_id"] != safe_text(session_id):
        return fallback
    role, call_id = row["role"], row["call_id"]

    def digest() -> str:
        body = message if message is not None else loads(
            conn.execute("select body from messages where id = ?", [row["id"]]).fetchone()[0])
        return hashlib.sha256(message_text(body).encode("utf-8", "surrogatepass")).hexdigest()

    if role == "tool" and call_id and "#" not in call_id and HANDLE.match(call_id):
        holding = conn.execute("select id from messages where tenant = ? and call_id = ? and session_id = ? "
                               "and role = 'tool' and (proxy is null or proxy = 0)",
                               [safe_text(tenant), safe_text(call_id), safe_text(session_id)]).fetchall()
        position: int | None = 1
        if [node for (node,) in holding] == [row["id"]]:  # the usual case, from the index alone
            results_count = 1
        else:
            results = distinct_results(conn, tenant, session_id, call_id)
            position = next((n for n, result in enumerate(results, 1) if row["id"] in result.ids), None)
            results_count = len(results)
        recorded = conn.execute("select handle, content_hash from tool_results where tenant = ? and "
                                "session_id = ? and call_id = ?", [safe_text(tenant), safe_text(session_id),
                                                                    safe_text(call_id)]).fetchall()
        if recorded and len(recorded) == 1 and results_count == 1 and position == 1:
            return str(recorded[0][0])  # the one result with this id is the one recorded
        if recorded:
            mine = digest()
            for handle, content_hash in recorded:
                if content_hash == mine:
                    return str(handle)
        if position is None:
            return fallback
        handle = call_id if position == 1 else f"{call_id}#{position}"
        # A recorded result (other text) answers to that handle first: name this message instead.
        return fallback if any(h == handle for h, _ in recorded) else handle
    if role == "user":
        found = conn.execute("select handle from tool_results where tenant = ? and session_id = ? and "
                             "content_hash = ? limit 1",
                             [safe_text(tenant), safe_text(session_id), digest()]).fetchone()
        if found is not None:
            return str(found[0])
    return fallback


def skips_internal_lines(row: dict[str, Any], message: dict[str, Any] | None) -> bool:
    """An old row of a turn that called client and internal tools indexed the internal calls too."""
    return row["proxy"] is None and message is not None and has_internal_call(message)


def fill_hit(conn: Queryable, row: dict[str, Any], message: dict[str, Any] | None, marked: str,
             first_line: int, edges: tuple[bool, bool], tenant: str | None, asking: str | None) -> bool:
    """Complete a hit row from its best chunk (`marked`: the chunk's text with the matches marked):
    its matching lines, snippet, line count and handle. False when it matched on the internal calls
    only (then it is no hit). Both readers finish their hits here."""
    skip = skips_internal_lines(row, message)
    lines = matching_lines(marked, first_line, skip_internal_calls=skip, edges=edges)
    if skip and not lines:
        return False
    row["lines"] = [[number, plain(text)] for number, text in lines]
    row["snippet"] = bracketed(lines[0][1]) if lines else ""
    row["line_count"] = message_text(message).count("\n") + 1 if message is not None else None
    row["handle"] = hit_handle(conn, row, message, tenant, asking)
    return True

