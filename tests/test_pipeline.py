"""A large resent request is rewritten on the event loop only when its work is in proportion to what is
new (pipeline.little_to_do): such a run makes no batch — nothing masked, evicted or pruned by the gate —
and a request that might is turned away before anything is done, then runs as it would have. Working
memory is saved when it starts or changes, and a session restored from it ends up the same."""

from __future__ import annotations

import copy
import itertools
from collections import Counter
from typing import Any

import orjson
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from proxy import budget, pipeline
from proxy import state as state_module
from proxy.errors import ContextLengthExceeded
from proxy.held_memory import held_total
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


class Archive:
    """The archive writer and reader for one process's StateStore: rows are readable once persisted (a
    session_memory row is replaced by the next of its kind, as the real upsert does)."""

    def __init__(self) -> None:
        self.memory_rows: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.working_writes = 0

    def persist(self, row: Any) -> None:
        if row.table == "session_memory":
            self.memory_rows[(row.row["tenant"], row.row["session_id"], row.row["kind"])] = row.row
            self.working_writes += row.row["kind"] == "working"

    def tool_result_rows(self, tenant: str, session_id: str) -> list[dict[str, Any]]:
        return []

    def tool_result_by_handle(self, tenant: str, handle: str) -> None:
        return None

    def session_window(self, tenant: str, session_id: str) -> None:
        return None

    def session_memory(self, tenant: str, session_id: str, kind: str) -> dict[str, Any] | None:
        return self.memory_rows.get((tenant, session_id, kind))


def entity_turns(turns: list[bool]) -> list[dict[str, Any]]:
    """A tool loop: each turn's result names an order (an entity for working memory) or is plain text."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You handle orders."},
                                      {"role": "user", "content": "Check my orders, then build the report."}]
    for k, names_one in enumerate(turns):
        name, result = ("get_order", orjson.dumps({"order_id": f"ORD-{k:04d}", "name": f"Order {k}",
                                                   "status": "shipped"}).decode()) \
            if names_one else ("bash", f"step {k}: compiled ok, nothing to report")
        call = {"id": f"c{k}", "type": "function", "function": {"name": name, "arguments": "{}"}}
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"c{k}", "content": result}]
    return messages


@settings(max_examples=30, deadline=None)
@given(turns=st.lists(st.booleans(), min_size=2, max_size=12), restart_at=st.integers(1, 11))
def test_working_memory_is_saved_when_it_starts_or_changes_and_restores_the_same(
        turns: list[bool], restart_at: int) -> None:
    loaded = LoadedPolicy("t", Policy.model_validate({"working_memory": {"inject": "always"},
                                                      "assembly": {"time_ms": 600_000}}), None)
    archive = Archive()
    live = StateStore(persist=archive.persist, lookup=archive)
    messages = entity_turns(turns)
    prefixes = [messages[:end] for end in range(4, len(messages) + 1, 2)]  # each ends with a result
    changes = 0
    for number, prefix in enumerate(prefixes):
        before = list(state.memory.entities) if (state := live.get("tenant-a", "s")) else []
        pipeline.run(pipeline.Conversation(MODEL, prefix, None), context(live, loaded))
        changes += number == 0 or turns[number]  # the first turn starts it; an order moves to the front
        assert live.get("tenant-a", "s").memory.entities != before or not turns[number] or number == 0
        if number + 1 == min(restart_at, len(prefixes) - 1):
            # A restart here: a new process builds the session from what was saved, and the next
            # request leaves it with the same working memory as the live process's.
            restarted = StateStore(persist=lambda row: None, lookup=archive)
            following = prefixes[number + 1]
            pipeline.run(pipeline.Conversation(MODEL, following, None), context(restarted, loaded))
            mirror = StateStore(persist=lambda row: None, lookup=None)
            for earlier in prefixes[:number + 2]:
                pipeline.run(pipeline.Conversation(MODEL, earlier, None), context(mirror, loaded))
            restored, whole = restarted.get("tenant-a", "s"), mirror.get("tenant-a", "s")
            assert restored.memory.entities == whole.memory.entities
    assert archive.working_writes == changes  # plain-text turns write nothing


def test_a_cache_marker_moved_to_the_newest_message_is_no_edited_history_for_working_memory() -> None:
    """Anthropic clients mark their newest message for caching every turn, so the message before it comes
    back without its marker: working memory goes on from where it was (it is not rebuilt from the whole
    history and saved again every turn), and ends as it would without markers."""
    loaded = LoadedPolicy("t", Policy.model_validate({"working_memory": {"inject": "always"},
                                                      "assembly": {"time_ms": 600_000}}), None)
    messages = entity_turns([True, False, False, False, False, False])
    prefixes = [messages[:end] for end in range(4, len(messages) + 1, 2)]
    marked_archive, plain_archive = Archive(), Archive()
    marked = StateStore(persist=marked_archive.persist, lookup=marked_archive)
    plain = StateStore(persist=plain_archive.persist, lookup=plain_archive)
    for prefix in prefixes:
        sent = [*prefix[:-1], {**prefix[-1], "cache_control": {"type": "ephemeral"}}]
        pipeline.run(pipeline.Conversation(MODEL, sent, None), context(marked, loaded))
        pipeline.run(pipeline.Conversation(MODEL, prefix, None), context(plain, loaded))
    assert marked_archive.working_writes == plain_archive.working_writes == 1  # when it started
    assert marked.get("tenant-a", "s").memory.entities == plain.get("tenant-a", "s").memory.entities


def test_a_cache_marker_moved_to_the_newest_message_keeps_the_client_side_cache_estimate() -> None:
    """The accounting's baseline (what the client's own request would have cost) counts the previous
    request as cached when it is a prefix of this one: a marker that moved off its last message is no
    edit (the provider's cached prefix stays). Chat clients sending Anthropic's markers in content parts
    (for OpenRouter, LiteLLM) move them every turn: each turn looked uncached, the savings overstated."""
    loaded = LoadedPolicy("t", Policy(), None)
    live = StateStore(persist=lambda row: None, lookup=None)
    turns = [{"role": "system", "content": "You are an agent. " * 300}]
    outcomes = []
    for number in range(3):
        turns.append({"role": "user", "content": [{"type": "text", "text": f"step {number}: go on"}]})
        marked_block = {**turns[-1]["content"][0], "cache_control": {"type": "ephemeral"}}
        newest = {**turns[-1], "content": [marked_block]}
        outcomes.append(pipeline.run(pipeline.Conversation(MODEL, [*turns[:-1], newest], None),
                                     context(live, loaded)))
        turns.append({"role": "assistant", "content": f"done {number}"})
    assert outcomes[0].tokens_before >= 1024
    for earlier, later in itertools.pairwise(outcomes):
        assert later.client_cached == earlier.tokens_before


def test_a_resent_marked_message_still_lets_the_next_request_onto_the_event_loop() -> None:
    """A client that keeps a marker on a message (Anthropic's two-breakpoint pattern: the last two user
    turns) resends it as the very object: the session's previous request is still continued (the cache
    estimate compares without markers, the loop's check by identity)."""
    loaded = LoadedPolicy("t", Policy(), None)
    live = StateStore(persist=lambda row: None, lookup=None)
    block = {"type": "text", "text": "fix it", "cache_control": {"type": "ephemeral"}}
    marked = {"role": "user", "content": [block]}
    first = [{"role": "system", "content": "You are an agent. " * 300}, marked]
    pipeline.run(pipeline.Conversation(MODEL, first, None), context(live, loaded))
    following = [*first, {"role": "assistant", "content": "done"}, {"role": "user", "content": "next"}]
    ctx = context(live, loaded)
    ctx.wait, ctx.fresh_bytes = False, len(orjson.dumps(following[2:]))
    outcome = pipeline.run(pipeline.Conversation(MODEL, following, None), ctx)  # (no WouldBlock)
    assert outcome.client_cached > 0


def test_a_last_message_decoded_anew_but_equal_still_lets_the_next_request_onto_the_event_loop() -> None:
    """Claude Code moves its cache marker off the previous turn's last message: the Messages codec, which
    leaves markers out of neutral messages, decodes that message anew into an equal object. The request
    still continues the session's previous one; one whose message there differs does not."""
    loaded = LoadedPolicy("t", Policy(), None)
    live = StateStore(persist=lambda row: None, lookup=None)
    first = [{"role": "system", "content": "You are an agent. " * 300}, {"role": "user", "content": "fix it"}]
    pipeline.run(pipeline.Conversation(MODEL, first, None), context(live, loaded))
    added = [{"role": "assistant", "content": "done"}, {"role": "user", "content": "next"}]
    for last, on_the_loop in (({"role": "user", "content": "fix it"}, True),
                              ({"role": "user", "content": "fix that"}, False)):
        following = [first[0], last, *added]
        ctx = context(live, loaded)
        ctx.wait, ctx.fresh_bytes = False, len(orjson.dumps(added))
        try:
            pipeline.run(pipeline.Conversation(MODEL, following, None), ctx)
            ran = True
        except WouldBlock:
            ran = False
        assert ran is on_the_loop
        pipeline.run(pipeline.Conversation(MODEL, first, None), context(live, loaded))  # (back to `first`)


def test_a_short_resent_history_walks_only_its_new_messages_for_their_memory(monkeypatch) -> None:
    """A session's carried memory is summed past what its previous request summed, however few its
    messages (a walk of every object of every message each turn cost Claude-style sessions ~40 µs)."""
    walked: list[int] = []
    monkeypatch.setattr(state_module, "held_total", lambda messages: walked.append(len(messages))
                        or held_total(messages))
    loaded = LoadedPolicy("t", Policy.model_validate({"window": {"enabled": False}}), None)
    store = StateStore()
    history: list[dict[str, Any]] = [{"role": "user", "content": "task " * 3000}]
    for turn in range(4):
        history = [*history, {"role": "assistant", "content": f"step {turn}"},
                   {"role": "user", "content": f"go {turn}"}]
        ctx = pipeline.PipelineContext(loaded, Session("short", "header"), "tenant-a", TOKENS, store)
        pipeline.run(pipeline.Conversation(MODEL, history, None), ctx)
        assert store.get("tenant-a", "short").carried_bytes == held_total(history)
    assert walked == [3, 2, 2, 2]


def test_idle_sessions_of_long_histories_stay_within_the_state_budget() -> None:
    """A session keeps its last request's messages (counts, rewrites and walks are keyed by them, for a
    resent history's next turn): their memory counts in the budget, summed past what was summed before.
    Before, sessions whose results were all short held their whole last parse each, uncounted."""
    loaded = LoadedPolicy("t", Policy.model_validate({"window": {"enabled": False}}), None)
    store = StateStore(budget_bytes=2_000_000)
    histories = {}
    for n in range(30):  # 30 sessions of ~220 KB of parsed history: over three times the budget
        history: list[dict[str, Any]] = [{"role": "user", "content": f"task {n}"}]
        for turn in range(3):  # a resent history: the very same objects and more
            history = [*history, *({"role": "assistant", "content": f"step {turn}.{k} " + "ok " * 1200}
                                   for k in range(20))]
            ctx = pipeline.PipelineContext(loaded, Session(f"s{n}", "header"), "tenant-a", TOKENS, store)
            pipeline.run(pipeline.Conversation(MODEL, history, None), ctx)
            state = store.get("tenant-a", f"s{n}")
            assert state.carried_bytes == held_total(history)
        histories[n] = history
        assert store.cached_bytes <= store.budget_bytes
    held = store.states()
    assert 1 < len(held) < 15 and held[-1].session_id == "s29"  # the least recently used ones left
    assert store.cached_bytes >= sum(held_total(histories[int(s.session_id[1:])]) for s in held)
