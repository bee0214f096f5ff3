"""Pipeline time per request vs history size, with the per-message caches warm.

Run: python bench/pipeline.py [--json]

Each history is a tool-heavy agent conversation (tool results of 300-3,000 tokens). The agent resends
its whole history every turn, so the warm case is the history seen before plus one new exchange: parsed
anew (new objects, as for a body under 8 KB), and as the server hands a larger resent body to the
pipeline — the earlier parse's very objects (wire/resent.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from proxy import pipeline
from proxy.policy import LoadedPolicy, Policy
from proxy.session import Session
from proxy.state import StateStore
from proxy.tokens import TokenCounter

SIZES = [1_000, 10_000, 50_000, 100_000, 200_000]
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
         for n in ("bash", "read_file", "write_file")]


def history(target_tokens: int, tokens: TokenCounter) -> list[dict]:
    messages = [{"role": "system", "content": "You are a coding agent. " * 40},
                {"role": "user", "content": "Fix the failing test in the payments module."}]
    total, k = 0, 0
    while total < target_tokens:
        size = (300, 900, 3000, 600)[k % 4]
        output = "\n".join(f"{k}:{i} src/payments/mod_{i % 17}.py:{i} ok value={i * 13}"
                           for i in range(size // 12))
        arguments = orjson.dumps({"cmd": f"step {k}"}).decode()
        call = {"id": f"call_{k}", "type": "function", "function": {"name": "bash", "arguments": arguments}}
        turn = [{"role": "assistant", "content": f"Step {k}.", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": f"call_{k}", "content": output}]
        messages += turn
        total = tokens.messages(messages, "gpt-4o")
        k += 1
    return [*messages, {"role": "user", "content": "continue"}]


def measure(size: int, repeats: int) -> dict:
    tokens = TokenCounter()
    policy = LoadedPolicy("bench", Policy.model_validate({"budget": {"max_input_tokens": 1_000_000}}), None)
    store = StateStore()
    messages = history(size, tokens)
    context = pipeline.PipelineContext(policy, Session("bench", "header"), "t", tokens, store)
    cold_start = time.perf_counter()
    pipeline.run(pipeline.Conversation("gpt-4o", messages[:-3], TOOLS), context)
    cold = (time.perf_counter() - cold_start) * 1000
    samples = []
    for _ in range(repeats):
        fresh = orjson.loads(orjson.dumps(messages))  # a new request: new objects, same content
        started = time.perf_counter()
        outcome = pipeline.run(pipeline.Conversation("gpt-4o", fresh, TOOLS), context)
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    same = []  # the server's case for a body over 8 KB: the earlier parse's objects (wire/resent.py)
    for _ in range(repeats):
        started = time.perf_counter()
        pipeline.run(pipeline.Conversation("gpt-4o", list(messages), TOOLS), context)
        same.append((time.perf_counter() - started) * 1000)
    return {"history_tokens": outcome.tokens_before, "forwarded_tokens": outcome.tokens_after,
            "messages": len(messages), "cold_ms": round(cold, 2),
            "same_objects_p50_ms": round(statistics.median(same), 3),
            "warm_p50_ms": round(statistics.median(samples), 3),
            "warm_p99_ms": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    rows = [measure(size, args.repeats) for size in SIZES]
    if args.json:
        print(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode())
        return
    print("| history tokens | messages | forwarded tokens | first sight ms | warm p50 ms | warm p99 ms "
          "| same objects p50 ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['history_tokens']} | {r['messages']} | {r['forwarded_tokens']} | {r['cold_ms']} | "
              f"{r['warm_p50_ms']} | {r['warm_p99_ms']} | {r['same_objects_p50_ms']} |")


if __name__ == "__main__":
    main()
