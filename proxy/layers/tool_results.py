"""Layer 1: large tool results become labelled summaries; older ones can be pruned to placeholders.

Every decision is recorded in the session state with the verbatim original, and re-applied identically
on every later request, so the forwarded prefix stays byte-stable for prompt caching.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from proxy import heavy
from proxy.layers.observations import Observations, handle_for, task_end
from proxy.session_state import SessionState
from proxy.state import StateStore
from proxy.summarize import gist, summarize
from proxy.wire.same_objects import same_objects, starts_with

SUMMARY = "summary"
PLACEHOLDER = "placeholder"
EVICTED = "evicted"  # left the prompt with its exchange; stored only to be read back


def summary_text(handle: str, tool: str | None, content: str, original_tokens: int,
                 body: str | None = None, arguments: str | None = None) -> str:
    """The labelled replacement. `body` is a model-written summary when one was prepared; `arguments`
    (the call's JSON arguments) let the summary keep the lines the call pointed at."""
    lines = content.count("\n") + 1
    label = f" from {tool}" if tool else ""
    return (f"[ctxproxy summary of tool result call_id={handle}{label}: original {original_tokens} tokens, "
            f"{lines} lines. This is a summary, not the output. Get the exact original with "
            f'read_tool_result(call_id="{handle}"), or a range with start_line/end_line.]\n'
            f"{body if body is not None else _body(content, tool, arguments)}")


def _body(content: str, tool: str | None, arguments: str | None) -> str:
    return heavy.call(summarize, content, tool_name=tool, arguments=arguments)


def replacement(handle: str, tool: str | None, content: str, count_text: Callable[[str], int],
                arguments: str | None = None) -> str | None:
    """The labelled summary layer 1 applies to `content`, or None when it would not be clearly smaller
    (at most half the original's tokens): then the original stays."""
    original_tokens = count_text(content)
    text = summary_text(handle, tool, content, original_tokens, arguments=arguments)
    return text if count_text(text) * 2 <= original_tokens else None


def placeholder_text(handle: str, content: str, original_tokens: int) -> str:
    return f"[summarized: call_id={handle}] {gist(content)}; {original_tokens} tokens via read_tool_result"


def results(messages: list[dict[str, Any]], observations: Observations | None,
            start: int = 0) -> Iterator[tuple[int, tuple[str, str]]]:
    """(index, (call id, content)) of every tool result, and of every observation a text-protocol agent
    sent as a user message after the task (its call id derived from its content)."""
    first_free = task_end(messages) if observations is not None else len(messages)
    for index in range(start, len(messages)):
        message = messages[index]
        content = message.get("content")
        if not isinstance(content, str):
            continue
        role = message.get("role")
        if role == "tool":
            yield index, (str(message.get("tool_call_id") or ""), content)
        elif role == "user" and observations is not None and index >= first_free \
                and observations.is_observation(message) and content:
            yield index, (handle_for(content), content)


Found = tuple[int, tuple[str, str]]  # (index, (call id, content)) of one result


def found_in(messages: list[dict[str, Any]], observations: Observations | None,
             carried: dict[str, Any] | None) -> list[Found]:
    """`results` as a list, remembered in `carried` (a session's) from request to request: a resent
    history is the same message objects (wire/resent.py), so only what follows the part it shares with
    the previous request is walked. Without `carried`, a plain walk."""
    if carried is None:
        return list(results(messages, observations))
    first_free = task_end(messages) if observations is not None else 0
    memo = carried.get("results")
    shared = 0
    if memo is not None:
        previous, seen_observations, seen_first_free, found = memo
        if previous is messages and seen_observations is observations:
            return found
        if seen_observations is observations and seen_first_free == first_free:
            shared = len(previous) if starts_with(messages, previous) else same_objects(previous, messages)
            found = found[:bisect.bisect_left(found, shared, key=operator.itemgetter(0))]
    if not shared:
        found = []
    found = [*found, *results(messages, observations, shared)]
    carried["results"] = (messages, observations, first_free, found)
    carried["shared"] = (memo[0] if memo is not None else None, shared)  # (for summarize_large)
    return found


def observed_in(messages: list[dict[str, Any]], found: list[Found],
                carried: dict[str, Any]) -> frozenset[int]:
    """Where the observations are (results a text-protocol agent sends as user messages), carried per
    session like `found` itself (whose entries found_in keeps, the very tuples, only for the same message
    objects): a request adds only its new entries'."""
    return _extended(carried, "observed", found, lambda entries: frozenset(
        index for index, _ in entries if messages[index].get("role") == "user"))


def calls_in(messages: list[dict[str, Any]],
             carried: dict[str, Any] | None) -> dict[str, tuple[str, str | None]]:
    """`calls_by_id`, carried per session: a result's tool is looked up on the turns that summarize new
    output, which would otherwise walk the whole history for one name."""
    return calls_by_id(messages) if carried is None else _extended(carried, "calls", messages, calls_by_id)


Carried = TypeVar("Carried", frozenset[int], dict[str, tuple[str, str | None]])  # (joined with |)


def _extended(carried: dict[str, Any], key: str, items: list[Any],
              build: Callable[[list[Any]], Carried]) -> Carried:
    """`build(items)`, remembered in `carried[key]`: when `items` starts with the very objects it was last
    built from, the earlier value `|` what the items past them build (sets: the union; dicts: later keys
    win, as one build over all would give). The items are kept as a copy: a list changed in place later
    cannot mislead."""
    memo = carried.get(key)
    if memo is not None and starts_with(items, memo[0]):
        earlier, value = memo
        if len(items) > len(earlier):
            value = value | build(items[len(earlier):])
    else:
        value = build(items)
    carried[key] = (list(items), value)
    return value


def calls_by_id(messages: list[dict[str, Any]]) -> dict[str, tuple[str, str | None]]:
    """call id -> (tool name, JSON arguments) of every assistant tool call."""
    found: dict[str, tuple[str, str | None]] = {}
    for message in messages:
        for call in message.get("tool_calls") or ():
            if isinstance(call, dict) and isinstance(call.get("id"), str):
                function = call.get("function") or {}
                arguments = function.get("arguments")
                found[call["id"]] = (str(function.get("name") or ""),
                                     arguments if isinstance(arguments, str) else None)
    return found


Waiting = tuple[int, tuple[str, str], tuple[str, str], str | None]  # index, key, (handle, summary), tool


def summarize_large(messages: list[dict[str, Any]], state: SessionState, store: StateStore,
                    count: Callable[[dict[str, Any]], int], threshold_tokens: int,
                    enabled: bool, tools_tokens: int = 0,
                    prepared: dict[tuple[str, str], str] | None = None,
                    observations: Observations | None = None, force: bool = False,
                    carried: dict[str, Any] | None = None, skip_before: int = 0) -> list[dict[str, Any]]:
    """Re-apply every earlier decision, and summarize large results when it pays.

    A result sent verbatim before is in the provider's cache: replacing it later re-bills everything after
    it. And until the session's first replacement the internal tools are not offered; offering them
    changes the tools list, which leads the prompt, so every cached token is billed again once. So a
    summary (computed once, kept in `state.pending`) waits until it pays: a new result is replaced at once
    when the tools are offered already; the first replacement waits until the summaries together save
    more than re-billing costs; older ones wait for the next eviction batch (`force`), which re-bills
    the prefix anyway. `tools_tokens` is the client's tools schema. Results before `skip_before` leave
    the prompt in this request (window.first_batch_floor): no decision is made for them.
    """
    out = messages
    if not enabled and not state.by_key:
        return out  # nothing to decide and no earlier decision to re-apply: no walk over the history
    calls: dict[str, tuple[str, str | None]] | None = None
    found = found_in(messages, observations, carried)
    settings = (enabled, threshold_tokens, observations)
    out, waiting, start = _carried_walk(messages, found, state, carried, settings)
    for index, key in found[start:]:
        stored = state.lookup(*key)
        if stored is None:
            message = messages[index]
            if index < skip_before or not enabled or key in state.kept or count(message) <= threshold_tokens:
                continue
            calls = calls if calls is not None else calls_in(messages, carried)
            tool, arguments = calls.get(key[0], (None, None))  # (an observation's obs- id names no call)
            waiting_summary = state.pending.get(key)
            if waiting_summary is None:
                handle = state.new_handle(key[0])
                summary = _summary_for(handle, key, message, count, tool, arguments, prepared)
                if summary is None:
                    state.kept.add(key)  # not clearly smaller: decided once, sticky
                    continue
                waiting_summary = state.pending[key] = (handle, summary)
            waiting.append((index, key, waiting_summary, tool))
            continue
        if stored.kind == EVICTED:
            continue  # kept for read-back only; its message is out of the prompt
        if out is messages:
            out = list(messages)
        out[index] = replaced(state, messages[index], stored.replacement)
    new_from = state.history_len  # results from here on were not sent before: no cached copy to lose
    if force or (waiting and not state.internal_tools_offered and _pays_off(messages, waiting, count,
                                                                            tools_tokens, new_from)):
        apply = waiting
    else:  # an older one waits for the next batch that re-bills the prefix anyway (an eviction)
        apply = [w for w in waiting if w[0] >= new_from] if state.internal_tools_offered else []
    for index, key, (handle, summary), tool in apply:
        state.pending.pop(key, None)  # (the same result may occur twice: one decision for both)
        stored = state.lookup(*key) or store.record(state, key[0], key[1], tool, summary, SUMMARY,
                                                    handle=handle)
        if out is messages:
            out = list(messages)
        out[index] = replaced(state, messages[index], stored.replacement)
    # (kept unless a result was skipped: a floor before the first result, the head of a history no batch
    # is certain for, skips nothing, and the walk is the one a request with no floor makes)
    if carried is not None and (not found or found[0][0] >= skip_before):
        applied = {id(w) for w in apply}
        carried["layer1"] = (messages, out, state.recorded, settings,
                             [w for w in waiting if id(w) not in applied])
    return out


def _carried_walk(messages: list[dict[str, Any]], found: list[Found], state: SessionState,
                  carried: dict[str, Any] | None,
                  settings: tuple[Any, ...]) -> tuple[list[dict[str, Any]], list[Waiting], int]:
    """What summarize_large's walk gave for the messages this request shares with the previous one:
    (the output so far, the results still waiting, where in `found` to go on). Valid while no decision
    was recorded since (every replacement of the shared part is then what it was) under the same
    settings; else nothing carried: (messages, [], 0)."""
    memo = carried.get("layer1") if carried is not None else None
    previous, shared = carried.get("shared", (None, 0)) if carried is not None else (None, 0)
    if memo is None or memo[0] is not previous or not shared or memo[2] != state.recorded \
            or memo[3] != settings:
        return messages, [], 0
    _, out_before, _, _, waiting_before = memo
    out = messages if out_before is previous else [*out_before[:shared], *messages[shared:]]
    waiting = [w for w in waiting_before if w[0] < shared and w[1] in state.pending]
    return out, waiting, bisect.bisect_left(found, shared, key=operator.itemgetter(0))


def replaced(state: SessionState, message: dict[str, Any], content: str) -> dict[str, Any]:
    """`message` with `content` instead of its own: the very object the session's previous request got
    when it is the same message and text, so whatever is keyed by it (token counts) carries over."""
    hit = state.rewrites.get(id(message))
    if hit is not None and hit[0] is message and hit[1]["content"] is content:
        return hit[1]
    new = {**message, "content": content}
    state.rewrites[id(message)] = (message, new)  # (holding `message`: its id is not reused meanwhile)
    return new


def _summary_for(handle: str, key: tuple[str, str], message: dict[str, Any],
                 count: Callable[[dict[str, Any]], int], tool: str | None, arguments: str | None,
                 prepared: dict[tuple[str, str], str] | None) -> str | None:
    """The labelled summary, or None when it would not be at most half the original."""
    original = count(message)
    summary = summary_text(handle, tool, key[1], original, (prepared or {}).get(key), arguments)
    return summary if count({**message, "content": summary}) * 2 <= original else None


# Later turns are estimated from the turns so far (a session that ran N turns is likely to run N more).
CACHED_SHARE_LOST = 0.9
MIN_LATER_TURNS, MAX_LATER_TURNS = 2, 30


def _pays_off(messages: list[dict[str, Any]], waiting: list[Waiting], count: Callable[[dict[str, Any]], int],
              tools_tokens: int, new_from: int) -> bool:
    """Offering the tools re-bills the cached prefix (~10x its cached price, once). A summary saves its
    tokens at full price on this request if its result is new, and a tenth of them on every later one.

    Asked every request while a first summary waits, so neither walk goes further than it must: the
    turns are counted up to the most that counts, the prefix summed until it outweighs the benefit."""
    assistant_turns = (m for m in messages if m.get("role") == "assistant")
    later = max(sum(1 for _ in itertools.islice(assistant_turns, MAX_LATER_TURNS)), MIN_LATER_TURNS)
    benefit = 0.0
    for index, _, (_, summary), _ in waiting:
        saved = count(messages[index]) - count({**messages[index], "content": summary})
        benefit += saved * ((1.0 if index >= new_from else 0.0) + 0.1 * later)
    if not new_from:
        return benefit >= 0
    cached = tools_tokens
    for message in itertools.islice(messages, new_from):
        if CACHED_SHARE_LOST * cached > benefit:
            return False  # (the sum only grows)
        cached += count(message)
    return benefit >= CACHED_SHARE_LOST * cached


Pending = list[tuple[str, str, str | None]]  # (call_id, content, tool name)


def pending_summaries(messages: list[dict[str, Any]], state: SessionState,
                      count: Callable[[dict[str, Any]], int], threshold_tokens: int,
                      observations: Observations | None = None) -> Pending:
    """Results that would be summarized now and have no decision yet: (call_id, content, tool)."""
    found: Pending = []
    calls: dict[str, tuple[str, str | None]] | None = None
    for index, key in results(messages, observations):
        if state.lookup(*key) or key in state.kept or key in state.pending \
                or count(messages[index]) <= threshold_tokens:
            continue
        calls = calls if calls is not None else calls_by_id(messages)
        found.append((key[0], key[1], calls.get(key[0], (None, None))[0]))
    return found


PLACEHOLDER_TOKENS = 48  # about what one placeholder costs (a handle, a gist, a size)


def maskable(original: list[dict[str, Any]], forwarded: list[dict[str, Any]], state: SessionState,
             count: Callable[[dict[str, Any]], int], keep_recent: int, *, start: int = 0,
             observations: Observations | None = None) -> dict[int, int]:
    """Indexes `prune` could mask, each with about how many tokens it would take off (an estimate, for
    choosing between masking and eviction before either changes anything)."""
    found = list(results(original, observations, start))
    candidates = found[:-keep_recent] if keep_recent else found
    savings: dict[int, int] = {}
    for index, key in candidates:
        stored = state.lookup(*key)
        if stored is not None and stored.kind in (PLACEHOLDER, EVICTED):
            continue
        tokens = count(forwarded[index])
        if tokens >= 2 * PLACEHOLDER_TOKENS:  # (prune skips results a placeholder would not halve)
            savings[index] = tokens - PLACEHOLDER_TOKENS
    return savings


def prune(original: list[dict[str, Any]], forwarded: list[dict[str, Any]], state: SessionState,
          store: StateStore, count: Callable[[dict[str, Any]], int], total: int, target: int,
          keep_recent: int, protected: frozenset[str] = frozenset(), *, start: int = 0,
          observations: Observations | None = None) -> tuple[list[dict[str, Any]], int]:
    """Turn older results into placeholders, oldest first, in one batch down to `target` tokens.

    `original` and `forwarded` are index-aligned (this layer never adds or removes messages); only
    messages from `start` on are considered. The `keep_recent` newest results stay as they are, and so do
    `protected` call ids (text the model just retrieved with read_tool_result is never summarized again).
    Observations of text-protocol agents count as results when `observations` is given.
    """
    found = [(i, key) for i, key in results(original, observations, start)
             if forwarded[i].get("tool_call_id") not in protected]
    candidates = found[:-keep_recent] if keep_recent else found
    everywhere: dict[tuple[str, str], list[int]] = {}
    for index, key in results(original, observations):
        everywhere.setdefault(key, []).append(index)
    out = forwarded
    calls: dict[str, tuple[str, str | None]] | None = None
    for index, (call_id, content) in candidates:
        if total <= target:
            break
        stored = state.lookup(call_id, content)
        if stored is not None and stored.kind == EVICTED:
            continue
        if stored is None or stored.kind != PLACEHOLDER:
            waiting = state.pending.get((call_id, content))
            handle = stored.handle if stored else waiting[0] if waiting else state.new_handle(call_id)
            placeholder = placeholder_text(handle, content, count(original[index]))
            if stored is None and len(placeholder) * 2 > len(content):
                continue  # too small to be worth a placeholder (and a cache break)
            state.pending.pop((call_id, content), None)
            calls = calls if calls is not None else calls_by_id(original)
            stored = store.record(state, call_id, content, calls.get(call_id, (None, None))[0], placeholder,
                                  PLACEHOLDER, handle=handle)
        # Every copy of the same result gets the same placeholder now, as later requests will give it.
        for position in everywhere.setdefault((call_id, content), [index]):
            if out[position].get("content") == stored.replacement or \
                    out[position].get("tool_call_id") in protected:
                continue  # masked before (or just now, where the same result came earlier)
            new_message = replaced(state, out[position], stored.replacement)
            total += count(new_message) - count(out[position])
            if out is forwarded:
                out = list(forwarded)
            out[position] = new_message
    return out, total
