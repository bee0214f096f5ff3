"""Token counts of requests, memoised so a request costs what is new in it (the encoders: proxy/encoders.py;
model windows and prices: proxy/model_map.py)."""

from __future__ import annotations

import asyncio
import functools
import itertools
import operator
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from proxy import heavy, parallel
from proxy.encoders import (
    _count_message,
    _encoder,
    count_first_on,
    count_messages,
    count_text,
    encoding_name_for,
    use_cache_dir,
)
from proxy.kept_counts import FILE_NAME, KeptCounts
from proxy.model_map import model_window
from proxy.token_sums import Summed, extended_total

if TYPE_CHECKING:
    from proxy.policy import PolicyStore

REPLY_PRIMING = 3

# From here a request's uncounted messages are counted across threads (a long history's first sight).
PARALLEL_MESSAGES = 16
PARALLEL_CHARS = 256 * 1024
_CACHE_LIMIT = 200_000
_TOOLS_SEEN_LIMIT = 256  # tools lists remembered by identity
# Keys hold the counted text itself: bound the memo by the characters it keeps alive, not only entries.
_CACHE_CHARS = 64 * 1024 * 1024


# By model, then by message object: id -> (the message, its count; holding it, no other has its id).
ByIdentity = dict[int, tuple[dict[str, Any], int]]
Scoped = dict[str, ByIdentity]
_COUNT = operator.itemgetter(1)


class TokenCounter:
    """Counts request tokens; per-message counts are memoised so cost grows with new messages only."""

    def __init__(self) -> None:
        self._memo: dict[tuple[str, Any], int] = {}
        self._chars = 0
        self._lock = threading.Lock()
        self._scope = threading.local()  # within one request: counts by message identity
        self.kept: KeptCounts | None = None  # counts an earlier process kept (proxy/kept_counts.py)
        self._tools_seen: dict[tuple[Any, ...], tuple[tuple[Any, ...], int]] = {}

    @contextmanager
    def request_scope(self, carried: Scoped | None = None,
                      sums: dict[str, Summed] | None = None) -> Iterator[None]:
        """Within it, this thread counts each message object once (a request's layers walk the history
        several times). `carried`: the session's previous request's scope (a resent history is the same
        objects, wire/resent.py); `sums`: its recent list totals by model (token_sums.py)."""
        outer, outer_sums = getattr(self._scope, "counts", None), getattr(self._scope, "sums", None)
        self._scope.counts = outer if outer is not None else carried if carried is not None else {}
        self._scope.sums = outer_sums if outer is not None else sums
        try:
            yield
        finally:
            self._scope.counts, self._scope.sums = outer, outer_sums

    def _remember(self, key: tuple[str, Any], size: int, count: int) -> None:
        with self._lock:
            if len(self._memo) >= _CACHE_LIMIT or self._chars + size > _CACHE_CHARS:
                self._memo.clear()
                self._chars = 0
            self._memo[key] = count
            self._chars += size

    def warm(self, models: Iterable[str] = ("gpt-4o",)) -> None:
        """Load tokenizers before the first request. By default only o200k: current OpenAI models' and the
        fallback of unknown families. cl100k (gpt-4, gpt-3.5) and Claude's load at their first request
        (once, 0.1-0.3 s, one build however many ask at once): each holds ~30-80 MB."""
        for model in models:
            _encoder(encoding_name_for(model))

    def text(self, text: str, model: str) -> int:
        # (memoised however short: blocks recur every request, the auto-summary's lines every batch)
        family = encoding_name_for(model)
        key = (family, ("text", _compact("t", text)))
        found = self._memo.get(key)
        if found is None:
            found = heavy.call(count_text, text, family)
            self._remember(key, 64 + (len(text) if len(text) <= INLINE_KEY else 0), found)
        return found

    def message(self, message: dict[str, Any], model: str) -> int:
        counts: Scoped | None = getattr(self._scope, "counts", None)
        scoped = None if counts is None else counts.get(model)
        if scoped is None and counts is not None:
            scoped = counts[model] = {}
        if scoped is not None and (hit := scoped.get(id(message))) is not None:
            return hit[1]
        family = encoding_name_for(model)
        key = (family, _message_key(message))
        found = self._memo.get(key)
        if found is None:
            found = _count_message(message, family)
            self._remember(key, _key_size(key[1]), found)
        if scoped is not None:
            scoped[id(message)] = (message, found)
        return found

    def counter(self, model: str) -> Callable[[dict[str, Any]], int]:
        """`lambda m: self.message(m, model)` for the request scope this thread is in, but a message counted
        before in it costs one lookup: the layers ask for the same messages' counts many times."""
        counts: Scoped | None = getattr(self._scope, "counts", None)
        if counts is None:
            return lambda message: self.message(message, model)
        get = counts.setdefault(model, {}).get
        message_count = self.message

        def count(message: dict[str, Any]) -> int:
            hit = get(id(message))
            return hit[1] if hit is not None else message_count(message, model)
        return count

    def messages(self, messages: list[dict[str, Any]], model: str) -> int:
        counts: Scoped | None = getattr(self._scope, "counts", None)
        if counts is None:
            return REPLY_PRIMING + sum(self.message(m, model) for m in messages)
        scoped = counts.setdefault(model, {})
        sums: dict[str, Summed] | None = getattr(self._scope, "sums", None)
        recent = sums.setdefault(model, []) if sums is not None else []
        total = extended_total(recent, messages, lambda rest: self._summed(rest, model, scoped))
        return REPLY_PRIMING + total

    def _summed(self, messages: list[dict[str, Any]], model: str,
                scoped: ByIdentity) -> int:
        try:  # every message counted before in this scope (a request's later walks): one pass, in C
            return sum(map(_COUNT, map(scoped.__getitem__, map(id, messages))))
        except KeyError:  # (one is not)
            pass
        # Those counted before in this scope are summed in C; only the others are counted one by one.
        hits = list(map(scoped.get, map(id, messages)))
        known: Iterable[tuple[dict[str, Any], int]] = filter(None, hits)
        new = list(itertools.compress(messages, map(operator.not_, hits)))
        if len(new) >= PARALLEL_MESSAGES:  # (the memo's counts, and any counted across threads, go in
            self._count_across_threads(new, model, scoped)  # the scope: summed in C like the others)
            hits = list(map(scoped.get, map(id, new)))
            known = itertools.chain(known, filter(None, hits))
            new = list(itertools.compress(new, map(operator.not_, hits)))
        return sum(map(_COUNT, known)) + sum(self.message(m, model) for m in new)

    def _count_across_threads(self, new: list[dict[str, Any]], model: str,
                              scoped: ByIdentity) -> None:
        """A first sight of a long history: what the memo does not know is counted on every core
        (proxy/parallel.py), into the memo and this request's scope."""
        todo, sizes = self._unknown(new, model, scoped)
        if sum(sizes) < PARALLEL_CHARS:
            return  # (the caller counts them one by one: not worth a hand-over)
        counted = parallel.map_split(functools.partial(count_messages, family=encoding_name_for(model)),
                                     [message for message, _ in todo], sizes)
        self._record(todo, counted, scoped)

    def _unknown(self, messages: list[dict[str, Any]], model: str, scoped: ByIdentity,
                 ) -> tuple[list[tuple[dict[str, Any], tuple[str, Any]]], list[int]]:
        """Those of `messages` neither the memo nor (from PARALLEL_CHARS of them) the counts an earlier
        process kept know, with their memo keys and sizes; the others' counts go into `scoped`."""
        family = encoding_name_for(model)
        todo: list[tuple[dict[str, Any], tuple[str, Any]]] = []
        memo_get, message_key = self._memo.get, _message_key  # (a first walk: per message, locals)
        for message in messages:
            key = (family, message_key(message))
            if (found := memo_get(key)) is not None:
                scoped[id(message)] = (message, found)
            else:
                todo.append((message, key))
        sizes = [_rough_chars(message) for message, _ in todo]
        if self.kept is not None and sum(sizes) >= PARALLEL_CHARS:  # (after a restart: known there)
            restored = self.kept.restore(family, [message for message, _ in todo])
            self._record([t for t, c in zip(todo, restored, strict=True) if c is not None],
                         [c for c in restored if c is not None], scoped)
            unknown = [count is None for count in restored]
            todo, sizes = list(itertools.compress(todo, unknown)), list(itertools.compress(sizes, unknown))
        return todo, sizes

    def _record(self, todo: list[tuple[dict[str, Any], tuple[str, Any]]], counts: list[int],
                scoped: ByIdentity) -> None:
        for (message, key), count in zip(todo, counts, strict=True):
            self._remember(key, _key_size(key[1]), count)
            scoped[id(message)] = (message, count)

    def tools(self, tools: list[Any] | None, model: str) -> int:
        if not tools:
            return 0
        # The very tool objects counted before (a request counts its tools several times; a resent body's
        # are the objects of its earlier parse, wire/resent.py; ours are constants) cost a lookup: the
        # cost is serializing the list, tens of KB for a coding agent's.
        identity = (model, *map(id, tools))
        if (hit := self._tools_seen.get(identity)) is not None:
            return hit[1]
        serialized = orjson.dumps(tools).decode()
        key = (encoding_name_for(model), ("tools", _compact("t", serialized)))
        found = self._memo.get(key)
        if found is None:
            found = self.text(serialized, model)
            self._remember(key, 64, found)
        with self._lock:
            if len(self._tools_seen) >= _TOOLS_SEEN_LIMIT:
                self._tools_seen.clear()
            self._tools_seen[identity] = (tuple(tools), found)  # (held: no other object takes their ids)
        return found

    def request(self, messages: list[dict[str, Any]], tools: list[Any] | None, model: str) -> int:
        return self.messages(messages, model) + self.tools(tools, model)


def server_counter(cache: Path, on_restored: Callable[[int], object] | None = None,
                   loop: asyncio.AbstractEventLoop | None = None) -> TokenCounter:
    """A server's counter: tokenizer ranks cached in `cache` (a quick start), huge texts counted in the
    worker process (which reads the same cache), counts kept across restarts beside them; `loop`, the
    server's event loop, where tiktoken then counts fastest (encoders.count_first_on)."""
    count_first_on(loop)
    use_cache_dir(cache)
    heavy.enable(use_cache_dir, cache)
    tokens = TokenCounter()
    tokens.kept = KeptCounts(cache / FILE_NAME, on_restored=on_restored)
    return tokens


def warm_up(tokens: TokenCounter, policies: PolicyStore) -> None:
    """Load encodings (and litellm's window map when a policy needs it) before the first request."""
    tokens.warm()
    for name in policies.names():
        budget = policies.get(name).policy.budget
        if budget.enabled and budget.max_input_tokens is None:
            model_window("gpt-4o")
            break


INLINE_KEY = 128  # a shorter text is its own memo key


def _compact(kind: str, value: str | bytes) -> Any:
    """A memo key part that does not keep a long text alive: the text, or (kind, length, hash).

    Python computes the same hash for the dict lookup anyway, so this costs no extra pass over the
    text; a 64-bit collision among the memo's entries is vanishingly rare (and would only skew one count).
    """
    # Serialized bytes are never kept: orjson's output holds ~4 KB of capacity however short it is.
    return value if isinstance(value, str) and len(value) <= INLINE_KEY else (kind, len(value), hash(value))


def _message_key(message: dict[str, Any]) -> Any:
    """Only the fields that are counted, as a tuple: big strings are hashed once, never re-serialized."""
    content = message.get("content")
    if isinstance(content, str):
        content = _compact("s", content)
    elif content is not None:
        content = _compact("j", orjson.dumps(content))
    calls = message.get("tool_calls")
    name, call_id = message.get("name"), message.get("tool_call_id")
    return (str(message.get("role")), content, None if name is None else str(name),
            None if call_id is None else str(call_id), _compact("c", orjson.dumps(calls)) if calls else None)


def _key_size(key: tuple[Any, ...]) -> int:
    return 64 + sum(len(part) if isinstance(part, str | bytes) else 48 for part in key)


def _rough_chars(message: dict[str, Any]) -> int:
    """About how much text a message holds (to split a history into equal parts)."""
    content = message.get("content")
    return (len(content) if isinstance(content, str) else 1024) + 256 * len(message.get("tool_calls") or ())


