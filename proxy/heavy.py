"""Pure, input-sized work on huge texts (token counts, summaries) in a separate process.

A worker thread keeps the event loop free, but not the GIL: while a 20 MB tool result is tokenized and
summarized in one thread, every other request's thread waits for the GIL at each step (measured: another
tenant's small request went from ~2 ms to 60-170 ms). Texts of `HUGE_CHARS` or more go to a one-worker
process pool instead, and the calling thread waits with the GIL released. Smaller texts, and processes
that never called `enable()` (replay, the CLI, unit tests), do the work inline.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

log = logging.getLogger("ctxproxy")

T = TypeVar("T")
HUGE_CHARS = 1_000_000

_pool: ProcessPoolExecutor | None = None
_enabled = False
_setup: tuple[Callable[..., None], tuple[Any, ...]] | None = None
_lock = threading.Lock()


def enable(setup: Callable[..., None] | None = None, *setup_args: Any) -> None:
    """Use a worker process for huge texts from now on (the server calls this at start-up);
    `setup(*setup_args)` runs first in that process (a module-level function: it is pickled by name)."""
    global _enabled, _setup
    _enabled, _setup = True, None if setup is None else (setup, setup_args)


def shutdown() -> None:
    global _pool, _enabled
    with _lock:
        pool, _pool, _enabled = _pool, None, False
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)


def _worker_pool() -> ProcessPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            # spawn, not fork: forking a process that runs threads (uvicorn, the archive writer) is unsafe.
            setup, setup_args = _setup or (None, ())
            _pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=setup, initargs=setup_args)
        return _pool


def call(work: Callable[..., T], text: str, *args: Any, **kwargs: Any) -> T:
    """`work(text, *args, **kwargs)`, in the worker process when `text` is huge. `work` must be a
    module-level function (it is pickled by name) and pure (the worker shares no state with us)."""
    if not _enabled or len(text) < HUGE_CHARS:
        return work(text, *args, **kwargs)
    try:
        return _worker_pool().submit(work, text, *args, **kwargs).result()
    except BrokenProcessPool:  # the worker died (killed, out of memory): start a new one next time
        global _pool
        with _lock:
            _pool = None
        log.warning("heavy-work process died; %s ran in-process", getattr(work, "__name__", work))
        return work(text, *args, **kwargs)
