"""Optional model-written summaries of large tool results, fetched through the same upstream.

Called before the pipeline (layers never talk HTTP); a failure or timeout falls back to the
deterministic summarizer. Whatever is chosen first is recorded and reused forever (sticky).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import anyio
import orjson

from proxy.upstream import Upstream

log = logging.getLogger("ctxproxy.summary")

MAX_INPUT_CHARS = 120_000
PROMPT = (
    "You compress the output of a software tool for an AI agent that will read your text instead of "
    "the output. Write a compact factual digest: what the output is, its structure and size, the key "
    "results. Copy identifiers, file paths, numbers, URLs and every error or warning line exactly as "
    "written; never paraphrase them or invent anything. No preamble. At most 300 words.")


async def summarize_one(upstream: Upstream, headers: dict[str, str], model: str, text: str,
                        tool_name: str | None, timeout_s: float) -> str | None:
    """One summary, or None (timeout, error status, empty or unhelpful answer)."""
    body = {"model": model, "temperature": 0, "messages": [
        {"role": "system", "content": PROMPT},
        {"role": "user", "content": f"Tool: {tool_name or 'unknown'}\n\n{text[:MAX_INPUT_CHARS]}"}]}
    try:
        with anyio.fail_after(timeout_s):
            response = await upstream.open("POST", "/chat/completions", b"", headers, orjson.dumps(body))
            payload = await Upstream.read(response, upstream.base_url)
    except Exception as exc:  # the deterministic summary is always there to fall back on
        log.warning("summarizer model %s failed (%s); using the deterministic summary", model,
                    type(exc).__name__)
        return None
    if response.status_code != 200:
        log.warning("summarizer model %s answered %s; using the deterministic summary", model,
                    response.status_code)
        return None
    try:
        content = orjson.loads(payload)["choices"][0]["message"]["content"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return None
    if not isinstance(content, str) or not content.strip() or len(content) >= len(text) // 2:
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
        body = {"model": model, "temperature": 0, "messages": [
            {"role": "system", "content": HEADLINE_PROMPT}, {"role": "user", "content": transcript[:20000]}]}
        try:
            with anyio.fail_after(timeout_s):
                response = await upstream.open("POST", "/chat/completions", b"", headers, orjson.dumps(body))
                payload = await Upstream.read(response, upstream.base_url)
            line = orjson.loads(payload)["choices"][0]["message"]["content"] if response.status_code == 200 \
                else None
        except Exception as exc:  # the deterministic headline stays
            log.warning("headline model %s failed (%s)", model, type(exc).__name__)
            return
        if isinstance(line, str) and line.strip():
            entry.model_line = " ".join(line.split())[:300]
