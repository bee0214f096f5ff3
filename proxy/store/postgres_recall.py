"""Recall on PostgreSQL: the ranked search behind PostgresReader.search, under a deadline.

What SQLite does with FTS5 (bm25, scope tokens in the MATCH, highlight(), chunk rowid arithmetic) is done
here with the chunk table of postgres_schema: scope tokens in the tsvector and filters on the chunk's
own tenant / session / policy columns, ts_rank over a bounded set of candidates (ranking), the matched
terms marked as FTS5 marks them, `first_line` and `seq` for line numbers and cut edges. The pure
helpers of archive_recall / archive_read_back (the guard, copies, handles, matching lines) are shared,
run through `?` SQL on this connection.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from proxy import archive_recall
from proxy.archive_codec import loads, safe_text
from proxy.archive_db import CHUNK_CHARS
from proxy.archive_read_back import HANDLE_COLUMNS, Queryable, handle_result
from proxy.archive_recall import END, MARK
from proxy.archive_traffic import MESSAGE_HANDLE, MESSAGE_HANDLE_CHARS, message_text
from proxy.store.sql import QmarkConnection

Row = dict[str, Any]
_WORD = re.compile(r"\w+", re.UNICODE)
_HEX = re.compile(r"^[0-9a-f]+$")
_RESET_EVERY = 0.025  # s: how stale a statement_timeout may get before it is set again (bounds overshoot)
CANDIDATES = 1000  # chunks a term brings to a capped ranking at most (see ranking)
# The scope tokens of a chunk's tsvector (postgres_schema), as tsquery.
_SESSION = "quote_literal('ts:' || md5(?::text || chr(1) || ?::text))::tsquery"
_PROJECT = "quote_literal('tp:' || md5(?::text || chr(1) || ?::text))::tsquery"
# Whether any word of the query is in more than COMMON of all chunks, by the planner's statistics (the
# most common lexemes of the tsvector column; none before the first ANALYZE): so common that a first
# scan on the project's token would walk the whole project's list (see ranking).
COMMON = 0.2
_COMMON = ("select coalesce(max(s.f), 0) >= {} as common from pg_stats p, unnest(p.most_common_elems::"
           "text::text[], p.most_common_elem_freqs) s(e, f) where p.schemaname = current_schema() and "
           "p.tablename = 'message_chunks' and p.attname = 'tsv' "
           "and s.e = any(tsvector_to_array(to_tsvector(?::regconfig, ?)))")
_TSV = re.compile(r"^\(?to_tsvector\('([A-Za-z0-9_.]+)'::regconfig,", re.S)
DEFAULT_CONFIG = "english"
_TOKEN = re.compile(r"[^\W_]+")  # a word as FTS5's unicode61 and PostgreSQL's parser (mostly) see one
_LONGEST = 2047  # characters: PostgreSQL indexes no longer word


_TIMEOUT = "select set_config('statement_timeout', %s, true)"
# For the search's transaction, with its first timeout: plans made for the terms at hand (psycopg prepares
# a statement run 5 times, and the server may then plan it once for any term: as if a rare id were as
# frequent as an average word); no scan of the whole chunk table (a LIMIT makes one look cheap when the
# planner expects many matches, but the archive only grows); no JIT (its compiling takes longer than
# these statements run).
_SETTINGS = ("select set_config('statement_timeout', %s, true), "
             "set_config('plan_cache_mode', 'force_custom_plan', true), "
             "set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)")


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
            self.conn.execute(_SETTINGS if not self._set_at else _TIMEOUT, [milliseconds])
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


@dataclass(frozen=True)
class Scope:
    """Which chunks a search looks at (each optional; values as stored: safe_text, pg_text)."""

    tenant: str | None = None
    session_id: str | None = None
    policy: str | None = None
    exclude_session: str | None = None

    def columns(self) -> list[tuple[str, Any]]:
        """Conditions on the chunk's own columns, with their values."""
        wanted = [(f"c.{name} = ?", value) for name, value in (
            ("tenant", self.tenant), ("session_id", self.session_id), ("policy", self.policy))
                  if value is not None]
        excluded = self.exclude_session
        return wanted + ([("c.session_id <> ?", excluded)] if excluded is not None else [])


def ranking(config: str, terms: list[str], scope: Scope) -> tuple[str, list[Any]]:
    """SQL ranking the chunks of `scope` that match any of `terms` (ts_rank, normalization 1: divided
    by 1 + log(length), so a long chunk does not win by length alone), and its parameters but limit
    and offset: one row per message (its best chunk), best first.

    A session's matches are all ranked, found on the GIN index with the session's token (its hits come
    first, and a session is small next to a project; the deadline bounds the rest; a session asked for
    without its tenant, by the dashboard, is filtered on its column).

    In a larger scope (a project, a tenant: scopes that grow with the archive) what is ranked is
    bounded: ts_rank reads the tsvector of every row it ranks, and a common word in a large project
    matches tens of thousands of chunks. A first scan takes at most CANDIDATES chunks a term matching
    the query (in a project, on the GIN index with the project's token); when it finds no more, they
    are all ranked: the hits of ranking every match. When it finds more, or when the statistics say
    the query holds a word in over COMMON of all chunks (the first scan would then grow with the
    project), each term brings its newest CANDIDATES matches instead (on the project's index newest
    first, or the GIN index for a rarer term, as the planner estimates) and, when those include later
    chunks of long messages, its newest CANDIDATES matches among messages' first chunks, so that one
    huge result (a 20 MB log is 5,000 chunks) cannot crowd every other message out. So a term in
    fewer chunks (an id, a rare word: what a query is usually after) still brings every match; a more
    common one is ranked on its newest: an older chunk holding only such terms is not a hit, one that
    also holds a rarer term of the query is."""
    query, query_params = ts_query(len(terms)), [p for term in terms for p in (config, term)]
    columns = scope.columns()
    where, values = "".join(f" and {c}" for c, _ in columns), [v for _, v in columns]
    rank = (f"select message_id, rowid, rank from (select message_id, rowid, rank, row_number() over "
            f"(partition by message_id order by rank, seq) as n from (select c.message_id, c.rowid, c.seq, "
            f"-ts_rank(c.tsv, {query}, 1) as rank from message_chunks c where ")
    best = ") scored) best where n = 1 order by rank, rowid limit ? offset ?"
    if scope.session_id is not None and scope.tenant is not None:
        # (Not the tenant's column: an index scan of every chunk of the tenant to intersect with would
        # cost more than it saves.)
        rest = [(c, v) for c, v in columns if c != "c.tenant = ?"]
        return (f"{rank}c.tsv @@ (({query}) && {_SESSION}){''.join(f' and {c}' for c, _ in rest)}{best}",
                [*query_params, *query_params, scope.tenant, scope.session_id, *(v for _, v in rest)])
    if scope.session_id is not None:
        return f"{rank}c.tsv @@ ({query}){where}{best}", [*query_params, *query_params, *values]
    # Newest first: on message_chunks_project* in a project (on -rowid: not the primary key, whose
    # backward scan the planner prefers for its physical order but which reads every project's chunks).
    project = scope.tenant is not None and scope.policy is not None
    newest = "-c.rowid" if project else "c.rowid desc"
    bound = CANDIDATES * len(terms)
    if project:  # the first scan on the project's token, unordered (it stops at its bound)
        exclude = [c for c in columns if c[0] == "c.session_id <> ?"]
        gate = _COMMON.format(COMMON)
        first = f"c.tsv @@ (({query}) && {_PROJECT}){''.join(f' and {c}' for c, _ in exclude)}"
        first_params = [config, " ".join(terms), *query_params, scope.tenant, scope.policy,
                        *(v for _, v in exclude)]
    else:
        gate, first = "select false as common", f"c.tsv @@ ({query}){where} order by {newest}"
        first_params = [*query_params, *values]

    def scan(name: str, when: str, pool: str = "") -> str:  # a term's newest CANDIDATES matches
        return (f"{name} as materialized (select c.rowid, c.seq from message_chunks c where {when} and "
                f"c.tsv @@ phraseto_tsquery(?::regconfig, ?){pool}{where} order by {newest} "
                f"limit {CANDIDATES})")

    # Each term's scans run only when the first scan was skipped or stopped at its bound; its first
    # chunks' scan, only when its own scan stopped at CANDIDATES (else it has every match already)
    # with later chunks among them (else they are the same).
    ctes = [f"gate as materialized ({gate})",
            f"everything as materialized (select c.rowid from message_chunks c where not (select common "
            f"from gate) and {first} limit {bound + 1})"]
    for n in range(len(terms)):
        full = f"(select count(*) from t{n}) = {CANDIDATES} and (select max(seq) from t{n}) > 0"
        ctes += [scan(f"t{n}", f"((select common from gate) or (select count(*) from everything) > {bound})"),
                 scan(f"f{n}", full, " and c.seq = 0")]
    found = " union all ".join([
        f"select rowid from everything where (select count(*) from everything) <= {bound}",
        *(f"select rowid from {pool}{n}" for n in range(len(terms)) for pool in "tf")])
    per_term = [p for term in terms for _ in range(2) for p in (config, term, *values)]
    return (f"with {', '.join(ctes)} {rank}c.rowid in ({found}){best}",
            [*first_params, *per_term, *query_params])


def ranked(conn: Timed, config: str, terms: list[str], scope: Scope, limit: int,
           in_scope: Callable[[Row], bool], tenant: str | None, asking: str | None, out: list[Row],
           body_inline: int) -> None:
    """Appends to `out` the best chunk of each of the `limit` best messages that are the conversation,
    with its matching lines, handle and message row, best first (see ranking). `out` keeps the hits
    finished when the deadline cuts."""
    sql, params = ranking(config, terms, scope)
    spare = limit * 4  # a page's spare rows absorb the copies dropped
    seen: dict[str, Row | None] = {}
    found: list[Row] = []
    offset = 0
    while len(found) < limit:
        rows = conn.execute(sql, [*params, spare, offset]).fetchall()
        best = {message: (chunk, rank) for message, chunk, rank in rows}
        found += _accepted(conn, best, limit - len(found), in_scope, seen, found, body_inline)
        if len(rows) < spare:
            break
        offset += spare
    if not found:
        return
    chunks = _chunks(conn, config, terms, [row["chunk"] for row in found],
                     [row["chunk"] for row in found if row["size"] is None or row["size"] > CHUNK_CHARS])
    for row in found:
        message = row.pop("message")
        marked, first, edges = chunks[row.pop("chunk")]
        if archive_recall.fill_hit(conn, row, message, marked, first, edges, tenant, asking):
            out.append(row)


def _accepted(conn: Timed, best: dict[str, tuple[int, float]], limit: int, in_scope: Callable[[Row], bool],
              seen: dict[str, Row | None], earlier: list[Row], body_inline: int) -> list[Row]:
    """Candidates in rank order that pass the scope check and the guard, one per distinct message (a
    message forwarded under another parent was archived again), at most `limit` (as ArchiveReader).
    Message rows are read as the walk reaches them, as many at once as are still wanted (most pass):
    a page's spare candidates are read only when some were dropped."""
    copies = {_copy(row) for row in earlier}
    taken = {row["id"] for row in earlier}  # (a write between two pages may move a message to the next)
    found: list[Row] = []
    order = list(best)
    for at, node in enumerate(order):
        if node not in seen:
            _fetch(conn, [m for m in order[at:at + limit - len(found)] if m not in seen], seen, body_inline)
        row = seen.get(node)
        if row is None or node in taken or not in_scope(row):
            continue
        if not archive_recall.keep(conn, row, row["message"]):
            continue
        copy = _copy(row)
        if copy[3] != "" and copy in copies:  # (a body without text cannot tell copies apart)
            continue
        copies.add(copy)
        chunk, rank = best[node]
        found.append(row | {"chunk": chunk, "rank": rank})
        if len(found) == limit:
            break
    return found


def _fetch(conn: Timed, ids: list[str], seen: dict[str, Row | None], body_inline: int) -> None:
    """Message rows into `seen` (None: no such message), the body only up to `body_inline` bytes."""
    cursor = conn.execute(
        "select id, parent_id, session_id, role, created_at, tenant, policy, call_id, size, proxy, "
        "case when size is null or size <= ? then body end as body from messages where id = any(?)",
        [body_inline, ids])
    columns = [d.name for d in cursor.description]
    seen.update(dict.fromkeys(ids))
    for values in cursor.fetchall():
        fetched = dict(zip(columns, values, strict=True))
        fetched["message"] = loads(fetched["body"]) if fetched["body"] is not None else None
        seen[fetched["id"]] = fetched


def _copy(row: Row) -> tuple[Any, ...]:
    text = message_text(row["message"]) if row["message"] is not None else None
    return row["session_id"], row["role"], row["call_id"], text if text is not None else row["size"]


def _chunks(conn: Timed, config: str, terms: list[str], rowids: list[int],
            long: list[int]) -> dict[int, tuple[str, int, tuple[bool, bool]]]:
    """Per chunk: its text with the query's terms marked (MARK ... END) as FTS5's highlight() marks
    them, the line it starts on, and whether it starts / ends inside a line (a line longer than a
    chunk was cut at a space): its neighbours are looked at for those in `long` only (a message's
    body no longer than a chunk has one chunk)."""
    rows = conn.execute(
        "select c.rowid, c.text, c.first_line, "
        "c.seq > 0 and coalesce((select right(p.text, 1) <> chr(10) from message_chunks p "
        "          where p.message_id = c.message_id and p.seq = c.seq - 1), false), "
        "c.rowid = any(?) and right(c.text, 1) <> chr(10) and exists (select 1 from message_chunks n "
        "          where n.message_id = c.message_id and n.seq = c.seq + 1) "
        "from message_chunks c where c.rowid = any(?)", [long, rowids]).fetchall()
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
    row = conn.execute(f"select {HANDLE_COLUMNS} from messages where id >= ? and id < ? and "
                       "left(id, ?) = ? and tenant = ? limit 1",
                       [prefix, prefix + "g", len(prefix), prefix, safe_text(tenant)]).fetchone()
    return handle_result(conn, handle, row)
