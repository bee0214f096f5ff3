"""Replay the shared agent traces through the pipeline and print the DESIGN.md metrics.

Run: python bench/replay.py [--traces DIR] [--windows real,16000] [--policy default] [--limit N] [--json]

"real" uses each model's own window from litellm's map; where the trace's model label is not a model
id litellm knows, the window of the model that produced it is given here explicitly.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from proxy.policy import LoadedPolicy, PolicyStore
from proxy.replay import format_table, replay_files

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACES = ROOT.parent / "shared" / "traces"
# Trace files whose model labels litellm cannot size: (tokenizer model, real window).
REAL_WINDOW_OVERRIDES = {
    "miniswe_gemini3pro_swebv_dev.jsonl": ("gemini-3-pro-preview", 1_048_576),
    "sweagent_repo_dev.jsonl": ("gpt-4o", None),
}


def with_window(loaded: LoadedPolicy, window: int | None) -> LoadedPolicy:
    budget = loaded.policy.budget.model_copy(update={"max_input_tokens": window})
    return LoadedPolicy(loaded.name, loaded.policy.model_copy(update={"budget": budget}), loaded.path)


def run(traces: Path, window: str, loaded: LoadedPolicy, limit: int | None) -> dict:
    merged: dict = {"policy": loaded.name, "window": window, "files": {}}
    for path in sorted(traces.glob("*.jsonl")):
        model, real = REAL_WINDOW_OVERRIDES.get(path.name, (None, None))
        size = real if window == "real" else int(window)
        policy = with_window(loaded, size) if size else loaded
        result = replay_files([path], policy, model=model or ("gpt-4o" if window != "real" else None),
                              limit=limit)
        merged["files"].update(result["files"])
    return merged


def overall(result: dict) -> dict:
    rows = list(result["files"].values())
    total = {k: sum(r[k] for r in rows) for k in ("conversations", "requests", "replaced", "over_budget",
                                                   "refused", "pairing_errors")}
    for key in ("token_ratio", "prefix_reuse", "cost_ratio"):
        total[key] = round(sum(r[key] * r["requests"] for r in rows) / max(1, total["requests"]), 4)
    total["recoverable"] = min(r["recoverable"] for r in rows)
    total["pipeline_ms_p50"] = max(r["pipeline_ms_p50"] for r in rows)
    total["pipeline_ms_p99"] = max(r["pipeline_ms_p99"] for r in rows)
    gates: dict[str, int] = {}
    for r in rows:
        for k, v in r["gates"].items():
            gates[k] = gates.get(k, 0) + v
    total["gates"] = dict(sorted(gates.items()))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--windows", default="real,16000")
    parser.add_argument("--policy", default="default")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.getLogger("ctxproxy").setLevel(logging.ERROR)  # the gate's once-per-session warnings
    loaded = PolicyStore(ROOT / "policies").get(args.policy)
    results = []
    for window in args.windows.split(","):
        result = run(args.traces, window, loaded, args.limit)
        result["overall"] = overall(result)
        results.append(result)
    if args.json:
        print(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode())
        return
    for result in results:
        print(f"\n### policy {result['policy']}, window {result['window']}\n")
        print(format_table(result))
    print("\n(overall: token_ratio/prefix_reuse/cost_ratio weighted by requests; pipeline ms = worst file)")


if __name__ == "__main__":
    main()
