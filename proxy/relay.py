"""The plain (no internal tools) upstream leg of a chat request: read a whole answer, or relay a stream
chunk by chunk, keeping what the archive needs either way."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

import anyio
import httpx

from proxy import rounds
from proxy.archive import ExchangeRecord
from proxy.upstream import Upstream

CHAT_PATH = "/chat/completions"


async def open_and_read(upstream: Upstream, headers: dict[str, str], content: bytes, query: bytes,
                        rc: rounds.RoundsContext) -> tuple[httpx.Response, bytes]:
    record = rc.new_record(rc.forwarded, None)
    rc.records.append(record)
    upstream_started = time.perf_counter()
    response = await upstream.open("POST", CHAT_PATH, query, headers, content)
    record.status = response.status_code
    record.response_body = await Upstream.read(response, upstream.base_url)
    record.upstream_ms = (time.perf_counter() - upstream_started) * 1000
    return response, record.response_body


async def relay_stream(response: httpx.Response, record: ExchangeRecord) -> AsyncIterator[bytes]:
    """Relay upstream bytes as they arrive and keep a copy for the archive."""
    try:
        async for chunk in response.aiter_raw():
            record.response_chunks.append(chunk)
            yield chunk
    except httpx.HTTPError as exc:
        record.error = f"upstream stream broke off: {exc or type(exc).__name__}"
    finally:
        with anyio.CancelScope(shield=True):
            await response.aclose()


async def archived(events: AsyncIterator[bytes], records: list[ExchangeRecord],
                   on_done: Callable[[], None]) -> AsyncIterator[bytes]:
    """Wrap a stream so its exchanges are archived however it ends (done, failed, client gone)."""
    try:
        async for event in events:
            yield event
    except BaseException:
        if records and not records[-1].error:
            records[-1].error = "client disconnected during the stream"
        raise
    finally:
        on_done()
