"""Recall on PostgreSQL: the ranked search behind PostgresReader.search, under a deadline.

What SQLite does with FTS5 (bm25, scope tokens in the MATCH, highlight(), chunk rowid arithmetic) is done
here with the chunk table of postgres_schema: filters on the chunk's own tenant / session / policy
columns, ts_rank over its tsvector, ts_headline for the matched terms, `first_line` and `seq` for line
numbers and cut edges. The pure helpers of archive_recall / archive_read_back (the guard, copies,
handles, matching lines) are shared, run through `?` SQL on this connection.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from typing import Any

from proxy import archive_recall
from proxy.archive_codec import loads, safe_text
from proxy.archive_read_back import Queryable, answers_internal
from proxy.archive_recall import END, MARK
from proxy.archive_traffic import MESSAGE_HANDLE, MESSAGE_HANDLE_CHARS, is_proxy_message, message_text
from proxy.store.sql import QmarkConnection

Row = dict[str, Any]
_WORD = re.compile(r"\w+", re.UNICODE)
_HEX = re.compile(r"^[0-9a-f]+$")
_RESET_EVERY = 0.025  # s: how stale a statement_timeout may get before it is set again (bounds overshoot)
# ts_rank's normalization 1 (divide by 1 + log(length)): a long chunk does not win by length alone.
_RANK = "ts_rank(c.tsv, q.query, 1)"
_TSV = re.compile(r"^to_tsvector\('([A-Za-z0-9_.]+)'::regconfig,", re.S)
DEFAULT_CONFIG = "english"
_TOKEN = re.compile(r"[^\W_]+")  # a word as FTS5's unicode61 and PostgreSQL's parser (mostly) see one
_LONGEST = 2047  # characters: PostgreSQL indexes no longer word


class Expired(Exception):
    """The deadline passed between two statements."""


class Timed(QmarkConnection):
    """A connection inside one search's transaction: before each statement the deadline is checked and
    statement_timeout set to the time left (so a slow statement is cancelled by the server, QueryCanceled),
    and the test seam `hook` runs."""

    def __init__(self, conn: Any, deadline: float, hook: Callable[[], None] | None) -> None:
        super().__init__(conn)
        self.deadline, self._hook, self._set_at = deadline, hook, 0.0

    def execute(self, sql: str, params: Iterable[Any] = ()) -> Any:
        if self._hook is not None:
            self._hook()
        now = time.monotonic()
        left = self.deadline - now
        if left <= 0:
            raise Expired()
        if now - self._set_at >= _RESET_EVERY:
            milliseconds = str(max(1, int(left * 1000)))  # (0 would mean no limit)
            self.conn.execute("select set_config('statement_timeout', %s, true)", [milliseconds])
            self._set_at = now
        return super().execute(sql, params)


def index_config(conn: Any) -> str | None:
    """The text search config message_chunks.tsv is made with (read from the catalog, so queries and
    marks follow the schema); None before the schema exists."""
    row = conn.execute(
        "select pg_get_expr(d.adbin, d.adrelid) from pg_attrdef d join pg_attribute a "
        "on a.attrelid = d.adrelid and a.attnum = d.adnum "
        "where d.adrelid = to_regclass('message_chunks') and a.attname = 'tsv'").fetchone()
    if row is None:
        return None
    found = _TSV.match(row[0].strip())
    return found.group(1) if found else DEFAULT_CONFIG


def words(text: str) -> list[str]:
    """The query's words, once each (case-insensitively), as fts_query takes them."""
    seen: dict[str, str] = {}
    for word in _WORD.findall(text):
        seen.setdefault(word.lower(), word)
    return list(seen.values())


def ts_query(count: int) -> str:
    """SQL for the OR of `count` words, each bound as a parameter: phraseto_tsquery reads its argument
    as plain text (user text is never tsquery syntax) and makes `ERR_QUOTA_7731` the phrase
    err <-> quota <-> 7731, as FTS5 reads the quoted word."""
    return " || ".join(["phraseto_tsquery(?::regconfig, ?)"] * count)


def ranked(conn: Timed, config: str, terms: list[str], scope: list[tuple[str, Any]],
           limit: int, in_scope: Callable[[Row], bool], tenant: str | None, asking: str | None,
           out: list[Row], body_inline: int) -> None:
    """Appends to `out` the best chunk of each of the `limit` best messages that are the conversation,
    with its matching lines, handle and message row, best first. `scope`: conditions on the chunk
    (`c.tenant = ?`, ...) with their values. `out` keeps the hits finished when the deadline cuts."""
    query = ts_query(len(terms))
    query_params = [p for term in terms for p in (config, term)]
    where = "".join(f" and {condition}" for condition, _ in scope)
    # One row per message (its best chunk), best first; a page's spare rows absorb the copies dropped.
    spare = limit * 4
    sql = (f"select message_id, rowid, rank from (select message_id, rowid, rank, row_number() over "
           f"(partition by message_id order by rank, seq) as n from (select c.message_id, c.rowid, c.seq, "
           f"-{_RANK} as rank from message_chunks c, (select {query} as query) q "
           f"where c.tsv @@ q.query{where}) scored) best where n = 1 order by rank, rowid limit ? offset ?")
    seen: dict[str, Row] = {}
    found: list[Row] = []
    offset = 0
    while len(found) < limit:
        rows = conn.execute(sql, [*query_params, *(v for _, v in scope), spare, offset]).fetchall()
        best = {message: (chunk, rank) for message, chunk, rank in rows}
        found += _accepted(conn, best, limit - len(found), in_scope, seen, found, body_inline)
        if len(rows) < spare:
            break
        offset += spare
    if not found:
        return
    chunks = _chunks(conn, config, terms, [row["chunk"] for row in found])
    for row in found:
        message = row.pop("message")
        skip = archive_recall.skips_internal_lines(row, message)
        marked, first, edges = chunks[row.pop("chunk")]
        lines = archive_recall.matching_lines(marked, first, skip_internal_calls=skip, edges=edges)
        if skip and not lines:
            continue  # it matched on the internal calls only
        row["lines"] = [[number, archive_recall.plain(text)] for number, text in lines]
        row["snippet"] = archive_recall.bracketed(lines[0][1]) if lines else ""
        row["line_count"] = message_text(message).count("\n") + 1 if message is not None else None
        row["handle"] = archive_recall.hit_handle(conn, row, message, tenant, asking)
        out.append(row)


def _accepted(conn: Timed, best: dict[str, tuple[int, float]], limit: int, in_scope: Callable[[Row], bool],
              seen: dict[str, Row], earlier: list[Row], body_inline: int) -> list[Row]:
    """Candidates in rank order that pass the scope check and the guard, one per distinct message (a
    message forwarded under another parent was archived again), at most `limit` (as ArchiveReader)."""
    wanted = [m for m in best if m not in seen]
    if wanted:
        cursor = conn.execute(
            "select id, parent_id, session_id, role, created_at, tenant, policy, call_id, size, proxy, "
            "case when size is null or size <= ? then body end as body from messages where id = any(?)",
            [body_inline, wanted])
        columns = [d.name for d in cursor.description]
        for values in cursor.fetchall():
            fetched = dict(zip(columns, values, strict=True))
            fetched["message"] = loads(fetched["body"]) if fetched["body"] is not None else None
            seen[fetched["id"]] = fetched
    copies = {_copy(row) for row in earlier}
    taken = {row["id"] for row in earlier}  # (a write between two pages may move a message to the next)
    found: list[Row] = []
    for node, (chunk, rank) in best.items():
        row = seen.get(node)
        if row is None or node in taken or not in_scope(row):
            continue
        if not archive_recall.keep(conn, row, row["message"]):
            continue
        copy = _copy(row)
        if copy[3] != "" and copy in copies:  # (a body without text cannot tell copies apart)
            continue
        copies.add(copy)
        found.append(row | {"chunk": chunk, "rank": rank})
        if len(found) == limit:
            break
    return found


def _copy(row: Row) -> tuple[Any, ...]:
    text = message_text(row["message"]) if row["message"] is not None else None
    return row["session_id"], row["role"], row["call_id"], text if text is not None else row["size"]


def _chunks(conn: Timed, config: str, terms: list[str],
            rowids: list[int]) -> dict[int, tuple[str, int, tuple[bool, bool]]]:
    """Per chunk: its text with the query's terms marked (MARK ... END) as FTS5's highlight() marks
    them, the line it starts on, and whether it starts / ends inside a line (a line longer than a
    chunk was cut at a space)."""
    rows = conn.execute(
        "select c.rowid, c.text, c.first_line, "
        "coalesce((select right(p.text, 1) <> chr(10) from message_chunks p "
        "          where p.message_id = c.message_id and p.seq = c.seq - 1), false), "
        "right(c.text, 1) <> chr(10) and exists (select 1 from message_chunks n "
        "          where n.message_id = c.message_id and n.seq = c.seq + 1) "
        "from message_chunks c where c.rowid = any(?)", [rowids]).fetchall()
    phrases = [[token.lower() for token in _TOKEN.findall(term)] for term in terms]
    tokens = {rowid: [(m.start(), m.end(), m.group().lower()) for m in _TOKEN.finditer(text)]
              for rowid, text, *_ in rows}
    # Stemming keeps a word's first letter: only words starting like a query word can match one.
    initials = {token[0] for phrase in phrases for token in phrase}
    wanted = {token for phrase in phrases for token in phrase} | {
        token for found in tokens.values() for _, _, token in found
        if token[0] in initials and len(token) <= _LONGEST}
    lexemes: dict[str, str | None] = dict(conn.execute(
        "select t, (tsvector_to_array(to_tsvector(?::regconfig, t)))[1] from unnest(?::text[]) t",
        [config, sorted(wanted)]).fetchall())
    wanted_phrases = [[lexemes.get(token) for token in phrase] for phrase in phrases]
    found = {}
    for rowid, text, first, starts, ends in rows:
        text_words = [(start, end, lexemes.get(token)) for start, end, token in tokens[rowid]]
        found[rowid] = (highlighted(text, text_words, wanted_phrases), first, (bool(starts), bool(ends)))
    return found


def highlighted(text: str, tokens: list[tuple[int, int, str | None]], phrases: list[list[str | None]]) -> str:
    """`text` with MARK ... END around each instance of a phrase (a query word's lexemes; None: a stop
    word, which matches any word, as in phraseto_tsquery), as FTS5 marks them: a word of several parts
    (ERR_QUOTA_7731) once around the whole, only where all of it is; overlapping instances as one.
    `tokens`: the text's words (start, end, lexeme or None)."""
    spans: list[tuple[int, int]] = []
    for phrase in phrases:
        while phrase and phrase[0] is None:  # phraseto_tsquery leaves out stop words at the ends
            phrase = phrase[1:]
        while phrase and phrase[-1] is None:
            phrase = phrase[:-1]
        for at in range(len(tokens) - len(phrase) + 1) if phrase else ():
            if all(want is None or tokens[at + n][2] == want for n, want in enumerate(phrase)):
                spans.append((tokens[at][0], tokens[at + len(phrase) - 1][1]))
    if not spans:  # (the chunk matched otherwise, as a path PostgreSQL's parser reads whole): its words
        single = {want for phrase in phrases for want in phrase if want is not None}
        spans = [(start, end) for start, end, lexeme in tokens if lexeme is not None and lexeme in single]
    out, done = [], 0
    for start, end in _merged(spans):
        out += [text[done:start], MARK, text[start:end], END]
        done = end
    out.append(text[done:])
    return "".join(out)


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def message_by_handle(conn: Queryable, tenant: str, handle: str) -> dict[str, Any] | None:
    """archive_read_back.message_by_handle for PostgreSQL: the prefix range is an index range whatever
    the database's collation (ids are lowercase hex: an id holding the prefix sorts below prefix + "g"),
    checked exactly with left()."""
    prefix = handle[len(MESSAGE_HANDLE):]
    if not handle.startswith(MESSAGE_HANDLE) or len(prefix) < MESSAGE_HANDLE_CHARS or not _HEX.match(prefix):
        return None  # (no archive id holds anything else)
    row = conn.execute("select id, session_id, role, call_id, proxy, parent_id, body from messages "
                       "where id >= ? and id < ? and left(id, ?) = ? and tenant = ? limit 1",
                       [prefix, prefix + "g", len(prefix), prefix, safe_text(tenant)]).fetchone()
    if row is None or row[4] == 1:
        return None
    message = loads(row[6])
    if row[4] is None and (is_proxy_message(message) or (
            row[2] == "tool" and row[3] and answers_internal(conn, row[5], row[3]))):
        return None
    return {"handle": handle, "call_id": row[3] or handle, "content": message_text(message),
            "tool_name": None}
