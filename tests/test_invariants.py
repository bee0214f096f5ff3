"""Property tests for the invariants of DESIGN.md, over generated agent conversations."""

from __future__ import annotations

import copy

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy import pipeline
from proxy.errors import ContextLengthExceeded
from proxy.internal_tools import READ_TOOL_RESULT, ToolContext, execute
from proxy.policy import LoadedPolicy, Policy
from proxy.session import Session
from proxy.state import StateStore
from proxy.tokens import TokenCounter
from tests.strategies import CLIENT_TOOLS, conversation, pairing_errors, request_prefixes

TOKENS = TokenCounter()
MODEL = "gpt-4o"
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_policy(window: int, threshold: int = 120) -> LoadedPolicy:
    policy = Policy.model_validate({"tool_results": {"threshold_tokens": threshold},
                                    "budget": {"max_input_tokens": window}})
    return LoadedPolicy("prop", policy, None)


def replay(messages, policy: LoadedPolicy, store: StateStore | None = None):
    """Run the pipeline on every request of a conversation, as an agent would send them."""
    store = store or StateStore()
    session = Session("s1", "header")
    results = []
    for prefix in request_prefixes(messages):
        sent = copy.deepcopy(prefix)
        context = pipeline.PipelineContext(policy, session, "tenant-a", TOKENS, store)
        try:
            outcome = pipeline.run(pipeline.Conversation(MODEL, sent, CLIENT_TOOLS), context)
        except ContextLengthExceeded:
            results.append((prefix, None))
            continue
        assert sent == prefix, "the pipeline must not mutate the client's messages"
        results.append((prefix, outcome))
    return results, store


@SETTINGS
@given(messages=conversation(), window=st.sampled_from([1500, 4000, 128_000]))
def test_pairing_order_system_prompt_tools_and_last_user_message_are_kept(messages, window):
    results, _ = replay(messages, make_policy(window))
    for sent, outcome in results:
        if outcome is None:
            continue
        assert pairing_errors(outcome.messages) == pairing_errors(sent)
        assert [m["role"] for m in outcome.messages] == [m["role"] for m in sent]
        assert outcome.messages[0] == sent[0]
        last_user = max(i for i, m in enumerate(sent) if m["role"] == "user")
        assert outcome.messages[last_user] == sent[last_user]
        assert outcome.tools[:len(CLIENT_TOOLS)] == CLIENT_TOOLS
        assert [t["function"]["name"] for t in outcome.tools[len(CLIENT_TOOLS):]] in ([], [READ_TOOL_RESULT])


@SETTINGS
@given(messages=conversation(), window=st.sampled_from([1500, 4000, 128_000]))
def test_rewriting_is_deterministic_and_sticky(messages, window):
    first, _ = replay(messages, make_policy(window))
    second, _ = replay(messages, make_policy(window))
    assert [orjson.dumps(o.messages) if o else None for _, o in first] == \
        [orjson.dumps(o.messages) if o else None for _, o in second]
    # Sticky: a message replaced once is replaced identically in every later request.
    seen: dict[tuple[int, str], str] = {}
    for sent, outcome in first:
        if outcome is None:
            continue
        for index, (before, after) in enumerate(zip(sent, outcome.messages, strict=True)):
            if before != after:
                key = (index, orjson.dumps(before).decode())
                assert seen.setdefault(key, orjson.dumps(after).decode()) == orjson.dumps(after).decode()
        for (index, original), replaced in seen.items():
            if index < len(sent) and orjson.dumps(sent[index]).decode() == original:
                assert orjson.dumps(outcome.messages[index]).decode() == replaced


@SETTINGS
@given(messages=conversation(), window=st.sampled_from([1500, 4000, 128_000]))
def test_tokens_never_go_up_and_pass_means_within_budget(messages, window):
    results, _ = replay(messages, make_policy(window))
    injected = TOKENS.tools([*CLIENT_TOOLS, {"type": "function", "function": {"name": READ_TOOL_RESULT}}],
                            MODEL)
    for _, outcome in results:
        if outcome is None:
            continue
        assert outcome.tokens_after <= outcome.tokens_before + injected + 200
        assert outcome.tokens_after * 1.05 < window  # nothing is ever forwarded over the window
        if outcome.gate == "pass":
            assert outcome.tokens_after * 1.05 < 0.70 * window


@SETTINGS
@given(messages=conversation(), window=st.sampled_from([1500, 4000, 128_000]))
def test_nothing_is_lost_every_replacement_reads_back_byte_identical(messages, window):
    results, store = replay(messages, make_policy(window))
    for sent, outcome in results:
        if outcome is None:
            continue
        for before, after in zip(sent, outcome.messages, strict=True):
            if before == after:
                continue
            assert before["role"] == "tool"
            stored = store.get("tenant-a", "s1").lookup(before["tool_call_id"], before["content"])
            assert stored is not None and stored.handle in after["content"]
            call = {"function": {"name": READ_TOOL_RESULT,
                                 "arguments": orjson.dumps({"call_id": stored.handle}).decode()}}
            read = execute(call, ToolContext(store, "tenant-a", "s1", page_chars=10**9))
            assert read == before["content"]
            other_tenant = execute(call, ToolContext(store, "tenant-b", "s1", page_chars=10**9))
            assert other_tenant.startswith("error:")


def test_the_gate_states_are_reachable_so_the_properties_are_not_vacuous():
    policy = make_policy(1500)
    tool_turns = []
    for k in range(10):
        call = {"id": f"c{k}", "type": "function", "function": {"name": "run", "arguments": "{}"}}
        tool_turns += [{"role": "assistant", "content": None, "tool_calls": [call]},
                       {"role": "tool", "tool_call_id": f"c{k}", "content": "build ok " * 60}]
    heavy = [{"role": "system", "content": "agent"}, {"role": "user", "content": "go"}, *tool_turns,
             {"role": "user", "content": "next"}]
    results, _ = replay(heavy, policy)
    gates = [o.gate for _, o in results if o]
    assert "pass" in gates and "prune" in gates
    huge = [{"role": "system", "content": "agent"}, {"role": "user", "content": "word " * 3000}]
    results, _ = replay(huge, policy)
    assert results[-1][1] is None  # refused
