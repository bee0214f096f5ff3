"""What layer 1 does to big tool results.

1. Synthetic: tokens before and after for ~60 KB outputs of each kind.
2. Real traces (../shared/traces/*.jsonl, read in place, never copied): every tool message, and every
   user message after the first where the file's meta says `observation_role: user` (mini-swe-agent,
   SWE-agent), over 500 tokens, goes through `replacement()` exactly as layer 1 would call it (with the tool
   name and arguments of the assistant's call). Critical tokens kept are counted by `bench.critical`, a
   content-based definition independent of the summarizer.

Run: python bench/summaries.py [--traces DIR] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from bench.critical import Kept
from proxy.layers.tool_results import replacement, summary_text
from proxy.tokens import TokenCounter

TRACES = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"
MIN_TOKENS = 500
MODEL = "gpt-4o"


def samples() -> dict[str, str]:
    root = Path(__file__).resolve().parent.parent / "proxy"
    python = "\n\n".join(p.read_text() for p in sorted(root.rglob("*.py")))[:60_000]
    log = "\n".join(
        f"2026-11-21T10:{i // 60 % 60:02d}:{i % 60:02d}Z {'ERROR' if i % 997 == 0 else 'INFO'} "
        f"worker.{i % 4} batch {i} shard-{i % 9} took {i % 83} ms" for i in range(900))
    records = [{"id": f"ord_{i:06d}", "customer": f"cus_{i % 37:04d}",
                "status": "paid" if i % 5 else "refunded", "total": round(i * 3.17, 2),
                "path": f"/orders/2026/{i}.json"} for i in range(520)]
    return {"python source": python, "service log": log, "JSON API answer": json.dumps(records, indent=1)}


def synthetic_table(tokens: TokenCounter) -> None:
    print("| tool result | chars | tokens | summary tokens | ratio | ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, text in samples().items():
        summary_text("warm", None, text, 0)  # first call compiles regexes; time the steady state
        before = tokens.text(text, MODEL)
        started = time.perf_counter()
        summary = summary_text("call_1", "read_file", text, before)
        elapsed = (time.perf_counter() - started) * 1000
        after = tokens.text(summary, MODEL)
        print(f"| {name} | {len(text)} | {before} | {after} | {after / before:.3f} | {elapsed:.1f} |")


def _text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: the text ones, as a provider would join them
        parts = [p.get("text") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return "\n".join(parts) if parts else None
    return None


def trace_outputs(path: Path) -> Iterator[tuple[str, str | None, str | None]]:
    """(content, tool name, arguments) of every tool output in a trace file, observations included."""
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            conv = json.loads(line)
            observations = (conv.get("meta") or {}).get("observation_role") == "user"
            calls: dict[str, tuple[str | None, str | None]] = {}
            users = 0
            for message in conv.get("messages") or ():
                role = message.get("role")
                for call in message.get("tool_calls") or ():
                    function = call.get("function") or {}
                    calls[str(call.get("id"))] = (function.get("name"), function.get("arguments"))
                text = _text(message.get("content"))
                if role == "tool" and text is not None:
                    yield (text, *calls.get(str(message.get("tool_call_id")), (None, None)))
                elif role == "user":
                    users += 1
                    if observations and users > 1 and text is not None:
                        yield text, None, None


@dataclass
class Tally:
    outputs: int = 0
    applied: int = 0
    kept: Kept = field(default_factory=Kept)
    ratios: list[float] = field(default_factory=list)
    ms: float = 0.0

    def row(self, name: str) -> str:
        by = self.kept.by_kind

        def share(kind: str) -> str:
            total, hit = by[kind]
            return f"{hit / total:.1%} ({total})" if total else "-"

        ratio = f"{statistics.median(self.ratios):.3f}" if self.ratios else "-"
        numbers = f"{self.kept.numbers_share():.1%}" if self.kept.numbers_total else "-"
        return (f"| {name} | {self.outputs} | {self.applied} | {self.outputs - self.applied} | "
                f"{self.kept.share():.1%} | {share('ids')} | {share('paths')} | {share('error_lines')} | "
                f"{numbers} | {ratio} | {self.ms:.0f} |")


def trace_table(tokens: TokenCounter, folder: Path, limit: int | None) -> None:
    def count(text: str) -> int:
        return tokens.text(text, MODEL)

    print("\n| trace file | outputs > 500 tok | applied | not made | critical kept | ids | paths | "
          "error lines | numbers | median size ratio | ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    overall = Tally()
    for path in sorted(folder.glob("*.jsonl")):
        tally = Tally()
        for content, tool, arguments in trace_outputs(path):
            if count(content) <= MIN_TOKENS:
                continue
            if limit is not None and tally.outputs >= limit:
                break
            tally.outputs += 1
            started = time.perf_counter()
            text = replacement("preview", tool, content, count, arguments)
            tally.ms += (time.perf_counter() - started) * 1000
            if text is not None:
                tally.applied += 1
                tally.kept.add(content, text)
                tally.ratios.append(count(text) / count(content))
        print(tally.row(path.name.removesuffix(".jsonl")))
        overall.outputs += tally.outputs
        overall.applied += tally.applied
        overall.ratios += tally.ratios
        overall.ms += tally.ms
        for kind, (total, hit) in tally.kept.by_kind.items():
            overall.kept.by_kind[kind][0] += total
            overall.kept.by_kind[kind][1] += hit
        overall.kept.total += tally.kept.total
        overall.kept.kept += tally.kept.kept
        overall.kept.numbers_total += tally.kept.numbers_total
        overall.kept.numbers_kept += tally.kept.numbers_kept
    print(overall.row("**overall**"))


def main(argv: list[str] | None = None) -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--traces", type=Path, default=TRACES, help="folder of *.jsonl traces")
    args.add_argument("--limit", type=int, help="at most this many outputs per trace file")
    args.add_argument("--no-traces", action="store_true", help="the synthetic table only")
    opts = args.parse_args(argv)
    tokens = TokenCounter()
    synthetic_table(tokens)
    if not opts.no_traces and opts.traces.is_dir():
        trace_table(tokens, opts.traces, opts.limit)


if __name__ == "__main__":
    main()
