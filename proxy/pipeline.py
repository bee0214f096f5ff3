"""The layers in order. Each takes the conversation and returns the rewritten one; none talks HTTP.

    tool-result summaries (layer 1) → internal tools offered → budget gate (layer 2: prune / refuse)
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy import budget, telemetry
from proxy.accounting import prefix_hit, unmarked
from proxy.archive import TableRow, utc_now
from proxy.assembly import HEAD, TAIL, TASK, Assembly, Fragment, assemble, place
from proxy.checkpoint import write_checkpoint
from proxy.errors import ContextLengthExceeded
from proxy.internal_tools import client_defines_internal_name, with_internal_tools
from proxy.layers import splices, window
from proxy.layers.folded import add_episode, apply_distilled, distill, episode_from_messages
from proxy.layers.folded import render as render_folded
from proxy.layers.observations import for_policy
from proxy.layers.tool_results import Pending, pending_summaries, summarize_large
from proxy.layers.window import Evicted
from proxy.layers.working_memory import WorkingMemory, observe_messages
from proxy.pins import Pin, file_pins
from proxy.pins import render as render_pins
from proxy.policy import LoadedPolicy, Policy
from proxy.session import Session
from proxy.session_state import SessionState
from proxy.state import StateStore, WouldBlock
from proxy.tokens import TokenCounter
from proxy.window_step import clear_of_batches, first_batch_floor, slide_window


@dataclass
class Conversation:
    """What the layers may rewrite. The system prompt and the client's tools are never edited in place."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[Any] | None


@dataclass
class Outcome:
    messages: list[dict[str, Any]]
    tools: list[Any] | None
    changed: bool
    tokens_before: int
    tokens_after: int
    gate: str = budget.PASS
    window: int = 0
    internal_tools: bool = False
    original: list[dict[str, Any]] | None = None  # the client's messages aligned with `messages`
    evicted: list[Evicted] = field(default_factory=list)  # exchanges this request evicted
    blocks: Assembly = field(default_factory=Assembly)  # what was injected, skipped, and how long it took
    unrewritten: bool = False  # the codec refused the rewrite (it broke the API's rules): sent as received
    client_cached: int = 0  # tokens of this request the client's previous request shares (as a prefix)
    forwarded_cached: int = 0  # the same for what we forward (0 when this request changed sent bytes)
    decided: dict[str, int] = field(default_factory=dict)  # results newly summarized/masked/evicted, by kind


@dataclass
class PipelineContext:
    policy: LoadedPolicy
    session: Session
    tenant: str
    tokens: TokenCounter
    store: StateStore
    checkpoints_dir: Path | None = None  # None: refusals write no file (replay)
    prepared: dict[tuple[str, str], str] | None = None  # model-written summaries fetched beforehand
    now: Callable[[], float] = time.time
    pins: Callable[[], list[Pin]] | None = None  # runtime pins of this project for this tenant
    wait: bool = True  # False (on the event loop): raise state.WouldBlock rather than wait for the session
    # With wait False: the bytes of the request past what an earlier body repeated; None: a small request.
    # WouldBlock unless the session's last request plus these stays clear of every batch (a large
    # request is rewritten on the event loop only when its work is in proportion to what is new).
    fresh_bytes: int | None = None


@telemetry.traced("ctxproxy.pipeline", telemetry.outcome_attributes)  # spans: no-op without telemetry
def run(conversation: Conversation, context: PipelineContext) -> Outcome:
    """Rewrite one request, one of a session at a time: in a worker thread, or on the event loop
    (`context.wait` False) when nothing in it waits and its work is in proportion to what is new."""
    with context.store.session(context.tenant, context.session.id, wait=context.wait) as state:
        if not context.wait and context.fresh_bytes is not None and not little_to_do(state, context,
                                                                                      conversation):
            raise WouldBlock("a large request that may rewrite in a batch")  # (nothing done yet)
        with context.tokens.request_scope(state.counted, state.walks.setdefault("token sums", {})):
            outcome = _run(conversation, context, state)
        carried = forget_counts(state, conversation.messages, outcome.tokens_before)
        context.store.carry(state, conversation.messages, carried)
        return outcome


GROWTH_MARGIN_TOKENS = 2_048  # what injected blocks (working memory, pins) may add in one turn


def little_to_do(state: SessionState, context: PipelineContext, conversation: Conversation) -> bool:
    """This request continues the session's previous one (its last message is at the same place: the
    very object of the same resent body, or an equal one decoded anew where the client edited only what
    the codec leaves out: Claude Code moves its cache marker off the previous turn's last message), adds
    at most `fresh_bytes` to it (a token is at least one byte), and stays clear of every batch."""
    client, forwarded, messages = state.last_client, state.last_forwarded, conversation.messages
    if client is None or forwarded is None or context.fresh_bytes is None:
        return False
    length, last, _ = client
    if not 0 < length <= len(messages) or (messages[length - 1] is not last and messages[length - 1] != last):
        return False
    return clear_of_batches(context.policy.policy, conversation.model, forwarded[2],
                            context.fresh_bytes + GROWTH_MARGIN_TOKENS)


CARRY_FROM_TOKENS = 2_000  # about the body size (8 KB) from which a resent history is the same objects


def forget_counts(state: SessionState, messages: list[dict[str, Any]], tokens: int) -> bool:
    """Keep what is carried from request to request (token counts, rewritten copies) to the client's
    messages and their copies once other objects (blocks, an edited history) outnumber them; nothing
    for a short history, whose next request is parsed anew (new objects: nothing would be found).
    Whether the messages are carried."""
    if tokens < CARRY_FROM_TOKENS:
        state.counted, state.rewrites, state.walks = {}, {}, {}
        return False
    counted = sum(len(by_id) for by_id in state.counted.values())
    if counted > 3 * len(messages) + 256 or len(state.rewrites) > len(messages) + 256:
        keep = {id(m) for m in messages}
        state.rewrites = {k: v for k, v in state.rewrites.items() if k in keep}
        keep.update(id(copy) for _, copy in state.rewrites.values())
        state.counted = {model: {k: v for k, v in by_id.items() if k in keep}
                         for model, by_id in state.counted.items()}
    return True


def _run(conversation: Conversation, context: PipelineContext, state: SessionState) -> Outcome:
    # First, the model's own turns whole again: internal calls the proxy answered beside client calls.
    client, conversation = conversation, splices.restored(conversation, state)
    policy, model, tokens = context.policy.policy, conversation.model, context.tokens
    before = tokens.request(conversation.messages, conversation.tools, model)
    decided_before = Counter(state.decisions)

    count = tokens.counter(model)

    # A client tool named like one of ours: we cannot offer our tools, so replace and evict nothing.
    can_offer_tools = not client_defines_internal_name(conversation.tools)
    layer1 = policy.tool_results
    observations = for_policy(tuple(layer1.observation_patterns), layer1.threshold_tokens)
    original = conversation.messages

    def layer_one(messages: list[dict[str, Any]], force: bool = False) -> list[dict[str, Any]]:
        with telemetry.span("ctxproxy.tool_results"):  # (not a decorator: that would be applied each request)
            return summarize_large(messages, state, context.store, count, layer1.threshold_tokens,
                                   enabled=layer1.enabled and can_offer_tools,
                                   tools_tokens=tokens.tools(conversation.tools, model),
                                   prepared=context.prepared, observations=observations, force=force,
                                   carried=None if force else state.walks, skip_before=0 if force else doomed)

    offered_before = state.internal_tools_offered
    # A first batch over a long history: what it certainly evicts needs no summary and no placeholder.
    doomed = first_batch_floor(original, observations, state, context, model) \
        if policy.window.enabled and can_offer_tools and state.window.cut is None else 0
    messages = layer_one(original)
    # Offering our tools changes the tools list, which leads the prompt: what an earlier request of the
    # session had cached is billed again.
    breaking = (can_offer_tools and state.history_len > 0 and state.internal_tools_offered
                and not offered_before)
    evicted: list[Evicted] = []
    if policy.window.enabled and can_offer_tools:
        original, messages, evicted = slide_window(original, messages, state, context, conversation,
                                                   observations, breaking, doomed)
        if evicted and state.pending:  # the batch re-bills the prefix anyway: waiting summaries go now
            messages = layer_one(original, force=True)  # (masks, earlier summaries re-applied as recorded)
    if evicted and policy.folded.enabled and not policy.folded.summarizer_model:
        fold(evicted, state, context)  # with a model this happens in the background (see app)
    if policy.working_memory.enabled:
        observe_entities(conversation.messages, state, context)
    blocks = assemble_blocks(original, state, context, model)
    kept = messages
    # (the task ends where it ended before the window: an anchor kept after it is not part of it)
    system_end, task_end = window.leading_system(original), window.head_end(conversation.messages)
    original, messages = (place(original, blocks, system_end, task_end),
                          place(messages, blocks, system_end, task_end))
    state.injected_tokens = sum(v for k, v in blocks.tokens.items() if k != "summary")
    tools = _tools_for(conversation.tools, state, policy, can_offer_tools)
    unchanged = messages is conversation.messages and tools is conversation.tools
    # The kept messages and the blocks summed apart: the blocks are new objects every request, the kept
    # ones the very list the window's walk summed (its total carried).
    total = before if unchanged else \
        tokens.request(kept, tools, model) + sum(map(count, [*blocks.head, *blocks.task, *blocks.tail]))

    with telemetry.span("ctxproxy.budget"):
        result = budget.check(original, messages, policy, model, state, context.store, count, total)
    offered = _tools_for(conversation.tools, state, policy, can_offer_tools)
    total = result.tokens if offered == tools else tokens.request(result.messages, offered, model)
    tools = offered
    if result.gate == budget.REFUSE or (policy.budget.enabled and result.window and
                                        budget.padded(total, policy.budget.pad_pct) >= result.window):
        refuse(conversation, context, result)
    state.history_len = len(conversation.messages)
    decided = state.decisions - decided_before
    # The cache hit each side would have had (accounting): the previous request as a prefix of this one.
    client_cached = prefix_hit(state.last_client, client.messages)
    kept_prefix = not (decided or evicted or offered_before != state.internal_tools_offered)
    forwarded_cached = prefix_hit(state.last_forwarded, result.messages) if kept_prefix else 0
    state.last_client = (len(client.messages), client.messages[-1] if client.messages else None, before)
    state.last_forwarded = (len(result.messages), result.messages[-1] if result.messages else None, total)
    return Outcome(result.messages, tools, changed=result.messages is not client.messages
                   or tools is not conversation.tools, tokens_before=before, tokens_after=total,
                   client_cached=client_cached, forwarded_cached=forwarded_cached, decided=dict(decided),
                   gate=result.gate, window=result.window, internal_tools=tools is not conversation.tools,
                   original=original, evicted=evicted, blocks=blocks)


@telemetry.traced("ctxproxy.blocks")
def assemble_blocks(original: list[dict[str, Any]], state: SessionState, context: PipelineContext,
                    model: str) -> Assembly:
    """Every injected block, through one budgeted assembly: pinned, auto-summary (then more to come)."""
    policy, tokens = context.policy.policy, context.tokens

    def pinned() -> list[Fragment]:
        pins = file_pins(context.policy, tokens) + (context.pins() if context.pins else [])
        text = render_pins(pins)
        return [Fragment("pinned", text, tokens.text(text, model), 1, HEAD, required=True)] if text else []

    def working_memory() -> list[Fragment]:
        # Until a result leaves the prompt (summarized, masked or evicted) every entity is in it verbatim:
        # the block would only add tokens and move the cache boundary every turn.
        if not policy.working_memory.enabled or (policy.working_memory.inject == "needed"
                                                 and not state.internal_tools_offered):
            return []
        text = state.memory.render()
        return [Fragment("working_memory", text, tokens.text(text, model), 5, TAIL)] if text else []

    def summary() -> list[Fragment]:
        block = state.window.block if policy.summary.enabled and state.window.cut is not None else None
        return [Fragment("summary", block, state.window.block_tokens, 2, TASK, recency=0.5)] if block else []

    last_user: dict[str, Any] = next((m for m in reversed(original) if m.get("role") == "user"), {})
    content = last_user.get("content")
    query = content if isinstance(content, str) else ""
    def folded_memory() -> list[Fragment]:
        text = render_folded(state.folded) if policy.folded.enabled else ""
        return [Fragment("folded", text, tokens.text(text, model), 3, TASK, recency=0.7)] if text else []

    sources = [("pinned", pinned), ("summary", summary), ("folded", folded_memory),
               ("working_memory", working_memory)]
    return assemble(sources, query, policy.assembly.tokens_max, policy.assembly.time_ms, policy.summary.role)


def fold(evicted: list[Evicted], state: SessionState, context: PipelineContext) -> None:
    """Deterministic folding: an evicted batch becomes one episode; past max_episodes the oldest half
    is distilled into semantic memory."""
    messages = [m for _, exchange in evicted for m in exchange]
    memory = state.folded
    episode = episode_from_messages(messages, memory.current_episode_id + 1,
                                    (memory.total_turns_seen, memory.total_turns_seen + len(messages) - 1))
    memory, flushed = add_episode(memory, episode, context.policy.policy.folded.max_episodes)
    if flushed:
        memory = apply_distilled(memory, distill(flushed, memory.semantic))
    state.folded = memory
    context.store.save_memory(state, "folded", memory.to_json())


def observe_entities(messages: list[dict[str, Any]], state: SessionState, context: PipelineContext) -> None:
    """Feed the tool results this session has not seen yet to its working memory (MRU of entities)."""
    settings = context.policy.policy.working_memory
    seen = state.memory_seen
    if seen > len(messages) or (seen and messages[seen - 1] is not state.memory_last
                                and unmarked(messages[seen - 1]) != unmarked(state.memory_last)):
        state.memory, seen = WorkingMemory(settings.max_entities), 0  # an edited history: start over
    if seen == len(messages):
        return
    state.memory.max_entities = settings.max_entities
    before = state.memory.entities  # (observing an entity makes a new list)
    observe_messages(state.memory, messages, max_from_list=settings.max_from_list,
                     type_patterns=settings.type_patterns or None, start=seen)
    state.memory_seen, state.memory_last = len(messages), messages[-1]
    if not seen or state.memory.entities is not before:
        # Saved when it starts (which also marks the session as one that existed, after a restart) and when
        # it changes: a session restored with an older `seen` observes the messages since again, which
        # changed nothing the first time and change nothing now. (Saved every turn, a session whose results
        # name no entity — a text-protocol agent's — wrote its last message out on every request.)
        context.store.save_memory(state, "working", {"version": 1, "memory": state.memory.to_dict(),
                                                     "seen": state.memory_seen, "last": state.memory_last})


def needs_model_summaries(conversation: Conversation, context: PipelineContext) -> Pending:
    """What a summarizer model would be asked to summarize for this request (empty without one)."""
    layer1 = context.policy.policy.tool_results
    if not (layer1.enabled and layer1.summarizer_model) or client_defines_internal_name(conversation.tools):
        return []
    state = context.store.get(context.tenant, context.session.id)
    return pending_summaries(conversation.messages, state,
                             lambda m: context.tokens.message(m, conversation.model), layer1.threshold_tokens,
                             for_policy(tuple(layer1.observation_patterns), layer1.threshold_tokens))


def gate_round(original: list[dict[str, Any]], forwarded: list[dict[str, Any]], tools: list[Any] | None,
               model: str, context: PipelineContext, protected: frozenset[str]) -> budget.GateResult:
    """Gate an internal round, whose forwarded list ends with internal calls and their results."""
    tokens = context.tokens
    total = tokens.request(forwarded, tools, model)
    with context.store.session(context.tenant, context.session.id) as state:
        result = budget.check(original, forwarded, context.policy.policy, model, state, context.store,
                              lambda m: tokens.message(m, model), total, protected)
    if result.gate == budget.REFUSE:
        refuse(Conversation(model, original, tools), context, result)
    return result


def _tools_for(client_tools: list[Any] | None, state: SessionState, policy: Policy,
               can_offer: bool) -> list[Any] | None:
    """Offer our tools from the first replaced result or evicted exchange on, together (sticky)."""
    if not (can_offer and state.internal_tools_offered):
        return client_tools
    return with_internal_tools(client_tools, read=policy.tool_results.enabled or policy.budget.enabled,
                               recall=policy.window.enabled)


def refuse(conversation: Conversation, context: PipelineContext, result: budget.GateResult) -> None:
    checkpoint_id = "ckpt-" + uuid.uuid4().hex
    budget_policy = context.policy.policy.budget
    message = (f"The conversation needs ~{result.estimated} input tokens after pruning, over the "
               f"{result.window}-token window of {conversation.model or 'the model'}. Shorten or split the "
               f"task (checkpoint {checkpoint_id}).")
    if context.checkpoints_dir is not None:
        write_checkpoint(context.checkpoints_dir, checkpoint_id, model=conversation.model,
                         estimated_tokens=result.estimated, max_input_tokens=result.window,
                         messages=result.messages, redact_secrets=budget_policy.checkpoint_redact_secrets)
        context.store.persist(TableRow("tickets", {
            "id": checkpoint_id, "created_at": utc_now(), "tenant": context.tenant,
            "session_id": context.session.id, "kind": "decompose-required", "severity": "critical",
            "checkpoint_id": checkpoint_id, "estimated_tokens": result.estimated,
            "max_input_tokens": result.window, "message": message}))
    raise ContextLengthExceeded(message, extra={"checkpoint_id": checkpoint_id,
                                                "estimated_tokens": result.estimated,
                                                "max_input_tokens": result.window})
