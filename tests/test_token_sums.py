"""A resent history's total extended from an earlier list's (proxy/token_sums.py): always the total a
full sum gives, and only the new messages summed when the history is resent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import token_sums
from proxy.token_sums import Summed, extended_total
from proxy.tokens import REPLY_PRIMING, TokenCounter

Message = dict[str, Any]


def weight(message: Message) -> int:
    return len(message["content"]) + 1


def total_of(messages: list[Message]) -> int:
    return sum(map(weight, messages))


def recording(asked: list[int]) -> Callable[[list[Message]], int]:
    """`total_of`, noting how many messages each call was asked to sum."""
    def spy(messages: list[Message]) -> int:
        asked.append(len(messages))
        return total_of(messages)
    return spy


# A pool of message objects; each step builds a list from it: the previous list extended, cut, edited in
# place after it was summed, rebuilt with a different object at some place, or something else.
steps = st.lists(st.tuples(st.sampled_from(["extend", "cut", "edit_after", "swap", "copy", "other"]),
                           st.integers(min_value=0, max_value=200)), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(steps, st.integers(min_value=1, max_value=140), st.sampled_from([1, token_sums.MIN_LENGTH]))
def test_the_total_is_always_what_a_full_sum_gives(script: list[tuple[str, int]], start: int,
                                                   min_length: int) -> None:
    pool = [{"content": "x" * (n % 17)} for n in range(400)]
    recent: Summed = []
    current = pool[:start]
    for action, n in script:
        if action == "extend":
            current = current + pool[len(current):len(current) + n % 5 + 1]
        elif action == "cut":
            current = current[:max(1, len(current) - n % 7)]
        elif action == "swap":  # the same last object, another one somewhere before it
            current = list(current)
            current[n % len(current) if len(current) > 1 else 0] = {"content": "swapped" * (n % 3 + 1)}
        elif action == "copy":  # an equal message, another object (a copy, or decoded anew)
            current = list(current)
            current[n % len(current)] = dict(current[n % len(current)])
        elif action == "other":
            current = pool[n:n + 70]
        got = extended_total(recent, current, total_of, min_length)
        assert got == total_of(current)
        if action == "edit_after":  # a list changed in place after its total was taken
            current[n % len(current)] = {"content": "edited in place" * 3}
            assert extended_total(recent, current, total_of, min_length) == total_of(current)


def test_a_resent_history_sums_only_what_is_new() -> None:
    asked: list[int] = []
    spy = recording(asked)

    history = [{"content": f"m{n}"} for n in range(200)]
    recent: Summed = []
    assert extended_total(recent, history[:100], spy) == total_of(history[:100])
    assert extended_total(recent, history[:102], spy) == total_of(history[:102])
    assert extended_total(recent, history[:102], spy) == total_of(history[:102])
    assert asked == [100, 2]  # the second: its two new messages; the third: nothing
    short = history[:token_sums.MIN_LENGTH - 1]
    extended_total(recent, short, spy)
    assert asked[-1] == len(short)  # (a short list is summed outright)
    extended_total(recent, short, spy, min_length=1)
    extended_total(recent, history[:token_sums.MIN_LENGTH], spy, min_length=1)
    assert asked[-2:] == [len(short), 1]  # unless told otherwise (a walk a message): then only the new one


def test_the_same_list_asked_for_again_keeps_the_others_remembered() -> None:
    """A request asks for one list's total from several steps: asked again, that list moves to the front
    instead of taking another place, so the session's other lists stay remembered."""
    asked: list[int] = []
    spy = recording(asked)

    pool = [{"content": f"m{n}"} for n in range(600)]
    lists = [pool[k * 100:k * 100 + 80] for k in range(token_sums.RECENT)]
    recent: Summed = []
    for listed in lists:
        extended_total(recent, listed, spy)
    for _ in range(token_sums.RECENT):
        assert extended_total(recent, lists[-1], spy) == total_of(lists[-1])
    asked.clear()
    first = lists[0] + pool[80:82]
    assert extended_total(recent, first, spy) == total_of(first)
    assert asked == [2]  # the oldest list is still remembered: only its two new messages summed


def test_the_counter_carries_a_sessions_totals_across_requests() -> None:
    """Through TokenCounter.messages as the pipeline calls it: a scope per request, the session's counts
    and sums carried; a resent history's total is what counting it afresh gives."""
    counter, fresh = TokenCounter(), TokenCounter()
    counted: dict[str, Any] = {}
    sums: dict[str, Summed] = {}
    history = [{"role": "user" if n % 2 else "assistant", "content": f"turn {n} " * (n % 9 + 1)}
               for n in range(150)]
    for end in (90, 92, 95, 95, 120):
        with counter.request_scope(counted, sums):
            got = counter.messages(history[:end], "gpt-4o")
        assert got == fresh.messages(history[:end], "gpt-4o") > REPLY_PRIMING
    assert len(sums["gpt-4o"]) == token_sums.RECENT


def test_a_history_whose_newest_message_is_edited_every_turn_sums_only_that_and_what_is_new() -> None:
    """Anthropic's clients move their cache marker to the newest message every turn: the previous last
    message comes back as another object. Its old count comes off, its new one and the new ones go on."""
    asked: list[int] = []
    spy = recording(asked)

    history = [{"content": f"m{n}"} for n in range(100)]
    recent: Summed = []
    for turn in range(3):
        marked = [*history[:-1], {**history[-1], "content": history[-1]["content"] + " (marked)"}]
        assert extended_total(recent, marked, spy) == total_of(marked)
        history = [*history, {"content": f"turn {turn}"}]
    assert asked == [100, 1, 2, 1, 2]  # the first whole; then the previous last message, and the two after
