"""The first sight of a long history (issue 14): the window's first batch skips what it certainly evicts —
no summary, no placeholder, no search of results for headline details never shown — and forwards exactly
what it would have forwarded doing all of that."""

from __future__ import annotations

import copy
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from proxy import pipeline, window_step
from proxy.errors import ContextLengthExceeded
from proxy.layers import auto_summary, tool_results, window
from proxy.layers.observations import for_policy
from proxy.policy import LoadedPolicy, Policy
from proxy.session import Session
from proxy.state import StateStore
from proxy.tokens import TokenCounter
from tests.strategies import CLIENT_TOOLS, long_conversation, request_prefixes

TOKENS = TokenCounter()
MODEL = "gpt-4o"


def clock() -> float:
    return 1_760_000_000.0


def policy(window_tokens: int, summary_tokens: int = 10_000) -> LoadedPolicy:
    # (no assembly deadline: a slow run must not skip a block in one of the runs compared)
    return LoadedPolicy("t", Policy.model_validate({
        "tool_results": {"threshold_tokens": 120}, "budget": {"max_input_tokens": window_tokens},
        "summary": {"max_tokens": summary_tokens}, "assembly": {"time_ms": 600_000}}), None)


Seen = tuple[pipeline.Outcome, str | None]  # what was forwarded, and the auto-summary block


def first_sight(messages: list[dict[str, Any]], loaded: LoadedPolicy) -> Seen:
    store = StateStore()
    context = pipeline.PipelineContext(loaded, Session("s1", "header"), "tenant-a", TOKENS, store, now=clock)
    outcome = pipeline.run(pipeline.Conversation(MODEL, copy.deepcopy(messages), CLIENT_TOOLS), context)
    return outcome, store.get("tenant-a", "s1").window.block


def without_shortcuts(messages: list[dict[str, Any]], loaded: LoadedPolicy) -> Seen:
    """The same request with every result decided and every headline searched in full."""
    with mock.patch.object(pipeline, "first_batch_floor", return_value=0), \
            mock.patch.object(window, "shown_in_full", lambda entries, *_: [True] * len(entries)):
        return first_sight(messages, loaded)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.data_too_large])
@given(messages=long_conversation(), window_tokens=st.sampled_from([1000, 2000, 4000, 8000]),
       summary_tokens=st.sampled_from([60, 400, 10_000]))
def test_a_first_batch_forwards_what_deciding_everything_would(
        messages: list[dict[str, Any]], window_tokens: int, summary_tokens: int) -> None:
    loaded = policy(window_tokens, summary_tokens)
    try:
        fast, fast_block = first_sight(messages, loaded)
    except Exception as refused:  # a refusal must be the same refusal
        try:
            without_shortcuts(messages, loaded)
        except Exception as also:
            assert type(also) is type(refused)
            return
        raise
    slow, slow_block = without_shortcuts(messages, loaded)
    assert fast.messages == slow.messages
    assert fast.tools == slow.tools and fast.tokens_after == slow.tokens_after and fast.gate == slow.gate
    assert fast_block == slow_block


def floor_of(messages: list[dict[str, Any]], loaded: LoadedPolicy) -> int:
    budget_tokens, low_water, limit = window_step.window_sizes(loaded.policy, MODEL)
    found = [(i, None) for i, m in enumerate(messages) if m["role"] == "tool"]
    return window.first_batch_floor(messages, found, lambda m: TOKENS.message(m, MODEL),
                                    max(budget_tokens, limit or 0), low_water, 3)


def long_history(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."},
                                      {"role": "user", "content": "fix the bug"}]
    for n in range(turns):
        thought = f"Step {n}: the failure in ord_{n} points at the parser; next I run it again. " * 4
        messages.append({"role": "assistant", "content": thought, "tool_calls": [
            {"id": f"call_{n}", "type": "function", "function": {"name": "run", "arguments": '{"x": 1}'}}]})
        lines = "\n".join(f"src/mod_{n}/file_{k}.py:{k}: ValueError in ord_{n}_{k}" for k in range(60))
        messages.append({"role": "tool", "tool_call_id": f"call_{n}", "content": lines})
    messages.append({"role": "user", "content": "and now?"})
    return messages


def test_a_long_first_sight_skips_what_it_evicts() -> None:
    messages = long_history(120)
    loaded = policy(8_000, summary_tokens=300)
    counted = mock.MagicMock(wraps=auto_summary._result_details)
    summarized = mock.MagicMock(wraps=tool_results.summarize)
    with mock.patch.object(auto_summary, "_result_details", counted), \
            mock.patch("proxy.layers.tool_results.summarize", summarized):
        outcome, block = first_sight(messages, loaded)
    floor = floor_of(messages, loaded)
    assert floor > 60 and len(outcome.evicted) > 100  # the floor is far in, most of the history leaves
    past_floor = sum(1 for i, m in enumerate(messages) if m["role"] == "tool" and i >= floor)
    assert summarized.call_count <= past_floor < 60  # only results past the floor were summarized (of 120)
    assert counted.call_count < 20  # only the newest headlines, which the block shows in full, searched
    slow, slow_block = without_shortcuts(messages, loaded)
    assert outcome.messages == slow.messages and block == slow_block


def reference_floor(messages: list[dict[str, Any]], found: list[tuple[int, Any]], over_tokens: int,
                    low_water_tokens: int, keep_recent: int) -> int:
    """window.first_batch_floor as a plain walk: every message counted (results at nothing), no shortcut."""
    head = window.head_end(messages)
    results = {index for index, _ in found}
    least = [0 if index in results else TOKENS.message(m, MODEL) for index, m in enumerate(messages)]
    if sum(least) <= over_tokens:
        return head
    observed = frozenset(i for i in results if messages[i].get("role") == "user")
    protect_from = window.in_progress_start(messages, head, observed)
    newest = [index for index, _ in found[-keep_recent:]] if keep_recent else []
    if newest:
        protect_from = min(protect_from, window.turn_start(messages, newest[0]))
    kept, floor = sum(least), head
    for candidate in window.valid_cuts(messages, head, protect_from):
        if candidate <= head:
            continue
        kept -= sum(least[floor:candidate])
        floor = candidate
        if kept <= low_water_tokens:
            break
    return floor


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.data_too_large])
@given(messages=long_conversation(), window_tokens=st.sampled_from([1000, 2000, 4000, 8000, 64000]))
def test_the_pipelines_first_batch_floor_is_the_plain_one(
        messages: list[dict[str, Any]], window_tokens: int) -> None:
    """The pipeline's first-batch floor settles the common case (the rest fits once results count nothing)
    from two sums; it must give what the plain walk over every message gives."""
    loaded = policy(window_tokens)
    store = StateStore()
    context = pipeline.PipelineContext(loaded, Session("s1", "header"), "tenant-a", TOKENS, store, now=clock)
    layer1 = loaded.policy.tool_results
    observations = for_policy(tuple(layer1.observation_patterns), layer1.threshold_tokens)
    with TOKENS.request_scope():
        fast = window_step.first_batch_floor(messages, observations, store.get("tenant-a", "s1"), context,
                                             MODEL)
    budget_tokens, low_water, limit = window_step.window_sizes(loaded.policy, MODEL)
    over = max(budget_tokens, limit or 0)
    plain = 0 if TOKENS.messages(messages, MODEL) <= over else reference_floor(
        messages, tool_results.found_in(messages, observations, None), over, low_water, layer1.keep_recent)
    event("within the budget" if not plain else "no batch certain" if plain == window.head_end(messages)
          else "a batch certain")
    assert fast == plain


def test_the_first_batch_floor_at_the_edge_of_the_budget() -> None:
    """Where the history less its results is the budget exactly, one token over or under it."""
    messages = long_history(40)
    results = [(i, None) for i, m in enumerate(messages) if m["role"] == "tool"]
    rest = sum(TOKENS.message(m, MODEL) for i, m in enumerate(messages) if m["role"] != "tool")
    for over in (rest - 1, rest, rest + 1):
        loaded = LoadedPolicy("t", Policy.model_validate({
            "budget": {"enabled": False}, "window": {"max_tokens": over}}), None)
        context = pipeline.PipelineContext(loaded, Session("s1", "header"), "tenant-a", TOKENS, StateStore(),
                                           now=clock)
        layer1 = loaded.policy.tool_results
        observations = for_policy(tuple(layer1.observation_patterns), layer1.threshold_tokens)
        with TOKENS.request_scope():
            fast = window_step.first_batch_floor(messages, observations,
                                                 context.store.get("tenant-a", "s1"), context, MODEL)
        _, low_water, _ = window_step.window_sizes(loaded.policy, MODEL)
        plain = reference_floor(messages, results, over, low_water, layer1.keep_recent)
        assert fast == plain
        assert (fast == window.head_end(messages)) == (over >= rest)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.data_too_large])
@given(messages=long_conversation(), window_tokens=st.sampled_from([1000, 2000, 4000, 8000]),
       masking=st.booleans())
def test_the_kept_total_handed_to_the_cut_choice_is_the_one_it_would_sum(
        messages: list[dict[str, Any]], window_tokens: int, masking: bool) -> None:
    """A session turn by turn: wherever the window hands choose_cut its own total of what the cut keeps,
    that total is exact (the fixed tokens and every kept_view message) and the cut is the one choose_cut
    chooses summing for itself."""
    # (layer 1 off: a batch is never masking first, so the totals handed over reach every batch)
    loaded = LoadedPolicy("t", Policy.model_validate({
        "tool_results": {"threshold_tokens": 120, "enabled": masking},
        "budget": {"max_input_tokens": window_tokens}}), None)
    context = pipeline.PipelineContext(loaded, Session("s1", "header"), "tenant-a", TOKENS, StateStore(),
                                       now=clock)
    choose_cut, hinted = window.choose_cut, []

    def checked(messages: list[dict[str, Any]], count: Any, previous: int | None, fixed: int, *args: Any,
                kept_tokens: int | None = None) -> window.Eviction:
        chosen = choose_cut(messages, count, previous, fixed, *args, kept_tokens=kept_tokens)
        if kept_tokens is not None:
            observed = args[2]  # (after the budget and the low-water mark)
            view = window.kept_view(messages, previous, observed)
            assert kept_tokens == fixed + sum(count(messages[i]) for i in view)
            assert chosen == choose_cut(messages, count, previous, fixed, *args)
            hinted.append(chosen.cut > chosen.new_from)
        return chosen

    with mock.patch.object(window, "choose_cut", checked):
        for request in request_prefixes(messages):
            try:
                pipeline.run(pipeline.Conversation(MODEL, request, CLIENT_TOOLS), context)
            except ContextLengthExceeded:  # a refusal: the session goes on with its next request
                continue
    event(f"hinted, batches among them: {'some' if any(hinted) else 'none'}")
    assert hinted or len(request_prefixes(messages)) < 2


@settings(max_examples=200, deadline=None)
@given(roles=st.lists(st.sampled_from(["user", "assistant", "tool", "system"]), max_size=30),
       observed=st.sets(st.integers(0, 30)), data=st.data())
def test_anchors_in_one_pass_are_the_ones_searched_back(roles: list[str], observed: set[int],
                                                        data: st.DataObject) -> None:
    messages = [{"role": role, "content": str(i)} for i, role in enumerate(roles)]
    head = data.draw(st.integers(0, len(messages)), label="head")
    start = data.draw(st.integers(0, len(messages)), label="start")
    frozen = frozenset(observed)
    assert window.anchors_from(messages, head, start, frozen) == [
        window.anchor_for(messages, head, at, frozen) for at in range(start, len(messages) + 1)]
