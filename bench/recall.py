"""recall latency over a large archive: this session first, then the project, on SQLite (FTS5/BM25)
or PostgreSQL (tsvector/GIN, proxy/store/postgres_recall.py).

Run: python bench/recall.py [--messages 1000000] [--big-mb 20] [--queries 300] [--db PATH | --url URL]

Builds (once, reused if --db exists / if --url's database already holds the archive) an archive with
the real schema: messages spread over 2,000 sessions of 20 tenants, ~40 words each from a 20k-word
vocabulary plus ids, and one `--big-mb` tool result of log lines (same vocabulary) in session s0, then
times recall for random 1-3 word queries (p50/p95/p99 ms): from random sessions, and from s0 itself,
where every query that matches the document ranks its chunks. Both backends get the same archive and
the same queries. PostgreSQL: `--url postgresql://user@/bench_recall?host=/run/postgresql` (the database
is created when missing; bench/recall_postgres.py builds it with COPY, the indexes made after the load).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson

from proxy.archive import chunk_text, insert_message, open_database, scope_of
from proxy.reader import ArchiveReader, SearchHits

TENANTS, SESSIONS = 20, 2000
BATCH = 10_000  # messages a transaction
CREATED_AT = "2026-11-21T10:00:00Z"


def vocabulary(rng: random.Random, size: int = 20_000) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = {"".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(size * 2)}
    return sorted(words)[:size]


def zipf(words: list[str]) -> list[float]:
    """Cumulative Zipf-like weights, as in real text: the word at rank r is 1/(r+1) as frequent."""
    cumulative, total = [], 0.0
    for rank in range(len(words)):
        total += 1 / (rank + 1)
        cumulative.append(total)
    return cumulative


def messages(count: int, rng: random.Random, words: list[str]) -> Iterator[tuple[str, str, str, str]]:
    """(id, tenant, session, text) of the `count` short messages, in insertion order."""
    cumulative = zipf(words)
    for index in range(count):
        session = index % SESSIONS
        text = " ".join(rng.choices(words, cum_weights=cumulative, k=40)) + f" ord_{index:07d}"
        yield f"m{index:08d}", f"t{session % TENANTS}", f"s{session}", text


def big_log(rng: random.Random, words: list[str], big_mb: int) -> dict[str, Any]:
    """A service log of `big_mb` MB: timestamp, level, ~10 words of the vocabulary a line; the tool
    result of session s0 (tenant t0)."""
    cumulative, lines, size = zipf(words), [], 0
    while size < big_mb * 1_000_000:
        line = (f"2026-11-21T10:{len(lines) // 60 % 60:02d}:{len(lines) % 60:02d} INFO "
                + " ".join(rng.choices(words, cum_weights=cumulative, k=10)))
        lines.append(line)
        size += len(line) + 1
    return {"role": "tool", "tool_call_id": "call_big", "content": "\n".join(lines)}


def progress(done: int, started: float) -> None:
    print(f"\r  {done} messages ({time.perf_counter() - started:.0f} s)", end="", file=sys.stderr)


def build(path: Path, count: int, rng: random.Random, words: list[str], big_mb: int) -> None:
    db = open_database(path)
    conn = db.conn
    started, batch, chunks = time.perf_counter(), [], []

    def write() -> None:
        with conn:
            conn.executemany("INSERT INTO messages (id, parent_id, tenant, session_id, policy, role, body, "
                             "created_at, size) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", batch)
            conn.executemany("INSERT INTO message_chunks_fts (message_id, scope, text) VALUES (?, ?, ?)",
                             chunks)

    for node, tenant, session, text in messages(count, rng, words):
        batch.append((node, None, tenant, session, "default", "tool", "{}", CREATED_AT, 2))
        chunks.extend((node, scope_of(tenant, session, "default"), piece) for piece in chunk_text(text))
        if len(batch) == BATCH:
            write()
            progress(int(node[1:]) + 1, started)
            batch, chunks = [], []
    if batch:
        write()
    if big_mb:
        message = big_log(rng, words, big_mb)
        body = orjson.dumps(message)
        written = time.perf_counter()
        with conn:
            insert_message(conn, "big-log", None, message, body, tenant="t0", session_id="s0",
                           policy="default", created_at="2026-11-21T10:00:00+00:00")
        print(f"\n  {len(body) / 1e6:.1f} MB log archived in {time.perf_counter() - written:.1f} s",
              end="", file=sys.stderr)
    db.execute("INSERT INTO message_chunks_fts(message_chunks_fts) VALUES('optimize')")
    db.close()
    print(f"\n  built in {time.perf_counter() - started:.0f} s", file=sys.stderr)


def timed(recall: Callable[..., SearchHits], rng: random.Random, words: list[str], queries: int,
          session_of: Callable[[], int], slowest: list[tuple[float, str, str]]) -> tuple[list[float], int]:
    samples, truncated = [], 0
    for _ in range(queries):
        session = session_of()
        query = " ".join(rng.choice(words[:5000]) for _ in range(rng.randint(1, 3)))
        started = time.perf_counter()
        hits = recall(f"t{session % TENANTS}", f"s{session}", "default", query, 8)
        samples.append((time.perf_counter() - started) * 1000)
        slowest.append((samples[-1], f"s{session}", query))
        truncated += hits.truncated
    return sorted(samples), truncated


def measure(recall: Callable[..., SearchHits], total: int, largest: int, size: int, words: list[str],
            queries: int, show_slowest: int) -> None:
    rng = random.Random(11)  # the same queries whichever backend, built now or reused
    print("| archive messages | largest MB | sessions queried | queries | recall p50 ms | p95 ms | p99 ms "
          "| truncated | db size MB |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    slowest: list[tuple[float, str, str]] = []
    for label, session_of in (("random", lambda: rng.randrange(SESSIONS)),
                              ("s0 (holds the log)", lambda: 0)):
        samples, truncated = timed(recall, rng, words, queries, session_of, slowest)
        pick = lambda q, s=samples: s[min(len(s) - 1, int(len(s) * q))]  # noqa: E731
        print(f"| {total} | {largest / 1e6:.0f} | {label} | {len(samples)} "
              f"| {statistics.median(samples):.1f} | {pick(0.95):.1f} | {pick(0.99):.1f} | {truncated} "
              f"| {size / 1e6:.0f} |")
    for ms, session, query in sorted(slowest, reverse=True)[:show_slowest]:
        print(f"  {ms:7.1f} ms  {session:6} {query}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--big-mb", type=int, default=20, help="size of the one huge tool result (0: none)")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--slowest", type=int, default=0, help="list the N slowest queries (stderr)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--db", type=Path, help="SQLite archive (built when missing)")
    where.add_argument("--url", help="PostgreSQL database (built when it does not hold the archive)")
    args = parser.parse_args()
    rng = random.Random(7)
    words = vocabulary(rng)
    if args.url:
        import recall_postgres

        recall_postgres.run(args, rng, words)
        return
    path = args.db or Path(tempfile.mkdtemp()) / "archive.db"
    if not path.exists():
        print(f"building {args.messages} messages and a {args.big_mb} MB log in {path} ...", file=sys.stderr)
        build(path, args.messages, rng, words, args.big_mb)
    reader = ArchiveReader(path)
    total = reader.db.execute("select count(*) from messages").fetchone()[0]
    big = reader.db.execute("select size from messages where id = 'big-log'").fetchone()
    measure(reader.recall, total, big[0] if big else 0, os.path.getsize(path), words, args.queries,
            args.slowest)


if __name__ == "__main__":
    main()
