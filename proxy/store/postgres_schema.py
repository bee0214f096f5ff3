"""The PostgreSQL archive schema, as append-only migrations: never edit one, add the next.

The same tables and columns as the SQLite archive (proxy/migrations.py, as of m012), so the report and
the dashboard run the same queries on both: every table has a `rowid` (an identity column) for the
insertion order SQLite gives for free, timestamps are ISO text as there, and `group_concat` exists as
an aggregate. Full-text search is a `tsvector` per ~4 KB chunk of a message's text (GIN-indexed), each
chunk carrying its message's tenant, session and policy (as columns, and as tokens in its tsvector) so
recall filters before it ranks, and its number and first line in the message so a hit names its line
without reading what precedes it.

Replicas migrate under one advisory lock, so two starting at once do not race."""

from __future__ import annotations

from typing import Any

MIGRATION_LOCK = 0x637478_0001  # pg_advisory_xact_lock key for migrations ("ctx" + 1)

MIGRATIONS: list[tuple[str, str]] = [
    ("m001_archive", r"""
CREATE OR REPLACE FUNCTION ctxproxy_concat(acc text, value text) RETURNS text
    LANGUAGE sql IMMUTABLE AS
    $$ SELECT CASE WHEN acc IS NULL THEN value WHEN value IS NULL THEN acc ELSE acc || ',' || value END $$;
CREATE OR REPLACE AGGREGATE group_concat(text) (SFUNC = ctxproxy_concat, STYPE = text);

CREATE TABLE messages (
    rowid bigint GENERATED ALWAYS AS IDENTITY,
    id text PRIMARY KEY,
    parent_id text,
    tenant text,
    session_id text,
    policy text,
    role text,
    body text,
    created_at text,
    call_id text,
    size bigint,
    proxy integer
);
CREATE INDEX messages_parent ON messages (parent_id);
CREATE INDEX messages_tenant_session ON messages (tenant, session_id);
CREATE INDEX messages_read_back ON messages (tenant, call_id, session_id, role, proxy);

CREATE TABLE message_chunks (
    rowid bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id text NOT NULL,
    seq integer NOT NULL,
    first_line integer NOT NULL,
    tenant text,
    session_id text,
    policy text,
    text text NOT NULL,
    -- Punctuation becomes spaces (one for one: positions stay), so a word inside a path, a host or
    -- `worker-3` is a word of its own, as SQLite's FTS5 tokenizer makes it. Then two scope tokens, as
    -- SQLite's chunks have: `ts:` + md5(tenant, session), `tp:` + md5(tenant, policy) (no word of the
    -- text holds a colon), so the GIN index finds a session's or a project's matches by itself, walking
    -- the shorter of the scope's list and the query's, instead of intersecting them with every chunk of
    -- the tenant (postgres_recall.ranking).
    tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', translate(text,
        '!"#$%&''()*+,-./:;<=>?@[\]^_`{|}~', '                                ')) || array_to_tsvector(ARRAY[
        'ts:' || md5(coalesce(tenant, '') || chr(1) || coalesce(session_id, '')),
        'tp:' || md5(coalesce(tenant, '') || chr(1) || coalesce(policy, ''))])) STORED,
    UNIQUE (message_id, seq)
);
-- A chunk's tsvector stays in its row (compressed if it can be; out of line only when the row would not
-- fit a page): ranking reads every candidate's tsvector, and one stored out of line (a 4 KB chunk's is
-- ~4.6 KB, more than its text) costs a TOAST index lookup and several reads. The text, read for the
-- final hits only, goes out of line instead.
ALTER TABLE message_chunks ALTER COLUMN tsv SET STORAGE MAIN;
-- New entries wait in the index's pending list until it holds gin_pending_list_limit, and every search
-- reads that list whole: at the default 4 MB (~3,000 chunks) a recall took ~8 ms longer; 512 kB bounds
-- it to ~1-2 ms, and the writer, off the hot path, merges the list into the index more often.
CREATE INDEX message_chunks_tsv ON message_chunks USING gin (tsv) WITH (gin_pending_list_limit = 512);
-- A project's chunks, and its messages' first chunks, newest first (order by -rowid): recall's
-- candidates for a common word (postgres_recall.ranking).
CREATE INDEX message_chunks_project ON message_chunks (tenant, policy, (-rowid));
CREATE INDEX message_chunks_project_first ON message_chunks (tenant, policy, (-rowid)) WHERE seq = 0;

CREATE TABLE exchanges (
    rowid bigint GENERATED ALWAYS AS IDENTITY,
    id text PRIMARY KEY,
    created_at text, session_id text, session_source text, tenant text, policy text, route text,
    model text, stream integer, status integer, latency_ms double precision, upstream_ms double precision,
    tokens_before bigint, tokens_after bigint, gate text, request_leaf text, forwarded_leaf text,
    params text, response_message_id text, response_id text, finish_reason text, prompt_tokens bigint,
    completion_tokens bigint, cached_tokens bigint, error text, response_raw bytea, parse_error text,
    response_truncated integer, cache_write_tokens bigint, usage text,
    round integer, upstream_headers_ms double precision, overhead_ms double precision,
    client_cached_tokens bigint, forwarded_cached_tokens bigint, summaries integer, masked integer,
    evicted_results integer, evictions integer, internal_rounds integer, recalls integer, reads integer,
    cost_usd double precision, baseline_usd double precision, saved_usd double precision,
    cost_source text, baseline_tokens bigint, baseline_cached_tokens bigint, prices text
);
CREATE INDEX exchanges_session ON exchanges (session_id, created_at);
CREATE INDEX exchanges_tenant ON exchanges (tenant, created_at);
CREATE INDEX exchanges_policy ON exchanges (policy, created_at);
CREATE INDEX exchanges_created ON exchanges (created_at);

CREATE TABLE tool_results (
    rowid bigint GENERATED ALWAYS AS IDENTITY,
    tenant text NOT NULL, session_id text NOT NULL, handle text NOT NULL,
    call_id text, content_hash text, tool_name text, content text, replacement text, kind text,
    created_at text,
    PRIMARY KEY (tenant, session_id, handle)
);
CREATE INDEX tool_results_handle ON tool_results (tenant, handle);
CREATE INDEX tool_results_hash ON tool_results (tenant, session_id, content_hash);

CREATE TABLE tickets (
    rowid bigint GENERATED ALWAYS AS IDENTITY,
    id text PRIMARY KEY,
    created_at text, tenant text, session_id text, kind text, severity text, checkpoint_id text,
    estimated_tokens bigint, max_input_tokens bigint, message text
);

CREATE TABLE session_windows (
    rowid bigint GENERATED ALWAYS AS IDENTITY,
    tenant text NOT NULL, session_id text NOT NULL,
    cut integer, last_evicted text, headlines text, block text, updated_at text,
    PRIMARY KEY (tenant, session_id)
);

CREATE TABLE session_memory (
    rowid bigint GENERATED ALWAYS AS IDENTITY,
    tenant text NOT NULL, session_id text NOT NULL, kind text NOT NULL, data text, updated_at text,
    PRIMARY KEY (tenant, session_id, kind)
);

CREATE TABLE pins (
    rowid bigint GENERATED ALWAYS AS IDENTITY,
    id text PRIMARY KEY,
    tenant text, policy text, name text, content text, tokens bigint, created_at text, session_id text
);
CREATE INDEX pins_scope ON pins (policy, tenant, session_id);
"""),
    ("m002_session_state", """
-- Replicas agree on a session through this row: a version every request of the session moves on (under
-- a per-session advisory lock), and the sticky state that is not a decision row (proxy/store/ledger.py).
CREATE TABLE session_state (
    tenant text NOT NULL, session_id text NOT NULL,
    version bigint NOT NULL, data text, updated_at text,
    PRIMARY KEY (tenant, session_id)
);
"""),
    ("m003_request_params", """
-- What a request held besides its messages, each distinct one once per tenant (exchanges.params_id; the
-- SQLite archive's m013_request_params).
CREATE TABLE request_params (id text PRIMARY KEY, tenant text, body text, created_at text);
ALTER TABLE exchanges ADD COLUMN params_id text;
"""),
    ("m004_no_parent_index", """
-- Nothing looks messages up by their parent (a chain is walked up, by id); the index only cost every new
-- message a write (the SQLite archive's m014_no_parent_index).
DROP INDEX IF EXISTS messages_parent;
"""),
    ("m005_no_session_index", """
-- Nothing looks messages up by tenant and session alone (read-back goes by messages_read_back, chains by
-- id); the index only cost every new message a write (the SQLite archive's m015_no_session_index).
DROP INDEX IF EXISTS messages_tenant_session;
"""),
]

# Each table's primary key: what INSERT OR REPLACE / OR IGNORE mean as ON CONFLICT clauses.
PRIMARY_KEYS: dict[str, tuple[str, ...]] = {
    "messages": ("id",), "exchanges": ("id",), "tool_results": ("tenant", "session_id", "handle"),
    "tickets": ("id",), "session_windows": ("tenant", "session_id"),
    "session_memory": ("tenant", "session_id", "kind"), "pins": ("id",),
    "session_state": ("tenant", "session_id"), "request_params": ("id",),
}


def apply(conn: Any) -> list[str]:
    """Apply the migrations not applied yet, in one transaction under the migration lock; the names
    applied. `conn`: a psycopg connection (autocommit off or on: this opens its own transaction)."""
    applied: list[str] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [MIGRATION_LOCK])
        conn.execute("CREATE TABLE IF NOT EXISTS ctxproxy_migrations (name text PRIMARY KEY, "
                     "applied_at timestamptz NOT NULL DEFAULT now())")
        done = {row[0] for row in conn.execute("SELECT name FROM ctxproxy_migrations")}
        for name, sql in MIGRATIONS:
            if name in done:
                continue
            conn.execute(sql)
            conn.execute("INSERT INTO ctxproxy_migrations (name) VALUES (%s)", [name])
            applied.append(name)
    return applied
