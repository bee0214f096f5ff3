"""Layer 3 as the pipeline runs it: the window's budget for a model, masking before evicting, what a
first batch certainly evicts, and storing what an eviction takes out of the prompt."""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from proxy import budget, telemetry
from proxy.internal_tools import with_internal_tools
from proxy.layers import window
from proxy.layers.observations import Observations
from proxy.layers.tool_results import EVICTED, Found, calls_by_id, found_in, maskable, observed_in, prune
from proxy.layers.window import Evicted
from proxy.policy import Policy
from proxy.session_state import SessionState
from proxy.state import StateStore
from proxy.tokens import REPLY_PRIMING

if TYPE_CHECKING:
    from proxy.pipeline import Conversation, PipelineContext


@telemetry.traced("ctxproxy.window")
def slide_window(original: list[dict[str, Any]], forwarded: list[dict[str, Any]], state: SessionState,
                 context: PipelineContext, conversation: Conversation, observations: Observations,
                 breaking: bool = False, doomed: int = 0,
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[Evicted]]:
    """Layer 3: over the window's budget, mask old results first (placeholders naming their handles,
    the conversation itself stays); if that alone cannot reach the low-water mark, mask all that may be
    and evict whole exchanges in the same request (see window.masking_target). One batch at a time, so the
    cached prefix survives between batches.

    A request that re-bills the prompt anyway (`breaking`: our tools are offered for the first time; or
    this batch masks) makes its batch from three quarters of the way from the low-water mark to the
    budget on, and goes down to the low-water mark: the break at hand pays for the batch, and the next
    break is a batch away instead of a turn or two."""
    policy, tokens, model = context.policy.policy, context.tokens, conversation.model
    budget_tokens, low_water, limit = window_sizes(policy, model)
    early = early_batch(budget_tokens, low_water)  # a batch from here when the cache breaks anyway
    summary_tokens = min(policy.summary.max_tokens, budget_tokens * 15 // 100)
    internal = with_internal_tools(None, read=True, recall=True) or []
    fixed = tokens.tools([*(conversation.tools or []), *internal], model) + state.injected_tokens

    count = tokens.counter(model)

    found = found_in(original, observations, state.walks)
    observed = observed_in(original, found, state.walks)
    keep_recent = policy.tool_results.keep_recent
    newest = found[-keep_recent:] if keep_recent else []
    keep_from = window.turn_start(original, newest[0][0]) if newest else None

    cut = window.sticky_cut(original, state, lambda t: tokens.text(t, model), context.now())
    view = window.kept_view(original, cut, observed)
    block = state.window.block_tokens if state.window.block else 0
    # (no cut: the view is every index, and the very list is summed again, a lookup, not a copy's walk)
    shown = forwarded if len(view) == len(forwarded) else [forwarded[i] for i in view]
    total = fixed + block + tokens.messages(shown, model) - REPLY_PRIMING
    batch_above = early if breaking else None
    kept: int | None = total  # (what choose_cut would sum again for the cut at hand, until masked)
    if total > (batch_above or budget_tokens) and policy.tool_results.enabled:
        start = max(cut or 0, window.head_end(original), doomed)  # what the cut removes needs no mask
        savings = maskable(original, forwarded, state, count, keep_recent, start=start,
                           observations=observations)
        target = window.masking_target(forwarded, savings, cut, total, count, budget_tokens, low_water,
                                summary_tokens, fixed + block, observed, keep_from, limit, batch_above)
        if target is not None:
            forwarded, masked = prune(original, forwarded, state, context.store, count, total, target,
                                      keep_recent, start=start, observations=observations)
            if masked < total:  # a break: masking all (target 0) means evicting to the low-water mark too
                batch_above = low_water if target == 0 else early
            total, kept = masked, None

    known_calls: list[dict[str, tuple[str, str | None]]] = []

    def calls() -> dict[str, tuple[str, str | None]]:  # (once per batch, and only if needed)
        if not known_calls:
            known_calls.append(calls_by_id(original))
        return known_calls[0]

    def keep(start: int, stop: int) -> dict[int, str]:
        return keep_evicted(start, stop, found, calls, state, context.store)

    original, forwarded, evicted = window.slide(
        original, forwarded, state, count, lambda t: tokens.text(t, model),
        budget_tokens=budget_tokens, low_water_tokens=low_water, summary_tokens=summary_tokens,
        summary=policy.summary.enabled, fixed_tokens=fixed, now=context.now(), observed=observed,
        keep_from=keep_from, keep=keep, limit_tokens=limit, batch_above=batch_above, kept_tokens=kept)
    if evicted:
        context.store.save_window(state)
    return original, forwarded, evicted


def window_sizes(policy: Policy, model: str) -> tuple[int, int, int | None]:
    """The window's budget, its low-water mark, and where the budget gate starts pruning (None: off)."""
    size = budget.window_for(policy, model)
    budget_tokens = policy.window.max_tokens or math.floor(policy.window.max_pct * size)
    limit = math.floor(policy.budget.prune_at_pct * size / (1 + policy.budget.pad_pct)) \
        if policy.budget.enabled else None
    return budget_tokens, math.floor(policy.window.low_water_pct * budget_tokens), limit


def early_batch(budget_tokens: int, low_water: int) -> int:
    """Where a batch is made when the cache breaks anyway: three quarters of the way to the budget."""
    return low_water + (budget_tokens - low_water) * 3 // 4


def clear_of_batches(policy: Policy, model: str, last_tokens: int, new_tokens: int) -> bool:
    """Whether a request of at most `new_tokens` more than the `last_tokens` forwarded last time stays
    below every point where a layer rewrites in a batch (masking, eviction, the gate's pruning, layer
    1's pruning when the gate is off): its work is then in proportion to what is new."""
    size = budget.window_for(policy, model)
    budget_tokens, low_water, limit = window_sizes(policy, model)
    ceilings = [early_batch(budget_tokens, low_water)] if policy.window.enabled else []
    if limit is not None:
        ceilings.append(limit)
    elif policy.tool_results.enabled:
        ceilings.append(math.floor(policy.tool_results.prune_at_pct * size))
    return last_tokens + new_tokens < min(ceilings, default=2**62)


def first_batch_floor(original: list[dict[str, Any]], observations: Observations, state: SessionState,
                      context: PipelineContext, model: str) -> int:
    """Before which index this request evicts everything for sure (window.first_batch_floor); 0 while
    the history is within the window's budget, the cheap common case."""
    budget_tokens, low_water, limit = window_sizes(context.policy.policy, model)
    over = max(budget_tokens, limit or 0)
    total = context.tokens.messages(original, model)  # (summed in C)
    if total <= over:
        return 0
    found = found_in(original, observations, state.walks)
    # (the results' total carried too: a resent history adds its new results to the last request's)
    results = context.tokens.messages([original[index] for index, _ in found], model)
    return window.first_batch_floor(original, found, context.tokens.counter(model), over, low_water,
                                    context.policy.policy.tool_results.keep_recent, total - REPLY_PRIMING,
                                    results - REPLY_PRIMING)


def keep_evicted(start: int, stop: int, found: list[Found],
                 calls: Callable[[], dict[str, tuple[str, str | None]]], state: SessionState,
                 store: StateStore) -> dict[int, str]:
    """Store every result an eviction takes out of the prompt, so read_tool_result returns it byte for
    byte by the handle its headline names (results already replaced keep their handle). `found` is in
    index order; `calls()` names each call's tool."""
    handles: dict[int, str] = {}
    first = bisect.bisect_left(found, start, key=operator.itemgetter(0))
    for index, (call_id, content) in itertools.takewhile(lambda f: f[0] < stop, found[first:]):
        stored = state.lookup(call_id, content)
        if stored is None:
            waiting = state.pending.pop((call_id, content), None)
            stored = store.record(state, call_id, content, calls().get(call_id, (None, None))[0], "",
                                  EVICTED, handle=waiting[0] if waiting else None)
        handles[index] = stored.handle
    return handles
