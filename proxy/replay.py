"""Offline replay of recorded agent conversations through the pipeline, with the DESIGN.md metrics.

One request per point where the agent called the model (each prefix that ends before an assistant
message), all in one session per conversation, exactly as a live agent would have sent them.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from proxy import pipeline
from proxy.errors import ContextLengthExceeded
from proxy.internal_tools import READ_TOOL_RESULT, ToolContext, execute
from proxy.policy import LoadedPolicy
from proxy.session import Session
from proxy.state import StateStore
from proxy.tokens import TokenCounter

CACHE_MIN_TOKENS = 1024  # providers cache prefixes from this length on
CACHED_PRICE = 0.1


@dataclass
class Totals:
    requests: int = 0
    conversations: int = 0
    raw_tokens: int = 0
    forwarded_tokens: int = 0
    forwarded_cached: int = 0
    raw_cost: float = 0.0
    forwarded_cost: float = 0.0
    replaced: int = 0
    recovered: int = 0
    over_budget: int = 0
    refused: int = 0
    pairing_errors: int = 0
    gates: Counter[str] = field(default_factory=Counter)
    pipeline_ms: list[float] = field(default_factory=list)

    def account(self, sent: list[dict[str, Any]], raw: int, raw_cached: int, outcome: pipeline.Outcome,
                cached: int) -> None:
        """One forwarded request: tokens and cost beside the unmodified request's, gate, budget, pairing."""
        self.gates[outcome.gate] += 1
        self.raw_tokens += raw
        self.forwarded_tokens += outcome.tokens_after
        self.forwarded_cached += cached
        self.raw_cost += raw_cached * CACHED_PRICE + (raw - raw_cached)
        self.forwarded_cost += cached * CACHED_PRICE + (outcome.tokens_after - cached)
        if outcome.window and outcome.tokens_after > outcome.window:
            self.over_budget += 1
        if pairing_errors(outcome.messages) != pairing_errors(sent):
            self.pairing_errors += 1

    def add(self, other: Totals) -> None:
        for name in ("requests", "conversations", "raw_tokens", "forwarded_tokens", "forwarded_cached",
                     "raw_cost", "forwarded_cost", "replaced", "recovered", "over_budget", "refused",
                     "pairing_errors"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.gates.update(other.gates)
        self.pipeline_ms.extend(other.pipeline_ms)

    def report(self) -> dict[str, Any]:
        ms = sorted(self.pipeline_ms) or [0.0]
        return {
            "conversations": self.conversations, "requests": self.requests,
            "token_ratio": _ratio(self.forwarded_tokens, self.raw_tokens),
            "prefix_reuse": _ratio(self.forwarded_cached, self.forwarded_tokens),
            "cost_ratio": _ratio(self.forwarded_cost, self.raw_cost),
            "recoverable": _ratio(self.recovered, self.replaced) if self.replaced else 1.0,
            "replaced": self.replaced, "over_budget": self.over_budget, "refused": self.refused,
            "pairing_errors": self.pairing_errors, "gates": dict(sorted(self.gates.items())),
            "pipeline_ms_p50": round(statistics.median(ms), 3),
            "pipeline_ms_p99": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 3),
        }


def _ratio(a: float, b: float) -> float:
    return round(a / b, 4) if b else 1.0


def pairing_errors(messages: list[dict[str, Any]]) -> list[str]:
    """Every assistant tool call answered right after it, in order, and every tool message called."""
    errors: list[str] = []
    pending: list[Any] = []  # open call ids, as the client sent them (any JSON value)
    for index, message in enumerate(messages):
        if message.get("role") == "tool":
            answered = message.get("tool_call_id")
            if pending and answered in pending:
                pending.remove(answered)
            else:
                errors.append(f"messages[{index}] answers {answered!r}, which no open call asked for")
            continue
        if pending:
            errors.append(f"messages[{index}] comes before calls {pending} were answered")
        pending = [c.get("id") for c in message.get("tool_calls") or () if isinstance(c, dict)]
    return errors


def request_points(messages: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    for index, message in enumerate(messages):
        if message.get("role") == "assistant" and index > 0:
            yield messages[:index]


def read_conversations(path: Path, limit: int | None = None) -> Iterator[dict[str, Any]]:
    with path.open("rb") as handle:
        for count, line in enumerate(handle):
            if limit is not None and count >= limit:
                return
            if line.strip():
                yield orjson.loads(line)


def bare_model(name: str) -> str:
    """Trace model labels carry notes ("google/x (via OpenRouter, ...)"); keep the model id."""
    return name.split(" (")[0].strip()


class Cache:
    """Tracks what a provider would have cached: the longest prefix shared with the previous request."""

    def __init__(self, tokens: TokenCounter, model: str) -> None:
        self.tokens, self.model = tokens, model
        self.previous: tuple[list[dict[str, Any]], Any] | None = None

    def cached(self, messages: list[dict[str, Any]], tools: list[Any] | None) -> int:
        previous, self.previous = self.previous, (messages, tools)
        if previous is None or previous[1] != tools:
            return 0  # the tools list leads the prompt: a change invalidates everything after it
        shared = 0
        for old, new in zip(previous[0], messages, strict=False):
            if old != new:
                break
            shared += 1
        cached = self.tokens.tools(tools, self.model) + sum(
            self.tokens.message(m, self.model) for m in messages[:shared])
        return cached if cached >= CACHE_MIN_TOKENS else 0


def neutral(conversation: dict[str, Any]) -> dict[str, Any]:
    """A conversation in the neutral (chat) shape: an OpenAI Responses request body (`input` items) or an
    Anthropic Messages one (a `system` field, or content blocks such as tool_use / tool_result) goes through
    its codec; a chat one is itself."""
    if "messages" not in conversation and "input" in conversation:
        from proxy.wire.responses import decode as decode_responses

        decoded = decode_responses(orjson.dumps(conversation))
        return {**conversation, "messages": decoded.messages, "tools": decoded.tools}
    messages = conversation.get("messages") or []
    blocks = {b.get("type") for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list)
              for b in m["content"] if isinstance(b, dict)}
    if "system" not in conversation and not blocks & {"tool_use", "tool_result", "thinking"}:
        return conversation
    from proxy.wire.messages import decode

    decoded = decode(orjson.dumps(conversation))
    return {**conversation, "messages": decoded.messages, "tools": decoded.tools}


def replay_conversation(conversation: dict[str, Any], policy: LoadedPolicy, tokens: TokenCounter,
                        model_override: str | None = None) -> Totals:
    conversation = neutral(conversation)
    model = model_override or bare_model(str(conversation.get("model") or "gpt-4o"))
    tools = conversation.get("tools") or None
    store = StateStore()
    session = Session(str(conversation.get("id") or "replay"), "replay")
    context = pipeline.PipelineContext(policy, session, "replay", tokens, store)
    totals = Totals(conversations=1)
    raw_cache, forwarded_cache = Cache(tokens, model), Cache(tokens, model)
    checked: set[str] = set()
    for prefix in request_points(conversation.get("messages") or []):
        totals.requests += 1
        raw = tokens.request(prefix, tools, model)
        raw_cached = raw_cache.cached(prefix, tools)
        started = time.perf_counter()
        try:
            outcome = pipeline.run(pipeline.Conversation(model, prefix, tools), context)
        except ContextLengthExceeded:
            totals.pipeline_ms.append((time.perf_counter() - started) * 1000)
            totals.refused += 1
            totals.gates["refuse"] += 1
            forwarded_cache.previous = None
            continue
        totals.pipeline_ms.append((time.perf_counter() - started) * 1000)
        cached = forwarded_cache.cached(outcome.messages, outcome.tools)
        totals.account(prefix, raw, raw_cached, outcome, cached)
        _check_recoverable(store, session.id, checked, totals)
    return totals


def _check_recoverable(store: StateStore, session_id: str, checked: set[str], totals: Totals) -> None:
    """Every replaced result must read back byte-identical through read_tool_result."""
    for handle, stored in store.get("replay", session_id).by_handle.items():
        if handle in checked:
            continue
        checked.add(handle)
        totals.replaced += 1
        arguments = orjson.dumps({"call_id": handle}).decode()
        call = {"function": {"name": READ_TOOL_RESULT, "arguments": arguments}}
        if execute(call, ToolContext(store, "replay", session_id, page_chars=1 << 40)) == stored.content:
            totals.recovered += 1


def replay_files(paths: list[Path], policy: LoadedPolicy, *, model: str | None = None,
                 limit: int | None = None) -> dict[str, Any]:
    tokens = TokenCounter()
    per_file: dict[str, Any] = {}
    overall = Totals(conversations=0)
    for path in paths:
        totals = Totals(conversations=0)
        for conversation in read_conversations(path, limit):
            totals.add(replay_conversation(conversation, policy, tokens, model))
        per_file[path.name] = totals.report()
        overall.add(totals)
    return {"policy": policy.name, "files": per_file, "overall": overall.report()}


def format_table(result: dict[str, Any]) -> str:
    columns = ["conversations", "requests", "token_ratio", "prefix_reuse", "cost_ratio", "recoverable",
               "over_budget", "refused", "pairing_errors", "pipeline_ms_p50", "pipeline_ms_p99"]
    header = "| file | " + " | ".join(columns) + " | gates |"
    lines = [header, "|" + "---|" * (len(columns) + 2)]
    for name, row in [*result["files"].items(), ("overall", result["overall"])]:
        gates = " ".join(f"{k}={v}" for k, v in row["gates"].items())
        lines.append(f"| {name} | " + " | ".join(str(row[c]) for c in columns) + f" | {gates} |")
    return "\n".join(lines)
