"""A resent history is parsed once: only what is new in a request body is parsed again.

Agents send the whole conversation with every request, so a long session's body is megabytes of which
only the last few messages are new. When a large body starts with the same bytes as a body parsed before
up to the end of one of its messages, those messages are taken from the earlier parse — the very same
objects, so everything keyed by them downstream (token counts, string hashes Python caches, layer
decisions) is found again instead of recomputed — and only the rest of the body is parsed.

Correctness rests on bytes alone: a message is reused only when every byte up to its end is identical, and
a JSON parser's state at that point depends on nothing else, so the result equals a full parse of the new
body (duplicate keys, odd shapes or anything unparsed fall back to one). Nothing here depends on which
session or tenant sent a body. Parsed messages are shared between requests, so nothing may edit them in
place (the pipeline never does: tests/test_invariants.py).
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.held_memory import held_bytes
from proxy.wire.byte_prefix import WINDOW, same_before, same_start
from proxy.wire.json_layout import Layout, element_ends, layout_of
from proxy.wire.splice import Spans

# A smaller body is parsed whole every request: tens of microseconds, and its few dozen messages, new
# objects every time, are looked up anew downstream (token counts, rewrites). A larger one's are not:
# from hundreds of messages that walk costs more than the parse (ms a request at 400).
MIN_BYTES = 8 * 1024
GROUP_PREFIX = 64  # bodies are grouped by their opening bytes (model, the system prompt's start)
GROUP_SIZE = 128  # bodies remembered per group (concurrent sessions of one agent share their opening)
TAIL_EDITS = 2  # a session's next body may differ in this many of its previous body's last elements
PROBES = 4  # fresh_bytes findings held for the parse that follows (each holds its body until then)
# (whose checks the bodies passed: a route's own, "" for chat's; the array's key; the opening bytes)
Group = tuple[str, str, bytes]

_TAIL_KEY = "\x00resent"
_TAIL_OPEN = b'{"\\u0000resent":[0'
_CLOSE = 0x5D  # ]


@dataclass
class Resent:
    body: dict[str, Any]
    reused: int  # leading elements taken from an earlier body (checked then)
    group: Group
    entry: _Body | None  # what to remember once checked (None: the new elements' ends are unknown)
    source: _Body  # the earlier body its first `reused` elements are taken from
    same_keys: frozenset[str] = frozenset()  # other keys whose values are its very objects (checked then)


class _Body:
    def __init__(self, raw: bytes, body: dict[str, Any], layout: Layout, keys_held: int = 0) -> None:
        self.raw, self.body, self.layout = raw, body, layout
        self.spans: Spans | None = None  # handed to the codec (wire/splice.py), once checked
        # memory the parsed keys beside the array hold: counted again only when a resend's bytes after
        # the array differ (the same bytes are taken as the very objects)
        self.keys_held = keys_held
        # What remembering it holds: its bytes and its parse (1.1 to 4 times the bytes in ../shared/traces:
        # counting the bytes alone let the cache hold several times its budget).
        self.cost = len(raw) + keys_held + (layout.held[-1] if layout.held else 0)
        self.derived_cost = 0  # of it: what a codec made of it holds (wire/decoded_prefix.py)
        # where its first element ends and the bytes just before it (a remembered body has elements)
        first_end = layout.ends[0] if layout.ends else 0
        self._first = (first_end, raw[first_end - WINDOW:first_end] if first_end >= WINDOW else None)

    def same_after(self, raw: bytes, closing: int) -> bool:
        """Whether `raw` past its array's `]` (at `closing`) is this body's past its own, byte for byte: the
        keys after the array (Claude Code sends its system prompt and tools there) parse the same."""
        mine = self.layout.closing
        return mine >= 0 and len(raw) - closing == len(self.raw) - mine and raw.endswith(self.raw[mine:])

    def resent_whole(self, raw: bytes) -> bool:
        """Whether `raw` repeats all of this body's elements (`shares_first` told before)."""
        return self._repeats(raw, len(self.layout.ends))

    def _repeats(self, raw: bytes, count: int) -> bool:
        """Whether `raw` repeats this body's first `count` elements: told by a few bytes before their end,
        then one memcmp of everything before it."""
        end = self.layout.ends[count - 1]
        return same_before(raw, self.raw, end) and same_start(raw, self.raw, end)

    def shares_first(self, raw: bytes) -> bool:
        """Whether `raw` could repeat this body's first element: the bytes just before its end are the same
        (another session of the same agent parts in its first element, its task, mostly: its many
        bodies are told apart by slicing a few bytes instead of a memcmp call each)."""
        end, before = self._first  # (kept: one slice of `raw` a candidate, however many there are)
        return before is None or raw[end - WINDOW:end] == before

    def continued(self, raw: bytes) -> int:
        """How many of this body's elements `raw` repeats when it is this body's session going on with its
        last few elements edited (Anthropic clients move their cache marker every turn), else 0 (its
        first element shared: `shares_first` told before): the counts tried largest first, each told by a
        few bytes before one memcmp of everything before it."""
        ends = self.layout.ends
        for count in range(len(ends) - 1, max(len(ends) - TAIL_EDITS - 1, 0), -1):
            if self._repeats(raw, count):
                return count if continues(count, len(ends)) else 0
        return 0

    def reusable(self, raw: bytes) -> int:
        """How many leading elements `raw` repeats byte for byte (memcmp stops at the first difference:
        another session's body, which differs early, costs next to nothing). The search, for a body that
        does not continue this one (`resent_whole` and `continued` tell those; `_best` asks them first)."""
        ends, mine = self.layout.ends, self.raw
        # The largest n with the first n elements repeated: galloping from the start first, so a body
        # that parts early (another session of the same agent: its task differs) costs a call or two.
        low, high, step = 0, len(ends), 1
        while low + step <= high:
            if not same_start(raw, mine, ends[low + step - 1]):
                high = low + step - 1
                break
            low, step = low + step, step * 2
        while low < high:
            middle = (low + high + 1) // 2
            if same_start(raw, mine, ends[middle - 1]):
                low = middle
            else:
                high = middle - 1
        return low


def continues(reused: int, elements: int) -> bool:
    """Whether a body that repeats `reused` of an earlier body's `elements` is that body's session going on:
    all of them, or all but the last few (a client may edit its newest messages: Anthropic clients move
    their cache marker to the newest every turn). Another session of the same agent repeats its opening."""
    return reused >= elements - TAIL_EDITS and reused * 2 > elements


class ResentBodies:
    """Recently parsed large bodies, grouped by their opening bytes: at most `limit_bytes` of memory,
    their bytes and their parse."""

    def __init__(self, limit_bytes: int = 64 * 1024 * 1024, min_bytes: int = MIN_BYTES,
                 group_prefix: int = GROUP_PREFIX) -> None:
        self.limit_bytes, self.min_bytes, self.group_prefix = limit_bytes, min_bytes, group_prefix
        self._groups: dict[Group, list[_Body]] = {}
        self._order: OrderedDict[int, tuple[Group, _Body]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        # fresh_bytes' findings for the parse of the same body object that follows it
        self._probes: OrderedDict[int, tuple[bytes, Group, _Body | None, int]] = OrderedDict()

    def fresh_bytes(self, raw: bytes, key: str, scope: str = "") -> int:
        """How many bytes of `raw` a parse would read anew: past the longest run of whole `key` elements an
        earlier body repeats (a few memcmp calls; all of them when none does)."""
        if len(raw) < self.min_bytes or not self.limit_bytes:
            return len(raw)
        group = (scope, key, raw[:self.group_prefix])
        best, reused = self._best(group, raw)
        with self._lock:  # the parse that follows takes it instead of comparing megabytes again
            self._probes[id(raw)] = (raw, group, best, reused)
            while len(self._probes) > PROBES:
                self._probes.popitem(last=False)
        if best is None:
            return len(raw)
        start, after = best.layout.ends[reused - 1], len(best.raw) - best.layout.closing
        # The keys after the array, when they are the earlier body's bytes (Claude Code's system prompt and
        # tools every turn): the parse takes them as its very objects, nothing there is read anew.
        same_after = len(raw) - after >= start and best.same_after(raw, len(raw) - after)
        return len(raw) - start - (after if same_after else 0)

    def _best(self, group: Group, raw: bytes) -> tuple[_Body | None, int]:
        """The remembered body `raw` builds on, and how many of its whole elements it repeats: one resent
        whole, else one whose session goes on with its last few elements edited, else the one it shares the
        most leading elements with."""
        with self._lock:
            candidates = list(self._groups.get(group, ()))
        # The sessions of one agent share their opening and part in their first element (the task, mostly):
        # the others are told apart once, by a few bytes each (the latest first), before the searches.
        sharing = [candidate for candidate in reversed(candidates) if candidate.shares_first(raw)]
        for candidate in sharing:  # one resent whole: a session's next turn
            if candidate.resent_whole(raw):
                return candidate, len(candidate.layout.ends)
        # Else one its session's next turn repeats but for its last few elements (Claude Code's every turn:
        # its cache marker moves), before searching the others (each would cost a few memcmp calls).
        for candidate in sharing:
            count = candidate.continued(raw)
            if count:
                return candidate, count
        best, reused = None, 0  # else (a session's first turn, an edited history) the longest shared part
        for candidate in sharing:
            count = candidate.reusable(raw)
            if count > reused:
                best, reused = candidate, count
        return best, reused

    def parse(self, raw: bytes, key: str, scope: str = "") -> Resent | None:
        """The body of `raw` when an earlier body shares a prefix of whole `key` elements with it; None
        when none does (parse it whole, check it, then `remember` it). Check the new elements, then
        `keep` the result: only checked bodies are reused (their elements are not checked again)."""
        if len(raw) < self.min_bytes or not self.limit_bytes:
            return None
        group = (scope, key, raw[:self.group_prefix])
        with self._lock:
            probe = self._probes.pop(id(raw), None)
        if probe is not None and probe[0] is raw and probe[1] == group:
            best, reused = probe[2], probe[3]
        else:
            best, reused = self._best(group, raw)
        if best is None:
            return None
        layout = best.layout
        parsed = _parse_after(raw, key, best, reused)
        if parsed is None:
            return None
        body, tail_ends, closing, same_after = parsed
        entry = None
        if tail_ends is not None:
            base, new = layout.held[reused - 1], itertools.accumulate(map(held_bytes, body[key][reused:]))
            held = layout.held[:reused] + [base + n for n in new]
            keys_held = best.keys_held if same_after else _keys_held(body, key)
            entry = _Body(raw, body, Layout(layout.head, layout.ends[:reused] + tail_ends, layout.opening,
                                             held, closing), keys_held)
        same_keys = frozenset(k for k in body if k != key) if same_after else frozenset(layout.head)
        return Resent(body, reused, group, entry, best, same_keys)

    def keep(self, resent: Resent) -> None:
        """A parsed body whose new elements passed the caller's checks: the next resend builds on it."""
        if resent.entry is not None:
            # Only the body this one continues is replaced (the session moved on: it is not resent again);
            # one it shares an opening with (another session of the same agent) stays for its session.
            moved_on = continues(resent.reused, len(resent.source.layout.ends))
            self._keep(resent.group, resent.entry, replacing=resent.source if moved_on else None)

    def remember(self, raw: bytes, key: str, body: dict[str, Any], scope: str = "") -> Spans | None:
        """A body parsed whole and checked, for the next request that resends it. Where its elements end
        is found now (a scan at a few ms a megabyte, once a session: later bodies are scanned past the
        reused part only). Returns where they lie (None for a small body or an odd shape)."""
        if len(raw) < self.min_bytes or not self.limit_bytes or type(body.get(key)) is not list:
            return None
        layout = layout_of(raw, key, len(body[key]), body[key])
        if layout is not None and layout.ends and all(k in body for k in layout.head):
            layout.head = {k: body[k] for k in layout.head}  # the body's own objects, as for messages
            layout.held = list(itertools.accumulate(map(held_bytes, body[key])))
            entry = _Body(raw, body, layout, _keys_held(body, key))
            entry.spans = self.spans_of(entry, Spans(raw, layout.opening, layout.ends))
            self._keep((scope, key, raw[:self.group_prefix]), entry)
            return entry.spans
        return None

    def spans_of(self, entry: _Body, spans: Spans) -> Spans:
        """`entry`'s spans, charging what a codec derives from them to its cost while it is remembered."""
        spans.charge = functools.partial(self._charge, id(entry))  # (no cycle: the entry is found by id)
        return spans

    def _charge(self, entry_id: int, spans: Spans, held: int) -> None:
        with self._lock:
            found = self._order.get(entry_id)
            if found is None or found[1].spans is not spans:
                return  # (dropped already: nothing of it is held here)
            entry = found[1]
            self._bytes += held - entry.derived_cost
            entry.cost += held - entry.derived_cost
            entry.derived_cost = held
            while self._bytes > self.limit_bytes and self._order:
                self._drop(next(iter(self._order)))

    def _keep(self, group: Group, entry: _Body, replacing: _Body | None = None) -> None:
        with self._lock:
            if replacing is not None and id(replacing) in self._order:
                self._drop(id(replacing))  # the session moved on: its previous body is not resent again
            members = self._groups.setdefault(group, [])
            if len(members) >= GROUP_SIZE:
                self._drop(id(members[0]))
            self._groups.setdefault(group, []).append(entry)
            self._order[id(entry)] = (group, entry)
            self._bytes += entry.cost
            while self._bytes > self.limit_bytes and self._order:
                self._drop(next(iter(self._order)))

    def clear(self) -> None:
        with self._lock:
            self._probes.clear()
            self._groups.clear()
            self._order.clear()
            self._bytes = 0

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def _drop(self, entry_id: int) -> None:
        group, entry = self._order.pop(entry_id)
        self._bytes -= entry.cost
        members = self._groups[group]
        members.remove(entry)
        if not members:
            del self._groups[group]


def _parse_after(raw: bytes, key: str, earlier: _Body, reused: int,
                 ) -> tuple[dict[str, Any], list[int] | None, int, bool] | None:
    """The body of `raw`, its first `reused` elements taken from `earlier`, the rest parsed as the array's
    continuation (an object with a sentinel key holding it, then the keys after it; those are `earlier`'s
    very objects when their bytes are the same, Claude Code's system prompt and tools every turn). Also
    the new elements' end offsets (None if not told), the offset past the `]` (-1), and that sameness."""
    layout = earlier.layout
    start = layout.ends[reused - 1]
    # Where the array ends if the bytes after it are the earlier body's: the one place they can be.
    closing = len(raw) - (len(earlier.raw) - layout.closing) if layout.closing >= 0 else -1
    same_after = start < closing and raw[closing - 1] == _CLOSE and earlier.same_after(raw, closing)
    tail = _tail(raw[start:closing] + b"}") if same_after else None
    if tail is None or len(tail) != 1:  # (more keys before those bytes: the array ends earlier)
        same_after, tail = False, _tail(raw[start:])
        if tail is None:
            return None  # not JSON, or something only the full parse reports well: leave it to that
    rest = tail.pop(_TAIL_KEY, None)
    if type(rest) is not list or not rest or rest[0] != 0 or key in tail \
            or any(k in layout.head for k in tail):
        return None  # a duplicate key: the full parse decides which one counts
    scanned = element_ends(raw, start, rest[1:])
    if same_after:  # the same bytes parse the same: the objects checked and counted before, not copies
        if scanned is None or scanned[1] != closing:
            return None  # (cannot be: those bytes parsed as the array's end)
        tail = {k: v for k, v in earlier.body.items() if k != key and k not in layout.head}
    ends = scanned[0] if scanned is not None and len(scanned[0]) == len(rest) - 1 else None
    body = {**layout.head, key: earlier.body[key][:reused] + rest[1:], **tail}
    return body, ends, scanned[1] if scanned is not None and ends is not None else -1, same_after


def _tail(continuation: bytes) -> dict[str, Any] | None:
    """The array's continuation and the keys after it, parsed under the sentinel key (None: not JSON)."""
    try:
        tail = orjson.loads(_TAIL_OPEN + continuation)
    except orjson.JSONDecodeError:
        return None
    return tail if type(tail) is dict else None


def _keys_held(body: dict[str, Any], key: str) -> int:
    return held_bytes({k: v for k, v in body.items() if k != key})


BODIES = ResentBodies()  # one per process: the codecs are stateless, this is their shared memory


def checked_keys(resent: Resent | None) -> frozenset[str]:
    """The keys besides `key` whose values a resent body took from an earlier one, which passed the
    checks then: its own bytes parse to the very same objects."""
    return frozenset() if resent is None else resent.same_keys


def parsed(raw: bytes, key: str, loads: Callable[[bytes], Any],
           scope: str = "") -> tuple[Any, int, Resent | None]:
    """(body, leading `key` elements checked in an earlier request, what to hand `remember_checked`):
    a resent history past what is new, else `loads(raw)` whole."""
    resent = BODIES.parse(raw, key, scope)
    return (resent.body, resent.reused, resent) if resent is not None else (loads(raw), 0, None)


def remember_checked(raw: bytes, key: str, body: dict[str, Any], resent: Resent | None,
                     scope: str = "") -> Spans | None:
    """After a body passed its checks: keep it (resent) or remember it (parsed whole) for the next.
    Returns where the elements under `key` lie in `raw`, when that is known (wire/splice.py)."""
    if resent is None:
        return BODIES.remember(raw, key, body, scope)
    entry = resent.entry
    if entry is not None:  # its first `reused` elements: the earlier body's, in the same places
        layout = entry.layout
        entry.spans = BODIES.spans_of(entry, Spans(raw, layout.opening, layout.ends, resent.source.spans,
                                                   resent.reused))
    BODIES.keep(resent)
    return None if entry is None else entry.spans
