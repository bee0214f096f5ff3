"""Input-sized work split across threads: the first sight of a long history counted on every core.

tiktoken's encoder releases the GIL while it encodes, so threads that each count a part of a history
run at once. How much that buys depends on the cores: a 2 MB session's 475k tokens took ~260 → ~160 ms
on this 2-core VM on 2026-11-24, and 115-119 → 108-112 ms for 1.7 times the CPU on 2026-12-07 (when
hashing and compressing, which let the GIL go, ran only 1.5 times as fast in two threads as in one).
Only a first sight counts this much at once. Parts are contiguous runs of about equal size; the
calling thread counts the first itself, a shared pool the others.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

MAX_THREADS = 8

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def threads() -> int:
    """The cores this process may run on (at most MAX_THREADS)."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # (not on Linux)
        usable = os.cpu_count() or 1
    return max(1, min(MAX_THREADS, usable))


def split(sizes: list[int], parts: int) -> list[tuple[int, int]]:
    """Contiguous `[start, stop)` runs covering every index once, at most `parts` of them, none empty,
    each closing once the runs so far hold their share of the total size."""
    if not sizes:
        return []
    parts, total = max(1, min(parts, len(sizes))), sum(sizes)
    runs: list[tuple[int, int]] = []
    start = held = 0
    for index, size in enumerate(sizes):
        held += size
        if len(runs) + 1 < parts and index + 1 < len(sizes) and held * parts >= total * (len(runs) + 1):
            runs.append((start, index + 1))
            start = index + 1
    runs.append((start, len(sizes)))
    return runs


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=MAX_THREADS - 1, thread_name_prefix="ctxproxy-count")
        return _pool


def map_split(work: Callable[[list[T]], list[R]], items: list[T], sizes: list[int]) -> list[R]:
    """`work(items)`, with `items` split by `sizes` into one run a usable core: the results in order.
    `work` must return one result an item and be safe to run in several threads at once."""
    runs = split(sizes, threads())
    if len(runs) < 2:
        return work(items)
    pool = _executor()
    others = [pool.submit(work, items[start:stop]) for start, stop in runs[1:]]
    start, stop = runs[0]
    results = work(items[start:stop])
    for future in others:
        results.extend(future.result())
    return results
