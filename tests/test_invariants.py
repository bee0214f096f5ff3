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
from proxy.replay import pairing_errors
from proxy.session import Session
from proxy.state import StateStore
from proxy.tokens import TokenCounter
from tests.strategies import CLIENT_TOOLS, conversation, request_prefixes

TOKENS = TokenCounter()
MODEL = "gpt-4o"


def CLOCK() -> float:  # headlines carry times: a fixed clock keeps runs comparable
    return 1_760_000_000.0


# Long conversations are the point here: some seeds draw many that exceed hypothesis's entropy budget.
SETTINGS = settings(max_examples=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def make_policy(window: int, threshold: int = 120, sliding: bool = True) -> LoadedPolicy:
    # (no assembly deadline: a slow run must not skip a block in one of the runs compared)
    policy = Policy.model_validate({"tool_results": {"threshold_tokens": threshold},
                                    "budget": {"max_input_tokens": window}, "window": {"enabled": sliding},
                                    "assembly": {"time_ms": 600_000}})
    return LoadedPolicy("prop", policy, None)


def replay(messages, policy: LoadedPolicy, store: StateStore | None = None):
    """Run the pipeline on every request of a conversation, as an agent would send them."""
    store = store or StateStore()
    session = Session("s1", "header")
    results = []
    for prefix in request_prefixes(messages):
        sent = copy.deepcopy(prefix)
        context = pipeline.PipelineContext(policy, session, "tenant-a", TOKENS, store, now=CLOCK)
        try:
            outcome = pipeline.run(pipeline.Conversation(MODEL, sent, CLIENT_TOOLS), context)
        except ContextLengthExceeded:
            results.append((prefix, None))
            continue
        assert sent == prefix, "the pipeline must not mutate the client's messages"
        results.append((prefix, outcome))
    return results, store


def injected(message: dict) -> bool:
    content = message.get("content")
    blocks = ("[ctxproxy ", "[WORKING MEMORY]", "## Folded memory")
    return isinstance(content, str) and content.startswith(blocks)


def is_subsequence(kept: list[dict], sent: list[dict]) -> bool:
    """Every kept message (injected blocks aside) is a sent message, in the same order."""
    remaining = iter(sent)
    return all(any(message == candidate for candidate in remaining)
               for message in kept if not injected(message))


def replacements(outcome) -> list[tuple[dict, dict]]:
    """(client message, forwarded message) pairs that differ; the pipeline returns both lists aligned."""
    return [(a, b) for a, b in zip(outcome.original, outcome.messages, strict=True) if a != b]


@SETTINGS
@given(messages=conversation(), window=st.sampled_from([1500, 4000, 128_000]))
def test_pairing_order_system_prompt_task_tools_and_last_user_message_are_kept(messages, window):
    results, _ = replay(messages, make_policy(window))
    for sent, outcome in results:
        if outcome is None:
            continue
        forwarded = outcome.messages
        assert pairing_errors(forwarded) == [] or pairing_errors(forwarded) == pairing_errors(sent)
        assert is_subsequence(outcome.original, sent)
        assert all(a["role"] == "tool" and a["tool_call_id"] == b["tool_call_id"]
                   for a, b in replacements(outcome))
        assert forwarded[0] == sent[0]  # the system prompt, first and unchanged
        first_user = next(m for m in sent if m["role"] == "user")
        assert first_user in forwarded  # the task statement
        last_user = [m for m in sent if m["role"] == "user"][-1]
        assert last_user in forwarded
        assert outcome.tools[:len(CLIENT_TOOLS)] == CLIENT_TOOLS
        assert [t["function"]["name"] for t in outcome.tools[len(CLIENT_TOOLS):]] in (
            [], [READ_TOOL_RESULT, "recall"])


@SETTINGS
@given(messages=conversation(max_turns=10), window=st.sampled_from([1500, 4000]))
def test_between_batches_the_forwarded_history_only_grows(messages, window):
    """The cut is sticky: unless a batch was evicted or pruned, the last request prefixes this one."""
    store = StateStore()
    previous = None
    batches = (0, 0)
    for prefix in request_prefixes(messages):
        context = pipeline.PipelineContext(make_policy(window), Session("s1", "header"), "tenant-a", TOKENS,
                                           store, now=CLOCK)
        try:
            outcome = pipeline.run(pipeline.Conversation(MODEL, copy.deepcopy(prefix), CLIENT_TOOLS), context)
        except ContextLengthExceeded:
            previous = None
            continue
        state = store.get("tenant-a", "s1")
        now = (len(state.window.headlines),
               sum(1 for r in state.by_handle.values() if r.kind == "placeholder"))
        if previous is not None and now == batches and outcome.tools == previous.tools:
            assert outcome.messages[:len(previous.messages)] == previous.messages
        previous, batches = outcome, now


@SETTINGS
@given(messages=conversation(), window=st.sampled_from([1500, 4000, 128_000]))
def test_rewriting_is_deterministic_and_sticky(messages, window):
    first, _ = replay(messages, make_policy(window))
    second, _ = replay(messages, make_policy(window))
    assert [orjson.dumps(o.messages) if o else None for _, o in first] == \
        [orjson.dumps(o.messages) if o else None for _, o in second]
    # Sticky: a tool result replaced once is replaced identically in every later request.
    replaced: dict[tuple[str, str], str] = {}
    for _, outcome in first:
        for before, after in replacements(outcome) if outcome else ():
            key = (before["tool_call_id"], before["content"])
            assert replaced.setdefault(key, after["content"]) == after["content"]


@SETTINGS
@given(messages=conversation(), window=st.sampled_from([1500, 4000, 128_000]))
def test_tokens_never_go_up_and_pass_means_within_budget(messages, window):
    results, _ = replay(messages, make_policy(window))
    internal = [{"type": "function", "function": {"name": n}} for n in (READ_TOOL_RESULT, "recall")]
    injected_tools = TOKENS.tools([*CLIENT_TOOLS, *internal], MODEL) + 200
    for _, outcome in results:
        if outcome is None:
            continue
        blocks = sum(TOKENS.message(m, MODEL) for m in outcome.messages if injected(m))
        assert outcome.tokens_after <= outcome.tokens_before + injected_tools + blocks
        assert outcome.tokens_after * 1.05 < window  # nothing is ever forwarded over the window
        if outcome.gate == "pass":
            assert outcome.tokens_after * 1.05 < 0.70 * window


@SETTINGS
@given(messages=conversation(), window=st.sampled_from([1500, 4000, 128_000]), resent=st.booleans(),
       sliding=st.booleans())
def test_the_token_totals_are_those_of_what_is_sent(messages, window, resent, sliding):
    """`tokens_before`/`tokens_after` (the x-ctxproxy-tokens-* headers, the gate's input) are the exact
    totals of the client's request and of what is forwarded, however they were carried or summed in
    parts — with each request parsed anew, and resent as the very objects of the previous one."""
    store, session = StateStore(), Session("s1", "header")
    # (working memory on every request: a block at the tail; without the window, the gate's pruning is
    # what offers our tools first, after the forwarded list was summed)
    loaded = make_policy(window, sliding=sliding)
    loaded = LoadedPolicy("prop", loaded.policy.model_copy(update={
        "working_memory": loaded.policy.working_memory.model_copy(update={"inject": "always"})}), None)
    messages = [{**m, "content": orjson.dumps({"order_id": f"ord_{n}", "name": "order", "log": m["content"]})
                 .decode()} if m["role"] == "tool" else m for n, m in enumerate(messages)]  # (entities)
    for prefix in request_prefixes(messages):
        sent = prefix if resent else copy.deepcopy(prefix)
        context = pipeline.PipelineContext(loaded, session, "tenant-a", TOKENS, store, now=CLOCK)
        try:
            outcome = pipeline.run(pipeline.Conversation(MODEL, sent, CLIENT_TOOLS), context)
        except ContextLengthExceeded:
            continue
        assert outcome.tokens_before == TOKENS.request(prefix, CLIENT_TOOLS, MODEL)
        assert outcome.tokens_after == TOKENS.request(outcome.messages, outcome.tools, MODEL)


@SETTINGS
@given(messages=conversation(), window=st.sampled_from([1500, 4000, 128_000]))
def test_nothing_is_lost_every_replacement_reads_back_byte_identical(messages, window):
    results, store = replay(messages, make_policy(window))
    for _, outcome in results:
        for before, after in replacements(outcome) if outcome else ():
            assert before["role"] == "tool"
            stored = store.get("tenant-a", "s1").lookup(before["tool_call_id"], before["content"])
            assert stored is not None and stored.handle in after["content"]
            call = {"function": {"name": READ_TOOL_RESULT,
                                 "arguments": orjson.dumps({"call_id": stored.handle}).decode()}}
            assert execute(call, ToolContext(store, "tenant-a", "s1", page_chars=10**9)) == before["content"]
            other_tenant = execute(call, ToolContext(store, "tenant-b", "s1", page_chars=10**9))
            assert other_tenant.startswith("error:")


def test_every_layer_is_reachable_so_the_properties_are_not_vacuous():
    tool_turns = []
    for k in range(10):
        call = {"id": f"c{k}", "type": "function", "function": {"name": "run", "arguments": "{}"}}
        talk = "I will run the build now. " * 8
        tool_turns += [{"role": "assistant", "content": talk, "tool_calls": [call]},
                       {"role": "tool", "tool_call_id": f"c{k}", "content": "build ok " * 60},
                       {"role": "user", "content": f"step {k} done, next"}]
    heavy = [{"role": "system", "content": "agent"}, {"role": "user", "content": "go"}, *tool_turns]
    results, _ = replay(heavy, make_policy(1500, sliding=False))
    gates = [o.gate for _, o in results if o]
    assert "pass" in gates and "prune" in gates
    results, store = replay(heavy, make_policy(1500))
    assert all(o is not None for _, o in results)  # with the window on, nothing is refused
    # ... because exchanges were evicted (masking old results alone cannot fit the talk around them)
    assert store.get("tenant-a", "s1").window.headlines
    huge = [{"role": "system", "content": "agent"}, {"role": "user", "content": "word " * 3000}]
    results, _ = replay(huge, make_policy(1500))
    assert results[-1][1] is None  # refused: the task alone is over the window
