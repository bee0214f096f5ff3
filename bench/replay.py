"""Replay the shared agent traces through the pipeline and print the DESIGN.md metrics.

Run: python bench/replay.py [--traces DIR] [--windows real,16000] [--policy default] [--limit N]
                            [--format chat|messages|both] [--json]

"real" uses each model's own window from litellm's map; where the trace's model label is not a model
id litellm knows, the window of the model that produced it is given here explicitly.

`--format messages` replays every request as an Anthropic Messages request through the Messages codec
(bench/messages_run.py); `both` runs chat and messages on the same conversations and adds a side-by-side
table. The messages figures are measured on the neutral conversation the pipeline produced, against the
decoded request; `codec_violations` counts encoded bodies the Messages API would reject (must be 0).
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

from bench import messages_run
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


def run(traces: Path, window: str, loaded: LoadedPolicy, limit: int | None, fmt: str = "chat") -> dict:
    merged: dict = {"policy": loaded.name, "window": window, "files": {}}
    if fmt != "chat":
        merged["format"] = fmt
    replay = messages_run.replay_files if fmt == "messages" else replay_files
    for path in sorted(traces.glob("*.jsonl")):
        model, real = REAL_WINDOW_OVERRIDES.get(path.name, (None, None))
        size = real if window == "real" else int(window)
        policy = with_window(loaded, size) if size else loaded
        result = replay([path], policy, model=model or ("gpt-4o" if window != "real" else None), limit=limit)
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
    if all("codec_checked" in r for r in rows):
        total["codec_checked"] = sum(r["codec_checked"] for r in rows)
        total["codec_violations"] = sum(r["codec_violations"] for r in rows)
        total["violation_samples"] = [s for r in rows for s in r["violation_samples"]][:3]
    return total


MESSAGES_COLUMNS = ["conversations", "requests", "token_ratio", "prefix_reuse", "cost_ratio", "recoverable",
                    "over_budget", "refused", "pairing_errors", "codec_checked", "codec_violations",
                    "pipeline_ms_p50", "pipeline_ms_p99"]
SIDE_BY_SIDE = ["token_ratio", "prefix_reuse", "cost_ratio", "recoverable", "refused"]


def format_messages_table(result: dict) -> str:
    """format_table's layout with the codec's columns (pipeline ms here: decode + pipeline + encode)."""
    lines = ["| file | " + " | ".join(MESSAGES_COLUMNS) + " | gates |",
             "|" + "---|" * (len(MESSAGES_COLUMNS) + 2)]
    for name, row in [*result["files"].items(), ("overall", result["overall"])]:
        gates = " ".join(f"{k}={v}" for k, v in row["gates"].items())
        lines.append(f"| {name} | " + " | ".join(str(row[c]) for c in MESSAGES_COLUMNS) + f" | {gates} |")
    samples = result["overall"].get("violation_samples")
    if samples:
        lines.append("\ncodec violations: " + " / ".join(samples))
    lines.append("\n(pipeline ms here: decode + pipeline + encode of each request, the server's work)")
    return "\n".join(lines)


def format_side_by_side(chat: dict, messages: dict) -> str:
    """chat | messages for each figure, per file and overall, on the same conversations."""
    head = " | ".join(f"{c} chat | {c} msgs" for c in SIDE_BY_SIDE)
    lines = [f"| file | {head} | same gates | codec_violations |", "|" + "---|" * (2 * len(SIDE_BY_SIDE) + 3)]
    for name in [*chat["files"], "overall"]:
        a = chat["overall"] if name == "overall" else chat["files"][name]
        b = messages["overall"] if name == "overall" else messages["files"][name]
        cells = " | ".join(f"{a[c]} | {b[c]}" for c in SIDE_BY_SIDE)
        lines.append(f"| {name} | {cells} | {'yes' if a['gates'] == b['gates'] else 'no'} | "
                     f"{b['codec_violations']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--windows", default="real,16000")
    parser.add_argument("--policy", default="default")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--format", choices=("chat", "messages", "both"), default="chat",
                        help="wire format the requests are sent in (both: chat and messages side by side)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.getLogger("ctxproxy").setLevel(logging.ERROR)  # the gate's once-per-session warnings
    loaded = PolicyStore(ROOT / "policies").get(args.policy)
    formats = ["chat", "messages"] if args.format == "both" else [args.format]
    results = []
    for window in args.windows.split(","):
        for fmt in formats:
            result = run(args.traces, window, loaded, args.limit, fmt)
            result["overall"] = overall(result)
            results.append(result)
    if args.json:
        print(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode())
        return
    for result in results:
        fmt = result.get("format")
        print(f"\n### policy {result['policy']}, window {result['window']}"
              + (f", format {fmt}" if fmt else "") + "\n")
        print(format_messages_table(result) if fmt == "messages" else format_table(result))
        if fmt == "messages" and args.format == "both":
            chat = next(r for r in results if r["window"] == result["window"] and "format" not in r)
            print(f"\n#### chat vs messages, window {result['window']}\n")
            print(format_side_by_side(chat, result))
    print("\n(overall: token_ratio/prefix_reuse/cost_ratio weighted by requests; pipeline ms = worst file)")


if __name__ == "__main__":
    main()
