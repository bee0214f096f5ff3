"""Retention benchmark: what each context strategy keeps of what the agent needs, and what it costs.

Run: python bench/retention.py [--traces DIR] [--files GLOB] [--windows real,32000,16000]
                               [--policies default,...] [--limit N] [--quick] [--mask-turns 10]
                               [--format chat|messages|responses|both|all] [--json]

Every trace conversation (../shared/traces, read in place) is replayed at each window through every
strategy, in the same run on the same conversations:

- `ctxproxy:<policy>`: the pipeline with a shipped policy; at "real" the policy's own budget, at 32000 and
  16000 `budget.max_input_tokens` set to that window (as bench/replay.py does);
- `ctxproxy:<policy>/messages` (`--format messages|both|all`): the same, every request sent as an
  Anthropic Messages request (bench/to_messages.py) through the Messages codec, and
  `ctxproxy:<policy>/responses` (`--format responses|all`) as a stateless OpenAI Responses request
  (bench/to_responses.py) through the Responses codec (bench/format_run.py); figures on the neutral
  conversation the pipeline produced, ratios against the decoded request; `codec` = encoded bodies the
  format's API would reject (must be 0). With more than one format, a table compares them side by side;
- `passthrough`: the raw prefix;
- `truncation`: naive truncation to the budget ctxproxy's window layer uses (`window.max_tokens`, else
  `window.max_pct` x window, of the default policy; tokens of messages and tools): the oldest messages after
  the system prompt are dropped, never starting on a tool message (so a tool call never loses its results),
  recomputed on every request;
- `masking`: observation masking (JetBrains, "The Complexity Trap"): outputs that answer an assistant turn
  older than the last N (`--mask-turns`, 10) become a one-line placeholder, recomputed on every request.
  Outputs are tool messages, and in text-protocol traces (meta `observation_role: user`) the user messages
  after the task statement that follow an assistant message.

Requests are the points where the agent called the model (each prefix ending before an assistant message).
Figures, with one definition for every strategy (critical tokens, ids, paths and numbers as in
bench/critical.py):

- token_ratio = forwarded tokens / raw tokens; prefix_reuse = share of forwarded tokens in the prefix shared
  with the previous request (from 1,024 tokens on; proxy/replay.py `Cache`); cost_ratio = forwarded cost /
  raw cost with cached tokens at 0.1 and the rest at 1.0; cost_ratio_w the same with uncached tokens at 1.25
  (written to the cache) in requests of 1,024 tokens or more. Sums over all requests (refused ones excluded).
- needles: at the last model call of a conversation, the ids, paths and numbers of an earlier non-system,
  non-assistant message that an assistant message after it (up to the one the last call produced) contains
  again as a whole token, minus those the system prompt or the tools show. `in_prompt` = share present in
  the text of what is forwarded at that call (messages, injected blocks included); `reachable` = in the
  prompt, or in the answer of ONE internal-tool call the prompt makes possible, when the forwarded tools
  offer it: `read_tool_result` of any handle the prompt shows (`call_id=…`, `handle=…`; the whole original,
  since paging by start_line is allowed), or `recall` with a query taken from the prompt (each auto-summary
  line without its bullet, time and size; each tool name with its arguments) — recall's answer is the text
  the model would see, from a real archive of the exchanges before that call. Baselines offer no tools:
  reachable = in prompt.
- task_kept: share of requests (after the task appeared) whose forwarded messages contain the task statement
  verbatim: the first user message after the system prompt, past leading assistant greetings and a
  SWE-agent demonstration ("Here is a demonstration…"). Conversations without one (tool loops) are left out.
- critical_kept: of every distinct replacement a strategy applied in a conversation (a text standing in the
  prompt for an original: ctxproxy's summaries and placeholders, each handle once; masking's placeholders),
  the share of the original's ids, paths and error lines the replacement keeps; numbers apart. Removals
  (truncation; evictions, which ctxproxy records with an empty replacement) are measured by the needles.
  `summaries`: the same over ctxproxy's summaries only. The JSON splits both by kind.
- replaced / read_back: distinct replacements, and the share read back byte-identical with
  `read_tool_result(call_id=handle)` (ctxproxy only). pairing_errors: requests whose tool calls/results pair
  worse than the client's; over_budget: requests forwarded over the setting's window; refused: ctxproxy
  refusals; errors: conversations where the strategy raised (their figures are left out).
- working_memory: share of tau-style conversations (taubench, tau2, toolbench files) with tool results whose
  working memory is non-empty at the last request (`wm_in_prompt`: its block is in the forwarded messages).

Overall rows sum the counts of every file, so their ratios weigh each request by its tokens.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import orjson

from bench.format_run import FORMATS as WIRE_FORMATS
from bench.format_run import FormatProxy
from bench.replay import REAL_WINDOW_OVERRIDES, with_window
from bench.retention_archive import archive_template, use_template
from bench.retention_metrics import MASK_KEEP_TURNS
from bench.retention_run import (
    Masking,
    Passthrough,
    Proxy,
    Setting,
    Strategy,
    Tally,
    Truncation,
    run_conversation,
)
from proxy import budget
from proxy.policy import LoadedPolicy, PolicyStore
from proxy.replay import bare_model
from proxy.tokens import TokenCounter

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACES = ROOT.parent / "shared" / "traces"
TAU_STYLE = ("taubench", "tau2bench", "toolbench")
CHUNK = 6  # conversations per job: long files are split so both cores stay busy
QUICK_LIMIT = 2
BASELINES = ("passthrough", "truncation", "masking")

_tokens: TokenCounter | None = None


def tokens() -> TokenCounter:
    global _tokens
    if _tokens is None:
        _tokens = TokenCounter()
    return _tokens


def setting_for(path: Path, window: str, conversation: dict[str, Any], default: LoadedPolicy,
                mask_turns: int, observation_role: str | None) -> tuple[Setting, int | None, str]:
    override_model, real = REAL_WINDOW_OVERRIDES.get(path.name, (None, None))
    model = override_model or ("gpt-4o" if window != "real" else bare_model(str(conversation.get("model")
                                                                               or "gpt-4o")))
    size = real if window == "real" else int(window)
    policy = with_window(default, size).policy if size else default.policy
    limit = budget.window_for(policy, model)
    truncation = policy.window.max_tokens or math.floor(policy.window.max_pct * limit)
    return (Setting(model, limit, truncation, mask_turns, observation_role == "user",
                    path.name.startswith(TAU_STYLE)), size, model)


Job = tuple[str, str, int, int, list[str], int, str, str]
FORMATS = {"chat": ("chat",), "messages": ("messages",), "responses": ("responses",),
           "both": ("chat", "messages"), "all": ("chat", "messages", "responses")}


def proxy_strategy(fmt: str, policy: LoadedPolicy, conversation: dict[str, Any], setting: Setting,
                   tokens: TokenCounter) -> Proxy:
    if fmt == "chat":
        return Proxy(policy, conversation, setting, tokens)
    return FormatProxy(policy, conversation, setting, tokens, WIRE_FORMATS[fmt])


def run_job(job: Job) -> tuple[str, str, dict[str, Any], float]:
    """One slice of one file at one window; returns the tallies by strategy (as dicts) and seconds."""
    file, window, start, stop, policy_names, mask_turns, template, fmt = job
    started = time.perf_counter()
    logging.getLogger("ctxproxy").setLevel(logging.ERROR)  # budget warnings would flood stderr
    use_template(Path(template))
    path = Path(file)
    store = PolicyStore(ROOT / "policies")
    loaded = [store.get(name) for name in policy_names]
    default = store.get("default")
    totals: dict[str, Tally] = {}
    with path.open("rb") as lines:
        for line in itertools.islice(lines, start, stop):
            if not line.strip():
                continue
            conversation = orjson.loads(line)
            role = (conversation.get("meta") or {}).get("observation_role")
            setting, size, model = setting_for(path, window, conversation, default, mask_turns, role)
            tools = conversation.get("tools") or None

            def count(messages: list[dict[str, Any]], tools: list[Any] | None = tools,
                      model: str = model) -> int:
                return tokens().request(messages, tools, model)

            strategies: list[Strategy] = [
                proxy_strategy(kind, with_window(policy, size) if size else policy, conversation, setting,
                               tokens())
                for policy in loaded for kind in FORMATS[fmt]]
            strategies += [Passthrough(tools, count), Truncation(tools, count, setting.truncation_budget),
                           Masking(tools, count, mask_turns, setting.user_observations)]
            for name, tally in run_conversation(conversation, strategies, setting, tokens()).items():
                totals.setdefault(name, Tally()).add(tally)
    return path.name, window, {k: v.to_dict() for k, v in totals.items()}, time.perf_counter() - started


def jobs(files: list[Path], windows: list[str], limit: int | None, policies: list[str],
         mask_turns: int, template: Path, fmt: str = "chat") -> list[Job]:
    found = []
    for path in files:
        with path.open("rb") as lines:
            count = sum(1 for _ in lines)
        count = min(count, limit) if limit is not None else count
        for window in windows:
            for start in range(0, count, CHUNK):
                found.append((str(path), window, start, min(start + CHUNK, count), policies, mask_turns,
                              str(template), fmt))
    # The biggest files first, so the pool does not end on one long job.
    return sorted(found, key=lambda j: -Path(j[0]).stat().st_size * (j[3] - j[2]))


def run(files: list[Path], windows: list[str], policies: list[str], limit: int | None, mask_turns: int,
        workers: int, fmt: str = "chat") -> dict[str, Any]:
    merged: dict[str, dict[str, dict[str, Tally]]] = {w: {} for w in windows}
    seconds: dict[str, float] = {}
    todo = jobs(files, windows, limit, policies, mask_turns, archive_template(), fmt)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for name, window, tallies, elapsed in pool.map(run_job, todo):
            seconds[name] = seconds.get(name, 0.0) + elapsed
            for strategy, data in tallies.items():
                merged[window].setdefault(name, {}).setdefault(strategy, Tally()).add(Tally.from_dict(data))
    suffixes = ["", *(f.suffix for f in WIRE_FORMATS.values())]
    order = [f"ctxproxy:{p}{s}" for p in policies for s in suffixes] + list(BASELINES)
    result: dict[str, Any] = {"windows": {},
                              "cpu_seconds_by_file": {k: round(v, 1) for k, v in seconds.items()}}
    for window, by_file in merged.items():
        overall: dict[str, Tally] = {}
        files_out: dict[str, Any] = {}
        for name in sorted(by_file):
            files_out[name] = {s: by_file[name][s].report() for s in order if s in by_file[name]}
            for strategy, tally in by_file[name].items():
                overall.setdefault(strategy, Tally()).add(tally)
        result["windows"][window] = {"files": files_out,
                                     "overall": {s: overall[s].report() for s in order if s in overall}}
    return result


COLUMNS = [("conv", "conversations"), ("req", "requests"), ("tokens", "token_ratio"),
           ("reuse", "prefix_reuse"), ("cost", "cost_ratio"), ("cost_w", "cost_ratio_w"),
           ("needles", "needles"),
           ("in_prompt", "needles_in_prompt"), ("reachable", "needles_reachable"), ("task", "task_kept"),
           ("critical", "critical_kept"), ("summaries", "summary_critical_kept"), ("numbers", "numbers_kept"),
           ("replaced", "replaced"),
           ("read_back", "read_back"), ("wm", "working_memory"), ("over", "over_budget"),
           ("refused", "refused"), ("pairing", "pairing_errors"), ("errors", "errors")]
CODEC_COLUMN = ("codec", "codec_violations")  # shown when a strategy ran in another wire format


def _cell(row: dict[str, Any], key: str) -> str:
    value = row.get(key)
    if value is None:
        return "-"
    if key in ("critical_kept", "summary_critical_kept"):
        return f"{value:.3f} ({row['critical' if key == 'critical_kept' else 'summary_critical']})"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def format_tables(result: dict[str, Any]) -> str:
    out = []
    for window, data in result["windows"].items():
        codec = any("codec_violations" in row for row in data["overall"].values())
        columns = [*COLUMNS, CODEC_COLUMN] if codec else COLUMNS
        out.append(f"\n### window {window}\n")
        out.append("| file | strategy | " + " | ".join(c for c, _ in columns) + " |")
        out.append("|---|---|" + "---:|" * len(columns))
        rows = [(name.removesuffix(".jsonl"), by) for name, by in data["files"].items()]
        for name, by_strategy in [*rows, ("**overall**", data["overall"])]:
            for strategy, row in by_strategy.items():
                out.append(f"| {name} | {strategy} | " + " | ".join(_cell(row, k) for _, k in columns) + " |")
        errors = [f"{strategy}: {sample}" for strategy, row in data["overall"].items()
                  for sample in row["error_samples"]]
        if errors:
            out.append("\nerrors: " + "; ".join(errors))
        broken = [f"{strategy}: {sample}" for strategy, row in data["overall"].items()
                  for sample in row.get("violation_samples") or ()]
        if broken:
            out.append("\ncodec violations: " + "; ".join(broken))
        out.append(format_cost_split(window, data["overall"]))
    return "\n".join(out)


def format_cost_split(window: str, overall: dict[str, Any]) -> str:
    """Where each strategy's cost goes, as shares of the raw cost (see Tally.cost_new)."""
    lines = [f"\nwhere the cost goes, window {window} (shares of the raw cost):\n",
             "| strategy | cost | new messages | billed again | cached reads | requests within budget: raw "
             "| forwarded |", "|---|---:|---:|---:|---:|---:|---:|"]
    for strategy, row in overall.items():
        split = row.get("cost_split") or {}
        cells = [row.get("cost_ratio"), split.get("new"), split.get("rebilled"), split.get("cached_reads"),
                 split.get("raw_within_budget"), split.get("forwarded_within_budget")]
        lines.append(f"| {strategy} | " + " | ".join("-" if c is None else f"{c:.3f}" for c in cells) + " |")
    return "\n".join(lines)


COMPARED = [("tokens", "token_ratio"), ("reuse", "prefix_reuse"), ("cost", "cost_ratio"),
            ("cost_w", "cost_ratio_w"), ("in_prompt", "needles_in_prompt"),
            ("reachable", "needles_reachable"), ("task", "task_kept"), ("critical", "critical_kept"),
            ("replaced", "replaced"),
            ("read_back", "read_back"), ("wm", "working_memory"), ("over", "over_budget"),
            ("refused", "refused"), ("pairing", "pairing_errors"), ("errors", "errors")]


def _value(row: dict[str, Any] | None, key: str) -> str:
    value = None if row is None else row.get(key)
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def format_comparison(result: dict[str, Any]) -> str:
    """ctxproxy in each wire format side by side (one value per format in each cell, chat first), per
    file and overall, for every policy run in more than one format; empty when none was."""
    out = []
    suffixes = ["", *(f.suffix for f in WIRE_FORMATS.values())]
    for window, data in result["windows"].items():
        policies = dict.fromkeys(s.split("/")[0] for s in data["overall"] if s.startswith("ctxproxy:"))
        for policy in policies:
            names = [policy + s for s in suffixes if policy + s in data["overall"]]
            if len(names) < 2:
                continue
            formats = " / ".join(n.partition("/")[2] or "chat" for n in names)
            out.append(f"\n### window {window}: {policy} by wire format ({formats})\n")
            out.append("| file | " + " | ".join(c for c, _ in COMPARED) + " | codec |")
            out.append("|---|" + "---:|" * (len(COMPARED) + 1))
            rows = [(name.removesuffix(".jsonl"), by) for name, by in data["files"].items()]
            for name, by in [*rows, ("**overall**", data["overall"])]:
                cells = [" / ".join(_value(by.get(n), key) for n in names) for _, key in COMPARED]
                codec = " / ".join(_value(by.get(n), "codec_violations") for n in names[1:])
                out.append(f"| {name} | " + " | ".join(cells) + f" | {codec} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--files", default="*.jsonl", help="glob of trace files in --traces")
    parser.add_argument("--windows", default="real,32000,16000")
    parser.add_argument("--policies", help="comma-separated; default: every shipped policy")
    parser.add_argument("--limit", type=int, help="conversations per file")
    parser.add_argument("--quick", action="store_true",
                        help=f"the first {QUICK_LIMIT} conversations per file")
    parser.add_argument("--mask-turns", type=int, default=MASK_KEEP_TURNS)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--format", choices=tuple(FORMATS), default="chat",
                        help="wire format of ctxproxy's requests (both: chat and messages; all: chat, "
                        "messages and responses, side by side)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    policies = args.policies.split(",") if args.policies else PolicyStore(ROOT / "policies").names()
    limit = QUICK_LIMIT if args.quick and args.limit is None else args.limit
    files = sorted(args.traces.glob(args.files))
    if not files:
        parser.error(f"no trace files match {args.files!r} in {args.traces}")
    started = time.perf_counter()
    result = run(files, args.windows.split(","), policies, limit, args.mask_turns, args.workers, args.format)
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
        return
    print(format_tables(result))
    print(format_comparison(result))
    print(f"\nelapsed {result['elapsed_s']} s ({args.workers} workers); CPU s by file: "
          f"{result['cpu_seconds_by_file']}")


if __name__ == "__main__":
    main()
