"""Layer 3: the sliding window. Whole exchanges leave the forwarded history, oldest first, in batches.

The cut is remembered per session: later requests drop exactly the same prefix, so the forwarded
history grows append-only between batches and the provider's prompt cache keeps working. Never cut:
the system prompt, the task statement (the opening user messages, after any assistant greeting), a tool
call apart from its results, the `keep_recent` newest results, or the exchange in progress. Text-protocol
agents send tool output back as user messages (observations): an exchange there is a command and its
output, and only a user's own words anchor an exchange.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proxy.layers.auto_summary import Costs, Count, Headline, headline, render, shown_in_full
from proxy.layers.observations import task_end

if TYPE_CHECKING:
    from proxy.session_state import SessionState


Evicted = tuple[Headline, list[dict[str, Any]]]  # a headline and the exchange it stands for


@dataclass(frozen=True)
class Eviction:
    head_end: int  # messages[:head_end] are always kept (system prompt(s) + task statement)
    cut: int  # messages[head_end:cut] are evicted
    new_from: int  # start of the range evicted by this request (== cut when nothing new)


def head_end(messages: list[dict[str, Any]]) -> int:
    """Index after the system prompt(s) and the task statement, which are never evicted."""
    return task_end(messages)


Indexes = frozenset[int]  # positions of observations (user messages holding environment output)


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


def _starts_exchange(messages: list[dict[str, Any]], index: int, observed: Indexes) -> bool:
    """A user's own message starts an exchange; so does a command that follows an observation."""
    if messages[index].get("role") == "user":
        return index not in observed
    return messages[index].get("role") == "assistant" and index - 1 in observed


def in_progress_start(messages: list[dict[str, Any]], head: int, observed: Indexes = frozenset()) -> int:
    """Start of the exchange in progress: the last user message after the task, else the last turn."""
    for index in range(len(messages) - 1, head - 1, -1):
        if messages[index].get("role") == "user" and index not in observed:
            return index
    return in_progress_turn(messages, head)


def exchanges(messages: list[dict[str, Any]], start: int, stop: int,
              observed: Indexes = frozenset()) -> list[tuple[int, int]]:
    """Split [start, stop) into exchanges: a new one at every user message (at every turn if none)."""
    boundaries = [i for i in range(start, stop) if _starts_exchange(messages, i, observed)]
    if not boundaries or boundaries[0] != start:
        boundaries = [start, *boundaries]
    if len(boundaries) == 1 and stop - start > 1:  # no user turns (pure tool loops): split at turns
        boundaries = [c for c in valid_cuts(messages, start, stop - 1) if c < stop] or [start]
    ends = [*boundaries[1:], stop]
    return [(a, b) for a, b in zip(boundaries, ends, strict=True) if a < b]


def anchor_for(messages: list[dict[str, Any]], head: int, cut: int,
               observed: Indexes = frozenset()) -> int | None:
    """A cut inside an exchange keeps that exchange's user message (the request being worked on)."""
    if cut >= len(messages) or (messages[cut].get("role") == "user" and cut not in observed):
        return None
    for index in range(cut - 1, head - 1, -1):
        if messages[index].get("role") == "user" and index not in observed:
            return index
    return None


def anchors_from(messages: list[dict[str, Any]], head: int, start: int,
                 observed: Indexes = frozenset()) -> list[int | None]:
    """`anchor_for(messages, head, at, observed)` for every `at` from `start` to `len(messages)`, in one
    pass (a walk over candidate cuts asks for each: one backward search apiece made it quadratic)."""
    last: int | None = None
    for index in range(head, start):
        if messages[index].get("role") == "user" and index not in observed:
            last = index
    anchors: list[int | None] = []
    for at in range(start, len(messages)):
        if messages[at].get("role") == "user" and at not in observed:
            anchors.append(None)  # (a cut at a user's message keeps it: no anchor)
            last = at if at >= head else None
        else:
            anchors.append(last)
    anchors.append(None)  # (nothing past the end)
    return anchors


def choose_cut(messages: list[dict[str, Any]], count: Count, previous_cut: int | None, fixed_tokens: int,
               budget_tokens: int, low_water_tokens: int, observed: Indexes = frozenset(),
               keep_from: int | None = None, limit_tokens: int | None = None,
               batch_above: int | None = None, kept_tokens: int | None = None) -> Eviction:
    """Keep the previous cut while the history fits; else evict one batch down to the low-water mark.

    Whole exchanges go first. Only if the exchange in progress alone is still over the budget (long
    tool loops after one user message) are its older turns evicted too, keeping its user message.
    `fixed_tokens` is what is forwarded besides the messages (tools, injected blocks); nothing from
    `keep_from` on (the turns holding the newest results) is evicted. A batch that would free little is
    not made while the history is under `limit_tokens` (where the budget gate starts pruning).
    `batch_above`: the cache breaks in this request anyway, so a batch is made from this level on (and
    however little it frees). `kept_tokens`: what is forwarded under the previous cut (`fixed_tokens` and
    the `kept_view` messages), when the caller has summed it already.
    """
    head = head_end(messages)
    cut = previous_cut if previous_cut is not None and head <= previous_cut <= len(messages) else head

    def anchored(at: int) -> int:
        anchor = anchor_for(messages, head, at, observed)
        return count(messages[anchor]) if anchor is not None else 0

    trigger = budget_tokens if batch_above is None else min(batch_above, budget_tokens)
    if kept_tokens is not None and kept_tokens <= trigger:  # (most requests: the caller's sum, no walk)
        return Eviction(head, cut, cut)
    base = fixed_tokens + sum(map(count, messages[:head]))
    kept = before = base + sum(map(count, messages[cut:])) + anchored(cut)
    if kept <= trigger:  # (every request between batches: one sum, no table)
        return Eviction(head, cut, cut)

    # suffix[i]: tokens of messages[i:], for i from the cut on (nothing before it is looked at again)
    suffix = [0] * (len(messages) + 1)
    for index in range(len(messages) - 1, cut - 1, -1):
        suffix[index] = suffix[index + 1] + count(messages[index])
    anchors = anchors_from(messages, head, cut, observed)

    def kept_at(at: int) -> int:
        anchor = anchors[at - cut]
        return base + suffix[at] + (count(messages[anchor]) if anchor is not None else 0)
    protect_from = in_progress_start(messages, head, observed)
    limit = len(messages) if keep_from is None else keep_from
    protect_from = min(protect_from, limit)
    best = cut
    for candidate in [c for c in valid_cuts(messages, cut, protect_from) if cut < c <= protect_from]:
        best, kept = candidate, kept_at(candidate)
        if kept <= low_water_tokens:
            return Eviction(head, best, cut)
    # Still over: older turns of the exchange in progress go too (its user message stays); the newest
    # results only when keeping them would take the history where the gate refuses.
    last_turns = [min(in_progress_turn(messages, head), limit), in_progress_turn(messages, head)]
    for last_turn, allowed in zip(last_turns, [trigger, limit_tokens or budget_tokens], strict=True):
        if kept <= allowed:
            break
        for candidate in [c for c in valid_cuts(messages, best, last_turn) if best < c <= last_turn]:
            best, kept = candidate, kept_at(candidate)
            if kept <= low_water_tokens:
                break
    if batch_above is None and before <= (limit_tokens or budget_tokens) \
            and before - kept < (budget_tokens - low_water_tokens) // 2:
        # What may go (not the head, not the newest results) frees less than half a batch: a cache break
        # for little, and another one soon. The budget gate prunes or refuses nearer the real window.
        return Eviction(head, cut, cut)
    return Eviction(head, best, cut)


def first_batch_floor(messages: list[dict[str, Any]], found: list[tuple[int, Any]], count: Count,
                      over_tokens: int, low_water_tokens: int, keep_recent: int,
                      total: int | None = None, results_total: int | None = None) -> int:
    """Where a first batch (no cut yet) certainly cuts at least, or the head when it may not cut at all.

    Counting every result at nothing (whatever layer 1 or masking would make of it, it is at least that)
    and everything else exactly: when even that is over `over_tokens` (the budget, and where the gate
    prunes), a batch is certain, and it passes every cut where the rest is still above the low-water
    mark. So the messages before that need no summary and no placeholder: they leave in this request.
    `total`, `results_total`: the messages' counts summed, and the results', when the caller has them."""
    head = head_end(messages)
    # The common case first, two sums: no batch is certain (every request of a history that is over the
    # budget only until layer 1 has summarized it).
    whole = total if total is not None else sum(map(count, messages))
    if results_total is None:
        results_total = sum(count(messages[index]) for index, _ in found)
    if whole - results_total <= over_tokens:
        return head
    results = {index for index, _ in found}
    least = [0 if index in results else count(message) for index, message in enumerate(messages)]
    observed = frozenset(i for i in results if messages[i].get("role") == "user")
    protect_from = in_progress_start(messages, head, observed)
    newest = [index for index, _ in found[-keep_recent:]] if keep_recent else []
    if newest:
        protect_from = min(protect_from, turn_start(messages, newest[0]))
    kept = sum(least)
    floor = head
    for candidate in valid_cuts(messages, head, protect_from):
        if candidate <= head:
            continue
        kept -= sum(least[floor:candidate])
        floor = candidate
        if kept <= low_water_tokens:
            break
    return floor


def in_progress_turn(messages: list[dict[str, Any]], head: int) -> int:
    """Start of the newest turn (the last place history may be cut at all)."""
    cuts = valid_cuts(messages, head, len(messages))
    return cuts[-1] if cuts else len(messages)


def turn_start(messages: list[dict[str, Any]], index: int) -> int:
    """The assistant turn a result at `index` answers (where a cut keeping that result must stop)."""
    for position in range(index, -1, -1):
        if messages[position].get("role") == "assistant":
            return position
    return index


def leading_system(messages: list[dict[str, Any]]) -> int:
    index = 0
    while index < len(messages) and messages[index].get("role") in ("system", "developer"):
        index += 1
    return index


def _is_among(outputs: frozenset[int], message: dict[str, Any]) -> bool:
    return id(message) in outputs


def sticky_cut(original: list[dict[str, Any]], state: SessionState, count_text: Callable[[str], int],
               now: float) -> int | None:
    """The session's cut if it still applies to this history (else forget it and its summary)."""
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
    return previous


def kept_view(messages: list[dict[str, Any]], cut: int | None, observed: Indexes = frozenset()) -> list[int]:
    """Indexes of `messages` forwarded under `cut`: the head, the anchor of a cut exchange, the rest."""
    head = head_end(messages)
    if cut is None or cut <= head:
        return list(range(len(messages)))
    anchor = anchor_for(messages, head, cut, observed)
    return [*range(head), *([anchor] if anchor is not None else []), *range(cut, len(messages))]


Keep = Callable[[int, int], dict[int, str]]  # stores an evicted range's results: index -> read-back handle


def slide(original: list[dict[str, Any]], forwarded: list[dict[str, Any]], state: SessionState,
          count: Count, count_text: Callable[[str], int], *, budget_tokens: int, low_water_tokens: int,
          summary_tokens: int, summary: bool, fixed_tokens: int, now: float,
          observed: Indexes = frozenset(), keep_from: int | None = None,
          keep: Keep | None = None, limit_tokens: int | None = None, batch_above: int | None = None,
          kept_tokens: int | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[Evicted]]:
    """Apply the sticky cut (evicting a new batch if needed) to both index-aligned lists.

    Returns the new (original, forwarded) lists, aligned, and what this request newly evicted. The
    auto-summary block is rendered into the session state (when `summary`); assembly places it. `keep`
    stores what a new batch evicts so it can be read back, and names its handles in the headlines.
    `kept_tokens`: what `forwarded` costs under the session's cut (choose_cut), when the caller has it.
    """
    window = state.window
    previous = sticky_cut(original, state, count_text, now)
    block_tokens = window.block_tokens if window.block else 0
    eviction = choose_cut(forwarded, count, previous, fixed_tokens + block_tokens, budget_tokens,
                          max(0, low_water_tokens - summary_tokens), observed, keep_from, limit_tokens,
                          batch_above, kept_tokens=kept_tokens)
    evicted_now: list[Evicted] = []
    if eviction.cut > eviction.new_from:
        spans = exchanges(original, eviction.new_from, eviction.cut, observed)
        kept = [keep(start, stop) if keep else {} for start, stop in spans]

        def headline_of(span: tuple[int, int], handles: dict[int, str], details: bool) -> Headline:
            start, stop = span
            outputs = frozenset(id(original[i]) for i in range(start, stop) if i in observed)
            return headline(original[start:stop], window.first_seen[start], count,
                            handles={i - start: h for i, h in handles.items()},
                            observation=functools.partial(_is_among, outputs), details=details)
        # Only the entries the block may show in full have their results searched for ids, paths and
        # errors: a first batch evicts hundreds, most of them shown as a bare line or not at all.
        # (the lines measured to decide are the lines rendered, but for those given details; every entry
        # measured stays referenced meanwhile, so no id in `costs` is another object's)
        costs: Costs = {}
        plain = [headline_of(span, handles, False) for span, handles in zip(spans, kept, strict=True)]
        shown = shown_in_full([*window.headlines, *plain], now, summary_tokens, count_text, costs)
        entries = [headline_of(span, handles, True) if in_full else entry for span, handles, entry, in_full
                   in zip(spans, kept, plain, shown[len(window.headlines):], strict=True)]
        evicted_now = [(entry, original[a:b]) for entry, (a, b) in zip(entries, spans, strict=True)]
        window.headlines.extend(entries)
        window.block = render(window.headlines, now, summary_tokens, count_text, costs) if summary else None
        window.block_tokens = count_text(window.block) if window.block else 0
        window.cut, window.last_evicted = eviction.cut, original[eviction.cut - 1]
    if window.cut is None or window.cut <= eviction.head_end:
        return original, forwarded, evicted_now
    view = kept_view(original, window.cut, observed)
    return [original[i] for i in view], [forwarded[i] for i in view], evicted_now


def masking_target(forwarded: list[dict[str, Any]], savings: dict[int, int], cut: int | None, total: int,
                   count: Callable[[dict[str, Any]], int], budget_tokens: int,
                   low_water: int, summary_tokens: int, fixed: int, observed: frozenset[int],
                   keep_from: int | None, limit: int | None, batch_above: int | None = None) -> int | None:
    """How far to mask now, or None. Masking keeps the conversation (every assistant and user message)
    and breaks the cache only from the first masked result on. If it alone reaches the low-water mark,
    mask down to it; else mask all it may and evict in the same request (one cache break; the batch
    then evicts fewer exchanges, since those it keeps are masked) — unless the two together would free
    less than half a batch while the history is below where the gate prunes: a cache break for little
    (when the cache breaks anyway, `batch_above` is set and that rule does not apply)."""
    if total - sum(savings.values()) <= low_water:
        return low_water
    if batch_above is not None:
        return 0
    masked = {id(forwarded[i]): count(forwarded[i]) - saving for i, saving in savings.items()}

    def count_masked(message: dict[str, Any]) -> int:
        return masked.get(id(message)) or count(message)

    plan = choose_cut(forwarded, count_masked, cut, fixed, budget_tokens,
                             max(0, low_water - summary_tokens), observed, keep_from, limit)
    after = fixed + sum(count_masked(forwarded[i]) for i in kept_view(forwarded, plan.cut, observed))
    if total - after < (budget_tokens - low_water) // 2 and (limit is None or total <= limit):
        return None
    return 0
