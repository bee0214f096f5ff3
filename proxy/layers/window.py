"""Layer 3: the sliding window. Whole exchanges leave the forwarded history, oldest first, in batches.

The cut is remembered per session: later requests drop exactly the same prefix, so the forwarded
history grows append-only between batches and the provider's prompt cache keeps working. Never cut:
the system prompt, the task statement (first user message), a tool call apart from its results, or
the exchange in progress. Text-protocol agents (tool output sent back as user messages) are handled
the same way, since every user message starts an exchange.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proxy.layers.auto_summary import Count, Headline, headline, render

if TYPE_CHECKING:
    from proxy.state import SessionState


Evicted = tuple[Headline, list[dict[str, Any]]]  # a headline and the exchange it stands for


@dataclass(frozen=True)
class Eviction:
    head_end: int  # messages[:head_end] are always kept (system prompt(s) + task statement)
    cut: int  # messages[head_end:cut] are evicted
    new_from: int  # start of the range evicted by this request (== cut when nothing new)


def head_end(messages: list[dict[str, Any]]) -> int:
    """Index after the leading system/developer messages and the first user message (the task)."""
    index = 0
    while index < len(messages) and messages[index].get("role") in ("system", "developer"):
        index += 1
    if index < len(messages) and messages[index].get("role") == "user":
        index += 1
    return index


def valid_cuts(messages: list[dict[str, Any]], start: int, stop: int) -> list[int]:
    """Indexes in [start, stop] where history may be cut: never between a call and its results."""
    cuts, open_calls = [], 0
    for index in range(start, min(stop, len(messages)) + 1):
        if index == len(messages):
            break
        message = messages[index]
        role = message.get("role")
        if role == "tool":
            open_calls = max(0, open_calls - 1)
            continue
        if open_calls == 0 and role in ("user", "assistant"):
            cuts.append(index)
        open_calls = len(message.get("tool_calls") or ()) if role == "assistant" else 0
    return cuts


def in_progress_start(messages: list[dict[str, Any]], head: int) -> int:
    """Start of the exchange in progress: the last user message after the task, else the last turn."""
    for index in range(len(messages) - 1, head - 1, -1):
        if messages[index].get("role") == "user":
            return index
    return in_progress_turn(messages, head)


def exchanges(messages: list[dict[str, Any]], start: int, stop: int) -> list[tuple[int, int]]:
    """Split [start, stop) into exchanges: a new one at every user message (at every turn if none)."""
    boundaries = [i for i in range(start, stop) if messages[i].get("role") == "user"]
    if not boundaries or boundaries[0] != start:
        boundaries = [start, *boundaries]
    if len(boundaries) == 1 and stop - start > 1:  # no user turns (pure tool loops): split at turns
        boundaries = [c for c in valid_cuts(messages, start, stop - 1) if c < stop] or [start]
    ends = [*boundaries[1:], stop]
    return [(a, b) for a, b in zip(boundaries, ends, strict=True) if a < b]


def anchor_for(messages: list[dict[str, Any]], head: int, cut: int) -> int | None:
    """A cut inside an exchange keeps that exchange's user message (the request being worked on)."""
    if cut >= len(messages) or messages[cut].get("role") == "user":
        return None
    for index in range(cut - 1, head - 1, -1):
        if messages[index].get("role") == "user":
            return index
    return None


def choose_cut(messages: list[dict[str, Any]], count: Count, previous_cut: int | None, fixed_tokens: int,
               budget_tokens: int, low_water_tokens: int) -> Eviction:
    """Keep the previous cut while the history fits; else evict one batch down to the low-water mark.

    Whole exchanges go first. Only if the exchange in progress alone is still over the budget (long
    tool loops after one user message) are its older turns evicted too, keeping its user message.
    `fixed_tokens` is what is forwarded besides the messages (tools, injected blocks).
    """
    head = head_end(messages)
    cut = previous_cut if previous_cut is not None and head <= previous_cut <= len(messages) else head

    suffix = [0] * (len(messages) + 1)  # suffix[i]: tokens of messages[i:]
    for index in range(len(messages) - 1, -1, -1):
        suffix[index] = suffix[index + 1] + count(messages[index])
    base = fixed_tokens + suffix[0] - suffix[head]

    def kept_tokens(at: int) -> int:
        anchor = anchor_for(messages, head, at)
        return base + suffix[at] + (count(messages[anchor]) if anchor is not None else 0)

    kept = kept_tokens(cut)
    if kept <= budget_tokens:
        return Eviction(head, cut, cut)
    protect_from = in_progress_start(messages, head)
    best = cut
    for candidate in [c for c in valid_cuts(messages, cut, protect_from) if cut < c <= protect_from]:
        best, kept = candidate, kept_tokens(candidate)
        if kept <= low_water_tokens:
            return Eviction(head, best, cut)
    if kept > budget_tokens:
        last_turn = in_progress_turn(messages, head)
        for candidate in [c for c in valid_cuts(messages, best, last_turn) if best < c <= last_turn]:
            best, kept = candidate, kept_tokens(candidate)
            if kept <= low_water_tokens:
                break
    return Eviction(head, best, cut)


def in_progress_turn(messages: list[dict[str, Any]], head: int) -> int:
    """Start of the newest turn (the last place history may be cut at all)."""
    cuts = valid_cuts(messages, head, len(messages))
    return cuts[-1] if cuts else len(messages)


def leading_system(messages: list[dict[str, Any]]) -> int:
    index = 0
    while index < len(messages) and messages[index].get("role") in ("system", "developer"):
        index += 1
    return index


def slide(original: list[dict[str, Any]], forwarded: list[dict[str, Any]], state: SessionState,
          count: Count, count_text: Callable[[str], int], *, budget_tokens: int, low_water_tokens: int,
          summary_tokens: int, summary: bool, fixed_tokens: int,
          now: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[Evicted]]:
    """Apply the sticky cut (evicting a new batch if needed) to both index-aligned lists.

    Returns the new (original, forwarded) lists, aligned, and what this request newly evicted. The
    auto-summary block is rendered into the session state (when `summary`); assembly places it.
    """
    window = state.window
    del window.first_seen[len(original):]  # a shorter history (the client compacted): times restart there
    window.first_seen.extend([now] * (len(original) - len(window.first_seen)))
    previous = window.cut
    unchanged = previous is not None and previous <= len(original) and \
        original[previous - 1] == window.last_evicted
    if previous is not None and not unchanged:
        previous = None  # the client edited what we had cut: start over rather than cut blindly
        window.cut, window.last_evicted, window.headlines, window.block = None, None, [], None
    if window.block and not window.block_tokens:
        window.block_tokens = count_text(window.block)  # e.g. restored after a restart
    block_tokens = window.block_tokens if window.block else 0
    eviction = choose_cut(forwarded, count, previous, fixed_tokens + block_tokens, budget_tokens,
                          max(0, low_water_tokens - summary_tokens))
    evicted_now: list[Evicted] = []
    if eviction.cut > eviction.new_from:
        for start, stop in exchanges(original, eviction.new_from, eviction.cut):
            entry = headline(original[start:stop], window.first_seen[start], count)
            window.headlines.append(entry)
            evicted_now.append((entry, original[start:stop]))
        window.block = render(window.headlines, now, summary_tokens, count_text) if summary else None
        window.block_tokens = count_text(window.block) if window.block else 0
        window.cut, window.last_evicted = eviction.cut, original[eviction.cut - 1]
    if window.cut is None or window.cut <= eviction.head_end:
        return original, forwarded, evicted_now
    anchor = anchor_for(original, eviction.head_end, window.cut)
    kept_anchor = [anchor] if anchor is not None else []

    def assemble(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [*messages[:eviction.head_end], *(messages[i] for i in kept_anchor), *messages[window.cut:]]

    return assemble(original), assemble(forwarded), evicted_now
