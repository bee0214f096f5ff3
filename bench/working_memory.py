"""Does working memory fire on real agent traces?

For each conversation with at least one tool result, feed all its messages to a fresh `WorkingMemory`
(`observe_messages`, default policy) and check whether the rendered block is non-empty. Prints the share per
trace file and overall (goal: >= 80 %), and with `--show N` the blocks of the first N conversations.

    .venv/bin/python bench/working_memory.py [--traces DIR] [--show N]

The traces are read from ../shared/traces (never copied into the repository).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.layers.working_memory import WorkingMemory, observe_messages

FILES = ("taubench_airline_gpt4o_dev", "tau2bench_dev", "tau2bench_solo_dev", "toolbench_chatgpt_dfs_dev")
DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


def has_tool_result(messages: list[dict]) -> bool:
    return any(m.get("role") in ("tool", "function") for m in messages if isinstance(m, dict))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--show", type=int, default=0, help="print the blocks of the first N conversations")
    args = parser.parse_args(argv)
    total_with, total_fired, total_entities, shown = 0, 0, 0, 0
    started = time.perf_counter()
    print(f"{'file':<32} {'convs':>6} {'w/ tools':>9} {'non-empty':>10} {'share':>7} {'entities/conv':>14}")
    for name in FILES:
        path = args.traces / f"{name}.jsonl"
        if not path.exists():
            print(f"{name:<32} missing")
            continue
        convs = with_tools = fired = entities = 0
        for line in path.read_bytes().splitlines():
            if not line.strip():
                continue
            messages = orjson.loads(line)["messages"]
            convs += 1
            if not has_tool_result(messages):
                continue
            with_tools += 1
            memory = WorkingMemory()
            observe_messages(memory, messages)
            block = memory.render()
            fired += bool(block)
            entities += len(memory.entities)
            if shown < args.show:
                shown += 1
                print(f"--- {name} #{convs}\n{block or '(empty)'}\n")
        share = fired / with_tools if with_tools else 0.0
        per = entities / with_tools if with_tools else 0.0
        print(f"{name:<32} {convs:>6} {with_tools:>9} {fired:>10} {share:>7.1%} {per:>14.1f}")
        total_with, total_fired, total_entities = total_with + with_tools, total_fired + fired, \
            total_entities + entities
    share = total_fired / total_with if total_with else 0.0
    print(f"{'overall':<32} {'':>6} {total_with:>9} {total_fired:>10} {share:>7.1%} "
          f"{(total_entities / total_with if total_with else 0.0):>14.1f}")
    print(f"({time.perf_counter() - started:.2f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
