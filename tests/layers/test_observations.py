"""Text-protocol observations, the task statement, and what the window does with them (issue 9)."""

from __future__ import annotations

import itertools

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import pipeline
from proxy.internal_tools import READ_TOOL_RESULT, ToolContext, execute
from proxy.layers import observations
from proxy.layers.observations import Observations, handle_for, task_end
from proxy.policy import LoadedPolicy, Policy
from proxy.session import Session
from proxy.state import StateStore
from proxy.tokens import TokenCounter

TOKENS = TokenCounter()
MODEL = "gpt-4o"


def clock() -> float:
    return 1_760_000_000.0


def run(messages: list[dict], policy: dict, store: StateStore, tools: list | None = None) -> pipeline.Outcome:
    loaded = LoadedPolicy("t", Policy.model_validate(policy), None)
    context = pipeline.PipelineContext(loaded, Session("s1", "header"), "tenant-a", TOKENS, store, now=clock)
    return pipeline.run(pipeline.Conversation(MODEL, messages, tools), context)


def read_back(store: StateStore, handle: str) -> str:
    call = {"function": {"name": READ_TOOL_RESULT, "arguments": orjson.dumps({"call_id": handle}).decode()}}
    return execute(call, ToolContext(store, "tenant-a", "s1", page_chars=1 << 30))


def listing(n: int, seed: int) -> str:
    return "\n".join(f"-rw-r--r-- 1 root root {seed * 1000 + i:6d} Oct 24 src/pkg{seed}/module_{i:04d}.py"
                     for i in range(n))


def test_task_statement_after_a_greeting_and_after_a_demonstration():
    greeting = [{"role": "system", "content": "s"}, {"role": "assistant", "content": "Hi! How can I help?"},
                {"role": "user", "content": "change my flight"}, {"role": "assistant", "content": "sure"}]
    assert task_end(greeting) == 3
    demonstration = [{"role": "system", "content": "s"},
                     {"role": "user", "content": "Here is a demonstration of how to do it..."},
                     {"role": "user", "content": "We're currently solving the following issue"},
                     {"role": "assistant", "content": "ls"}]
    assert task_end(demonstration) == 3
    tool_loop = [{"role": "system", "content": "s"},
                 {"role": "assistant", "content": None, "tool_calls": [{"id": "a"}]}]
    assert task_end(tool_loop) == 1


def test_observation_shapes_and_stable_handles():
    observations = Observations(size_tokens=500)
    assert observations.is_observation({"role": "user", "content": "<returncode>0</returncode>\n<output>"})
    assert observations.is_observation(
        {"role": "user", "content": "x\n(Open file: n/a)\n(Current directory: /repo)\nbash-$"})
    assert not observations.is_observation({"role": "user", "content": "please also fix the tests"})
    assert observations.is_observation({"role": "user", "content": "a pasted log line\n" * 200})
    assert not observations.is_observation({"role": "assistant", "content": "<returncode>0</returncode>"})
    assert handle_for("abc") == handle_for("abc") != handle_for("abd")
    assert handle_for("abc").startswith("obs-") and len(handle_for("abc")) == 16


def miniswe(turns: int, lines: int = 120) -> list[dict]:
    task = "<pr_description>Fix the W042 warning in django/db/models</pr_description>"
    messages = [{"role": "system", "content": "You run one bash command per turn."},
                {"role": "user", "content": task}]
    for turn in range(turns):
        command = f"THOUGHT: look\n```bash\nls -la src/pkg{turn}\n```"
        output = f"<returncode>0</returncode>\n<output>\n{listing(lines, turn)}\n</output>"
        messages += [{"role": "assistant", "content": command}, {"role": "user", "content": output}]
    return messages


def test_text_protocol_observations_are_summarized_sticky_and_read_back_byte_for_byte():
    store = StateStore()
    policy = {"tool_results": {"threshold_tokens": 500}, "window": {"enabled": False}}
    history = miniswe(6)
    outcomes = [run(history[:end], policy, store) for end in range(4, len(history) + 1, 2)]
    last = outcomes[-1]
    replaced = [(sent, forwarded) for sent, forwarded in zip(history, last.messages, strict=True)
                if sent != forwarded]
    assert replaced, "observations over the threshold must be summarized"
    for sent, forwarded in replaced:
        assert sent["role"] == forwarded["role"] == "user"
        handle = handle_for(sent["content"])
        assert f"call_id={handle}" in forwarded["content"]
        assert read_back(store, handle) == sent["content"]
    assert last.messages[1] == history[1], "the task statement is never summarized"
    # Sticky: the same history again gives the same bytes.
    assert run(history, policy, store).messages == last.messages


def test_first_summaries_wait_until_offering_the_tools_pays():
    """A few results behind a cached prompt do not pay for re-billing it; as the session goes on and
    they pile up, they do, and then all of them are replaced in one batch."""
    store = StateStore()
    system = {"role": "system", "content": "policy " * 1500}
    history = [system, {"role": "user", "content": "task"}]
    policy = {"tool_results": {"threshold_tokens": 300}, "window": {"enabled": False}}
    run(list(history), policy, store)  # the prompt is in the provider's cache from here on
    first = None
    for turn in range(24):
        call = {"id": f"c{turn}", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
        history += [{"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": f"c{turn}", "content": listing(60, turn)}]
        outcome = run(list(history), policy, store)
        if outcome.internal_tools and first is None:
            first = turn
            summarized = [m for m in outcome.messages if m.get("role") == "tool"
                          and m["content"].startswith("[ctxproxy summary")]
            assert len(summarized) == turn + 1, "every waiting result is summarized in the one batch"
    assert first is not None and first > 2


def test_window_masks_old_results_before_evicting_and_keeps_the_newest_verbatim():
    store = StateStore()
    policy = {"tool_results": {"threshold_tokens": 100_000, "keep_recent": 3},
              "budget": {"max_input_tokens": 16_000}}
    history = [{"role": "system", "content": "agent"}, {"role": "user", "content": "audit the repo"}]
    for turn in range(14):
        call = {"id": f"c{turn}", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
        history += [{"role": "assistant", "content": f"Looking at pkg{turn} next.", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": f"c{turn}", "content": listing(40, turn)}]
        outcome = run(list(history), policy, store)
    forwarded = outcome.messages
    masked = [m for m in forwarded if m.get("role") == "tool" and m["content"].startswith("[summarized:")]
    assert masked, "old results are masked first"
    assert not store.get("tenant-a", "s1").window.headlines, "masking was enough: nothing evicted"
    assert [m["content"] for m in forwarded if m.get("role") == "tool"][-3:] == \
        [m["content"] for m in history if m.get("role") == "tool"][-3:]
    # the conversation itself stays: every assistant message is still forwarded
    assert sum(1 for m in forwarded if m.get("role") == "assistant") == 14
    for message in masked:
        handle = message["content"].split("call_id=")[1].split("]")[0]
        original = next(m for m in history if m.get("tool_call_id") == handle)
        assert read_back(store, handle) == original["content"]


def test_evicted_results_and_observations_are_readable_by_the_handles_the_summary_names():
    store = StateStore()
    policy = {"tool_results": {"threshold_tokens": 100_000, "keep_recent": 2},
              "budget": {"max_input_tokens": 8_000}, "window": {"max_tokens": 1500}}
    history = miniswe(30, lines=12)
    for end in range(4, len(history) + 1, 2):
        outcome = run(history[:end], policy, store)
    state = store.get("tenant-a", "s1")
    assert state.window.headlines, "this history must overflow the window"
    block = state.window.block or ""
    evicted_outputs = [m["content"] for m in history[2:state.window.cut] if m["role"] == "user"]
    assert evicted_outputs
    assert handle_for(evicted_outputs[-1]) in block, "the auto-summary names the handle of what left"
    for content in evicted_outputs:  # older headlines shed details within the block's budget; recall
        assert read_back(store, handle_for(content)) == content  # names the handles of those
    assert history[1] in outcome.messages, "the task statement stays"


def test_working_memory_block_waits_until_a_result_has_left_the_prompt():
    store = StateStore()
    policy = {"tool_results": {"threshold_tokens": 100_000, "keep_recent": 1},
              "budget": {"max_input_tokens": 8_000}, "window": {"max_tokens": 1500}}
    history = [{"role": "system", "content": "support agent"}, {"role": "user", "content": "my order?"}]
    blocks = []
    for turn in range(12):
        record = orjson.dumps({"order_id": f"ORD-{turn:04d}", "status": "shipped",
                               "items": [{"sku": f"SKU-{turn}-{i}", "name": "lamp " * 20} for i in range(6)]})
        history += [{"role": "assistant", "content": None, "tool_calls": [{
                        "id": f"c{turn}", "type": "function",
                        "function": {"name": "get_order_details", "arguments": "{}"}}]},
                    {"role": "tool", "tool_call_id": f"c{turn}", "content": record.decode()}]
        outcome = run(list(history), policy, store)
        blocks.append(outcome.blocks.tokens.get("working_memory", 0))
        if not store.get("tenant-a", "s1").internal_tools_offered:
            assert not blocks[-1], "nothing left the prompt yet: every entity is in it verbatim"
    assert blocks[-1] > 0, "once results left the prompt, the block carries their ids"
    always = {**policy, "working_memory": {"inject": "always"}}
    first = run(history[:4], always, StateStore())
    assert first.blocks.tokens.get("working_memory", 0) > 0


def test_the_same_observation_twice_gets_one_decision():
    store = StateStore()
    policy = {"tool_results": {"threshold_tokens": 300}, "window": {"enabled": False}}
    output = f"<returncode>0</returncode>\n<output>\n{listing(80, 1)}\n</output>"
    command = {"role": "assistant", "content": "```bash\nls\n```"}
    history = [*miniswe(0), command, {"role": "user", "content": output}, command,
               {"role": "user", "content": output}]
    outcome = run(history, policy, store)
    assert outcome.messages[3] == outcome.messages[5] != history[3]
    assert read_back(store, handle_for(output)) == output


def test_the_task_after_a_greeting_exchange_is_part_of_the_head():
    """`hi` / `How can I help?` (or the placeholder turn an Anthropic client must open with) does not state
    the task: the user's next run does, and it is protected with it. A real task is not a greeting."""
    greeting = [{"role": "system", "content": "s"}, {"role": "user", "content": "(start)"},
                {"role": "assistant", "content": "Hello! How can I help?"},
                {"role": "user", "content": "Cancel reservation ABC123 please."},
                {"role": "assistant", "content": "Sure."}]
    assert task_end(greeting) == 4
    worded = [{**m} for m in greeting]
    worded[1]["content"] = "Fix the failing export test in src/export/csv_writer.py, please."
    assert task_end(worded) == 2
    command = [{**m} for m in greeting]
    command[2]["content"] = "```bash\nls\n```"
    assert task_end(command) == 2


def test_a_cache_break_carries_the_whole_batch():
    """Offering our tools or masking re-bills the prompt; the window makes its batch in that same request
    (down to the low-water mark), so the next break is a batch away, not one turn later."""
    store = StateStore()
    policy = {"tool_results": {"threshold_tokens": 100_000, "keep_recent": 3},
              "budget": {"max_input_tokens": 16_000}, "window": {"low_water_pct": 0.5}}  # 12k budget, 6k low
    history = [{"role": "system", "content": "You run one bash command per turn."},
               {"role": "user", "content": "<pr_description>Fix W042</pr_description>"}]
    previous: pipeline.Outcome | None = None
    breaks: list[int] = []
    for turn in range(40):
        reasoning = f"THOUGHT: pkg{turn} " + "the model reasons at length about the code " * 40
        history += [{"role": "assistant", "content": f"{reasoning}\n```bash\nls -la src/pkg{turn}\n```"},
                    {"role": "user", "content": f"<returncode>0</returncode>\n<output>\n{listing(12, turn)}"
                                                "\n</output>"}]
        outcome = run(list(history), policy, store)
        if previous is not None and (outcome.tools != previous.tools or
                                     outcome.messages[:len(previous.messages)] != previous.messages):
            breaks.append(turn)
            assert outcome.tokens_after <= 6_000, "a break goes down to the low-water mark"
        previous = outcome
    assert len(breaks) >= 2
    assert min(b - a for a, b in itertools.pairwise(breaks)) >= 5


_OPENING_KINDS = [
    {"role": "system", "content": "You are an agent."},
    {"role": "developer", "content": "Be terse."},
    {"role": "user", "content": "hi"},
    {"role": "user", "content": "Fix the failing test in payments/tests/test_refund.py, please."},
    {"role": "assistant", "content": "How can I help?"},
    {"role": "assistant", "content": "```bash\nls\n```"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                          "function": {"name": "ls", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(st.integers(0, len(_OPENING_KINDS) - 1), max_size=9), min_size=1, max_size=6),
       st.lists(st.integers(0, 9), min_size=1, max_size=6), st.booleans())
def test_a_remembered_task_end_is_what_reading_the_list_says(lists: list[list[int]], cuts: list[int],
                                                            copies: bool) -> None:
    """Lists that open with the same messages (the very objects, or equal copies) and then part, or end
    early: the remembered answer is always what reading the list gives."""
    shared = [dict(_OPENING_KINDS[k]) for k in lists[0]]
    for kinds, cut in zip(lists, itertools.cycle(cuts)):
        opening = [dict(m) for m in shared[:cut]] if copies else shared[:cut]
        messages = [*opening, *(dict(_OPENING_KINDS[k]) for k in kinds)]
        assert task_end(messages) == observations._task_end(messages)[0]


def test_the_task_end_of_a_resent_history_is_not_read_again(monkeypatch) -> None:
    """Asked about six times a request, of lists opening with the same messages: read once."""
    history = [{"role": "system", "content": "agent"},
               {"role": "user", "content": "Fix the failing refund test in payments/app.py, please."},
               *({"role": "user" if n % 2 else "assistant", "content": f"step {n}"} for n in range(40))]
    reads: list[int] = []
    real = observations._task_end
    monkeypatch.setattr(observations, "_task_end", lambda messages: reads.append(1) or real(messages))
    for end in range(10, 40):
        assert task_end(history[:end]) == 2
    assert len(reads) <= 1
