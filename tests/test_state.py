"""The session-state cache is bounded in bytes; what leaves it comes back from the archive unchanged."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from proxy import tokens as tokens_module
from proxy.archive import TableRow
from proxy.state import StateStore, WouldBlock
from proxy.store.ledger import LedgerEntry
from proxy.tokens import TokenCounter


class MemoryArchive:
    """Stands in for the archive writer + reader: persisted rows are readable after the barrier."""

    def __init__(self) -> None:
        self.pending: list[TableRow] = []
        self.rows: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.barriers = 0

    def persist(self, row: TableRow) -> None:
        self.pending.append(row)

    def barrier(self) -> None:
        self.barriers += 1
        for row in self.pending:
            if row.table == "tool_results":
                self.rows[(row.row["tenant"], row.row["session_id"], row.row["handle"])] = row.row
        self.pending.clear()

    def tool_result_rows(self, tenant: str, session_id: str) -> list[dict[str, Any]]:
        return [r for (t, s, _), r in self.rows.items() if (t, s) == (tenant, session_id)]

    def tool_result_by_handle(self, tenant: str, handle: str) -> dict[str, Any] | None:
        return next((r for (t, _, h), r in self.rows.items() if (t, h) == (tenant, handle)), None)

    def session_window(self, tenant: str, session_id: str) -> None:
        return None

    def session_memory(self, tenant: str, session_id: str, kind: str) -> None:
        return None


def test_cache_stays_within_its_byte_budget_and_rebuilds_from_the_archive():
    archive = MemoryArchive()
    store = StateStore(persist=archive.persist, lookup=archive, budget_bytes=200_000, barrier=archive.barrier)
    originals = {}
    for n in range(40):  # 40 sessions with a 40 KB original each: 1.6 MB, eight times the budget
        state = store.get("tenant", f"s{n}")
        originals[n] = f"session {n} " + "x" * 40_000
        store.record(state, f"call{n}", originals[n], "run", f"summary {n}", "summary")
        assert store.cached_bytes <= store.budget_bytes
    assert len(store.states()) < 10
    # The oldest session left the cache; it is rebuilt with its original, after the writer caught up.
    rebuilt = store.get("tenant", "s0")
    assert archive.barriers >= 1
    assert rebuilt.by_handle["call0"].content == originals[0]
    assert rebuilt.by_handle["call0"].replacement == "summary 0"
    assert store.find("tenant", "s0", "call0").content == originals[0]
    assert store.cached_bytes <= store.budget_bytes


def test_a_state_in_use_is_never_dropped():
    archive = MemoryArchive()
    store = StateStore(persist=archive.persist, lookup=archive, budget_bytes=50_000, barrier=archive.barrier)
    busy = store.get("tenant", "busy")
    with busy.lock:  # a request of this session is being rewritten
        store.record(busy, "call", "y" * 30_000, "run", "summary", "summary")
        for n in range(10):
            other = store.get("tenant", f"other{n}")
            store.record(other, "call", "z" * 30_000, "run", "summary", "summary")
        assert store.get("tenant", "busy") is busy


def test_concurrent_first_requests_of_a_session_share_one_state():
    store = StateStore()
    seen, start = [], threading.Barrier(8)

    def get() -> None:
        start.wait()
        seen.append(store.get("tenant", "same"))

    threads = [threading.Thread(target=get) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(state) for state in seen}) == 1


def test_token_memo_keeps_no_long_text_alive_and_still_hits_for_a_resent_copy(monkeypatch):
    counter = TokenCounter()
    contents = [f"{n} " + "word " * 10_000 for n in range(100)]  # 5 MB of distinct text
    counts = [counter.message({"role": "tool", "tool_call_id": f"c{n}", "content": text}, "gpt-4o")
              for n, text in enumerate(contents)]

    def parts(value: Any) -> list[Any]:
        return [p for item in value for p in parts(item)] if isinstance(value, tuple) else [value]

    kept = [part for key in counter._memo for part in parts(key) if isinstance(part, str | bytes)]
    assert max(len(part) for part in kept) <= tokens_module.INLINE_KEY
    recounted: list[dict] = []
    real_count = tokens_module._count_message
    monkeypatch.setattr(tokens_module, "_count_message",
                        lambda message, family: recounted.append(message) or real_count(message, family))
    # The same history resent as new objects (as agents do): every count is a memo hit.
    again = [counter.message({"role": "tool", "tool_call_id": f"c{n}", "content": "".join([text])}, "gpt-4o")
             for n, text in enumerate(contents)]
    assert again == counts and recounted == []


def test_a_rebuilt_session_treats_everything_as_already_sent():
    """After a restart the proxy does not know what the provider has cached: no result counts as new,
    so no waiting summary lands in the middle of the cached history just because the state was lost."""
    archive = MemoryArchive()
    store = StateStore(persist=archive.persist, lookup=archive, barrier=archive.barrier)
    state = store.get("tenant", "s1")
    assert state.history_len == 0  # a new session: nothing was sent before
    store.record(state, "call", "x" * 1000, "run", "summary", "summary")
    archive.barrier()
    restarted = StateStore(persist=archive.persist, lookup=archive, barrier=archive.barrier)
    assert restarted.get("tenant", "s1").history_len >= 1 << 30
    assert restarted.get("tenant", "s2").history_len == 0


def test_session_without_waiting_refuses_whatever_would_wait():
    store = StateStore()
    with pytest.raises(WouldBlock), store.session("tenant", "s", wait=False):
        pass  # not in memory: building it may read the archive
    state = store.get("tenant", "s")
    with store.session("tenant", "s", wait=False) as found:
        assert found is state and state.lock.locked()
    assert not state.lock.locked()
    with state.lock, pytest.raises(WouldBlock), store.session("tenant", "s", wait=False):
        pass  # another request of the session is being rewritten
    replicas = StateStore(ledger=object())  # type: ignore[arg-type]  # (a database round trip)
    replicas.get("tenant", "s")
    with pytest.raises(WouldBlock), replicas.session("tenant", "s", wait=False):
        pass


class OneLedger:
    """A session ledger another replica writes to: each `move_on` is a request it rewrote meanwhile."""

    def __init__(self) -> None:
        self.entry = LedgerEntry(version=0, snapshot=None)

    def move_on(self) -> None:
        self.entry.version += 1

    @contextlib.contextmanager
    def open(self, tenant: str, session_id: str) -> Iterator[LedgerEntry]:
        yield self.entry

    def unavailable(self, exc: BaseException) -> bool:
        return False


def test_walks_carried_from_this_replicas_last_request_are_dropped_once_another_replica_moved_on():
    """Walks remembered by message object reflect the decisions of this copy's last request; another
    replica's request since then may have changed them (tests/store/test_replicas_e2e.py end to end)."""
    ledger = OneLedger()
    store = StateStore(lookup=MemoryArchive(), ledger=ledger)  # type: ignore[arg-type]
    with store.session("tenant", "s") as state:
        state.walks["found"] = ("a walk of this request",)
    with store.session("tenant", "s") as state:
        assert "found" in state.walks  # nothing moved: this copy is current
    ledger.move_on()
    with store.session("tenant", "s") as state:
        assert state.walks == {}
