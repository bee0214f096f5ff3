"""The store of per-session sticky state (proxy/session_state.py): what was replaced and how, and the
verbatim originals behind it.

Replacements are decided once and then repeated byte for byte on every later request (prompt
caching depends on it). Decisions are written through to the archive so they survive a restart.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import orjson

from proxy.archive import TableRow, utc_now
from proxy.errors import StorageUnavailable
from proxy.held_memory import held_total
from proxy.layers.auto_summary import Headline
from proxy.layers.folded import FoldedMemory
from proxy.layers.splices import loads as load_splices
from proxy.layers.working_memory import WorkingMemory
from proxy.session_state import SessionState, StoredResult, WindowState
from proxy.state_snapshot import restore, snapshot
from proxy.store.ledger import LedgerEntry, SessionLedger
from proxy.token_sums import extended_total

CACHE_BYTES = 64 * 1024 * 1024  # the default byte budget of the in-process session cache
UNKNOWN_HISTORY = 1 << 30  # history_len of a session rebuilt from the archive


Persist = Callable[[TableRow], None]


class Lookup(Protocol):
    """Read access to persisted tool results (the archive reader in the server, nothing in replay)."""

    def tool_result_rows(self, tenant: str, session_id: str) -> list[dict[str, Any]]: ...

    def tool_result_by_handle(self, tenant: str, handle: str) -> dict[str, Any] | None: ...

    def session_window(self, tenant: str, session_id: str) -> dict[str, Any] | None: ...

    def session_memory(self, tenant: str, session_id: str, kind: str) -> dict[str, Any] | None: ...

    def archived_result(self, tenant: str, session_id: str | None, handle: str) -> dict[str, Any] | None:
        """A message the model saw, from the archive, by call id, `id#n` or `msg-...`: in `session_id`,
        or (None) the tenant's newest session holding it. Keys: handle, call_id, content, tool_name."""
        ...


def _result_size(stored: StoredResult) -> int:
    # str of mostly ASCII: ~1 byte a character, plus the handle/key entries
    return len(stored.content) + len(stored.replacement) + 256


def _from_row(row: dict[str, Any]) -> StoredResult:
    return StoredResult(row["handle"], row["call_id"], row["content"], row["tool_name"], row["replacement"],
                        row["kind"])


KINDS = ("tool_results", "window", "working", "folded", "splices")  # the parts of a state in the archive


class WouldBlock(Exception):
    """`StateStore.session(wait=False)` could not have the state without waiting; nothing was done."""


class StateStore:
    """Session states by (tenant, session): a cache with a byte budget over what the archive holds.

    Everything a state holds is persisted through `persist`, so a state dropped from the cache is
    rebuilt from the archive (`lookup`) when its session comes back; `barrier` waits until what was
    persisted before is readable, so the rebuilt state is never older than the dropped one.
    """

    def __init__(self, persist: Persist | None = None, lookup: Lookup | None = None,
                 budget_bytes: int = CACHE_BYTES, barrier: Callable[[], object] | None = None,
                 ledger: SessionLedger | None = None) -> None:
        self._persist = persist
        self._ledger = ledger
        self._open: dict[tuple[Any, Any], LedgerEntry] = {}  # sessions inside `session` with a ledger
        self._lookup = lookup
        self._barrier = barrier
        self.budget_bytes = budget_bytes
        self._sessions: OrderedDict[tuple[str, str], SessionState] = OrderedDict()
        self._bytes = 0
        self._dropped = False  # a state left the cache: rebuilding one must wait for the writer
        self._lock = threading.Lock()

    @property
    def cached_bytes(self) -> int:
        return self._bytes

    def states(self) -> list[SessionState]:
        """The sessions held in memory, the one used least recently first."""
        with self._lock:
            return list(self._sessions.values())

    def get(self, tenant: str, session_id: str) -> SessionState:
        key = (tenant, session_id)
        with self._lock:
            state = self._sessions.get(key)
            if state is not None:
                self._sessions.move_to_end(key)
                return state
        state = self._build(tenant, session_id)
        with self._lock:
            existing = self._sessions.get(key)
            if existing is not None:  # another thread built it meanwhile: one state per session
                return existing
            self._sessions[key] = state
            self._bytes += state.size
            self._shrink()
        return state

    def _build(self, tenant: str, session_id: str) -> SessionState:
        """A session's state as the archive holds it."""
        if self._dropped and self._barrier is not None:
            self._barrier()
        state = SessionState(tenant, session_id)
        self._load(state, KINDS)
        if state.by_handle or state.window.cut is not None or state.memory_seen:
            # A session that existed before (a restart, or it left the cache): what the client sent
            # before is unknown, so treat it all as sent (cached), never as new.
            state.history_len = UNKNOWN_HISTORY
        return state

    def _load(self, state: SessionState, kinds: Iterable[str]) -> None:
        """Read these parts of a session's state from the archive into `state`, replacing them."""
        lookup, tenant, session_id = self._lookup, state.tenant, state.session_id
        if lookup is None:
            return
        for kind in kinds:
            if kind == "tool_results":
                state.by_key, state.by_handle = {}, {}
                for row in lookup.tool_result_rows(tenant, session_id):
                    stored = _from_row(row)
                    state.by_key[(stored.call_id, stored.content)] = stored
                    state.by_handle[stored.handle] = stored
                    state.size += _result_size(stored)
            elif kind == "window":
                window = lookup.session_window(tenant, session_id)
                first_seen = state.window.first_seen
                state.window = WindowState(
                    cut=window["cut"], last_evicted=orjson.loads(window["last_evicted"]),
                    headlines=[Headline(**h) for h in orjson.loads(window["headlines"])],
                    block=window["block"], first_seen=first_seen) if window else WindowState()
                state.size += len(state.window.block or "") * 2
            else:
                found = lookup.session_memory(tenant, session_id, kind)
                if kind == "working":
                    saved = orjson.loads(found["data"]) if found else {}
                    state.memory = WorkingMemory.from_dict(saved.get("memory")) if found else WorkingMemory()
                    state.memory_seen, state.memory_last = saved.get("seen", 0), saved.get("last")
                elif kind == "folded":
                    state.folded = FoldedMemory.from_json(found["data"]) if found else FoldedMemory()
                elif kind == "splices":
                    state.splices = load_splices(found["data"]) if found else {}
                    state.size += len(found["data"]) if found else 0

    @contextlib.contextmanager
    def session(self, tenant: str, session_id: str, *, wait: bool = True) -> Iterator[SessionState]:
        """The session's state, for one request (or one change) at a time. With a ledger (replicas on
        PostgreSQL) also one at a time across processes: the state is brought up to what the database
        holds first, and what the request decided is committed there before the next one may start.

        wait=False (the event loop's own thread): raise WouldBlock, having done nothing, unless the state
        is in memory and free now and no ledger is involved (a database round trip)."""
        if not wait:
            key = (tenant, session_id)
            with self._lock:
                cached = self._sessions.get(key)
                if cached is not None:
                    self._sessions.move_to_end(key)
            if cached is None or self._ledger is not None or not cached.lock.acquire(blocking=False):
                raise WouldBlock(f"session {session_id} is not in memory or is busy")
            try:
                yield cached
            finally:
                cached.lock.release()
            return
        state = self.get(tenant, session_id)
        with state.lock:
            if self._ledger is None:
                yield state
                return
            key = (tenant, session_id)
            try:
                with self._ledger.open(tenant, session_id) as entry:
                    if entry.version != state.version:
                        self._catch_up(state, entry)
                    self._open[key] = entry
                    try:
                        yield state
                    finally:
                        del self._open[key]
                        entry.snapshot = snapshot(state)
            except BaseException as exc:
                state.version, state.kinds = -1, {}  # not known to match the database: rebuild next time
                if self._ledger.unavailable(exc):
                    raise StorageUnavailable(f"the session store is unavailable ({type(exc).__name__}); "
                                             "nothing was forwarded, retry") from exc
                raise
            state.version, state.kinds = entry.version, dict(entry.kinds)

    def _catch_up(self, state: SessionState, entry: LedgerEntry) -> None:
        """Another replica moved the session on: reload the parts of its state whose decision rows it
        wrote (in place: other threads of this process may be waiting on this state's lock), then take
        its snapshot."""
        moved = [kind for kind in KINDS if entry.kinds.get(kind, 0) != state.kinds.get(kind, 0)]
        if state.version < 0:
            moved = list(KINDS)  # this copy may hold changes that were never committed
        before = state.size
        self._load(state, moved)
        self.grow(state, state.size - before)
        restore(state, entry.snapshot)
        # Walks remembered by message object (layers/tool_results.found_in...) carry this copy's own last
        # decisions, not the other replica's since.
        state.walks.clear()

    def grow(self, state: SessionState, added: int) -> None:
        """Account for bytes a state took on (results, window blocks) and keep within the budget."""
        state.size += added
        with self._lock:
            if self._sessions.get((state.tenant, state.session_id)) is state:
                self._bytes += added
                self._shrink()

    def carry(self, state: SessionState, messages: list[dict[str, Any]], carried: bool) -> None:
        """Account for the client's messages a state keeps until the session's next request (its counts,
        rewrites and walks are keyed by them): their memory, summed past what an earlier request summed
        (token_sums.py). Uncounted, idle sessions of long histories each held their last parse whatever
        the budget (in bench/faults.py, 100 of up to ~280 KB: 52 MB)."""
        held = extended_total(state.walks.setdefault("held sums", []), messages, held_total,
                              min_length=1) if carried else 0
        self.grow(state, held - state.carried_bytes)
        state.carried_bytes = held

    def _shrink(self) -> None:
        """Drop least recently used states over the budget, but never one a request is rewriting."""
        if self._bytes <= self.budget_bytes:
            return
        for key in list(self._sessions):
            if self._bytes <= self.budget_bytes or len(self._sessions) <= 1:
                return
            state = self._sessions[key]
            if not state.lock.acquire(blocking=False):
                continue
            try:
                del self._sessions[key]
                self._bytes -= state.size
                self._dropped = True
            finally:
                state.lock.release()

    def persist(self, row: TableRow) -> None:
        """Through the archive writer; inside `session` with a ledger, in the session's own commit."""
        entry = self._open.get((row.row.get("tenant"), row.row.get("session_id"))) if self._open else None
        if entry is not None:
            entry.rows.append(row)
        elif self._persist:
            self._persist(row)

    def record(self, state: SessionState, call_id: str, content: str, tool_name: str | None,
               replacement: str, kind: str, handle: str | None = None) -> StoredResult:
        """Remember (or update) the replacement of one tool result and persist it with its original.
        `handle`: the one the replacement text already names (else a new one)."""
        stored, state.recorded = state.lookup(call_id, content), state.recorded + 1
        if stored is None:
            stored = StoredResult(handle or state.new_handle(call_id), call_id, content, tool_name,
                                  replacement, kind)
            state.by_key[(call_id, content)] = stored
            state.by_handle[stored.handle] = stored
            state.decisions[kind] += 1
            self.grow(state, _result_size(stored))
        else:
            if stored.kind != kind:
                state.decisions[kind] += 1
            stored.replacement, stored.kind = replacement, kind
        self.persist(TableRow("tool_results", {
            "tenant": state.tenant, "session_id": state.session_id, "handle": stored.handle,
            "call_id": call_id, "content_hash": hashlib.sha256(content.encode()).hexdigest(),
            "tool_name": tool_name, "content": content, "replacement": replacement, "kind": kind,
            "created_at": utc_now()}))
        return stored

    def save_window(self, state: SessionState) -> None:
        window = state.window
        self.grow(state, len(window.block or "") + 256)  # one batch's block and headlines (approximate)
        self.persist(TableRow("session_windows", {
            "tenant": state.tenant, "session_id": state.session_id, "cut": window.cut,
            "last_evicted": orjson.dumps(window.last_evicted).decode(),
            "headlines": orjson.dumps(window.headlines).decode(),  # (dataclasses as asdict, no copy)
            "block": window.block,
            "updated_at": utc_now()}))

    def save_memory(self, state: SessionState, kind: str, data: dict[str, Any] | str) -> None:
        self.persist(TableRow("session_memory", {
            "tenant": state.tenant, "session_id": state.session_id, "kind": kind,
            "data": data if isinstance(data, str) else orjson.dumps(data).decode(), "updated_at": utc_now()}))

    def find(self, tenant: str, session_id: str, handle: str) -> StoredResult | None:
        """A stored original by handle, for this tenant only: what this session recorded (summarized,
        masked, evicted), then what this session's archived messages hold (any result it was sent, kind
        "archived"), then the tenant's other sessions in the same order."""
        own = self.get(tenant, session_id).by_handle.get(handle)
        if own is not None:
            return own
        archived = self._archived(tenant, session_id, handle)
        if archived is not None:
            return archived
        others = [state for state in self.states() if state.tenant == tenant]
        for state in others:
            if handle in state.by_handle:
                return state.by_handle[handle]
        row = self._lookup.tool_result_by_handle(tenant, handle) if self._lookup else None
        return _from_row(row) if row else self._archived(tenant, None, handle)

    def _archived(self, tenant: str, session_id: str | None, handle: str) -> StoredResult | None:
        # getattr: a Lookup written before read-back from the archive existed simply has none.
        archived = getattr(self._lookup, "archived_result", None)
        found = archived(tenant, session_id, handle) if archived is not None else None
        if found is None:
            return None
        return StoredResult(found["handle"], found["call_id"], found["content"], found.get("tool_name"), "",
                            "archived")
