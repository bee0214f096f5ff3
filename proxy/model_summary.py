"""Optional model-written summaries of large tool results, fetched through the same upstream.

Called before the pipeline (layers never talk HTTP); a failure or timeout falls back to the
deterministic summarizer. Whatever is chosen first is recorded and reused forever (sticky).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import anyio
import orjson

from proxy.layers import folded, folded_model
from proxy.policy import Policy
from proxy.session_state import SessionState
from proxy.state import StateStore
from proxy.upstream import Upstream

log = logging.getLogger("ctxproxy.summary")

MAX_INPUT_CHARS = 120_000
# Set per client request (and inherited by the background work it starts): archives each model call made
# on its behalf, for accounting: (model, HTTP status, ms, answer bytes).
Spend = Callable[[str, int, float, bytes], Awaitable[None]]
SPEND: contextvars.ContextVar[Spend | None] = contextvars.ContextVar("ctxproxy_spend", default=None)
PROMPT = (
    "You compress the output of a software tool for an AI agent that will read your text instead of "
    "the output. Write a compact factual digest: what the output is, its structure and size, the key "
    "results. Copy identifiers, file paths, numbers, URLs and every error or warning line exactly as "
    "written; never paraphrase them or invent anything. No preamble. At most 300 words.")


async def ask(upstream: Upstream, headers: dict[str, str], model: str, messages: list[dict[str, Any]],
              timeout_s: float) -> str | None:
    """One completion through the upstream; None on timeout, error status or an unreadable answer."""
    body = {"model": model, "temperature": 0, "messages": messages}
    started = time.perf_counter()
    try:
        with anyio.fail_after(timeout_s):
            response = await upstream.open("POST", "/chat/completions", b"", headers, orjson.dumps(body))
            payload = await Upstream.read(response, upstream.base_url)
    except Exception as exc:  # every caller has a deterministic fallback
        log.warning("model %s failed (%s); using the deterministic fallback", model, type(exc).__name__)
        return None
    if (spend := SPEND.get()) is not None:  # the proxy's own calls are spend, like the client's
        await spend(model, response.status_code, (time.perf_counter() - started) * 1000, payload)
    if response.status_code != 200:
        log.warning("model %s answered %s; using the deterministic fallback", model, response.status_code)
        return None
    try:
        content = orjson.loads(payload)["choices"][0]["message"]["content"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return None
    return content if isinstance(content, str) and content.strip() else None


async def summarize_one(upstream: Upstream, headers: dict[str, str], model: str, text: str,
                        tool_name: str | None, timeout_s: float) -> str | None:
    """One summary, or None (timeout, error status, empty or unhelpful answer)."""
    request = f"Tool: {tool_name or 'unknown'}\n\n{text[:MAX_INPUT_CHARS]}"
    content = await ask(upstream, headers, model, [{"role": "system", "content": PROMPT},
                                                   {"role": "user", "content": request}], timeout_s)
    if content is None or len(content) >= len(text) // 2:
        return None
    return content.strip()


async def prepare(upstream: Upstream, headers: dict[str, str], model: str,
                  pending: list[tuple[str, str, str | None]], timeout_s: float) -> dict[tuple[str, str], str]:
    """Summaries for every (call_id, content, tool) that needs one, fetched concurrently."""
    results = await asyncio.gather(*(summarize_one(upstream, headers, model, content, tool, timeout_s)
                                     for _, content, tool in pending))
    pairs = zip(pending, results, strict=True)
    return {(call_id, content): summary for (call_id, content, _), summary in pairs if summary is not None}


HEADLINE_PROMPT = (
    "Write one line of at most 25 words saying what this part of an agent conversation was about: what "
    "was asked, which tools ran, and the outcome. Copy ids, paths and numbers exactly. No preamble.")


async def write_headlines(upstream: Upstream, headers: dict[str, str], model: str,
                          evicted: list[tuple[Any, list[dict[str, Any]]]], timeout_s: float) -> None:
    """Background: model-written headlines for evicted exchanges, picked up at the next batch."""
    for entry, messages in evicted:
        transcript = "\n".join(f"{m.get('role')}: {str(m.get('content') or '')[:2000]}" for m in messages)
        prompt = [{"role": "system", "content": HEADLINE_PROMPT},
                  {"role": "user", "content": transcript[:20000]}]
        line = await ask(upstream, headers, model, prompt, timeout_s)
        if line is None:
            return  # the deterministic headlines stay
        entry.model_line = " ".join(line.split())[:300]


async def fold_with_model(upstream: Upstream, headers: dict[str, str], model: str,
                          evicted: list[tuple[Any, list[dict[str, Any]]]], state: SessionState,
                          store: StateStore, max_episodes: int, timeout_s: float) -> None:
    """Background folding: the model writes the episode (and the semantic memory when half the episodes
    are flushed); its JSON is validated and retried once, then the deterministic fallback is used."""
    messages = [m for _, exchange in evicted for m in exchange]
    seen = state.folded.total_turns_seen
    episode_id, turns = state.folded.current_episode_id + 1, (seen, seen + len(messages) - 1)
    episode = None
    for _ in range(2):
        text = await ask(upstream, headers, model, folded_model.episode_prompt(messages), timeout_s)
        episode = folded_model.parse_episode(text, episode_id, turns) if text else None
        if episode is not None:
            break
    memory, flushed = folded.add_episode(
        state.folded, episode or folded.episode_from_messages(messages, episode_id, turns), max_episodes)
    if flushed:
        semantic = None
        for _ in range(2):
            text = await ask(upstream, headers, model, folded_model.semantic_prompt(flushed, memory.semantic),
                             timeout_s)
            semantic = folded_model.parse_semantic(text) if text else None
            if semantic is not None:
                break
        memory = folded.apply_distilled(memory, semantic or folded.distill(flushed, memory.semantic))
    await anyio.to_thread.run_sync(_save_folded, store, state, memory)


def _save_folded(store: StateStore, state: SessionState, memory: folded.FoldedMemory) -> None:
    with store.session(state.tenant, state.session_id) as current:  # (committed like a request's state)
        current.folded = memory
        store.save_memory(current, "folded", memory.to_json())


def after_eviction(background: Callable[[Coroutine[Any, Any, None]], None], upstream: Upstream,
                   headers: dict[str, str], policy: Policy, evicted: list[tuple[Any, list[dict[str, Any]]]],
                   state: SessionState, store: StateStore) -> None:
    """Schedule the model work an eviction batch asks for (the deterministic parts already ran)."""
    timeout = policy.tool_results.summarizer_timeout_s
    if policy.summary.enabled and policy.summary.summarizer_model:
        background(write_headlines(upstream, headers, policy.summary.summarizer_model, evicted, timeout))
    if policy.folded.enabled and policy.folded.summarizer_model:
        background(fold_with_model(upstream, headers, policy.folded.summarizer_model, evicted, state, store,
                                   policy.folded.max_episodes, timeout))
