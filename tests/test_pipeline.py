"""A large resent request is rewritten on the event loop only when its work is in proportion to what is
new (pipeline.little_to_do): such a run makes no batch — nothing masked, evicted or pruned by the gate —
and a request that might is turned away before anything is done, then runs as it would have."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import orjson
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from proxy import budget, pipeline
from proxy.errors import ContextLengthExceeded
from proxy.layers.tool_results import SUMMARY
from proxy.policy import LoadedPolicy, Policy
from proxy.session import Session
from proxy.state import StateStore, WouldBlock
from proxy.tokens import TokenCounter
from tests.strategies import CLIENT_TOOLS, long_conversation, request_prefixes

TOKENS = TokenCounter()
MODEL = "gpt-4o"


def policy(window_tokens: int, window_on: bool, budget_on: bool) -> LoadedPolicy:
    # (no assembly deadline: a slow run must not skip a block in one of the runs compared)
    return LoadedPolicy("t", Policy.model_validate({
        "tool_results": {"threshold_tokens": 120},
        "budget": {"enabled": budget_on, "max_input_tokens": window_tokens},
        "window": {"enabled": window_on, "max_tokens": window_tokens * 3 // 4},
        "assembly": {"time_ms": 600_000}}), None)


def context(store: StateStore, loaded: LoadedPolicy) -> pipeline.PipelineContext:
    return pipeline.PipelineContext(loaded, Session("s", "header"), "tenant-a", TOKENS, store,
                                    now=lambda: 1_760_000_000.0)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.data_too_large])
@given(messages=long_conversation(), window_tokens=st.sampled_from([4000, 8000, 16000, 64000]),
       window_on=st.booleans(), budget_on=st.booleans())
def test_a_request_let_onto_the_event_loop_makes_no_batch(
        messages: list[dict[str, Any]], window_tokens: int, window_on: bool, budget_on: bool) -> None:
    loaded, store = policy(window_tokens, window_on, budget_on), StateStore()
    fast, refused, previous = 0, 0, 0
    for prefix in request_prefixes(messages):  # one list: a resent history is the very same objects
        ctx = context(store, loaded)
        ctx.wait, ctx.fresh_bytes = False, len(orjson.dumps(prefix[previous:]))
        state = store.get("tenant-a", "s")
        before = (Counter(state.decisions), state.last_forwarded) if state else None
        try:
            outcome = pipeline.run(pipeline.Conversation(MODEL, prefix, CLIENT_TOOLS), ctx)
        except WouldBlock:
            refused += 1
            state = store.get("tenant-a", "s")
            assert before is None or (Counter(state.decisions), state.last_forwarded) == before
            try:
                pipeline.run(pipeline.Conversation(MODEL, prefix, CLIENT_TOOLS), context(store, loaded))
            except ContextLengthExceeded:  # over the window: the conversation ends here
                return
        else:
            fast += 1
            assert not outcome.evicted and outcome.gate in (budget.PASS, budget.WARN)
            assert set(outcome.decided) <= {SUMMARY}  # new results summarized: work on what is new
        previous = len(prefix)
    assert refused >= 1  # the first request: no previous one to go by
    event(f"requests on the event loop: {'some' if fast else 'none'}")


def test_the_same_bytes_whichever_way_a_request_runs() -> None:
    """Turned away from the event loop or not, each request forwards what a plain run forwards."""
    messages = [{"role": "user", "content": "fix the parser"}]
    for n in range(30):
        messages += [
            {"role": "assistant", "content": f"step {n}", "tool_calls": [
                {"id": f"call_{n}", "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"call_{n}",
             "content": "\n".join(f"src/m{n}/f{k}.py:{k}: ValueError ord_{n}_{k}" for k in range(40))}]
    loaded = policy(8000, True, True)
    plain_store, trying_store = StateStore(), StateStore()
    plain_messages = copy.deepcopy(messages)
    tried = Counter[bool]()
    previous = 0
    for end in range(3, len(messages) + 1, 2):
        plain = pipeline.run(pipeline.Conversation(MODEL, plain_messages[:end], CLIENT_TOOLS),
                             context(plain_store, loaded))
        ctx = context(trying_store, loaded)
        ctx.wait, ctx.fresh_bytes = False, len(orjson.dumps(messages[previous:end]))
        try:
            trying = pipeline.run(pipeline.Conversation(MODEL, messages[:end], CLIENT_TOOLS), ctx)
            tried[True] += 1
        except WouldBlock:
            trying = pipeline.run(pipeline.Conversation(MODEL, messages[:end], CLIENT_TOOLS),
                                  context(trying_store, loaded))
            tried[False] += 1
        assert trying.messages == plain.messages and trying.tools == plain.tools
        previous = end
    assert tried[True] and tried[False]  # both ways were taken
