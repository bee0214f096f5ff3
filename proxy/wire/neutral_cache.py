"""Neutral messages decoded from a native one, reused while the native message is the same object.

A resent history's native messages are the earlier parse's very objects (wire/resent.py); decoding them
again into neutral messages would make new objects every request, and with them every count, rewrite and
spool reference keyed by the neutral message would be lost. A codec whose neutral messages are not its
native ones (Anthropic Messages) keeps here what it decoded for each native message at its position.
"""

from __future__ import annotations

import threading
from typing import Any

MAX_ENTRIES = 16384  # native messages remembered (each held alive, as the resent body holds it anyway)


class NeutralCache:
    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._made: dict[int, tuple[Any, int, list[tuple[dict[str, Any], Any]]]] = {}
        self._lock = threading.Lock()

    def get(self, native: Any, k: int) -> list[tuple[dict[str, Any], Any]] | None:
        """(neutral message, its origin) pairs decoded from `native` at position `k`, or None."""
        hit = self._made.get(id(native))  # (the entry holds `native`: an id found is that object)
        return hit[2] if hit is not None and hit[1] == k else None

    def put(self, native: Any, k: int, made: list[tuple[dict[str, Any], Any]]) -> None:
        with self._lock:
            if len(self._made) >= self.max_entries:
                self._made.clear()
            self._made[id(native)] = (native, k, made)

    def clear(self) -> None:
        with self._lock:
            self._made.clear()


NEUTRAL = NeutralCache()
