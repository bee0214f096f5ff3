"""recall latency over a large archive: FTS5/BM25 search, this session first, then the project.

Run: python bench/recall.py [--messages 1000000] [--queries 300] [--db PATH]

Builds (once, reused if --db exists) an archive with the real schema: messages spread over 2,000
sessions of 20 tenants, ~40 words each from a 20k-word vocabulary plus ids, then times
ArchiveReader.recall for random 1-3 word queries (p50/p95/p99 ms).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.archive import open_database, scope_of
from proxy.reader import ArchiveReader

TENANTS, SESSIONS = 20, 2000


def vocabulary(rng: random.Random, size: int = 20_000) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = {"".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(size * 2)}
    return sorted(words)[:size]


def build(path: Path, count: int, rng: random.Random, words: list[str]) -> None:
    db = open_database(path)
    cumulative, total = [], 0.0
    for rank in range(len(words)):  # Zipf-like frequencies, as in real text
        total += 1 / (rank + 1)
        cumulative.append(total)
    started, batch = time.perf_counter(), []
    for index in range(count):
        session = index % SESSIONS
        text = " ".join(rng.choices(words, cum_weights=cumulative, k=40)) + f" ord_{index:07d}"
        tenant = f"t{session % TENANTS}"
        batch.append({"id": f"m{index:08d}", "parent_id": None, "tenant": tenant,
                      "session_id": f"s{session}", "policy": "default", "role": "tool", "text": text,
                      "scope": scope_of(tenant, f"s{session}", "default"),
                      "body": "{}", "created_at": "2026-11-21T10:00:00+00:00"})
        if len(batch) == 10_000:
            with db.atomic():
                db["messages"].insert_all(batch)
            batch = []
            elapsed = time.perf_counter() - started
            print(f"\r  {index + 1} messages ({elapsed:.0f} s)", end="", file=sys.stderr)
    if batch:
        with db.atomic():
            db["messages"].insert_all(batch)
    db.execute("INSERT INTO messages_fts(messages_fts) VALUES('optimize')")
    db.close()
    print(file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--db", type=Path)
    args = parser.parse_args()
    rng = random.Random(7)
    words = vocabulary(rng)
    path = args.db or Path(tempfile.mkdtemp()) / "archive.db"
    if not path.exists():
        print(f"building {args.messages} messages in {path} ...", file=sys.stderr)
        build(path, args.messages, rng, words)
    reader = ArchiveReader(path)
    total = reader.db.execute("select count(*) from messages").fetchone()[0]
    samples = []
    for _ in range(args.queries):
        session = rng.randrange(SESSIONS)
        query = " ".join(rng.choice(words[:5000]) for _ in range(rng.randint(1, 3)))
        started = time.perf_counter()
        reader.recall(f"t{session % TENANTS}", f"s{session}", "default", query, 8)
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    pick = lambda q: samples[min(len(samples) - 1, int(len(samples) * q))]  # noqa: E731
    print("| archive messages | queries | recall p50 ms | p95 ms | p99 ms | db size MB |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(f"| {total} | {len(samples)} | {statistics.median(samples):.1f} | {pick(0.95):.1f} "
          f"| {pick(0.99):.1f} | {os.path.getsize(path) / 1e6:.0f} |")


if __name__ == "__main__":
    main()
