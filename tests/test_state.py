"""The session-state cache is bounded in bytes; what leaves it comes back from the archive unchanged."""

from __future__ import annotations

import threading
from typing import Any

from proxy import tokens as tokens_module
from proxy.archive import TableRow
from proxy.state import StateStore
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
    assert store.cached_sessions < 10
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


def test_token_memo_is_bounded_by_the_text_it_keeps(monkeypatch):
    monkeypatch.setattr(tokens_module, "_CACHE_CHARS", 1_000_000)
    counter = TokenCounter()
    for n in range(100):  # 100 distinct 50 KB messages: 5 MB of keys if nothing bounded them
        counter.message({"role": "tool", "tool_call_id": f"c{n}", "content": f"{n} " + "word " * 10_000},
                        "gpt-4o")
        assert counter._chars <= 1_000_000
    assert 0 < len(counter._memo) < 100
