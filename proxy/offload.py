"""Input-sized work (parsing, serializing, counting) leaves the event loop, but only when it is large
enough to matter: below the threshold a thread hop costs more than the work."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import anyio

T = TypeVar("T")
LARGE = 256 * 1024  # bytes
# A request this small is rewritten on the event loop when nothing in it can wait (app.rewrite_soon): its
# pipeline takes well under a millisecond, and a worker thread would cost more in hops and GIL handoffs.
INLINE_BYTES = 64 * 1024
# A resent history is rewritten on the event loop when its new part is this small (and it is clear of
# every batch): summarizing new output runs ~1 ms a KB in the worst case, so the loop is held ~15 ms at most.
INLINE_FRESH_BYTES = 16 * 1024


async def off_loop_if_large(size: int, work: Callable[..., T], *args: Any) -> T:
    return await anyio.to_thread.run_sync(work, *args) if size > LARGE else work(*args)
