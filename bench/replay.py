"""Replay the shared agent traces through the pipeline and print the DESIGN.md metrics.

Run: python bench/replay.py [--traces DIR] [--windows real,16000] [--policy default] [--limit N]
                            [--format chat|messages|responses|both|all] [--json]

"real" uses each model's own window from litellm's map; where the trace's model label is not a model
id litellm knows, the window of the model that produced it is given here explicitly.

`--format messages` replays every request as an Anthropic Messages request through the Messages codec,
`--format responses` as a stateless OpenAI Responses request through the Responses codec
(bench/format_run.py); `both` runs chat and messages, `all` chat, messages and responses on the same
conversations, and adds a side-by-side table. The other formats' figures are measured on the neutral
conversation the pipeline produced, against the decoded request; `codec_violations` counts encoded bodies
the format's API would reject (must be 0).
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

from bench import format_run
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
    for path in sorted(traces.glob("*.jsonl")):
        model, real = REAL_WINDOW_OVERRIDES.get(path.name, (None, None))
        size = real if window == "real" else int(window)
        policy = with_window(loaded, size) if size else loaded
        options = {"model": model or ("gpt-4o" if window != "real" else None), "limit": limit}
        result = replay_files([path], policy, **options) if fmt == "chat" \
            else format_run.replay_files([path], policy, fmt=format_run.FORMATS[fmt], **options)
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


FORMAT_COLUMNS = ["conversations", "requests", "token_ratio", "prefix_reuse", "cost_ratio", "recoverable",
                  "over_budget", "refused", "pairing_errors", "codec_checked", "codec_violations",
                  "pipeline_ms_p50", "pipeline_ms_p99"]
SIDE_BY_SIDE = ["token_ratio", "prefix_reuse", "cost_ratio", "recoverable", "replaced", "refused",
                "pipeline_ms_p50"]
CHOICES = {"chat": ["chat"], "messages": ["messages"], "responses": ["responses"],
           "both": ["chat", "messages"], "all": ["chat", "messages", "responses"]}


def format_codec_table(result: dict) -> str:
    """format_table's layout with the codec's columns (pipeline ms here: decode + pipeline + encode)."""
    lines = ["| file | " + " | ".join(FORMAT_COLUMNS) + " | gates |",
             "|" + "---|" * (len(FORMAT_COLUMNS) + 2)]
    for name, row in [*result["files"].items(), ("overall", result["overall"])]:
        gates = " ".join(f"{k}={v}" for k, v in row["gates"].items())
        lines.append(f"| {name} | " + " | ".join(str(row[c]) for c in FORMAT_COLUMNS) + f" | {gates} |")
    samples = result["overall"].get("violation_samples")
    if samples:
        lines.append("\ncodec violations: " + " / ".join(samples))
    lines.append("\n(pipeline ms here: decode + pipeline + encode of each request, the server's work)")
    return "\n".join(lines)


def format_side_by_side(by_format: dict[str, dict]) -> str:
    """Each figure in every format (cells: one value per format, in the header's order), per file and
    overall, on the same conversations; `same gates`, for each format after the first: whether its gate
    counts equal the first's."""
    names = list(by_format)
    first = by_format[names[0]]
    lines = [f"formats per cell: {' / '.join(names)} (same gates, codec_violations: "
             f"{' / '.join(names[1:])})\n",
             "| file | " + " | ".join(SIDE_BY_SIDE) + " | same gates | codec_violations |",
             "|---|" + "---:|" * (len(SIDE_BY_SIDE) + 2)]
    for name in [*first["files"], "overall"]:
        rows = [r["overall"] if name == "overall" else r["files"][name] for r in by_format.values()]
        cells = " | ".join(" / ".join(str(r[c]) for r in rows) for c in SIDE_BY_SIDE)
        same = " / ".join("yes" if r["gates"] == rows[0]["gates"] else "no" for r in rows[1:])
        codec = " / ".join(str(r.get("codec_violations", "-")) for r in rows[1:])
        lines.append(f"| {name} | {cells} | {same} | {codec} |")
    lines.append("\n(pipeline ms: chat's is the pipeline alone; the other formats' adds decode and encode)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--windows", default="real,16000")
    parser.add_argument("--policy", default="default")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--format", choices=tuple(CHOICES), default="chat",
                        help="wire format the requests are sent in (both: chat and messages; all: chat, "
                        "messages and responses, side by side)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.getLogger("ctxproxy").setLevel(logging.ERROR)  # the gate's once-per-session warnings
    loaded = PolicyStore(ROOT / "policies").get(args.policy)
    formats = CHOICES[args.format]
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
        print(format_table(result) if fmt is None else format_codec_table(result))
        if len(formats) > 1 and (fmt or "chat") == formats[-1]:
            same = {r.get("format") or "chat": r for r in results if r["window"] == result["window"]}
            print(f"\n#### {' vs '.join(formats)}, window {result['window']}\n")
            print(format_side_by_side(same))
    print("\n(overall: token_ratio/prefix_reuse/cost_ratio weighted by requests; pipeline ms = worst file)")


if __name__ == "__main__":
    main()
