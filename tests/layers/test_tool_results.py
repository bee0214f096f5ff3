"""The results walk a session carries from request to request (issue 14): a resent history is walked only
where it differs from the previous request, and finds exactly what a whole walk finds."""

from __future__ import annotations

from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import pipeline
from proxy.layers import tool_results
from proxy.layers.observations import Observations
from proxy.layers.tool_results import calls_by_id, calls_in, found_in, observed_in, results
from proxy.policy import LoadedPolicy, Policy
from proxy.session import Session
from proxy.state import StateStore
from proxy.tokens import TokenCounter
from proxy.wire.same_objects import same_objects
from tests.strategies import CLIENT_TOOLS, long_conversation, request_prefixes

OBSERVATIONS = Observations(size_tokens=50)


def message(kind: int, n: int) -> dict[str, Any]:
    """A message of one of the shapes the walk tells apart (a fresh object every time)."""
    if kind == 0:
        return {"role": "user", "content": f"please fix bug {n}"}
    if kind == 1:
        return {"role": "assistant", "content": f"running step {n}",
                "tool_calls": [{"id": f"c{n % 3}", "type": "function",  # (ids reused, arguments not)
                                "function": {"name": "sh", "arguments": f'{{"step": {n}}}'}}]}
    if kind == 2:
        return {"role": "tool", "tool_call_id": f"c{n % 3}", "content": f"output {n % 4}"}
    if kind == 3:
        return {"role": "user", "content": f"<returncode>0</returncode><output>{n % 4}</output>"}
    if kind == 4:
        return {"role": "user", "content": "x " * 300}  # an observation by its size alone
    return {"role": "system", "content": "you are an agent"}


kinds = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 9)), max_size=12)
# Each request keeps some of the previous one's messages (the same objects) and adds new ones.
requests = st.lists(st.tuples(st.integers(0, 14), kinds), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(requests, st.booleans())
def test_a_carried_walk_finds_what_a_whole_walk_finds(steps: list[tuple[int, list[tuple[int, int]]]],
                                                      text_protocol: bool) -> None:
    observations = OBSERVATIONS if text_protocol else None
    carried: dict[str, Any] = {}
    history: list[dict[str, Any]] = [message(5, 0), message(0, 0)]
    for keep, added in steps:
        history = history[:keep] + [message(kind, n) for kind, n in added]
        assert found_in(history, observations, carried) == list(results(history, observations))
        found = found_in(history, observations, carried)
        assert found is carried["results"][3]  # the same list again
        assert observed_in(history, found, carried) == {i for i, _ in found if history[i]["role"] == "user"}
        assert calls_in(history, carried) == calls_by_id(history)


def test_the_walk_starts_where_the_history_differs() -> None:
    first = [message(5, 0), message(0, 0), message(1, 1), message(2, 1)]
    carried: dict[str, Any] = {}
    found_in(first, OBSERVATIONS, carried)
    walked: list[int] = []

    class Spy(list):  # type: ignore[type-arg]
        def __getitem__(self, index: Any) -> Any:
            if isinstance(index, int):
                walked.append(index)
            return super().__getitem__(index)

    second = Spy([*first, message(1, 2), message(2, 2)])
    assert found_in(second, OBSERVATIONS, carried) == [(3, ("c1", "output 1")), (5, ("c2", "output 2"))]
    # (the task statement's end is found again: the opening messages are read, nothing after them)
    assert 3 not in walked and {4, 5} <= set(walked)


def test_the_shared_prefix_compares_objects_not_values() -> None:
    a, b = message(0, 1), message(0, 1)
    assert same_objects([a, b], [a, b, a]) == 2
    assert same_objects([a, b], [a, dict(b)]) == 1
    assert same_objects([], [a]) == 0


def session_outputs(prefixes: list[list[dict[str, Any]]], window_tokens: int, carry: bool) -> list[Any]:
    """What the pipeline forwards for each request of one session (the same message objects resent)."""
    # (no assembly deadline: a slow run must not skip a block in one of the runs compared)
    loaded = LoadedPolicy("t", Policy.model_validate({
        "tool_results": {"threshold_tokens": 120}, "budget": {"max_input_tokens": window_tokens},
        "assembly": {"time_ms": 600_000}}), None)
    store, outputs, tokens = StateStore(), [], TokenCounter()
    walk = tool_results._carried_walk if carry else (lambda messages, *_: (messages, [], 0))
    with mock.patch.object(tool_results, "_carried_walk", walk), \
            mock.patch.object(pipeline, "CARRY_FROM_TOKENS", 0):  # carry even for short histories
        for prefix in prefixes:
            context = pipeline.PipelineContext(loaded, Session("s1", "header"), "tenant-a", tokens, store,
                                               now=lambda: 1_760_000_000.0)
            try:
                outcome = pipeline.run(pipeline.Conversation("gpt-4o", prefix, CLIENT_TOOLS), context)
            except Exception as refused:
                outputs.append(type(refused).__name__)
                continue
            outputs.append((outcome.messages, outcome.tools, outcome.tokens_after))
    return outputs


@settings(max_examples=40, deadline=None)
@given(st.data(), st.sampled_from([1500, 4000, 128_000]))
def test_layer_one_carried_over_requests_forwards_what_a_whole_walk_would(data: st.DataObject,
                                                                           window_tokens: int) -> None:
    messages = data.draw(long_conversation())
    prefixes = request_prefixes(messages)  # slices: each request resends the earlier ones' very objects
    if data.draw(st.booleans()):  # and once, an edited history (new objects from there on)
        cut = data.draw(st.integers(1, len(prefixes) - 1)) if len(prefixes) > 1 else 0
        edited = [dict(m) for m in prefixes[cut]]
        prefixes = [*prefixes[:cut], edited, *prefixes[cut + 1:]]
    assert session_outputs(prefixes, window_tokens, carry=True) == \
        session_outputs(prefixes, window_tokens, carry=False)


def test_summaries_waiting_in_a_carried_walk_still_pay_off_together() -> None:
    # A long chat, then large results one request at a time: the first one's summary alone does not pay
    # for offering the tools (it waits, pending), the first two together do, and both are applied.
    chat: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."},
                                  {"role": "user", "content": "fix it"}]
    for n in range(40):
        chat += [{"role": "assistant", "content": f"thinking about step {n} " * 20},
                 {"role": "user", "content": f"ok {n} " * 20}]
    for n in range(4):
        chat.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{n}", "type": "function", "function": {"name": "run", "arguments": "{}"}}]})
        log = "\n".join(f"INFO worker {k % 3} processed ok" for k in range(200))
        chat.append({"role": "tool", "tool_call_id": f"c{n}", "content": f"{log}\nid ord_{n}"})
    prefixes = request_prefixes(chat)
    carried = session_outputs(prefixes, 128_000, carry=True)
    assert carried == session_outputs(prefixes, 128_000, carry=False)

    def summaries(output: Any) -> int:
        return sum(str(m.get("content")).startswith("[ctxproxy summary") for m in output[0])

    first = next(i for i, output in enumerate(carried) if summaries(output))
    assert summaries(carried[first]) == 2 and summaries(carried[first - 1]) == 0  # the waiting one too


def test_a_summary_masked_later_is_not_carried_as_a_summary() -> None:
    """Hypothesis found it: masking turns a result already summarized into a placeholder (its record
    changes kind; the number of stored results does not). The next request must forward the placeholder,
    not the summary the carried layer-1 output still held."""
    store, counter = StateStore(), TokenCounter()
    log = "\n".join(f"INFO worker {k % 3} processed ok" for k in range(200))
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "agent"}, {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c0", "content": log}]

    def layer_one(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        with store.session("t", "s") as state:
            return tool_results.summarize_large(
                messages, state, store, lambda m: counter.message(m, "gpt-4o"), 120, enabled=True,
                carried=state.walks)

    with store.session("t", "s") as state:  # our tools are offered already: a summary applies at once
        state.window.cut, state.window.headlines = 0, [mock.sentinel.headline]
    first = layer_one(history)
    assert str(first[3]["content"]).startswith("[ctxproxy summary")
    with store.session("t", "s") as state:  # what the window's masking does to it
        store.record(state, "c0", log, "run", "[masked c0]", tool_results.PLACEHOLDER)
    second = layer_one([*history, {"role": "user", "content": "and now?"}])
    assert second[3]["content"] == "[masked c0]"


def test_a_session_no_batch_is_certain_for_carries_layer_ones_walk() -> None:
    """A history over the window's budget until layer 1 summarizes it (no cut yet): the pipeline asks
    where a first batch would certainly cut and gets the head (none is certain). Such a request skips no
    result, so its walk is carried like any other: the next request looks up only the result it adds (it
    looked up every result again before)."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "you are an agent"},
                                     {"role": "user", "content": "fix the parser"}]
    log = "\n".join(f"INFO worker {k % 3} processed ok" for k in range(150))
    for n in range(30):
        call = {"id": f"call_{n}", "type": "function", "function": {"name": "run", "arguments": "{}"}}
        history += [{"role": "assistant", "content": f"step {n}", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": f"call_{n}", "content": f"{log}\nid {n}"}]
    prefixes = [history[:end] for end in (40, 42, 44)]  # resent: the very objects, one result more each
    loaded = LoadedPolicy("t", Policy.model_validate({"tool_results": {"threshold_tokens": 120},
                                                      "budget": {"max_input_tokens": 16_000}}), None)
    store, tokens = StateStore(), TokenCounter()
    looked_up: list[int] = []
    lookup = tool_results.SessionState.lookup
    with mock.patch.object(tool_results.SessionState, "lookup", autospec=True,
                           side_effect=lambda *args: looked_up.append(1) or lookup(*args)):
        for prefix in prefixes:
            looked_up.clear()
            context = pipeline.PipelineContext(loaded, Session("s1", "header"), "tenant-a", tokens, store)
            outcome = pipeline.run(pipeline.Conversation("gpt-4o", prefix, CLIENT_TOOLS), context)
    assert store.get("tenant-a", "s1").window.cut is None and outcome.decided  # no cut; summaries made
    assert outcome.tokens_before > 16_000 * 0.8  # (over the budget before layer 1)
    assert len(looked_up) <= 3  # the new result (looked up, recorded, applied), not the 21 before it


def _pays_off_as_written_before(messages: list[dict[str, Any]], waiting: list[Any], count: Any,
                                tools_tokens: int, new_from: int) -> bool:
    """The rule with both walks whole (the oracle the early exits are held to)."""
    turns = sum(1 for m in messages if m.get("role") == "assistant")
    later = min(max(turns, tool_results.MIN_LATER_TURNS), tool_results.MAX_LATER_TURNS)
    benefit = 0.0
    for index, _, (_, summary), _ in waiting:
        saved = count(messages[index]) - count({**messages[index], "content": summary})
        benefit += saved * ((1.0 if index >= new_from else 0.0) + 0.1 * later)
    cached = (tools_tokens + sum(count(m) for m in messages[:new_from])) if new_from else 0
    return benefit >= tool_results.CACHED_SHARE_LOST * cached


def _weigh(message: dict[str, Any]) -> int:
    return len(str(message.get("content", ""))) + 3


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["user", "assistant", "tool"]), st.integers(0, 3000)),
                min_size=1, max_size=80),
       st.lists(st.tuples(st.integers(0, 79), st.integers(0, 400)), max_size=4),
       st.integers(0, 5000), st.integers(0, 80))
def test_whether_summaries_pay_off_is_what_both_whole_walks_say(
        shape: list[tuple[str, int]], picks: list[tuple[int, int]], tools_tokens: int, new_from: int) -> None:
    messages = [{"role": role, "content": "x" * size} for role, size in shape]
    waiting = [(index % len(messages), ("c", "k"), ("h", "s" * size), None) for index, size in picks]
    new_from = min(new_from, len(messages))
    assert tool_results._pays_off(messages, waiting, _weigh, tools_tokens, new_from) \
        == _pays_off_as_written_before(messages, waiting, _weigh, tools_tokens, new_from)


def test_a_summary_that_cannot_pay_yet_is_told_without_summing_the_whole_history() -> None:
    """Asked every request while a first summary waits: a long prefix that outweighs it early is not
    summed to its end, nor its turns counted past the most that count."""
    history = [{"role": "assistant" if n % 2 else "user", "content": f"turn {n} " * 50} for n in range(2000)]
    history.append({"role": "tool", "content": "result " * 2000})
    asked: list[int] = []

    def count(message: dict[str, Any]) -> int:
        asked.append(1)
        return _weigh(message)
    roles: list[str] = []
    watched = [_Watched(m, roles) for m in history]
    waiting = [(len(history) - 1, ("c", "k"), ("h", "short"), None)]
    assert not tool_results._pays_off(watched, waiting, count, 1000, len(history) - 1)
    assert len(asked) < 200 and len(roles) < 200


class _Watched(dict):
    """A message noting each time its role is read."""

    def __init__(self, message: dict[str, Any], roles: list[str]) -> None:
        super().__init__(message)
        self._roles = roles

    def get(self, key: str, default: Any = None) -> Any:
        if key == "role":
            self._roles.append(key)
        return super().get(key, default)
