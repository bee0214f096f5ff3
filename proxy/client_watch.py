"""The client leaving, watched with one plain task that cancels the request's own.

Under uvicorn (ASGI spec 2.3) `send` to a departed client returns silently: only `receive` tells, with an
`http.disconnect`. Starlette's StreamingResponse listens in an anyio task group (~50 µs a response on
uvloop), and a second task for the work plus `asyncio.wait` costs ~10 µs; one asyncio task waiting on
`receive` and cancelling the request's task costs ~3 µs. The work sees the CancelledError a task group
would throw into it, so its `finally` and shielded archive work run as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from starlette.types import Receive


@dataclass
class Watch:
    gone: bool = False  # the client left while the watch was open (and its task was cancelled for it)
    ended: bool = False  # set by the holder once the response is complete: a disconnect then is no news


@contextlib.contextmanager
def client_watch(receive: Receive) -> Iterator[Watch]:
    """While open, the client leaving cancels this task; that cancellation ends at the block's edge (the
    block is left as if it had returned: look at `gone`). A cancellation from elsewhere goes through."""
    task, watch = asyncio.current_task(), Watch()
    if task is None:  # (not in a task: nothing to cancel)
        yield watch
        return
    running = task

    async def wait() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if not watch.ended:  # (a complete response also reads as a disconnect from here on)
            watch.gone = True
            running.cancel()

    watcher = asyncio.get_running_loop().create_task(wait())
    try:
        yield watch
    except asyncio.CancelledError:
        if not watch.gone or running.uncancel() > 0:  # cancelled for another reason too
            raise
    else:
        if watch.gone:  # the client left as the block ended (which took the cancel in)
            running.uncancel()
    finally:
        watcher.cancel()
