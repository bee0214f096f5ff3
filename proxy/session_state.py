"""What one session's sticky state holds: its replaced results and their originals, the window's
decisions, its memory blocks, and what is carried from request to request (proxy/state.py keeps them).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from proxy.layers.auto_summary import Headline
from proxy.layers.folded import FoldedMemory
from proxy.layers.splices import Splice
from proxy.layers.working_memory import WorkingMemory

Prefix = tuple[int, Any, int]  # messages, the last one, tokens
_SESSION_OVERHEAD = 4096  # rough fixed cost of one cached session (dicts, memory blocks)


@dataclass
class StoredResult:
    handle: str  # what the model passes to read_tool_result: the call id, or `id#n` when an id is reused
    call_id: str
    content: str
    tool_name: str | None
    replacement: str
    kind: str  # summary | placeholder


@dataclass
class WindowState:
    """The sliding window's sticky decisions for one session."""

    cut: int | None = None  # messages[head:cut] are evicted
    last_evicted: dict[str, Any] | None = None  # messages[cut - 1], to notice an edited history
    headlines: list[Headline] = field(default_factory=list)
    block: str | None = None  # the rendered auto-summary, repeated until the next batch
    block_tokens: int = 0
    first_seen: list[float] = field(default_factory=list)  # when each message index first arrived


@dataclass
class SessionState:
    tenant: str
    session_id: str
    by_key: dict[tuple[str, str], StoredResult] = field(default_factory=dict)  # (call_id, content)
    by_handle: dict[str, StoredResult] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)
    kept: set[tuple[str, str]] = field(default_factory=set)  # over the threshold but summaries would not help
    # Summaries made but not applied yet (they wait until offering the internal tools pays): key ->
    # (handle, summary). Not persisted: recomputed identically after a restart.
    pending: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    history_len: int = 0  # messages in the client's previous request (what the provider may have cached)
    # The previous request as the client sent it and as it was forwarded: (messages, last message, tokens),
    # for the cache hit each would have had (accounting); and the decisions recorded so far, by kind.
    last_client: Prefix | None = None
    last_forwarded: Prefix | None = None
    decisions: Counter[str] = field(default_factory=Counter)
    recorded: int = 0  # StateStore.record calls: a walk carried from before the last one is stale
    window: WindowState = field(default_factory=WindowState)
    injected_tokens: int = 0  # injected blocks besides the auto-summary, as of the last request
    memory: WorkingMemory = field(default_factory=WorkingMemory)
    memory_seen: int = 0  # messages of the client's history already fed to working memory
    memory_last: dict[str, Any] | None = None  # messages[memory_seen - 1], to notice an edited history
    folded: FoldedMemory = field(default_factory=FoldedMemory)
    # Internal calls taken out of turns that also called client tools, put back in later histories.
    splices: dict[tuple[Any, ...], Splice] = field(default_factory=dict)
    # Token counts by message object, carried from request to request (see TokenCounter.request_scope).
    counted: dict[str, dict[int, tuple[dict[str, Any], int]]] = field(default_factory=dict, repr=False,
                                                                       compare=False)
    # Rewritten copies of messages (summaries, placeholders) by the message, for the same reason.
    rewrites: dict[int, tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=dict, repr=False,
                                                                        compare=False)
    # Walks over the history remembered by message object (layers/tool_results.found_in), same reason.
    walks: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # Requests of one session are rewritten one at a time (the pipeline runs in worker threads).
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    size: int = _SESSION_OVERHEAD  # approximate bytes held, for the store's byte budget
    carried_bytes: int = 0  # of which the client's messages kept from its last request (StateStore.carry)
    # With a ledger (replicas): the version of the session's committed state this copy reflects, and
    # how often each kind of decision row had been written then.
    version: int = 0
    kinds: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    @property
    def internal_tools_offered(self) -> bool:
        """Once a result was replaced or history evicted, the internal tools stay offered (sticky)."""
        return bool(self.by_handle) or (self.window.cut is not None and bool(self.window.headlines))

    def lookup(self, call_id: str, content: str) -> StoredResult | None:
        return self.by_key.get((call_id, content))

    def new_handle(self, call_id: str) -> str:
        """`call_id`, or `call_id#n` when the id is already taken (clients reuse ids)."""
        taken = {handle for handle, _ in self.pending.values()} if self.pending else set()
        if call_id not in self.by_handle and call_id not in taken:
            return call_id
        n = 2
        while f"{call_id}#{n}" in self.by_handle or f"{call_id}#{n}" in taken:
            n += 1
        return f"{call_id}#{n}"
