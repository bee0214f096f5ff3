"""bench/recall.py on PostgreSQL: builds the same archive in a PostgreSQL database, then times
PostgresReader.recall on it.

The archive has the real schema (postgres_schema.apply) and the rows PostgresRowWriter._insert writes
(messages, and message_chunks with seq, first_line, tenant, session_id, policy), loaded with COPY in
transactions of 10,000 messages. The secondary indexes of both tables are dropped for the load and made
again afterwards from their own definitions (as pg_restore does: one sort instead of a million inserts),
then VACUUM ANALYZE (what autovacuum does on an archive written over weeks). So the GIN index's pending
list is empty, where a live archive's holds up to its gin_pending_list_limit (512 kB), which every
search reads: ~2 ms more per recall, measured with 540 chunks inserted after a build.

The build's session is `synchronous_commit = off` with a large maintenance_work_mem for the index
builds; the server's settings are its own (this bench tunes nothing there). The database's comment
names the build (message count, log size, a hash of the schema): a database holding it is reused as it
is, one holding another build of this bench is emptied and built again, one holding anything else is
refused.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import time
from typing import Any

import orjson
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from recall import BATCH, CREATED_AT, big_log, measure, messages, progress

from proxy.archive_db import chunk_text, message_call_id
from proxy.archive_traffic import message_text
from proxy.store import postgres_schema
from proxy.store.postgres import pg_text
from proxy.store.postgres_reader import PostgresReader

_MESSAGES = ("COPY messages (id, parent_id, tenant, session_id, policy, role, body, created_at, call_id, "
             "size, proxy) FROM STDIN")
_CHUNKS = "COPY message_chunks (message_id, seq, first_line, tenant, session_id, policy, text) FROM STDIN"
# The indexes that are not a constraint's (those stay: ids must stay unique during the load).
_SECONDARY = ("select i.relname, pg_get_indexdef(i.oid) from pg_index x "
              "join pg_class i on i.oid = x.indexrelid "
              "where x.indrelid in ('messages'::regclass, 'message_chunks'::regclass) "
              "and not exists (select 1 from pg_constraint c where c.conindid = x.indexrelid)")


def connect(url: str) -> psycopg.Connection[Any]:
    """A connection to the database of `url`, created first when the server does not have it."""
    try:
        return psycopg.connect(url, autocommit=True)
    except psycopg.OperationalError as exc:
        if "does not exist" not in str(exc):
            raise
    name = conninfo_to_dict(url)["dbname"]
    with psycopg.connect(make_conninfo(url, dbname="postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(str(name))))
    return psycopg.connect(url, autocommit=True)


def chunk_rows(node: str, tenant: str, session: str, text: str) -> list[tuple[Any, ...]]:
    """The message's chunk rows as PostgresRowWriter._insert makes them."""
    rows, line = [], 1
    for seq, chunk in enumerate(chunk_text(text)):
        rows.append((node, seq, line, tenant, session, "default", pg_text(chunk)))
        line += chunk.count("\n")
    return rows


def build(conn: psycopg.Connection[Any], count: int, rng: random.Random, words: list[str],
          big_mb: int) -> None:
    started = time.perf_counter()
    conn.execute("set synchronous_commit = off")
    conn.execute("set maintenance_work_mem = '1GB'")
    indexes = conn.execute(_SECONDARY).fetchall()
    for name, _ in indexes:
        conn.execute(sql.SQL("drop index {}").format(sql.Identifier(name)))
    batch: list[tuple[Any, ...]] = []
    chunks: list[tuple[Any, ...]] = []

    def write() -> None:
        with conn.transaction(), conn.cursor() as cursor:
            with cursor.copy(_MESSAGES) as copy:
                for row in batch:
                    copy.write_row(row)
            with cursor.copy(_CHUNKS) as copy:
                for row in chunks:
                    copy.write_row(row)

    for node, tenant, session, text in messages(count, rng, words):
        # proxy 0: classified when written (a short text with no call: never the proxy's own traffic)
        batch.append((node, None, tenant, session, "default", "tool", "{}", CREATED_AT, None, 2, 0))
        chunks.extend(chunk_rows(node, tenant, session, text))
        if len(batch) == BATCH:
            write()
            progress(int(node[1:]) + 1, started)
            batch, chunks = [], []
    if big_mb:
        message = big_log(rng, words, big_mb)
        body = orjson.dumps(message).decode()
        batch.append(("big-log", None, "t0", "s0", "default", "tool", body, "2026-11-21T10:00:00+00:00",
                      message_call_id(message), len(body), 0))
        chunks.extend(chunk_rows("big-log", "t0", "s0", message_text(message)))
    if batch:
        write()
    loaded = time.perf_counter()
    print(f"\n  loaded in {loaded - started:.0f} s; indexes ...", end="", file=sys.stderr)
    for _, definition in indexes:
        conn.execute(definition)
    indexed = time.perf_counter()
    print(f" {indexed - loaded:.0f} s; vacuum analyze ...", end="", file=sys.stderr)
    conn.execute("vacuum analyze messages")
    conn.execute("vacuum analyze message_chunks")
    print(f" {time.perf_counter() - indexed:.0f} s; built in {time.perf_counter() - started:.0f} s",
          file=sys.stderr)


def marker(args: argparse.Namespace) -> str:
    """The database comment naming what was built (a schema change means a new build)."""
    schema = hashlib.sha256(repr(postgres_schema.MIGRATIONS).encode()).hexdigest()[:12]
    return f"ctxproxy bench/recall.py: {args.messages} messages, {args.big_mb} MB log, schema {schema}"


def prepare(conn: psycopg.Connection[Any], args: argparse.Namespace, rng: random.Random,
            words: list[str]) -> None:
    """Reuse the database when it holds this build; else (empty, or another build of this bench) build."""
    [comment] = conn.execute("select shobj_description(oid, 'pg_database') from pg_database "
                             "where datname = current_database()").fetchone() or [None]
    if comment == marker(args):
        return
    ours = comment is not None and comment.startswith("ctxproxy bench/recall.py:")
    if not ours and conn.execute("select 1 from pg_tables where schemaname = 'public' limit 1").fetchone():
        sys.exit("the database holds tables this bench did not build: give it an empty one")
    conn.execute("drop schema public cascade")
    conn.execute("create schema public")
    postgres_schema.apply(conn)
    print(f"building {args.messages} messages and a {args.big_mb} MB log in PostgreSQL ...", file=sys.stderr)
    build(conn, args.messages, rng, words, args.big_mb)
    name = conn.execute("select current_database()").fetchone()
    conn.execute(sql.SQL("comment on database {} is {}").format(
        sql.Identifier(str(name[0] if name else "")), sql.Literal(marker(args))))


def run(args: argparse.Namespace, rng: random.Random, words: list[str]) -> None:
    with connect(args.url) as conn:
        prepare(conn, args, rng, words)
        total, largest, size = conn.execute(
            "select (select count(*) from messages), (select coalesce(max(size), 0) from messages), "
            "pg_database_size(current_database())").fetchone() or (0, 0, 0)
    reader = PostgresReader(args.url)
    try:
        measure(reader.recall, total, largest, size, words, args.queries, args.slowest)
    finally:
        reader.close()
