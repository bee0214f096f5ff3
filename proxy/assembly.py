"""Assembly of every injected block under a token budget and a time budget.

Sources are asked in precedence order; one that fails, or that the deadline does not reach, is skipped
(and reported) instead of delaying the request. Pinned knowledge is always in (it has its own hard
budget); the rest is scored — BM25 relevance to the last user message, recency, source precedence —
and selected within `tokens_max`, duplicates dropped. Placement is fixed per source, not per score, so
the prompt prefix stays stable: slow-changing blocks right after the system prompt, fast-changing ones
late (before the last user message).
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("ctxproxy.assembly")

HEAD, TASK, TAIL = "head", "task", "tail"  # after the system prompt | after the task statement | late
_WORD = re.compile(r"\w+", re.UNICODE)


@dataclass
class Fragment:
    source: str
    text: str
    tokens: int
    precedence: int  # lower = more important, and placed earlier
    placement: str = HEAD
    recency: float = 1.0  # 0..1
    required: bool = False


@dataclass
class Assembly:
    head: list[dict[str, Any]] = field(default_factory=list)  # after the system prompt, in order
    task: list[dict[str, Any]] = field(default_factory=list)  # after the task statement, in order
    tail: list[dict[str, Any]] = field(default_factory=list)  # before the last user message
    skipped: list[str] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=dict)
    duration_ms: float = 0.0


Source = tuple[str, Callable[[], list[Fragment]]]


def bm25(query: str, documents: list[str], k1: float = 1.2, b: float = 0.75) -> list[float]:
    """Okapi BM25 of each document against the query, over this small corpus."""
    terms = [t.lower() for t in _WORD.findall(query)]
    docs = [Counter(t.lower() for t in _WORD.findall(d)) for d in documents]
    if not terms or not docs:
        return [0.0] * len(documents)
    lengths = [sum(d.values()) for d in docs]
    average = sum(lengths) / len(docs) or 1.0
    scores = []
    for doc, length in zip(docs, lengths, strict=True):
        score = 0.0
        for term in set(terms):
            having = sum(1 for d in docs if term in d)
            idf = math.log(1 + (len(docs) - having + 0.5) / (having + 0.5))
            tf = doc.get(term, 0)
            score += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / average)) if tf else 0.0
        scores.append(score)
    return scores


def assemble(sources: list[Source], query: str, tokens_max: int, time_ms: float, role: str,
             clock: Callable[[], float] = time.perf_counter) -> Assembly:
    started = clock()
    result = Assembly()
    fragments: list[Fragment] = []
    for name, produce in sources:
        if (clock() - started) * 1000 > time_ms:
            result.skipped.append(f"{name}:deadline")
            continue
        try:
            fragments.extend(produce())
        except Exception:  # a broken source costs its block, never the request
            log.exception("assembly: source %s failed; skipped", name)
            result.skipped.append(f"{name}:error")
    seen: set[str] = set()
    unique = []
    for fragment in fragments:
        if fragment.text.strip() and fragment.text not in seen:
            seen.add(fragment.text)
            unique.append(fragment)
    chosen = [f for f in unique if f.required]
    optional = [f for f in unique if not f.required]
    if sum(f.tokens for f in optional) <= tokens_max:
        ranked = list(range(len(optional)))  # all of them fit: no choice to rank (the query can be huge)
    else:
        relevance = bm25(query, [f.text for f in optional])
        top = max(relevance, default=0.0) or 1.0
        ranked = sorted(range(len(optional)), key=lambda i: -(
            0.5 * relevance[i] / top + 0.2 * optional[i].recency + 0.3 / optional[i].precedence))
    budget = tokens_max
    for index in ranked:
        if optional[index].tokens <= budget:
            chosen.append(optional[index])
            budget -= optional[index].tokens
        else:
            result.skipped.append(f"{optional[index].source}:budget")
    chosen.sort(key=lambda f: f.precedence)
    for fragment in chosen:
        message = {"role": role, "content": fragment.text}
        {HEAD: result.head, TASK: result.task}.get(fragment.placement, result.tail).append(message)
        result.tokens[fragment.source] = result.tokens.get(fragment.source, 0) + fragment.tokens
    result.duration_ms = (clock() - started) * 1000
    return result


def place(messages: list[dict[str, Any]], assembly: Assembly, system_end: int,
          task_end: int | None = None) -> list[dict[str, Any]]:
    """Insert the blocks: head after the system prompt, task after the task statement (so a block that
    changes with each eviction batch leaves the system prompt and the task in the provider's cache), tail
    before a final user message, else last."""
    if not assembly.head and not assembly.task and not assembly.tail:
        return messages  # unchanged: the request can go upstream byte for byte
    task_end = system_end if task_end is None else max(task_end, system_end)
    out = [*messages[:system_end], *assembly.head, *messages[system_end:task_end], *assembly.task,
           *messages[task_end:]]
    if not assembly.tail:
        return out
    if out and out[-1].get("role") == "user":
        return [*out[:-1], *assembly.tail, out[-1]]
    return [*out, *assembly.tail]
