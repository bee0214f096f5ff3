"""Assembly time with every block on: pinned files and runtime pins, auto-summary, folded memory and
working memory, over an archive of 100k messages (pins are read from it on every request).

Run: python bench/assembly.py [--messages 100000] [--requests 500]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from proxy import pipeline
from proxy.archive import open_database, scope_of
from proxy.pins import PinStore
from proxy.policy import load_policy_file
from proxy.session import Session
from proxy.state import StateStore
from proxy.tokens import TokenCounter


def archive(path: Path, count: int) -> None:
    db = open_database(path)
    rows = ({"id": f"m{i:08d}", "tenant": "t", "session_id": f"s{i % 500}", "policy": "bench", "role": "tool",
             "text": f"build step {i} compiled module_{i % 97} ok", "body": "{}",
             "scope": scope_of("t", f"s{i % 500}", "bench"), "created_at": "2026-11-21T10:00:00+00:00"}
            for i in range(count))
    with db.atomic():
        db["messages"].insert_all(rows, batch_size=5000)
    db.close()


def conversation(turns: int) -> list[dict]:
    messages = [{"role": "system", "content": "You manage a website."},
                {"role": "user", "content": "Tidy up the pages and deploy."}]
    for k in range(turns):
        pages = [{"id": f"page-{k}-{i}", "title": f"Page {k}.{i}"} for i in range(5)]
        call = {"id": f"c{k}", "type": "function", "function": {"name": "list_pages", "arguments": "{}"}}
        result = orjson.dumps({"pages": pages, "log": ["ok"] * 120}).decode()
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"c{k}", "content": result},
                     {"role": "assistant", "content": f"Decided to keep page {k} because it has traffic."},
                     {"role": "user", "content": f"Next, page {k + 1}?"}]
    return messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=500)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp())
    rules = "# House rules\n" + "Always run the tests before a deploy.\n" * 150
    (folder / "conventions.md").write_text(rules)
    (folder / "bench.yaml").write_text(
        "pinned:\n  files: [conventions.md]\nbudget:\n  max_input_tokens: 16000\n"
        "folded:\n  enabled: true\n  max_episodes: 4\nworking_memory:\n  enabled: true\n")
    policy = load_policy_file(folder / "bench.yaml")
    archive(folder / "archive.db", args.messages)
    tokens = TokenCounter()
    pins = PinStore(folder / "archive.db", tokens)
    for n in range(3):
        pins.add(policy, f"Runtime pin {n}: staging is stg-0{n}.", name=f"pin{n}")
    store = StateStore()
    context = pipeline.PipelineContext(policy, Session("bench", "header"), "t", tokens, store,
                                       pins=lambda: pins.list("bench", "t"))
    messages = conversation(120)
    durations, blocks = [], {}
    points = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for n in range(args.requests):
        prefix = messages[:points[min(n, len(points) - 1)]]
        outcome = pipeline.run(pipeline.Conversation("gpt-4o", prefix, None), context)
        durations.append(outcome.blocks.duration_ms)
        blocks = outcome.blocks.tokens
    durations.sort()
    p95 = durations[int(len(durations) * 0.95)]
    print("| archive messages | requests | assembly p50 ms | p95 ms | p99 ms | block tokens (last request) |")
    print("|---:|---:|---:|---:|---:|---|")
    print(f"| {args.messages} | {len(durations)} | {statistics.median(durations):.3f} | {p95:.3f} "
          f"| {durations[int(len(durations) * 0.99)]:.3f} | "
          + ", ".join(f"{k} {v}" for k, v in sorted(blocks.items())) + " |")
    start = time.perf_counter()
    pins.list("bench", "t")
    print(f"\n(one pins query: {(time.perf_counter() - start) * 1000:.3f} ms)")


if __name__ == "__main__":
    main()
