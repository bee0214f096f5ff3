"""What layer 1 does to big tool results: tokens before and after for ~60 KB outputs of each kind.

Run: python bench/summaries.py
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from proxy.layers.tool_results import summary_text
from proxy.tokens import TokenCounter


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


def main() -> None:
    tokens = TokenCounter()
    print("| tool result | chars | tokens | summary tokens | ratio | ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, text in samples().items():
        summary_text("warm", None, text, 0)  # first call compiles regexes; time the steady state
        before = tokens.text(text, "gpt-4o")
        started = time.perf_counter()
        summary = summary_text("call_1", "read_file", text, before)
        elapsed = (time.perf_counter() - started) * 1000
        after = tokens.text(summary, "gpt-4o")
        print(f"| {name} | {len(text)} | {before} | {after} | {after / before:.3f} | {elapsed:.1f} |")


if __name__ == "__main__":
    main()
