"""The archive: every exchange recorded in SQLite by one background writer, off the request path.

Messages are content-addressed and parent-linked (id = hash of parent id + message bytes), so each
distinct message is stored once however often a growing conversation is resent.

Nothing acknowledged is lost. `submit` serializes the item and appends it to a spool file in the data
dir before it returns (what reached the page cache survives kill -9); the writer commits in IMMEDIATE
transactions and waits out a busy database instead of dropping; a start replays whatever an earlier
run left in the spool (idempotently: exchange ids are keys, messages are content-addressed). Any
upstream body is archived: what cannot be parsed is kept raw, with the problem named. One process
per data dir, enforced with a lock file.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import re
import sqlite3
import struct
import threading
import time
import zlib
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import orjson
from sqlite_utils import Database

from proxy import migrations
from proxy.errors import ConfigError
from proxy.sse import assemble

log = logging.getLogger("ctxproxy.archive")

BATCH_MAX = 256  # items per transaction
BATCH_BYTES = 32 * 1024 * 1024  # serialized bytes per transaction (one bigger item still goes alone)
QUEUE_BYTES = 64 * 1024 * 1024  # `submit` blocks while more than this waits to be committed
SEGMENT_BYTES = 64 * 1024 * 1024  # a spool segment is closed (and deleted once committed) past this
RETRY_FOR = 300.0  # seconds of an unavailable database before warnings turn into errors (or a start fails)
CHUNK_CHARS = 4096  # searchable text is indexed in chunks of about this many characters
ERROR_CHARS = 65536  # an error answer's text kept in exchanges.error
_SEEN_LIMIT = 500_000
_SESSION_CHAINS = 2000
_WARN_EVERY = 10.0


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


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


@dataclass
class TableRow:
    """A row for a side table (tool results, tickets), written by the same background writer."""

    table: str
    row: dict[str, Any]
    replace: bool = True


# ------------------------------------------------------------------------------------ JSON and text

def _default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, set | frozenset):
        return list(value)
    return str(value)


def serialize(value: Any) -> tuple[bytes, bool]:
    """(JSON bytes, whether the stdlib wrote them). orjson, or the stdlib for what orjson refuses (lone
    surrogates, integers past 64 bits). The fallback escapes every non-ASCII character, so the bytes
    are valid UTF-8 whatever the strings held, and `loads` gives the same values back."""
    try:
        return orjson.dumps(value, default=_default), False
    except TypeError:
        return json.dumps(value, ensure_ascii=True, separators=(",", ":"), default=_default).encode(), True


def dumps(value: Any) -> bytes:
    return serialize(value)[0]


_LONG_DIGITS = re.compile(r"[0-9]{19}")
_LONG_DIGITS_BYTES = re.compile(rb"[0-9]{19}")


def loads(data: bytes | str) -> Any:
    """Inverse of `dumps`: orjson, or the stdlib for escaped lone surrogates (orjson refuses them) and
    integers past 64 bits (orjson would read them as floats)."""
    digits = _LONG_DIGITS if isinstance(data, str) else _LONG_DIGITS_BYTES
    if digits.search(data) is None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)  # raises ValueError (JSONDecodeError) when it is not JSON at all


def safe_text(value: Any) -> str | None:
    """A string SQLite can store: lone surrogates become `\\udXXX` text, non-strings their JSON."""
    if value is None:
        return None
    if not isinstance(value, str):
        return dumps(value).decode()
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def _cell(value: Any) -> Any:
    """A value for a column of a side-table row."""
    if value is None or isinstance(value, float | bytes):
        return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**63 else str(value)
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return dumps(value).decode()


# ----------------------------------------------------------------------------------- request params

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SECRET_KEY = re.compile(
    r"(?:^|_)(?:api_?key|apikey|x_api_key|authorization|auth|bearer|password|passwd|passphrase|"
    r"secrets?|cookies?|token|credentials?|private_?key|signature)$")
SECRET_FIELDS = frozenset({"api_key", "apikey", "authorization", "api-key", "x-api-key"})  # (compat)


@functools.lru_cache(maxsize=8192)
def _secret_name(key: str) -> bool:
    normalized = _CAMEL.sub("_", key).lower().replace("-", "_").replace(".", "_").strip("_")
    return bool(_SECRET_KEY.search(normalized))


def is_secret_key(key: Any) -> bool:
    """Does a field name look like it holds a credential (api_key, extra_headers.Authorization, ...)?

    Plural counts such as max_tokens are not secrets; token, access_token and X-Api-Key are.
    """
    return isinstance(key, str) and _secret_name(key)


_SCHEMA_NAMES = frozenset({"properties", "patternProperties", "$defs", "definitions"})


def _without_secrets(value: Any, names: bool = False) -> Any:
    """`value` minus secret-named fields at any depth; parts without any are shared, not copied. Under a
    JSON schema's `properties` (tools, response_format) keys are parameter names, not credentials."""
    if isinstance(value, dict):
        cleaned, changed = {}, False
        for k, v in value.items():
            if not names and is_secret_key(k):
                changed = True
                continue
            kept = _without_secrets(v, not names and k in _SCHEMA_NAMES) if isinstance(v, dict | list) else v
            cleaned[k] = kept
            changed = changed or kept is not v
        return cleaned if changed else value
    if isinstance(value, list):
        items = [_without_secrets(v) if isinstance(v, dict | list) else v for v in value]
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    return value


_CACHE_JSON_BYTES = 256 * 1024


@functools.lru_cache(maxsize=128)
def _holds_secrets(dumped: bytes) -> bool:
    value = loads(dumped)
    return _without_secrets(value) is not value


def _clean(value: Any) -> Any:
    # Agents resend the same tools every turn: the verdict for identical JSON is remembered.
    try:
        dumped = orjson.dumps(value)
    except TypeError:
        return _without_secrets(value)
    if len(dumped) <= _CACHE_JSON_BYTES and not _holds_secrets(dumped):
        return value
    return _without_secrets(value)


def request_params(body: dict[str, Any]) -> dict[str, Any]:
    """Everything of a request but its messages, minus any field at any depth that could carry a
    credential. A new dict; the body is never changed (nested parts without secrets are shared)."""
    return {k: _clean(v) if isinstance(v, dict | list) else v
            for k, v in body.items() if k != "messages" and not is_secret_key(k)}


# ---------------------------------------------------------------------------------------- database

def open_database(path: Path, busy_timeout: float = 30.0) -> Database:
    """Open (creating 0600 if needed) the archive with WAL and the current schema."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    os.close(fd)
    os.chmod(path, 0o600)
    conn = sqlite3.connect(str(path), check_same_thread=False, timeout=busy_timeout)
    db = Database(conn)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    migrations.apply(db)
    return db


def message_id(parent_id: str, body: bytes) -> str:
    return hashlib.sha256(parent_id.encode("utf-8", "surrogatepass") + b"\0" + body).hexdigest()[:32]


def scope_token(kind: str, value: str) -> str:
    """One alphanumeric token per tenant / session / policy, indexed next to the text."""
    return kind + hashlib.sha1(value.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def scope_of(tenant: str, session_id: str, policy: str) -> str:
    # Project = tenant + policy as one token: intersecting two large doclists would cost more.
    return " ".join((scope_token("tn", tenant), scope_token("ss", session_id), project_token(tenant, policy)))


def project_token(tenant: str, policy: str) -> str:
    return scope_token("tp", tenant + "\0" + policy)


def searchable_text(message: Any) -> str:
    if not isinstance(message, dict):
        return "" if message is None else str(message)
    parts: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        parts.extend(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            parts.append(f"{function.get('name', '')}({function.get('arguments', '')})")
    return "\n".join(parts)


def message_call_id(message: Any) -> str | None:
    """The tool call a message answers (tool) or makes first (assistant), for recall's call_id."""
    if not isinstance(message, dict):
        return None
    if message.get("tool_call_id"):
        return safe_text(str(message["tool_call_id"]))
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls and isinstance(calls[0], dict) and calls[0].get("id"):
        return safe_text(str(calls[0]["id"]))
    return None


def chunk_text(text: str, size: int = CHUNK_CHARS) -> list[str]:
    """Cut `text` into pieces of at most `size` characters, at line ends where there are any (else at
    spaces, else anywhere), so search work per hit stays bounded however long a document is."""
    if len(text) <= size:
        return [text] if text else []
    chunks, start, end_of_text = [], 0, len(text)
    while start < end_of_text:
        end = start + size
        if end >= end_of_text:
            chunks.append(text[start:])
            break
        cut = text.rfind("\n", start + size // 2, end)
        if cut < 0:
            cut = text.rfind(" ", start + size // 2, end)
        cut = end if cut < 0 else cut + 1
        chunks.append(text[start:cut])
        start = cut
    return chunks


# text and scope live in the chunk index (message_chunks_fts) only.
_MESSAGE_INSERT = ("INSERT OR IGNORE INTO messages (id, parent_id, tenant, session_id, policy, role, body, "
                   "created_at, call_id, size) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
_CHUNK_INSERT = "INSERT INTO message_chunks_fts (message_id, scope, text) VALUES (?, ?, ?)"


def insert_message(conn: sqlite3.Connection, node: str, parent: str | None, message: Any, body: bytes,
                   *, tenant: str, session_id: str, policy: str, created_at: str,
                   searchable: bool = True) -> bool:
    """Store one message (once: ignored when its id exists) and index its text in chunks."""
    role = message.get("role") if isinstance(message, dict) else None
    inserted = conn.execute(_MESSAGE_INSERT, (
        node, parent, safe_text(tenant), safe_text(session_id), safe_text(policy), safe_text(role),
        body.decode("utf-8"), created_at, message_call_id(message), len(body))).rowcount
    if inserted and searchable:
        text = safe_text(searchable_text(message)) or ""
        scope = scope_of(tenant, session_id, policy)
        conn.executemany(_CHUNK_INSERT, [(node, scope, chunk) for chunk in chunk_text(text)])
    return bool(inserted)


# --------------------------------------------------------------------- items as bytes (queue, spool)

_EXCHANGE, _ROW = 1, 2
_BLOB_FIELDS = ("response_body", "response_chunks")
_EXCHANGE_FIELDS = tuple(f.name for f in fields(ExchangeRecord) if f.name not in _BLOB_FIELDS)
_HEAD = struct.Struct("<BBI")  # kind, 1 if the stdlib wrote the JSON, its length
_BLOB = struct.Struct("<q")


def encode_item(item: ExchangeRecord | TableRow) -> bytes:
    """An item as bytes: kind, JSON of its fields, then the raw response body and stream bytes."""
    if isinstance(item, ExchangeRecord):
        kind = _EXCHANGE
        meta: dict[str, Any] = {name: getattr(item, name) for name in _EXCHANGE_FIELDS}
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


def decode_item(payload: bytes) -> ExchangeRecord | TableRow:
    kind, by_stdlib, size = _HEAD.unpack_from(payload)
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
        return TableRow(meta["table"], meta["row"], bool(meta.get("replace", True)))
    if kind != _EXCHANGE:
        raise ValueError(f"unknown archive item kind {kind}")
    record = ExchangeRecord(**{k: v for k, v in meta.items() if k in _EXCHANGE_FIELDS})
    blobs += [None] * (2 - len(blobs))
    record.response_body = blobs[0]
    record.response_chunks = [blobs[1]] if blobs[1] else []
    return record


# ------------------------------------------------------------------------------------------- spool

_FRAME = struct.Struct("<4sQI")  # magic, payload length, crc32
_MAGIC = b"CXS1"


class CorruptSpool(Exception):
    pass


def frame(payload: bytes) -> bytes:
    return _FRAME.pack(_MAGIC, len(payload), zlib.crc32(payload))


def read_frames(path: Path) -> Iterator[bytes]:
    """The payloads of a spool file. A frame cut short at the end (a write the process died in, never
    acknowledged) ends the file; anything else that does not check out raises CorruptSpool."""
    with open(path, "rb") as f:
        while True:
            head = f.read(_FRAME.size)
            if len(head) < _FRAME.size:
                return
            magic, length, crc = _FRAME.unpack(head)
            if magic != _MAGIC:
                raise CorruptSpool(f"{path}: bad frame at offset {f.tell() - _FRAME.size}")
            payload = f.read(length)
            if len(payload) < length:
                return
            if zlib.crc32(payload) != crc:
                raise CorruptSpool(f"{path}: checksum mismatch at offset {f.tell() - length - _FRAME.size}")
            yield payload


def _write_all(fd: int, parts: list[bytes]) -> None:
    written, total = os.writev(fd, parts), sum(len(p) for p in parts)
    if written < total:  # short write (rare on regular files): finish the rest
        rest = b"".join(parts)[written:]
        while rest:
            rest = rest[os.write(fd, rest):]


def _open_append(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)


class Spool:
    """Append-only segment files `<data_dir>/spool/NNNNNNNNNNNN.log` holding every submitted item until
    it is committed: a segment is truncated (current) or deleted (older) once all its items are.
    Not thread-safe: the writer calls it under its own lock."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.folder = folder
        self.leftovers = spool_files(folder)
        numbers = [int(p.stem) for p in self.leftovers if p.stem.isdigit()]
        self.segment = max(numbers, default=0) + 1
        self.fd: int | None = _open_append(self._path(self.segment))
        self.size = 0
        self.pending: Counter[int] = Counter({self.segment: 0})

    def _path(self, segment: int) -> Path:
        return self.folder / f"{segment:012d}.log"

    def append(self, payload: bytes) -> int:
        if self.fd is None:
            raise OSError("spool is closed")
        if self.size >= SEGMENT_BYTES:
            self._rotate()
        _write_all(self.fd, [frame(payload), payload])
        self.size += _FRAME.size + len(payload)
        self.pending[self.segment] += 1
        return self.segment

    def _rotate(self) -> None:
        assert self.fd is not None
        os.close(self.fd)
        if self.pending[self.segment] == 0:
            self._unlink(self.segment)
        self.segment += 1
        self.fd = _open_append(self._path(self.segment))
        self.size = 0
        self.pending[self.segment] = 0

    def committed(self, segments: Iterable[int | None]) -> None:
        for segment in segments:
            if segment is not None:
                self.pending[segment] -= 1
        for segment in [s for s, n in self.pending.items() if n <= 0]:
            if segment != self.segment:
                self._unlink(segment)
            elif self.size and self.fd is not None:
                os.ftruncate(self.fd, 0)  # O_APPEND: the next item goes to offset 0
                self.size = 0

    def _unlink(self, segment: int) -> None:
        self.pending.pop(segment, None)
        with contextlib.suppress(FileNotFoundError):
            self._path(segment).unlink()

    def close(self) -> None:
        if self.fd is None:
            return
        os.close(self.fd)
        self.fd = None
        if all(n <= 0 for n in self.pending.values()):
            self._unlink(self.segment)


def spool_files(folder: Path) -> list[Path]:
    """Leftover spool files in replay order: set-aside records first, then segments, then late ones."""
    order = {"rejected": 0, "late": 2}
    found = [p for p in folder.glob("*.log") if p.is_file()]
    return sorted(found, key=lambda p: (order.get(p.stem.split("-")[0], 1), p.name))


# -------------------------------------------------------------------------------- data-dir lock

class DataDirLock:
    """An exclusive flock on `<data_dir>/ctxproxy.lock`: one ctxproxy process per data dir."""

    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = data_dir / "ctxproxy.lock"
        self.fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if not isinstance(exc, BlockingIOError):  # e.g. no locks on this file system
                os.close(self.fd)
                raise
            holder = os.pread(self.fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(self.fd)
            self.fd = None
            raise ConfigError(
                f"another ctxproxy process is using {data_dir} (pid {holder}); one process per data_dir: "
                "stop it, or give this one its own data_dir (replicas sharing one archive need the "
                "PostgreSQL backend, which comes later)", code="data_dir_in_use") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)

    @staticmethod
    def check(data_dir: Path) -> None:
        """Raise the ConfigError now if another process holds `data_dir` (for a clean CLI message before
        the server starts; the writer takes the lock for real)."""
        DataDirLock(data_dir).release()

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


# ------------------------------------------------------------------------------------------ writer

class _Queued(NamedTuple):
    seq: int
    segment: int | None
    payload: bytes


class _WriteFailed(Exception):
    """A permanent error (a bug or a record that cannot be stored)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")


_TRANSIENT_CODES = frozenset({5, 6, 8, 10, 13, 14, 15})  # BUSY LOCKED READONLY IOERR FULL CANTOPEN PROTOCOL
_TRANSIENT_WORDS = ("locked", "busy", "disk i/o", "disk is full", "unable to open", "readonly", "read-only")


def _transient(exc: BaseException) -> bool:
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in _TRANSIENT_CODES:
        return True
    return any(word in str(exc).lower() for word in _TRANSIENT_WORDS)


class ArchiveWriter:
    """Single writer thread. `submit` serializes the item, appends it to the spool and queues the bytes;
    it blocks while more than `max_queued_bytes` wait (call it off the event loop). `flush` waits for
    what was submitted so far; `close` writes everything and releases the data dir.

    Holds `<data_dir>/ctxproxy.lock` from start to close: a second writer on the same data dir (another
    process, or this one before close) gets a ConfigError. Readers (ArchiveReader, the CLI) need no lock.
    """

    def __init__(self, path: Path, *, max_queued_bytes: int = QUEUE_BYTES, retry_for: float = RETRY_FOR,
                 busy_timeout: float = 30.0) -> None:
        self.path = path
        self.data_dir = path.parent
        self.max_queued_bytes = max_queued_bytes
        self.retry_for = retry_for
        self._lock_file = DataDirLock(self.data_dir)
        try:
            self._db = open_database(path, busy_timeout)
            self._conn = self._db.conn
            self._conn.isolation_level = None  # transactions are explicit: BEGIN IMMEDIATE ... COMMIT
            self._seen: set[str] = set()
            self._last_chain: dict[tuple[str, str, str], tuple[list[Any], list[str]]] = {}
            self._cond = threading.Condition()
            self._queue: deque[_Queued] = deque()
            self._queued_bytes = 0
            self._submitted = 0  # sequence number of the last item queued
            self._done = 0  # every item up to this sequence number is committed (or set aside)
            self._stopping = False
            self._closed = False
            self._rejected: int | None = None
            self._starting = True  # replaying the spool: an unavailable database fails the start
            self._stale = False  # replaying set-aside records: never overwrite a row written since
            self.spool = Spool(self.data_dir / "spool")
            self._replay(self.spool.leftovers)
            self._starting = False
        except BaseException:
            if getattr(self, "spool", None) is not None:
                self.spool.close()
            if getattr(self, "_db", None) is not None:
                self._db.close()
            self._lock_file.release()
            raise
        self._thread = threading.Thread(target=self._run, name="ctxproxy-archive", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------------------- submitting

    def submit(self, item: ExchangeRecord | TableRow) -> None:
        """Durable (spooled) when this returns; may block while the writer is behind."""
        self._enqueue(encode_item(item))

    def submit_many(self, items: Iterable[ExchangeRecord | TableRow]) -> None:
        for payload in [encode_item(item) for item in items]:
            self._enqueue(payload)

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    def _enqueue(self, payload: bytes) -> None:
        with self._cond:
            while (not self._closed and self._queued_bytes
                   and self._queued_bytes + len(payload) > self.max_queued_bytes):
                self._cond.wait()
            if self._closed:
                self._late(payload)
                return
            try:
                segment: int | None = self.spool.append(payload)
            except OSError as exc:
                log.error("archive: cannot append to the spool (%s); this record is only in memory until "
                          "it is committed", exc)
                segment = None
            self._submitted += 1
            self._queue.append(_Queued(self._submitted, segment, payload))
            self._queued_bytes += len(payload)
            self._cond.notify_all()

    def _late(self, payload: bytes) -> None:
        """Submitted after close: kept in its own spool file, written at the next start."""
        path = self.spool.folder / f"late-{time.time_ns()}-{os.getpid()}.log"
        log.error("archive: a record arrived after the writer closed; kept in %s for the next start", path)
        fd = _open_append(path)
        try:
            _write_all(fd, [frame(payload), payload])
        finally:
            os.close(fd)

    def flush(self, timeout: float = 30.0) -> bool:
        """Block until everything submitted so far is committed (for shutdown, the CLI and tests)."""
        with self._cond:
            target = self._submitted
            return self._cond.wait_for(lambda: self._done >= target, timeout)

    def close(self, timeout: float = 120.0) -> None:
        """Write everything queued, stop the thread, release the data dir. Whatever is still not written
        after `timeout` (a database locked for that long) stays in the spool for the next start."""
        with self._cond:
            if self._stopping:
                return
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            if self._thread.is_alive():
                log.error("archive: writer still busy after %.0f s; %d records stay in the spool and are "
                          "written at the next start", timeout, len(self._queue))
            else:
                self.spool.close()
                self._db.close()
                if self._rejected is not None:
                    os.close(self._rejected)
                    self._rejected = None
        self._lock_file.release()

    # ------------------------------------------------------------------------------- writing

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    self._closed = True  # later submits go to their own spool file
                    self._cond.notify_all()
                    return
                batch: list[_Queued] = []
                size = 0
                while self._queue and len(batch) < BATCH_MAX and (
                        not batch or size + len(self._queue[0].payload) <= BATCH_BYTES):
                    entry = self._queue.popleft()
                    batch.append(entry)
                    size += len(entry.payload)
            kept = False
            try:
                self._commit([entry.payload for entry in batch])
            except Exception:  # a bug in the writer itself: leave the items in the spool
                log.exception("archive: writer failed on a batch of %d; it stays in the spool", len(batch))
                kept = True
            with self._cond:
                self._done = batch[-1].seq
                self._queued_bytes -= size
                if not kept:
                    try:
                        self.spool.committed(entry.segment for entry in batch)
                    except OSError as exc:
                        log.warning("archive: could not trim the spool: %s", exc)
                self._cond.notify_all()

    def _replay(self, files: list[Path]) -> None:
        """Write what an earlier run left in the spool (idempotent, in order), before any new work.
        Set-aside (rejected) records are older than what was committed after them: they only fill
        gaps (insert or ignore), never replace a row."""
        total = 0
        for path in files:
            self._stale = path.name.startswith("rejected-")
            try:
                total += self._replay_file(path)
            finally:
                self._stale = False
        if total:
            log.warning("archive: wrote %d records an earlier run left in the spool", total)

    def _replay_file(self, path: Path) -> int:
        batch: list[bytes] = []
        size = count = 0
        try:
            for payload in read_frames(path):
                batch.append(payload)
                size += len(payload)
                count += 1
                if len(batch) >= BATCH_MAX or size >= BATCH_BYTES:
                    self._commit(batch)
                    batch, size = [], 0
        except (CorruptSpool, OSError) as exc:
            self._commit(batch)
            kept = path.with_suffix(".corrupt")
            log.error("archive: %s; the file is kept as %s", exc, kept)
            path.rename(kept)
            return count
        self._commit(batch)
        path.unlink()
        return count

    def _commit(self, payloads: list[bytes]) -> None:
        """Write items in one transaction; on a permanent error, one by one: an item that cannot be
        written is set aside in a `rejected-*.log` spool file (retried at the next start). A busy or
        locked database is waited out, in order, however long it takes (see _transaction)."""
        items = []
        for payload in payloads:
            try:
                items.append((payload, decode_item(payload)))
            except Exception as exc:
                self._reject(payload, f"cannot decode: {type(exc).__name__}: {exc}")
        if not items:
            return
        try:
            self._transaction([item for _, item in items])
            return
        except _WriteFailed:
            pass
        for payload, item in items:
            try:
                self._transaction([item])
            except _WriteFailed as failed:
                self._reject(payload, str(failed))

    def _transaction(self, items: list[ExchangeRecord | TableRow]) -> None:
        """One IMMEDIATE transaction. A busy, locked, full or failing database is retried with backoff,
        never given up on while running (records stay in order, safe in the spool; `submit` blocks once
        the queue is full); warnings become errors after `retry_for`. During the start-up replay, an
        outage longer than `retry_for` fails the start instead (the spool is kept)."""
        started = time.monotonic()
        delay, warned, failed, escalated = 0.05, 0.0, False, False
        while True:
            try:
                self._conn.execute("BEGIN IMMEDIATE")  # takes the write lock now: the busy timeout applies
                try:
                    for item in items:
                        self._write_item(item)
                    self._conn.execute("COMMIT")
                except BaseException:
                    self._rollback()
                    raise
            except sqlite3.OperationalError as exc:
                if not _transient(exc):
                    raise _WriteFailed(exc) from exc
                now = time.monotonic()
                waited = now - started
                if self._starting and waited >= self.retry_for:
                    raise ConfigError(
                        f"the archive {self.path} stayed unavailable for {waited:.0f} s while replaying the "
                        f"spool ({exc}); nothing was lost: the spool in {self.spool.folder} is kept and "
                        "replayed at the next start", code="archive_unavailable") from exc
                late = waited >= self.retry_for
                if not failed or (late and not escalated) or now - warned >= (
                        self.retry_for if late else _WARN_EVERY):
                    (log.error if late else log.warning)(
                        "archive: database unavailable for %.0f s (%s); retrying, %d records wait (safe in "
                        "the spool)", waited, exc, len(items))
                    warned, failed, escalated = now, True, late
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            except Exception as exc:
                raise _WriteFailed(exc) from exc
            if failed:
                log.warning("archive: database writable again after %.1f s; %d records committed",
                            time.monotonic() - started, len(items))
            return

    def _rollback(self) -> None:
        # Nodes remembered as written were rolled back: forget them.
        self._seen.clear()
        self._last_chain.clear()
        if self._conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")

    def _reject(self, payload: bytes, reason: str) -> None:
        log.error("archive: could not write a record (%s); it is kept in %s and retried at the next start",
                  reason, self.spool.folder)
        try:
            if self._rejected is None:
                self._rejected = _open_append(self.spool.folder / f"rejected-{time.time_ns()}.log")
            _write_all(self._rejected, [frame(payload), payload])
        except OSError as exc:
            log.error("archive: could not keep the rejected record: %s", exc)

    def _write_item(self, item: ExchangeRecord | TableRow) -> None:
        if isinstance(item, TableRow):
            row = {k: _cell(v) for k, v in item.row.items()}
            columns = ", ".join(_quote(k) for k in row)
            verb = "INSERT OR REPLACE" if item.replace and not self._stale else "INSERT OR IGNORE"
            self._conn.execute(f"{verb} INTO {_quote(item.table)} ({columns}) "
                               f"VALUES ({', '.join('?' * len(row))})", list(row.values()))
        else:
            self._write(item)

    def _store_chain(self, messages: list[Any], record: ExchangeRecord, kind: str = "request") -> str:
        # Agents resend the whole history every turn: reuse the ids of the prefix this session sent
        # last time (a dict comparison is far cheaper than serializing and hashing it again).
        messages = messages if isinstance(messages, list) else [messages]
        key = (record.tenant, record.session_id, kind)
        previous, previous_ids = self._last_chain.get(key, ([], []))
        shared = 0
        for old, new in zip(previous, messages, strict=False):
            if old != new:
                break
            shared += 1
        ids = previous_ids[:shared]
        parent = ids[-1] if ids else f"tenant:{record.tenant}"
        for message in messages[shared:]:
            body = dumps(message)
            node = message_id(parent, body)
            if node not in self._seen:
                self._insert(node, parent, message, body, record)
                self._remember(node)
            parent = node
            ids.append(node)
        if len(self._last_chain) >= _SESSION_CHAINS:
            self._last_chain.clear()
        self._last_chain[key] = (messages, ids)
        return parent

    def _insert(self, node: str, parent: str, message: Any, body: bytes, record: ExchangeRecord,
                searchable: bool = True) -> None:
        insert_message(self._conn, node, safe_text(parent), message, body, tenant=record.tenant,
                       session_id=record.session_id, policy=record.policy, created_at=record.created_at,
                       searchable=searchable)

    def _remember(self, node: str) -> None:
        if len(self._seen) >= _SEEN_LIMIT:
            self._seen.clear()
        self._seen.add(node)

    def _write(self, record: ExchangeRecord) -> None:
        request_leaf = self._store_chain(record.request_messages or [], record)
        forwarded_leaf = request_leaf
        if record.forwarded_messages is not None:
            forwarded_leaf = self._store_chain(record.forwarded_messages, record, "forwarded")
        row: dict[str, Any] = {
            "id": record.id, "created_at": record.created_at, "session_id": record.session_id,
            "session_source": record.session_source, "tenant": record.tenant, "policy": record.policy,
            "route": record.route, "model": record.model, "stream": int(bool(record.stream)),
            "status": record.status, "latency_ms": round(float(record.latency_ms or 0), 3),
            "upstream_ms": round(float(record.upstream_ms or 0), 3), "tokens_before": record.tokens_before,
            "tokens_after": record.tokens_after, "gate": record.gate, "request_leaf": request_leaf,
            "forwarded_leaf": forwarded_leaf, "params": dumps(record.params).decode(), "error": record.error,
        }
        raw = _raw_response(record)
        if 200 <= _int(record.status, 0) < 300:
            row.update(self._response_fields(record, request_leaf, raw))
        elif raw:
            if not record.error:
                row["error"] = raw[:ERROR_CHARS].decode("utf-8", "replace")
            if len(raw) > ERROR_CHARS:
                row["response_raw"] = raw
        row = {k: _cell(v) for k, v in row.items()}
        verb = "INSERT OR IGNORE" if self._stale else "INSERT OR REPLACE"
        self._conn.execute(f"{verb} INTO exchanges ({', '.join(_quote(k) for k in row)}) "
                           f"VALUES ({', '.join('?' * len(row))})", list(row.values()))

    def _response_fields(self, record: ExchangeRecord, request_leaf: str, raw: bytes) -> dict[str, Any]:
        parsed = parse_response(record)
        fields_: dict[str, Any] = {"response_id": parsed.response_id, "finish_reason": parsed.finish_reason}
        if parsed.message is not None:
            body = dumps(parsed.message)
            node = message_id(request_leaf, body)
            # The proxy's own answers (slash commands) would make recall find its earlier results.
            self._insert(node, request_leaf, parsed.message, body, record,
                         searchable=record.gate != "command")
            fields_["response_message_id"] = node
        usage = parsed.usage or {}
        details = usage.get("prompt_tokens_details")
        details = details if isinstance(details, dict) else {}
        fields_.update(prompt_tokens=_int(usage.get("prompt_tokens")),
                       completion_tokens=_int(usage.get("completion_tokens")),
                       cached_tokens=_int(details.get("cached_tokens")))
        if parsed.problems:
            fields_["parse_error"] = "; ".join(parsed.problems)[:4000]
            fields_["response_raw"] = raw
        return fields_


def _quote(name: str) -> str:
    return '"' + str(name).replace('"', '""') + '"'


def _int(value: Any, default: int | None = None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _raw_response(record: ExchangeRecord) -> bytes:
    if record.stream and record.response_chunks:
        return b"".join(record.response_chunks)
    return bytes(record.response_body or b"")


# --------------------------------------------------------------------------------- response parsing

@dataclass
class ParsedResponse:
    message: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    response_id: str | None = None
    finish_reason: str | None = None
    problems: list[str] = field(default_factory=list)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def parse_response(record: ExchangeRecord) -> ParsedResponse:
    """The answer of a 2xx exchange, whatever shape it came in: what can be read, plus what could not."""
    if record.stream:
        folded = assemble(record.response_chunks)
        parsed = ParsedResponse(usage=folded.usage, response_id=folded.response_id,
                                finish_reason=folded.finish_reason, problems=list(folded.problems))
        if folded.chunks:
            parsed.message = folded.message()
        elif not parsed.problems:
            parsed.problems.append("the stream carried no chat-completion chunk")
        _check_usage(parsed)
        return parsed
    parsed = ParsedResponse()
    raw = record.response_body or b""
    try:
        body = loads(raw)
    except ValueError as exc:
        parsed.problems.append(f"the response body ({len(raw)} bytes) is not JSON: {exc}")
        return parsed
    if not isinstance(body, dict):
        parsed.problems.append(f"the response JSON is {_kind(body)}, not an object")
        return parsed
    if isinstance(body.get("id"), str):
        parsed.response_id = body["id"]
    elif body.get("id") is not None:
        parsed.problems.append(f"id is {_kind(body['id'])}, not a string")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        parsed.problems.append("choices is missing" if choices is None else
                               "choices is empty" if choices == [] else f"choices is {_kind(choices)}")
    elif not isinstance(choices[0], dict):
        parsed.problems.append(f"choices[0] is {_kind(choices[0])}, not an object")
    else:
        first = choices[0]
        message = first.get("message")
        if isinstance(message, dict):
            parsed.message = message
        else:
            parsed.problems.append(f"choices[0].message is {_kind(message)}, not an object")
        finish = first.get("finish_reason")
        if isinstance(finish, str):
            parsed.finish_reason = finish
        elif finish is not None:
            parsed.problems.append(f"choices[0].finish_reason is {_kind(finish)}")
    usage = body.get("usage")
    if isinstance(usage, dict):
        parsed.usage = usage
    elif usage is not None:
        parsed.problems.append(f"usage is {_kind(usage)}, not an object")
    _check_usage(parsed)
    return parsed


def _check_usage(parsed: ParsedResponse) -> None:
    usage = parsed.usage
    if not usage:
        return
    if not isinstance(usage, dict):
        parsed.problems.append(f"usage is {_kind(usage)}, not an object")
        parsed.usage = None
        return
    for name in ("prompt_tokens", "completion_tokens"):
        if usage.get(name) is not None and _int(usage.get(name)) is None:
            parsed.problems.append(f"usage.{name} is {_kind(usage[name])}, not an integer")
    details = usage.get("prompt_tokens_details")
    if details is not None and not isinstance(details, dict):
        parsed.problems.append(f"usage.prompt_tokens_details is {_kind(details)}, not an object")
    elif isinstance(details, dict) and details.get("cached_tokens") is not None \
            and _int(details.get("cached_tokens")) is None:
        parsed.problems.append("usage.prompt_tokens_details.cached_tokens is "
                               f"{_kind(details['cached_tokens'])}")


def _parse_response(record: ExchangeRecord) -> tuple[dict | None, dict | None, str | None, str | None]:
    """(message, usage, response id, finish reason); kept for callers of the old shape."""
    parsed = parse_response(record)
    return parsed.message, parsed.usage, parsed.response_id, parsed.finish_reason
