"""A resent history is spooled once: an exchange record is written to the spool relative to the previous
record of its session in the same spool segment, holding only the messages after the ones they share.

Agents resend the whole conversation with every request, so spooling each record whole writes (and
checksums) megabytes a turn for a long session. The messages a record shares with its session's previous
one are the very same objects (wire/resent.py), found by identity in C; the record then names that
record (its place in the segment) and how many it shares. The base stays in the segment until the
segment is emptied or rotated (spool.TRUNCATE_BYTES, SEGMENT_BYTES), which starts a new epoch: the next
record of every session is spooled whole again. So a segment is emptied or rotated only once at least
as many bytes were written after the whole records the sessions' bases go back to as they hold (else
several long sessions whose histories together fill a segment would spool them whole every turn); a
session quiet for IDLE_SECONDS no longer counts. A replay (a start after a crash) reads a segment in
order and makes every record whole before it is committed (Expander).

The writer itself never reads the spool back: it is handed the submitted record. Records set aside or
arriving after close are always spooled whole.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from proxy.archive_codec import dumps
from proxy.archive_items import ExchangeRecord, decode_item, encode_item, unknown_kind
from proxy.archive_params import same_params
from proxy.spool import Spool
from proxy.wire.resent import MIN_BYTES
from proxy.wire.same_objects import same_objects, starts_with

MAX_SESSIONS = 4096  # sessions whose last spooled record is remembered as a base
MIN_SHARED = 8  # fewer shared messages than this: spooled whole (not worth a reference)
MAX_EQUAL_TRIES = 8  # equal objects that are not the same ones compared (serialized) per list
MIN_BASE_BYTES = MIN_BYTES  # a smaller record is no base (its session's bodies are parsed anew: no
# message is the same object next time)

IDLE_SECONDS = 600.0  # a session quiet this long is no base any more (its next record is spooled whole)

Key = tuple[str, str]  # (tenant, session id)


class _Base:
    __slots__ = ("epoch", "forwarded", "index", "params", "request", "root_bytes", "used")

    def __init__(self, epoch: int, index: int, record: ExchangeRecord, root_bytes: int, used: float) -> None:
        self.epoch, self.index = epoch, index
        self.request, self.forwarded, self.params = record.request_messages, record.forwarded_messages, \
            record.params
        self.root_bytes = root_bytes  # the whole record its chain of relative records starts from
        self.used = used


def shared(earlier: list[Any], later: list[Any], equal_tries: int = MAX_EQUAL_TRIES) -> int:
    """How many leading elements of `later` are the very objects of `earlier`, or (at most `equal_tries`
    of them) other objects that serialize to the same bytes: the blocks the pipeline injects are made
    anew every request, so the forwarded list would otherwise share only what precedes the first."""
    if starts_with(later, earlier):
        return len(earlier)  # (the client's history resent: one quicker pass)
    size, at = min(len(earlier), len(later)), 0
    while True:
        at = same_objects(earlier, later, at)
        if at >= size or equal_tries <= 0 or not _same_bytes(earlier[at], later[at]):
            return at
        equal_tries, at = equal_tries - 1, at + 1


def size_above(value: Any, limit: int) -> bool:
    """Whether the strings in `value` (JSON-like) hold more than `limit` characters, with ~8 a node for
    the rest; stops as soon as they do."""
    stack, size = [value], 0
    while stack:
        item = stack.pop()
        size += len(item) if isinstance(item, str | bytes) else 8
        if size > limit:
            return True
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def _same_bytes(one: Any, other: Any) -> bool:
    # (== alone is not enough: 1 == 1.0 == True, and key order is not compared; the replay must give
    # the record's own bytes back)
    return bool(one == other) and dumps(one) == dumps(other)


class Bases:
    """The last record spooled per session (the writer's: called under its lock, before each append).
    It keeps `spool.base_bytes` at the bytes of the whole records the sessions' bases go back to, in
    the spool's current epoch: what emptying or rotating the segment would make them spool again."""

    def __init__(self, min_base_bytes: int = MIN_BASE_BYTES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.min_base_bytes = min_base_bytes
        self._clock = clock
        self._last: OrderedDict[Key, _Base] = OrderedDict()  # least recently used first

    def encode(self, record: ExchangeRecord, spool: Spool, small_only: int | None = None) -> bytes | None:
        """The record's spool payload (relative to its session's previous record when that pays), and
        the record remembered as the base of the next one. Call right before `spool.append`.
        `small_only`: None (doing nothing) unless the messages it writes hold about that many bytes at
        most (a caller on the event loop, which must not serialize a whole history)."""
        key = (record.tenant, record.session_id)
        request, forwarded = record.request_messages, record.forwarded_messages
        base = self._last.get(key)
        if spool.full or base is None or base.epoch != spool.epoch or not isinstance(request, list):
            base = None  # (a full segment is rotated first: a new epoch, where nothing is a base yet)
        on_request = shared(base.request, request) if base is not None else 0
        on_forwarded = -1  # forwarded unchanged (None) or spooled whole
        if base is not None and on_request >= MIN_SHARED and isinstance(forwarded, list) \
                and isinstance(base.forwarded, list):
            on_forwarded = shared(base.forwarded, forwarded)
        if small_only is not None:  # what a relative record would write: the new messages of each list
            new_forwarded = forwarded[max(on_forwarded, 0):] if isinstance(forwarded, list) else None
            new = [request[on_request:], new_forwarded]
            if on_request < MIN_SHARED or size_above(new, small_only):
                return None
        spool.rotate_if_full()
        self._forget(key, spool)
        if on_request < MIN_SHARED:
            payload = encode_item(record)
            if len(payload) >= self.min_base_bytes:
                self._remember(key, record, len(payload), spool)
            return payload
        assert base is not None  # (messages were shared with it)
        self._remember(key, record, base.root_bytes, spool)
        # (Claude Code's params, its tools, are ~15 KB a turn: the base's very objects are not written again)
        return encode_item(record, relative=(base.index, on_request, on_forwarded,
                                             same_params(base.params, record.params)))

    def _remember(self, key: Key, record: ExchangeRecord, root_bytes: int, spool: Spool) -> None:
        now = self._clock()
        self._last[key] = _Base(spool.epoch, spool.records, record, root_bytes, now)
        spool.base_bytes += root_bytes
        while len(self._last) > MAX_SESSIONS or next(iter(self._last.values())).used < now - IDLE_SECONDS:
            self._forget(next(iter(self._last)), spool)

    def _forget(self, key: Key, spool: Spool) -> None:
        gone = self._last.pop(key, None)
        if gone is not None and gone.epoch == spool.epoch:  # (a new epoch starts the spool's count at 0)
            spool.base_bytes -= gone.root_bytes

    def unspooled(self, record: ExchangeRecord, spool: Spool) -> None:
        """The record's append failed: it is no base."""
        self._forget((record.tenant, record.session_id), spool)


class Expander:
    """Makes the records of one spool file whole again, in file order (replay)."""

    def __init__(self) -> None:
        self._records: list[tuple[Key, list[Any], list[Any] | None, dict[str, Any]] | None] = []

    def __call__(self, payload: bytes) -> bytes:
        try:
            item, relative = decode_item(payload, relative=True)
        except Exception:  # not decodable here: the commit names the problem and sets it aside
            self._records.append(None)
            return payload
        if not isinstance(item, ExchangeRecord):
            self._records.append(None)
            return payload
        key = (item.tenant, item.session_id)
        if relative is not None:
            index, on_request, on_forwarded, same_params = relative
            base = self._records[index] if 0 <= index < len(self._records) else None
            if base is None or base[0] != key or len(base[1]) < on_request:
                self._records.append(None)
                return unknown_kind(payload, "its base record is not in the spool")
            item.request_messages = base[1][:on_request] + item.request_messages
            if on_forwarded >= 0 and isinstance(base[2], list) and isinstance(item.forwarded_messages, list):
                item.forwarded_messages = base[2][:on_forwarded] + item.forwarded_messages
            if same_params:
                item.params = base[3]
            payload = encode_item(item)
        self._records.append((key, item.request_messages, item.forwarded_messages, item.params))
        return payload
