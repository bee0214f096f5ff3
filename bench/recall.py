"""recall latency over a large archive: FTS5/BM25 search, this session first, then the project.

Run: python bench/recall.py [--messages 1000000] [--big-mb 20] [--queries 300] [--db PATH]

Builds (once, reused if --db exists) an archive with the real schema: messages spread over 2,000
sessions of 20 tenants, ~40 words each from a 20k-word vocabulary plus ids, and one `--big-mb` tool
result of log lines (same vocabulary) in session s0, then times ArchiveReader.recall for random 1-3 word
queries (p50/p95/p99 ms): from random sessions, and from s0 itself, where every query that matches
the document ranks its chunks.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson

from proxy.archive import chunk_text, insert_message, open_database, scope_of
from proxy.reader import ArchiveReader

TENANTS, SESSIONS = 20, 2000


def vocabulary(rng: random.Random, size: int = 20_000) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = {"".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(size * 2)}
    return sorted(words)[:size]


def build(path: Path, count: int, rng: random.Random, words: list[str], big_mb: int) -> None:
    db = open_database(path)
    conn = db.conn
    cumulative, total = [], 0.0
    for rank in range(len(words)):  # Zipf-like frequencies, as in real text
        total += 1 / (rank + 1)
        cumulative.append(total)
    started, batch, chunks = time.perf_counter(), [], []

    def write() -> None:
        with conn:
            conn.executemany("INSERT INTO messages (id, parent_id, tenant, session_id, policy, role, body, "
                             "created_at, size) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", batch)
            conn.executemany("INSERT INTO message_chunks_fts (message_id, scope, text) VALUES (?, ?, ?)",
                             chunks)

    for index in range(count):
        session = index % SESSIONS
        text = " ".join(rng.choices(words, cum_weights=cumulative, k=40)) + f" ord_{index:07d}"
        tenant = f"t{session % TENANTS}"
        scope = scope_of(tenant, f"s{session}", "default")
        node = f"m{index:08d}"
        batch.append((node, None, tenant, f"s{session}", "default", "tool", "{}", "2026-11-21T10:00:00Z", 2))
        chunks.extend((node, scope, piece) for piece in chunk_text(text))
        if len(batch) == 10_000:
            write()
            batch, chunks = [], []
            elapsed = time.perf_counter() - started
            print(f"\r  {index + 1} messages ({elapsed:.0f} s)", end="", file=sys.stderr)
    if batch:
        write()
    if big_mb:
        lines, size = [], 0
        while size < big_mb * 1_000_000:  # a service log: timestamp, level, ~10 words of the vocabulary
            line = (f"2026-11-21T10:{len(lines) // 60 % 60:02d}:{len(lines) % 60:02d} INFO "
                    + " ".join(rng.choices(words, cum_weights=cumulative, k=10)))
            lines.append(line)
            size += len(line) + 1
        message = {"role": "tool", "tool_call_id": "call_big", "content": "\n".join(lines)}
        body = orjson.dumps(message)
        written = time.perf_counter()
        with conn:
            insert_message(conn, "big-log", None, message, body, tenant="t0", session_id="s0",
                           policy="default", created_at="2026-11-21T10:00:00+00:00")
        print(f"\n  {len(body) / 1e6:.1f} MB log archived in {time.perf_counter() - written:.1f} s",
              end="", file=sys.stderr)
    db.execute("INSERT INTO message_chunks_fts(message_chunks_fts) VALUES('optimize')")
    db.close()
    print(file=sys.stderr)


def timed(reader: ArchiveReader, rng: random.Random, words: list[str], queries: int,
          session_of: Callable[[], int]) -> tuple[list[float], int]:
    samples, truncated = [], 0
    for _ in range(queries):
        session = session_of()
        query = " ".join(rng.choice(words[:5000]) for _ in range(rng.randint(1, 3)))
        started = time.perf_counter()
        hits = reader.recall(f"t{session % TENANTS}", f"s{session}", "default", query, 8)
        samples.append((time.perf_counter() - started) * 1000)
        truncated += hits.truncated
    return sorted(samples), truncated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--big-mb", type=int, default=20, help="size of the one huge tool result (0: none)")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--db", type=Path)
    args = parser.parse_args()
    rng = random.Random(7)
    words = vocabulary(rng)
    path = args.db or Path(tempfile.mkdtemp()) / "archive.db"
    if not path.exists():
        print(f"building {args.messages} messages and a {args.big_mb} MB log in {path} ...", file=sys.stderr)
        build(path, args.messages, rng, words, args.big_mb)
    reader = ArchiveReader(path)
    total = reader.db.execute("select count(*) from messages").fetchone()[0]
    big = reader.db.execute("select size from messages where id = 'big-log'").fetchone()
    print("| archive messages | largest MB | sessions queried | queries | recall p50 ms | p95 ms | p99 ms "
          "| truncated | db size MB |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for label, session_of in (("random", lambda: rng.randrange(SESSIONS)),
                              ("s0 (holds the log)", lambda: 0)):
        samples, truncated = timed(reader, rng, words, args.queries, session_of)
        pick = lambda q, s=samples: s[min(len(s) - 1, int(len(s) * q))]  # noqa: E731
        print(f"| {total} | {(big[0] if big else 0) / 1e6:.0f} | {label} | {len(samples)} "
              f"| {statistics.median(samples):.1f} | {pick(0.95):.1f} | {pick(0.99):.1f} | {truncated} "
              f"| {os.path.getsize(path) / 1e6:.0f} |")


if __name__ == "__main__":
    main()
