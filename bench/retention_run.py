"""One conversation through every strategy of the retention benchmark, and the tallies it adds up to.

A strategy turns each request prefix into what would be sent (`Sent`), or None when it refuses; the
accounting (tokens, cache, task, needles) is shared, so every strategy is measured the same way. The
ctxproxy strategy also answers its own internal tools at the end (read_tool_result on its store, recall
on a real archive of the conversation written like the server writes it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import orjson

from bench.critical import Kept
from bench.retention_archive import TENANT, archived
from bench.retention_metrics import (
    joined,
    last_call,
    mask,
    needles,
    present,
    summary_queries,
    task_index,
    text_of,
    tool_call_queries,
    truncate,
    visible_handles,
)
from proxy import pipeline
from proxy.errors import ContextLengthExceeded
from proxy.internal_tools import READ_TOOL_RESULT, RECALL, ToolContext, execute, tool_name
from proxy.policy import LoadedPolicy
from proxy.replay import CACHE_MIN_TOKENS, CACHED_PRICE, Cache, pairing_errors
from proxy.session import Session
from proxy.state import StateStore
from proxy.tokens import TokenCounter

WRITE_PRICE = 1.25
WHOLE = 1 << 40  # page size that returns a whole original in one read (paging allowed by definition)
SUMMARY_PREFIX = "[ctxproxy auto-summary"
MEMORY_PREFIX = "[WORKING MEMORY]"
ERROR_SAMPLES = 3
ERROR_CHARS = 300  # an exception's message can quote a whole tool result

_SUMS = ("conversations", "requests", "raw_tokens", "forwarded_tokens", "forwarded_cached", "raw_cost",
         "forwarded_cost", "raw_cost_w", "forwarded_cost_w", "over_budget", "refused", "pairing_errors",
         "task_requests", "task_kept", "needles", "needles_in_prompt", "needles_reachable", "replaced",
         "recovered", "critical_total", "critical_kept", "numbers_total", "numbers_kept", "wm_conversations",
         "wm_nonempty", "wm_in_prompt", "errors", "recalls", "reads", "codec_checked", "codec_violations",
         "cost_new", "cost_rebilled", "cost_reads", "raw_cost_within", "forwarded_cost_within")


@dataclass
class Tally:
    """Additive counts of one strategy over some conversations (ratios are taken at the end)."""

    conversations: int = 0
    requests: int = 0
    raw_tokens: int = 0
    forwarded_tokens: int = 0
    forwarded_cached: int = 0
    raw_cost: float = 0.0
    forwarded_cost: float = 0.0
    raw_cost_w: float = 0.0
    forwarded_cost_w: float = 0.0
    over_budget: int = 0
    refused: int = 0
    pairing_errors: int = 0
    task_requests: int = 0
    task_kept: int = 0
    needles: int = 0
    needles_in_prompt: int = 0
    needles_reachable: int = 0
    replaced: int = 0  # distinct replacements (handles, or masked outputs) in the conversation
    recovered: int = 0  # of those, read back byte-identical through read_tool_result
    critical_total: int = 0
    critical_kept: int = 0
    numbers_total: int = 0
    numbers_kept: int = 0
    wm_conversations: int = 0
    wm_nonempty: int = 0
    wm_in_prompt: int = 0
    errors: int = 0
    recalls: int = 0  # recall calls made to test reachability
    reads: int = 0  # read_tool_result calls made to test reachability
    codec_checked: int = 0  # requests encoded in another wire format and checked (bench/format_run.py)
    codec_violations: int = 0  # of those, bodies the format's API would reject
    # Where the forwarded cost goes: uncached tokens of messages new since the previous request (at 1.0;
    # no strategy that forwards them can avoid them), other uncached tokens (a changed prefix billed
    # again), cached reads (at 0.1); and the raw and forwarded cost of the requests whose raw size is
    # within the truncation budget (what a strategy that leaves them alone cannot lower).
    cost_new: float = 0.0
    cost_rebilled: float = 0.0
    cost_reads: float = 0.0
    raw_cost_within: float = 0.0
    forwarded_cost_within: float = 0.0
    kinds: Counter[str] = field(default_factory=Counter)
    by_kind: dict[str, list[int]] = field(default_factory=lambda: {"ids": [0, 0], "paths": [0, 0],
                                                                  "error_lines": [0, 0]})
    # replacement kind -> [critical total, kept, numbers total, numbers kept]
    kept_by_replacement: dict[str, list[int]] = field(default_factory=dict)
    error_samples: list[str] = field(default_factory=list)
    violation_samples: list[str] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        for name in _SUMS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.kinds.update(other.kinds)
        for kind, (total, kept) in other.by_kind.items():
            self.by_kind[kind][0] += total
            self.by_kind[kind][1] += kept
        for kind, counts in other.kept_by_replacement.items():
            mine = self.kept_by_replacement.setdefault(kind, [0, 0, 0, 0])
            mine[:] = [a + b for a, b in zip(mine, counts, strict=True)]
        self.error_samples = (self.error_samples + other.error_samples)[:ERROR_SAMPLES]
        self.violation_samples = (self.violation_samples + other.violation_samples)[:ERROR_SAMPLES]

    def count_kept(self, kept: Kept, kind: str) -> None:
        counts = self.kept_by_replacement.setdefault(kind, [0, 0, 0, 0])
        counts[:] = [counts[0] + kept.total, counts[1] + kept.kept, counts[2] + kept.numbers_total,
                     counts[3] + kept.numbers_kept]
        self.critical_total += kept.total
        self.critical_kept += kept.kept
        self.numbers_total += kept.numbers_total
        self.numbers_kept += kept.numbers_kept
        for token_kind, (total, hits) in kept.by_kind.items():
            self.by_kind[token_kind][0] += total
            self.by_kind[token_kind][1] += hits

    def report(self) -> dict[str, Any]:
        def ratio(a: float, b: float) -> float | None:
            return round(a / b, 4) if b else None

        summaries = self.kept_by_replacement.get("summary", [0, 0, 0, 0])
        codec = {"codec_checked": self.codec_checked, "codec_violations": self.codec_violations,
                 "violation_samples": self.violation_samples} if self.codec_checked else {}
        return codec | {
            "conversations": self.conversations, "requests": self.requests,
            "token_ratio": ratio(self.forwarded_tokens, self.raw_tokens),
            "prefix_reuse": ratio(self.forwarded_cached, self.forwarded_tokens),
            "cost_ratio": ratio(self.forwarded_cost, self.raw_cost),
            "cost_ratio_w": ratio(self.forwarded_cost_w, self.raw_cost_w),
            "needles": self.needles, "needles_in_prompt": ratio(self.needles_in_prompt, self.needles),
            "needles_reachable": ratio(self.needles_reachable, self.needles),
            "task_kept": ratio(self.task_kept, self.task_requests), "task_requests": self.task_requests,
            "critical_kept": ratio(self.critical_kept, self.critical_total), "critical": self.critical_total,
            "critical_by_kind": {k: ratio(h, t) for k, (t, h) in self.by_kind.items()},
            "summary_critical_kept": ratio(summaries[1], summaries[0]), "summary_critical": summaries[0],
            "critical_by_replacement": {k: {"critical": c[0], "kept": ratio(c[1], c[0]), "numbers": c[2],
                                            "numbers_kept": ratio(c[3], c[2])}
                                        for k, c in sorted(self.kept_by_replacement.items())},
            "numbers_kept": ratio(self.numbers_kept, self.numbers_total),
            "replaced": self.replaced, "replaced_kinds": dict(sorted(self.kinds.items())),
            "read_back": ratio(self.recovered, self.replaced) if self.kinds.get("masked") != self.replaced
            else None,
            "working_memory": ratio(self.wm_nonempty, self.wm_conversations),
            "working_memory_in_prompt": ratio(self.wm_in_prompt, self.wm_conversations),
            "wm_conversations": self.wm_conversations,
            "over_budget": self.over_budget, "refused": self.refused, "pairing_errors": self.pairing_errors,
            "errors": self.errors, "error_samples": self.error_samples,
            "recall_calls": self.recalls, "read_calls": self.reads,
            "cost_split": {"new": ratio(self.cost_new, self.raw_cost),
                           "rebilled": ratio(self.cost_rebilled, self.raw_cost),
                           "cached_reads": ratio(self.cost_reads, self.raw_cost),
                           "raw_within_budget": ratio(self.raw_cost_within, self.raw_cost),
                           "forwarded_within_budget": ratio(self.forwarded_cost_within, self.raw_cost)},
        }

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["kinds"] = dict(self.kinds)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Tally:
        tally = cls(**{k: v for k, v in data.items() if k != "kinds"})
        tally.kinds = Counter(data.get("kinds") or {})
        return tally


@dataclass
class Sent:
    messages: list[dict[str, Any]]
    tools: list[Any] | None
    tokens: int
    # What the client sent, when it is not the chat prefix (another wire format, decoded): its neutral
    # messages and (tokens, cached tokens); ratios and pairing are then taken against it.
    client: list[dict[str, Any]] | None = None
    raw: tuple[int, int] | None = None


@dataclass
class Setting:
    """What every strategy of one conversation shares: the model, the window and the baselines' knobs."""

    model: str
    window: int  # the setting's window: over_budget is measured against it for every strategy
    truncation_budget: int  # the default policy's window-layer budget
    mask_turns: int
    user_observations: bool  # text-protocol trace: observations come back as user messages
    tau_style: bool  # working memory is expected to fire on this file


class Strategy:
    name = ""

    def request(self, prefix: list[dict[str, Any]]) -> Sent | None:
        raise NotImplementedError

    def finish(self, last: Sent | None, left: set[str], tally: Tally) -> set[str]:
        """Count what is specific to the strategy; returns the needles it can reach besides the prompt."""
        return set()


class Passthrough(Strategy):
    name = "passthrough"

    def __init__(self, tools: list[Any] | None, count: Callable[[list[dict[str, Any]]], int]) -> None:
        self.tools, self.count = tools, count

    def request(self, prefix: list[dict[str, Any]]) -> Sent | None:
        return Sent(prefix, self.tools, self.count(prefix))


class Truncation(Passthrough):
    name = "truncation"

    def __init__(self, tools: list[Any] | None, count: Callable[[list[dict[str, Any]]], int],
                 budget: int) -> None:
        super().__init__(tools, count)
        self.budget = budget

    def request(self, prefix: list[dict[str, Any]]) -> Sent | None:
        kept = truncate(prefix, self.budget, self.count)
        return Sent(kept, self.tools, self.count(kept))


class Masking(Passthrough):
    name = "masking"

    def __init__(self, tools: list[Any] | None, count: Callable[[list[dict[str, Any]]], int], turns: int,
                 user_observations: bool) -> None:
        super().__init__(tools, count)
        self.turns, self.user_observations = turns, user_observations
        self.masked: dict[int, tuple[str, str]] = {}  # index -> (original, placeholder), distinct

    def request(self, prefix: list[dict[str, Any]]) -> Sent | None:
        out, masked = mask(prefix, self.turns, self.user_observations)
        for index, text in masked:
            self.masked.setdefault(index, (text_of(prefix[index]), text))
        return Sent(out, self.tools, self.count(out))

    def finish(self, last: Sent | None, left: set[str], tally: Tally) -> set[str]:
        kept = Kept()
        for original, text in self.masked.values():
            kept.add(original, text)
        tally.replaced += len(self.masked)
        tally.kinds["masked"] += len(self.masked)
        tally.count_kept(kept, "masked")
        return set()


class Proxy(Strategy):
    """The pipeline, one StateStore and session per conversation, as bench/replay.py runs it."""

    def __init__(self, loaded: LoadedPolicy, conversation: dict[str, Any], setting: Setting,
                 tokens: TokenCounter) -> None:
        self.name = f"ctxproxy:{loaded.name}"
        self.loaded, self.setting = loaded, setting
        self.tools = conversation.get("tools") or None
        self.store = StateStore()
        self.session = Session(str(conversation.get("id") or "replay"), "replay")
        self.context = pipeline.PipelineContext(loaded, self.session, TENANT, tokens, self.store)
        self.history: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = []
        self.messages = conversation.get("messages") or []

    def request(self, prefix: list[dict[str, Any]]) -> Sent | None:
        try:
            conversation = pipeline.Conversation(self.setting.model, prefix, self.tools)
            outcome = pipeline.run(conversation, self.context)
        except ContextLengthExceeded:
            self.history.append((prefix, None))
            return None
        self.history.append((prefix, outcome.messages))
        return Sent(outcome.messages, outcome.tools, outcome.tokens_after)

    def tool_context(self, search: Any = None, page_chars: int = WHOLE) -> ToolContext:
        return ToolContext(self.store, TENANT, self.session.id, page_chars, search=search,
                           policy=self.loaded.name,
                           recall_results=self.loaded.policy.window.recall_results)

    def finish(self, last: Sent | None, left: set[str], tally: Tally) -> set[str]:
        state = self.store.get(TENANT, self.session.id)
        kept: dict[str, Kept] = {}
        for handle, stored in state.by_handle.items():
            tally.replaced += 1
            tally.kinds[stored.kind] += 1
            if call(READ_TOOL_RESULT, {"call_id": handle}, self.tool_context()) == stored.content:
                tally.recovered += 1
            if stored.replacement:  # an empty one stands for a removal (eviction): measured by needles
                kept.setdefault(stored.kind, Kept()).add(stored.content, stored.replacement)
        for kind, counts in kept.items():
            tally.count_kept(counts, kind)
        forwarded = last.messages if last else []
        before_last = self.messages[:last_call(self.messages) or 0]
        if self.setting.tau_style and any(m.get("role") == "tool" for m in before_last):
            tally.wm_conversations += 1
            tally.wm_nonempty += bool(state.memory.render())
            tally.wm_in_prompt += any(text_of(m).startswith(MEMORY_PREFIX) for m in forwarded)
        offered = {tool_name(spec) or "" for spec in (last.tools or [])} if last else set()
        if not left or not offered & {READ_TOOL_RESULT, RECALL}:
            return set()
        return self.reach(forwarded, offered, set(left), tally, state.window.block)

    def reach(self, forwarded: list[dict[str, Any]], offered: set[str], left: set[str], tally: Tally,
              block: str | None) -> set[str]:
        reached: set[str] = set()
        text = joined(forwarded)
        if READ_TOOL_RESULT in offered:
            for handle in visible_handles(text):
                tally.reads += 1
                answer = call(READ_TOOL_RESULT, {"call_id": handle}, self.tool_context())
                if not answer.startswith("error:"):
                    found = present(left, answer)
                    reached |= found
                    left -= found
                if not left:
                    return reached
        if RECALL not in offered:
            return reached
        queries: dict[str, None] = {}
        for message in forwarded:
            body = text_of(message)
            if body.startswith(SUMMARY_PREFIX) or (block and body == block):
                queries.update(dict.fromkeys(summary_queries(body)))
        queries.update(dict.fromkeys(tool_call_queries(forwarded)))
        if not queries:
            return reached
        with archived(self.history[:-1], self.messages, self.session, self.loaded.name,
                      self.setting.model) as reader:
            context = self.tool_context(search=reader.recall,
                                        page_chars=self.loaded.policy.tool_results.read_page_chars)
            for query in queries:
                tally.recalls += 1
                found = present(left, call(RECALL, {"query": query}, context))
                reached |= found
                left -= found
                if not left:
                    break
        return reached


def call(name: str, arguments: dict[str, Any], context: ToolContext) -> str:
    return execute({"function": {"name": name, "arguments": orjson.dumps(arguments).decode()}}, context)


def run_conversation(conversation: dict[str, Any], strategies: list[Strategy], setting: Setting,
                     tokens: TokenCounter) -> dict[str, Tally]:
    """Every strategy over every request point of one conversation; a strategy that raises is counted as
    an error for this conversation (its partial figures dropped), the others go on."""
    messages = conversation.get("messages") or []
    tools = conversation.get("tools") or None
    model = setting.model
    last = last_call(messages)
    points = [i for i, m in enumerate(messages) if m.get("role") == "assistant" and i > 0]
    raw = [tokens.request(messages[:i], tools, model) for i in points]
    new = [sum(tokens.message(m, model) for m in messages[start:i])
           for start, i in zip([0, *points], points, strict=False)]
    raw_cache = Cache(tokens, model)
    raw_cached = [raw_cache.cached(messages[:i], tools) for i in points]
    task = task_index(messages)
    task_text = text_of(messages[task]) if task is not None else None
    wanted = needles(messages, tools) if last is not None else set()
    results: dict[str, Tally] = {}
    for strategy in strategies:
        tally = Tally(conversations=1)
        try:
            _run_strategy(strategy, messages, points, raw, raw_cached, task, task_text, wanted, setting,
                          tokens, tools, tally, new)
        except Exception as exc:  # reported, never fatal: the other strategies go on
            sample = f"{conversation.get('id')}: {type(exc).__name__}: {exc}"
            tally = Tally(errors=1, error_samples=[sample[:ERROR_CHARS]])
        results[strategy.name] = tally
    return results


def _run_strategy(strategy: Strategy, messages: list[dict[str, Any]], points: list[int], raw: list[int],
                  raw_cached: list[int], task: int | None, task_text: str | None, wanted: set[str],
                  setting: Setting, tokens: TokenCounter, tools: list[Any] | None, tally: Tally,
                  new: list[int]) -> None:
    cache = Cache(tokens, setting.model)
    sent: Sent | None = None
    for number, index in enumerate(points):
        prefix = messages[:index]
        sent = strategy.request(prefix)
        if sent is None:
            tally.refused += 1
            cache.previous = None
            continue
        tally.requests += 1
        cached = cache.cached(sent.messages, sent.tools)
        raw_tokens, raw_hit = sent.raw or (raw[number], raw_cached[number])
        tally.raw_tokens += raw_tokens
        tally.forwarded_tokens += sent.tokens
        tally.forwarded_cached += cached
        tally.raw_cost += raw_hit * CACHED_PRICE + raw_tokens - raw_hit
        tally.forwarded_cost += cached * CACHED_PRICE + sent.tokens - cached
        tally.cost_new += min(new[number], sent.tokens - cached)
        tally.cost_rebilled += max(0, sent.tokens - cached - new[number])
        tally.cost_reads += cached * CACHED_PRICE
        if raw_tokens <= setting.truncation_budget:
            tally.raw_cost_within += raw_hit * CACHED_PRICE + raw_tokens - raw_hit
            tally.forwarded_cost_within += cached * CACHED_PRICE + sent.tokens - cached
        tally.raw_cost_w += cost_w(raw_tokens, raw_hit)
        tally.forwarded_cost_w += cost_w(sent.tokens, cached)
        tally.over_budget += sent.tokens > setting.window
        tally.pairing_errors += pairing_errors(sent.messages) != pairing_errors(
            prefix if sent.client is None else sent.client)
        if task is not None and task < index and task_text is not None:
            tally.task_requests += 1
            tally.task_kept += any(m is messages[task] or task_text in text_of(m) for m in sent.messages)
    tally.needles += len(wanted)
    in_prompt = present(wanted, joined(sent.messages)) if sent is not None else set()  # refused: nothing
    tally.needles_in_prompt += len(in_prompt)
    reached = strategy.finish(sent, wanted - in_prompt, tally)
    tally.needles_reachable += len(in_prompt) + len(reached & (wanted - in_prompt))


def cost_w(tokens: int, cached: int) -> float:
    """Cached tokens at 0.1; the rest at 1.25 when the request is long enough to be written to the cache."""
    write = WRITE_PRICE if tokens >= CACHE_MIN_TOKENS else 1.0
    return cached * CACHED_PRICE + (tokens - cached) * write
