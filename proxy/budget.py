"""Layer 2: the four-state gate every upstream call passes: pass, warn, prune, refuse."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.layers.observations import Observations, for_policy
from proxy.layers.tool_results import prune
from proxy.model_map import model_window
from proxy.policy import Policy
from proxy.session_state import SessionState
from proxy.state import StateStore

log = logging.getLogger("ctxproxy.budget")

PASS, WARN, PRUNE, REFUSE = "pass", "warn", "prune", "refuse"


@dataclass
class GateResult:
    gate: str
    messages: list[dict[str, Any]]
    tokens: int  # counted tokens of messages + tools as forwarded
    estimated: int  # with pad_pct applied
    window: int


def window_for(policy: Policy, model: str) -> int:
    return policy.budget.max_input_tokens or model_window(model)


def padded(tokens: int, pad_pct: float) -> int:
    return math.ceil(tokens * (1 + pad_pct))


def check(original: list[dict[str, Any]], forwarded: list[dict[str, Any]],
          policy: Policy, model: str, state: SessionState, store: StateStore,
          count: Callable[[dict[str, Any]], int], total: int,
          protected: frozenset[str] = frozenset()) -> GateResult:
    """Gate one upstream call. `total` is the current count of `forwarded` plus the tools."""
    budget = policy.budget
    if not budget.enabled:
        return _layer1_only(original, forwarded, policy, model, state, store, count, total, protected)
    window = window_for(policy, model)
    estimated = padded(total, budget.pad_pct)
    if estimated < budget.soft_warn_at_pct * window:
        return GateResult(PASS, forwarded, total, estimated, window)
    if estimated < budget.prune_at_pct * window:
        if WARN not in state.warned:  # once per session per band, not once per turn
            state.warned.add(WARN)
            log.warning("context budget warn", extra={"session": state.session_id, "tokens": estimated,
                                                       "window": window, "pct": round(estimated / window, 3)})
        return GateResult(WARN, forwarded, total, estimated, window)
    target = math.floor(budget.prune_to_pct * window / (1 + budget.pad_pct))
    forwarded, total = prune(original, forwarded, state, store, count, total, target, budget.keep_recent,
                             protected, observations=_observations(policy))
    estimated = padded(total, budget.pad_pct)
    if estimated >= window:
        return GateResult(REFUSE, forwarded, total, estimated, window)
    state.warned.discard(WARN)
    return GateResult(PRUNE, forwarded, total, estimated, window)


def _layer1_only(original: list[dict[str, Any]], forwarded: list[dict[str, Any]],
                 policy: Policy, model: str, state: SessionState, store: StateStore,
                 count: Callable[[dict[str, Any]], int], total: int,
                 protected: frozenset[str]) -> GateResult:
    """Without the gate, Layer 1 still prunes on its own at tool_results.prune_at_pct (never refuses)."""
    layer1 = policy.tool_results
    if not layer1.enabled:
        return GateResult(PASS, forwarded, total, total, 0)
    window = window_for(policy, model)
    if total < layer1.prune_at_pct * window:
        return GateResult(PASS, forwarded, total, total, window)
    target = math.floor(policy.budget.prune_to_pct * window)
    forwarded, total = prune(original, forwarded, state, store, count, total, target, layer1.keep_recent,
                             protected, observations=_observations(policy))
    return GateResult(PRUNE, forwarded, total, total, window)


def _observations(policy: Policy) -> Observations:
    return for_policy(tuple(policy.tool_results.observation_patterns), policy.tool_results.threshold_tokens)
