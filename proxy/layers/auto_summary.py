"""The auto-summary block: one headline per evicted exchange, grouped by age, within a token budget.

Rendered only when a batch is evicted and then repeated byte for byte, so it never breaks the prompt
cache between batches. Deterministic: the same evictions at the same times give the same block.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

Count = Callable[[dict[str, Any]], int]

SNIPPET = 110


@dataclass
class Headline:
    at: float  # when the proxy first saw the exchange (epoch seconds)
    asked: str
    tools: str
    outcome: str
    tokens: int
    model_line: str | None = None  # written later by summary.summarizer_model, used from the next batch


def _first_line(text: Any) -> str:
    if isinstance(text, list):
        text = " ".join(p.get("text", "") for p in text if isinstance(p, dict))
    if not isinstance(text, str):
        return ""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= SNIPPET else line[:SNIPPET - 1] + "…"


def headline(messages: list[dict[str, Any]], at: float, count: Count) -> Headline:
    """What was asked, which tools ran, how it ended, and its size."""
    asked = _first_line(messages[0].get("content")) if messages[0].get("role") == "user" else "(continued)"
    calls: Counter[str] = Counter()
    outcome = ""
    for message in messages:
        for call in message.get("tool_calls") or ():
            if isinstance(call, dict):
                calls[str((call.get("function") or {}).get("name") or "?")] += 1
        if message.get("role") == "assistant" and _first_line(message.get("content")):
            outcome = _first_line(message.get("content"))
    tools = ", ".join(f"{name} x{n}" if n > 1 else name for name, n in calls.items())
    return Headline(at, asked, tools, outcome, sum(count(m) for m in messages))


AGE_LABELS = ("Earlier in this session", "Yesterday", "This week", "Older")


def _age_label(at: float, now: float) -> str:
    day = datetime.fromtimestamp(now, UTC).date()
    then = datetime.fromtimestamp(at, UTC).date()
    if then >= day:
        return "Earlier in this session"
    if then == day - timedelta(days=1):
        return "Yesterday"
    if then > day - timedelta(days=7):
        return "This week"
    return "Older"


def _line(entry: Headline, full: bool) -> str:
    when = datetime.fromtimestamp(entry.at, UTC).strftime("%a %H:%M")
    size = f"~{entry.tokens / 1000:.1f}k tokens" if entry.tokens >= 1000 else f"~{entry.tokens} tokens"
    if full and entry.model_line:
        return f"- ({when}, {size}) {entry.model_line}"
    text = f"- ({when}, {size}) {entry.asked or '(no text)'}"
    if full and entry.tools:
        text += f" · tools: {entry.tools}"
    if full and entry.outcome:
        text += f" → {entry.outcome}"
    return text


def render(entries: list[Headline], now: float, max_tokens: int, count_text: Callable[[str], int]) -> str:
    """The block's text. Oldest entries lose their details first, then are dropped (and counted).

    Line costs are measured once; the block is composed once, then checked (and trimmed if the
    estimate was off by a few tokens).
    """
    total_tokens = sum(e.tokens for e in entries)
    full_cost = [count_text(_line(e, True)) + 1 for e in entries]
    short_cost = [count_text(_line(e, False)) + 1 for e in entries]
    frame = count_text(_compose([], [], 1, total_tokens, len(entries), now)) + 8 * len(AGE_LABELS)
    detailed = [True] * len(entries)
    cost = sum(full_cost)
    for index in range(len(entries) - 1):  # the newest keeps its details longest
        if frame + cost <= max_tokens:
            break
        detailed[index] = False
        cost -= full_cost[index] - short_cost[index]
    dropped = 0
    while dropped < len(entries) and frame + cost > max_tokens:
        cost -= full_cost[dropped] if detailed[dropped] else short_cost[dropped]
        dropped += 1
    while True:
        text = _compose(entries[dropped:], detailed[dropped:], dropped, total_tokens, len(entries), now)
        if dropped >= len(entries) or count_text(text) <= max_tokens:
            return text
        dropped += 1


def _compose(entries: list[Headline], full: list[bool], dropped: int, total_tokens: int, total: int,
             now: float) -> str:
    lines = [f"[ctxproxy auto-summary: {total} earlier exchange{'s' if total != 1 else ''} "
             f"(~{total_tokens} tokens) left this conversation to keep it within the context window. "
             "Headlines only; their full text is searchable with the recall tool.]"]
    if dropped:
        lines.append(f"- ({dropped} older exchange{'s' if dropped != 1 else ''} not listed)")
    label = None
    for entry, detailed in zip(entries, full, strict=True):
        age = _age_label(entry.at, now)
        if age != label:
            lines.append(f"## {age}")
            label = age
        lines.append(_line(entry, detailed))
    lines.append("Older history is available via recall(query).")
    return "\n".join(lines)
