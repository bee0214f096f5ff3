"""What callers hand to the archive (ExchangeRecord, TableRow) and their byte form for the writer's
queue and the spool (encode_item / decode_item): JSON of the fields, then the raw response bytes."""

from __future__ import annotations

import json
import os
import struct
import threading
import time
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, overload

import orjson

from proxy.archive_codec import serialize

if TYPE_CHECKING:
    from proxy.archive_parse import ParsedResponse

_second: tuple[int, str] = (-1, "")  # the last second formatted, and its text


def utc_now() -> str:
    """Now, as `datetime.now(UTC).isoformat(timespec="milliseconds")` writes it; the date and time of day
    are formatted once a second (every exchange is stamped: the datetime calls cost ~10 us in a busy
    server, against ~1 us in a loop)."""
    return stamp(time.time_ns())


def stamp(ns: int) -> str:
    """`utc_now` at `ns` nanoseconds since the epoch."""
    global _second
    second, millisecond = divmod(ns // 1_000_000, 1000)
    known, text = _second
    if second != known:
        text = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        _second = (second, text)
    return f"{text}.{millisecond:03d}+00:00"


_ID_BATCH = 256
_ids: list[str] = []
_ids_lock = threading.Lock()


def new_id() -> str:
    """A random id of 32 hex digits, like `uuid.uuid4().hex` (128 random bits instead of 122): one call for
    the system's randomness per 256 ids, which in a busy server costs ~10 us each (that call lets the GIL
    go). A forked child starts its own batch, so two processes never hand out the same ids."""
    with _ids_lock:
        if not _ids:
            pool = os.urandom(16 * _ID_BATCH).hex()
            _ids.extend(pool[at:at + 32] for at in range(0, len(pool), 32))
        return _ids.pop()


def _start_anew() -> None:  # (in a forked child: a lock another thread held at the fork stays held)
    global _ids_lock
    _ids_lock = threading.Lock()
    _ids.clear()


os.register_at_fork(after_in_child=_start_anew)


@dataclass
class ExchangeRecord:
    """Everything known about one upstream call, handed to the writer as-is (cheap to build)."""

    id: str
    created_at: str
    session_id: str
    session_source: str
    tenant: str
    policy: str
    route: str
    model: str | None
    stream: bool
    request_messages: list[Any]
    params: dict[str, Any]
    forwarded_messages: list[Any] | None = None  # None: forwarded unchanged
    status: int = 0
    latency_ms: float = 0.0
    upstream_ms: float = 0.0
    tokens_before: int | None = None
    tokens_after: int | None = None
    gate: str = "pass"
    response_body: bytes | None = None
    response_chunks: list[bytes] = field(default_factory=list)
    error: str | None = None
    response_truncated: bool = False  # only the first upstream.max_response_bytes of the answer were kept
    response_kept: int = 0  # bytes of a streamed answer kept so far
    round: int = 0  # 0: the call the client asked for; 1, 2...: internal rounds the proxy made
    upstream_headers_ms: float | None = None  # time to the upstream's response headers (first byte)
    overhead_ms: float | None = None  # what the proxy added (the whole exchange, on its first call)
    client_cached_tokens: int | None = None  # the client's request shared with its previous one
    forwarded_cached_tokens: int | None = None  # our estimate for what was forwarded (no provider usage)
    # What the proxy did in this exchange (first call): results summarized, masked and evicted,
    # exchanges evicted, internal rounds, recall and read_tool_result calls answered.
    summaries: int = 0
    masked: int = 0
    evicted_results: int = 0
    evictions: int = 0
    internal_rounds: int = 0
    recalls: int = 0
    reads: int = 0
    # What the relay read of a whole streamed answer as it passed, the same the writer would read from
    # the chunks (in memory only: a record read back from the spool is read from its bytes)
    answer: ParsedResponse | None = field(default=None, repr=False, compare=False)

    def keep_chunk(self, chunk: bytes, cap: int) -> None:
        """Keep a streamed chunk for the archive, up to `cap` bytes in all; past that, mark the record."""
        room = cap - self.response_kept
        if len(chunk) > room:
            self.response_truncated = True
            chunk = chunk[:max(room, 0)]
        if chunk:
            self.response_chunks.append(chunk)
            self.response_kept += len(chunk)


@dataclass
class TableRow:
    """A row for a side table (tool results, tickets), written by the same background writer."""

    table: str
    row: dict[str, Any]
    replace: bool = True


# --------------------------------------------------------------------- items as bytes (queue, spool)

_EXCHANGE, _ROW, _UNUSABLE = 1, 2, 3
# spool_delta: [base index, request messages shared, forwarded shared or -1, 1 if the params are the base's]
_RELATIVE = "_relative_to"
_BLOB_FIELDS = ("response_body", "response_chunks")
_EXCHANGE_FIELDS = tuple(f.name for f in fields(ExchangeRecord) if f.name not in (*_BLOB_FIELDS, "answer"))
_HEAD = struct.Struct("<BBI")  # kind, 1 if the stdlib wrote the JSON, its length
_BLOB = struct.Struct("<q")


def encode_item(item: ExchangeRecord | TableRow, relative: tuple[int, int, int, bool] | None = None) -> bytes:
    """An item as bytes: kind, JSON of its fields, then the raw response body and stream bytes.
    `relative` (base record's index in its spool segment, request messages and forwarded messages shared
    with it, -1: forwarded whole, whether its params are the base's): only the messages after those are
    written, and the params only when they differ (spool_delta.py)."""
    if isinstance(item, ExchangeRecord):
        kind = _EXCHANGE
        meta: dict[str, Any] = {name: getattr(item, name) for name in _EXCHANGE_FIELDS}
        if relative is not None:
            index, on_request, on_forwarded, same_params = relative
            meta["request_messages"] = item.request_messages[on_request:]
            if on_forwarded >= 0 and item.forwarded_messages is not None:
                meta["forwarded_messages"] = item.forwarded_messages[on_forwarded:]
            if same_params:
                meta["params"] = {}
            meta[_RELATIVE] = [index, on_request, on_forwarded, int(same_params)]
        blobs = [item.response_body, b"".join(item.response_chunks) if item.response_chunks else None]
    elif isinstance(item, TableRow):
        kind, meta, blobs = _ROW, {"table": item.table, "row": item.row, "replace": item.replace}, []
    else:
        raise TypeError(f"the archive writes ExchangeRecord and TableRow, not {type(item).__name__}")
    head, by_stdlib = serialize(meta)
    parts = [_HEAD.pack(kind, int(by_stdlib), len(head)), head]
    for blob in blobs:
        parts.append(_BLOB.pack(-1 if blob is None else len(blob)))
        if blob:
            parts.append(bytes(blob))
    return b"".join(parts)


def unknown_kind(payload: bytes, reason: str) -> bytes:
    """The payload made undecodable, naming why (it is set aside, kept whole, when committed)."""
    note = reason.encode()
    return _HEAD.pack(_UNUSABLE, 0, len(note)) + note + payload


@overload
def decode_item(payload: bytes) -> ExchangeRecord | TableRow: ...


@overload
def decode_item(payload: bytes, relative: Literal[True]) -> tuple[ExchangeRecord | TableRow,
                                                                 tuple[int, int, int, bool] | None]: ...


def decode_item(payload: bytes, relative: bool = False) -> Any:
    """The item of `encode_item`'s bytes. A record spooled relative to another raises ValueError, unless
    `relative` (then: the item holding only its own messages, and the reference)."""
    kind, by_stdlib, size = _HEAD.unpack_from(payload)
    if kind == _UNUSABLE:
        raise ValueError(payload[_HEAD.size:_HEAD.size + size].decode("utf-8", "replace"))
    position = _HEAD.size
    head = payload[position:position + size]
    meta = json.loads(head) if by_stdlib else orjson.loads(head)
    position += size
    blobs: list[bytes | None] = []
    while position < len(payload):
        (length,) = _BLOB.unpack_from(payload, position)
        position += _BLOB.size
        if length < 0:
            blobs.append(None)
        else:
            blobs.append(payload[position:position + length])
            position += length
    if kind == _ROW:
        row = TableRow(meta["table"], meta["row"], bool(meta.get("replace", True)))
        return (row, None) if relative else row
    if kind != _EXCHANGE:
        raise ValueError(f"unknown archive item kind {kind}")
    record = ExchangeRecord(**{k: v for k, v in meta.items() if k in _EXCHANGE_FIELDS})
    blobs += [None] * (2 - len(blobs))
    record.response_body = blobs[0]
    record.response_chunks = [blobs[1]] if blobs[1] else []
    reference = meta.get(_RELATIVE)
    if relative:  # (a spool from before params were shared holds three numbers)
        return record, None if reference is None else (*reference[:3], bool(reference[3:4] == [1]))
    if reference is not None:
        raise ValueError("a record spooled relative to another one, read without it")
    return record
