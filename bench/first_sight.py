"""A first sight of a long history: what it costs in the pipeline, and the least any proxy that manages
the context must do before it forwards.

For the real sessions of bench/session_replay.py (the first turn past 100 KB, 500 KB and 2 MB of
history, the default policy, gpt-4o's window), in-process, medians of a few tries:
- decoding the body (orjson) and finding where its messages lie (wire/json_layout.py);
- counting exactly what the pipeline forwards, tokenizer memo empty: a proxy that decides what fits the
  window must at least count that;
- counting the whole history, memo empty (what `tokens_before` is);
- the pipeline's first sight, cold (no count known) and memo-warm (the same content seen before in
  another session: counts known, the summaries, placeholders and headlines made anew).
The floor forwards the bytes without reading them: its added p99 at 2 MB is a few ms (bench/overhead.py).

Run: python bench/first_sight.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import orjson

from bench.payloads import chat_body
from bench.session_replay import SIZES, session_bodies
from proxy import pipeline
from proxy.policy import PolicyStore
from proxy.session import Session
from proxy.state import StateStore
from proxy.tokens import TokenCounter
from proxy.wire.json_layout import layout_of

POLICIES = Path(__file__).resolve().parent.parent / "policies"
TRIES = 3


def ms(work: Callable[[], Any], tries: int = TRIES) -> float:
    took = []
    for _ in range(tries):
        started = time.perf_counter()
        work()
        took.append((time.perf_counter() - started) * 1000)
    return statistics.median(took)


def first_sight(raw: bytes, tokens: TokenCounter, name: str) -> pipeline.Outcome:
    body = orjson.loads(raw)
    context = pipeline.PipelineContext(PolicyStore(POLICIES).get("default"), Session(name, "header"),
                                       "bench", tokens, StateStore())
    return pipeline.run(pipeline.Conversation(body["model"], body["messages"], body.get("tools")), context)


def row(size: str) -> str:
    raw = session_bodies({size: SIZES[size]}, 1, chat_body)[size][0]
    messages = orjson.loads(raw)["messages"]
    decode = ms(lambda: orjson.loads(raw))
    layout = ms(lambda: layout_of(raw, "messages", len(messages), messages))
    outcome = first_sight(raw, TokenCounter(), "probe")
    forwarded = orjson.loads(orjson.dumps(outcome.messages))  # (new objects: nothing counted yet)
    count_forwarded = ms(lambda: TokenCounter().messages(forwarded, "gpt-4o"))
    count_whole = ms(lambda: TokenCounter().messages(messages, "gpt-4o"))
    tries = iter(range(1000))
    cold = ms(lambda: first_sight(raw, TokenCounter(), f"cold-{next(tries)}"))
    warm_tokens = TokenCounter()
    first_sight(raw, warm_tokens, "warm-up")
    warm = ms(lambda: first_sight(raw, warm_tokens, f"warm-{next(tries)}"))
    return (f"| {size} | {len(raw) / 1e6:.2f} | {decode:.1f} | {layout:.1f} | {count_forwarded:.1f} "
            f"| {count_whole:.1f} | {cold:.1f} | {warm:.1f} "
            f"| {outcome.tokens_before} / {outcome.tokens_after} |")


def main() -> None:
    TokenCounter().warm()  # (the tokenizer's load is a start-up cost, not a first sight's)
    print("| history | body MB | decode ms | layout ms | count forwarded ms | count whole ms "
          "| first sight cold ms | memo-warm ms | tokens before / forwarded |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for size in ("100KB", "500KB", "2MB"):
        print(row(size))


if __name__ == "__main__":
    main()
